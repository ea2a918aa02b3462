// The transformer forward pass of both families, batched over sequences, with an inter-step K/V cache.
//
// One graph serves every case: each sequence's rows are run through the network together (the
// mat-muls see every row of every sequence), their post-RoPE K/V are written into that sequence's
// cache at their positions, and their queries attend over that cache's rows [0, n_kv) only. A full
// forward pass is the batch of every position; a cached step is the batch of the active positions,
// the other rows keeping the K/V of an earlier step.
#pragma once

#include "model_impl.h"

#include <vector>

struct ggml_context;
struct ggml_cgraph;
struct ggml_gallocr;

namespace diffuse {

// Post-RoPE keys and values of every layer: (head_dim * n_head_kv, n_ctx) each, F16 or F32.
// Not cleared: a row is always written (by a full pass) before any query reads it.
class KVCache {
public:
    KVCache(const ModelImpl & model, int n_ctx);
    ~KVCache();
    KVCache(const KVCache &) = delete;
    KVCache & operator=(const KVCache &) = delete;

    int n_ctx() const { return n_ctx_; }
    uint64_t id() const { return id_; }   // unique per cache ever made: graphs built on it know it
    std::vector<ggml_tensor *> k, v;   // one per layer
private:
    int n_ctx_;
    uint64_t id_;
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer * buf_ = nullptr;
};

// One sequence's share of a forward pass.
struct SequenceRows {
    KVCache * cache = nullptr;       // this sequence's K/V (distinct for every sequence of a pass)
    std::vector<int32_t> tokens;     // (n_q,) ids of the rows to compute
    std::vector<int32_t> positions;  // (n_q,) their absolute positions: RoPE angle and cache row
    int n_kv = 0;                    // its queries attend over cache rows [0, n_kv)
    std::vector<int32_t> out_rows;   // indices into [0, n_q) whose logits are wanted
};

// Builds, allocates and runs forward graphs on one CPU backend. Not thread-safe: each Context has one.
class ForwardRunner {
public:
    explicit ForwardRunner(const ModelImpl & model);
    ~ForwardRunner();
    ForwardRunner(const ForwardRunner &) = delete;
    ForwardRunner & operator=(const ForwardRunner &) = delete;

    // logits: (sum of n_out, n_vocab) row-major, the sequences' out_rows in order, written in place.
    // n_threads is an upper bound: a pass too small to pay for waking the threads uses fewer.
    // A pass of the same shape as the previous one (rows per sequence, n_kv, caches) reuses its
    // graph and allocation: only the inputs are written.
    void run(const std::vector<SequenceRows> & seqs, int n_threads, float * logits);

    // MoE: the experts the last run chose for sequence s (its out_rows given again), best first:
    // (n_layer, n_q, n_expert_used) row-major, -1 for last-layer rows not in out_rows.
    void routing(size_t s, const std::vector<int32_t> & out_rows, std::vector<int32_t> & experts) const;

private:
    struct Shape {
        std::vector<uint64_t> caches;   // KVCache ids
        std::vector<int> n_q, n_kv, n_out;
        bool operator==(const Shape & o) const {
            return caches == o.caches && n_q == o.n_q && n_kv == o.n_kv && n_out == o.n_out;
        }
    };
    struct Inputs {
        ggml_tensor * tokens = nullptr;     // I32 (n_q_total)
        ggml_tensor * positions = nullptr;  // I32 (n_q_total)
        std::vector<ggml_tensor *> cache_rows;   // per sequence, I64 (n_q): cache rows to write
        std::vector<ggml_tensor *> gather_rows;  // per sequence, I64 (n_q): its rows in the batch (B > 1)
        ggml_tensor * out_rows = nullptr;   // I32 (n_out_total), into the batch
        ggml_tensor * logits = nullptr;     // (n_vocab, n_out_total)
        // MoE, per layer: the router's ranking, I32 (n_expert, rows) best first; rows = n_q_total
        // (last layer: n_out_total)
        std::vector<ggml_tensor *> experts;
    };
    void build(const std::vector<SequenceRows> & seqs);
    int threads_for_pass(int n_threads) const;   // at most n_threads, fewer for a small pass

    const ModelImpl & model_;
    ggml_backend * backend_ = nullptr;  // the CPU backend: thread count and its work buffer
    ggml_gallocr * galloc_ = nullptr;
    std::vector<uint8_t> graph_meta_;   // tensor and graph headers of the current graph
    ggml_context * ctx_ = nullptr;      // the current graph's context, kept while its shape repeats
    ggml_cgraph * graph_ = nullptr;
    Shape shape_;
    Inputs in_;
};

}  // namespace diffuse
