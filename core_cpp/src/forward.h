// The forward pass, batched over sequences, with a K/V cache per sequence: the architecture's
// graph (core_cpp/src/models/, built from graph.h's blocks) planned, allocated and run. A full
// forward pass is the batch of every position; a cached step is the batch of the active positions,
// the other rows keeping the K/V of an earlier step.
#pragma once

#include "graph.h"
#include "model_impl.h"

#include <vector>

struct ggml_context;
struct ggml_cgraph;
struct ggml_gallocr;

namespace diffuse {

// Post-RoPE keys and values of every layer: (head_dim * n_head_kv, n_ctx) each (that layer's
// geometry), F16 or F32.
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
    // (n_q,) the rows' cache rows when they are not their positions (WeDLM: a window in pass order,
    // each row at its true RoPE position); empty: positions. The mask below reads these.
    std::vector<int32_t> cache_rows;
    int n_kv = 0;                    // its queries attend over cache rows [0, n_kv)
    // > 0: block-causal attention over blocks of attn_block positions aligned at 0 (a query at
    // cache row p sees cache row r iff r / attn_block <= p / attn_block); 0: bidirectional.
    int attn_block = 0;
    std::vector<int32_t> out_rows;   // indices into [0, n_q) whose logits are wanted
    // DiffusionGemma: true for the decoder over a canvas (bidirectional, the decoder's layer scalars,
    // self-conditioning), false for the encoder (attn_block 1). Sliding layers see the n_swa - 1
    // rows before the query (encoder) or before the first canvas row (decoder), and the query's
    // own rows. self_cond: the previous step's logits of these rows, (n_q, n_vocab), or nullptr.
    bool canvas = false;
    const float * self_cond = nullptr;
    // Self-speculation's draft pass: o_proj adds the model's draft LoRA (ignored for a model
    // without one). Every sequence of a pass agrees.
    bool draft_lora = false;
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
    void build(const std::vector<SequenceRows> & seqs);
    int threads_for_pass(int n_threads) const;   // at most n_threads, fewer for a small pass

    const ModelImpl & model_;
    ggml_backend * backend_ = nullptr;  // the CPU backend: thread count and its work buffer
    ggml_gallocr * galloc_ = nullptr;
    std::vector<uint8_t> graph_meta_;   // tensor and graph headers of the current graph
    ggml_context * ctx_ = nullptr;      // the current graph's context, kept while its shape repeats
    ggml_cgraph * graph_ = nullptr;
    BatchShape shape_;
    GraphInputs in_;
    std::vector<uint16_t> mask_;        // staging for a sequence's attention mask
    std::vector<float> sc_on_, sc_zero_; // staging for the self-conditioning inputs
};

}  // namespace diffuse
