// The transformer forward pass of both families, with an inter-step K/V cache.
//
// One graph serves every case: the rows in a ForwardBatch are run through the network, their
// post-RoPE K/V are written into the cache at their positions, and their queries attend over cache
// rows [0, n_kv). A full forward pass is the batch of every position; a cached step is the batch of
// the active positions only, the other rows keeping the K/V of an earlier step.
#pragma once

#include "model_impl.h"

#include <vector>

struct ggml_context;
struct ggml_gallocr;

namespace diffuse {

// Post-RoPE keys and values of every layer: (head_dim * n_head_kv, n_ctx) F32 each. Not cleared:
// a row is always written (by a full pass) before any query reads it.
class KVCache {
public:
    KVCache(const ModelImpl & model, int n_ctx);
    ~KVCache();
    KVCache(const KVCache &) = delete;
    KVCache & operator=(const KVCache &) = delete;

    int n_ctx() const { return n_ctx_; }
    std::vector<ggml_tensor *> k, v;   // one per layer
private:
    int n_ctx_;
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer * buf_ = nullptr;
};

struct ForwardBatch {
    std::vector<int32_t> tokens;     // (n_q,) ids of the rows to compute
    std::vector<int32_t> positions;  // (n_q,) their absolute positions: RoPE angle and cache row
    int n_kv = 0;                    // queries attend over cache rows [0, n_kv)
    std::vector<int32_t> out_rows;   // indices into [0, n_q) whose logits are wanted
};

class ForwardRunner {
public:
    explicit ForwardRunner(ModelImpl & model);
    ~ForwardRunner();
    ForwardRunner(const ForwardRunner &) = delete;
    ForwardRunner & operator=(const ForwardRunner &) = delete;

    // logits: (n_out, n_vocab) row-major, written in place. Graph memory is planned once and reused.
    void run(KVCache & cache, const ForwardBatch & batch, int n_threads, float * logits);

private:
    ModelImpl & model_;
    ggml_gallocr * galloc_ = nullptr;
    std::vector<uint8_t> graph_meta_;   // tensor and graph headers of the per-call context
};

}  // namespace diffuse
