#include "forward.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cmath>

namespace diffuse {

static constexpr int MAX_GRAPH_NODES = 8192;

// ---- KVCache ----

KVCache::KVCache(const ModelImpl & model, int n_ctx) : n_ctx_(n_ctx) {
    const HParams & hp = model.hparams();
    const size_t n_tensors = 2 * hp.n_layer;
    ggml_init_params ip = {ggml_tensor_overhead() * n_tensors, nullptr, /*no_alloc*/ true};
    ctx_ = ggml_init(ip);
    if (!ctx_) throw Error("cannot create the KV cache context");
    const int64_t row = hp.head_dim * hp.n_head_kv;
    for (int il = 0; il < hp.n_layer; ++il) {
        k.push_back(ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, row, n_ctx));
        v.push_back(ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, row, n_ctx));
    }
    buf_ = ggml_backend_alloc_ctx_tensors(ctx_, model.backend());
    if (!buf_) {
        ggml_free(ctx_);
        throw Error("out of memory allocating the KV cache (" + std::to_string(n_ctx) + " positions)");
    }
}

KVCache::~KVCache() {
    if (buf_) ggml_backend_buffer_free(buf_);
    if (ctx_) ggml_free(ctx_);
}

// ---- graph ----

namespace {

struct GraphInputs {
    ggml_tensor * tokens;      // I32 (n_q)
    ggml_tensor * positions;   // I32 (n_q)
    ggml_tensor * rows;        // I64 (n_q), cache rows to write (= positions)
    ggml_tensor * out_rows;    // I32 (n_out)
};

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * weight, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), weight);
}

ggml_tensor * linear(ggml_context * ctx, ggml_tensor * w, ggml_tensor * b, ggml_tensor * x) {
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    return b ? ggml_add(ctx, y, b) : y;
}

// Builds logits (n_vocab, n_out) for the batch. The two families differ only in the q/k/v biases
// (present in Dream), the head counts (Dream is GQA) and the rope mode, all read from the file.
ggml_tensor * build_graph(ggml_context * ctx, ggml_cgraph * gf, const ModelImpl & model,
                          KVCache & cache, int n_q, int n_kv, int n_out, GraphInputs & in) {
    const HParams & hp = model.hparams();
    const Weights & w = model.weights();
    const int64_t hd = hp.head_dim;

    in.tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_q);
    in.positions = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_q);
    in.rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_q);
    in.out_rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_out);
    for (ggml_tensor * t : {in.tokens, in.positions, in.rows, in.out_rows}) ggml_set_input(t);

    const float kq_scale = 1.0f / std::sqrt((float) hd);
    ggml_tensor * x = ggml_get_rows(ctx, w.tok_embd, in.tokens);   // (n_embd, n_q)

    for (int il = 0; il < hp.n_layer; ++il) {
        const LayerWeights & L = w.layers[il];
        ggml_tensor * cur = rms_norm(ctx, x, L.attn_norm, hp.rms_eps);

        ggml_tensor * q = ggml_reshape_3d(ctx, linear(ctx, L.wq, L.bq, cur), hd, hp.n_head, n_q);
        ggml_tensor * k = ggml_reshape_3d(ctx, linear(ctx, L.wk, L.bk, cur), hd, hp.n_head_kv, n_q);
        ggml_tensor * v = linear(ctx, L.wv, L.bv, cur);                 // (hd * n_head_kv, n_q)
        q = ggml_rope_ext(ctx, q, in.positions, nullptr, hd, hp.rope_mode, 0, hp.rope_theta,
                          1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        k = ggml_rope_ext(ctx, k, in.positions, nullptr, hd, hp.rope_mode, 0, hp.rope_theta,
                          1.0f, 0.0f, 1.0f, 0.0f, 0.0f);

        // Store this batch's K/V at their positions; attend over the first n_kv cache rows.
        ggml_tensor * kc = ggml_set_rows(ctx, cache.k[il], ggml_reshape_2d(ctx, k, hd * hp.n_head_kv, n_q), in.rows);
        ggml_tensor * vc = ggml_set_rows(ctx, cache.v[il], v, in.rows);
        ggml_tensor * K = ggml_view_3d(ctx, kc, hd, hp.n_head_kv, n_kv, kc->nb[0] * hd, kc->nb[1], 0);
        ggml_tensor * V = ggml_view_3d(ctx, vc, hd, hp.n_head_kv, n_kv, vc->nb[0] * hd, vc->nb[1], 0);

        K = ggml_permute(ctx, K, 0, 2, 1, 3);                          // (hd, n_kv, n_head_kv)
        ggml_tensor * Q = ggml_permute(ctx, q, 0, 2, 1, 3);            // (hd, n_q, n_head)
        ggml_tensor * kq = ggml_mul_mat(ctx, K, Q);                    // (n_kv, n_q, n_head); GQA by broadcast
        kq = ggml_soft_max_ext(ctx, kq, nullptr, kq_scale, 0.0f);      // bidirectional: no mask
        ggml_tensor * Vt = ggml_cont(ctx, ggml_permute(ctx, V, 1, 2, 0, 3));  // (n_kv, hd, n_head_kv)
        ggml_tensor * o = ggml_mul_mat(ctx, Vt, kq);                   // (hd, n_q, n_head)
        o = ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3));          // (hd, n_head, n_q)
        o = ggml_mul_mat(ctx, L.wo, ggml_reshape_2d(ctx, o, hd * hp.n_head, n_q));

        if (il == hp.n_layer - 1) {
            // Only rows whose logits are wanted go through the last FFN and the head.
            o = ggml_get_rows(ctx, o, in.out_rows);
            x = ggml_get_rows(ctx, x, in.out_rows);
        }
        x = ggml_add(ctx, x, o);

        cur = rms_norm(ctx, x, L.ffn_norm, hp.rms_eps);
        ggml_tensor * gate = ggml_silu(ctx, ggml_mul_mat(ctx, L.ffn_gate, cur));
        ggml_tensor * up = ggml_mul_mat(ctx, L.ffn_up, cur);
        x = ggml_add(ctx, x, ggml_mul_mat(ctx, L.ffn_down, ggml_mul(ctx, gate, up)));
    }

    x = rms_norm(ctx, x, w.output_norm, hp.rms_eps);
    ggml_tensor * logits = ggml_mul_mat(ctx, w.output, x);            // (n_vocab, n_out)
    ggml_set_output(logits);
    ggml_build_forward_expand(gf, logits);
    return logits;
}

}  // namespace

// ---- ForwardRunner ----

ForwardRunner::ForwardRunner(ModelImpl & model) : model_(model) {
    galloc_ = ggml_gallocr_new(ggml_backend_get_default_buffer_type(model.backend()));
    graph_meta_.resize(ggml_tensor_overhead() * MAX_GRAPH_NODES + ggml_graph_overhead_custom(MAX_GRAPH_NODES, false));
}

ForwardRunner::~ForwardRunner() { ggml_gallocr_free(galloc_); }

void ForwardRunner::run(KVCache & cache, const ForwardBatch & b, int n_threads, float * logits) {
    const HParams & hp = model_.hparams();
    const int n_q = (int) b.tokens.size();
    const int n_out = (int) b.out_rows.size();
    if (n_q == 0 || n_out == 0) throw Error("empty forward batch");
    if (b.positions.size() != b.tokens.size()) throw Error("forward batch: positions and tokens differ in length");
    if (b.n_kv <= 0 || b.n_kv > cache.n_ctx()) throw Error("forward batch: n_kv out of range");
    model_.check_tokens(b.tokens.data(), b.tokens.size());
    for (int32_t p : b.positions)
        if (p < 0 || p >= b.n_kv) throw Error("forward batch: position " + std::to_string(p) + " outside the context");
    for (int32_t r : b.out_rows)
        if (r < 0 || r >= n_q) throw Error("forward batch: output row out of range");

    ggml_init_params ip = {graph_meta_.size(), graph_meta_.data(), /*no_alloc*/ true};
    ggml_context * ctx = ggml_init(ip);
    ggml_cgraph * gf = ggml_new_graph_custom(ctx, MAX_GRAPH_NODES, false);
    GraphInputs in{};
    ggml_tensor * out = build_graph(ctx, gf, model_, cache, n_q, b.n_kv, n_out, in);

    if (!ggml_gallocr_alloc_graph(galloc_, gf)) {
        ggml_free(ctx);
        throw Error("out of memory allocating the compute graph (" + std::to_string(n_q) + " positions)");
    }
    std::vector<int64_t> rows(b.positions.begin(), b.positions.end());
    ggml_backend_tensor_set(in.tokens, b.tokens.data(), 0, sizeof(int32_t) * n_q);
    ggml_backend_tensor_set(in.positions, b.positions.data(), 0, sizeof(int32_t) * n_q);
    ggml_backend_tensor_set(in.rows, rows.data(), 0, sizeof(int64_t) * n_q);
    ggml_backend_tensor_set(in.out_rows, b.out_rows.data(), 0, sizeof(int32_t) * n_out);

    ggml_backend_cpu_set_n_threads(model_.backend(), n_threads);
    const ggml_status st = ggml_backend_graph_compute(model_.backend(), gf);
    if (st != GGML_STATUS_SUCCESS) {
        ggml_free(ctx);
        throw Error("forward pass failed (ggml status " + std::to_string((int) st) + ")");
    }
    ggml_backend_tensor_get(out, logits, 0, (size_t) n_out * hp.n_vocab * sizeof(float));
    ggml_free(ctx);
}

}  // namespace diffuse
