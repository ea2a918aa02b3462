#include "forward.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <utility>

namespace diffuse {

// Graph size: about 26 nodes per layer plus 16 per layer and sequence (attention, cache writes,
// views), plus for MoE about 20 per layer and 2 per used expert (router, the k-way sum); sized per
// shape, since a larger graph costs a larger hash set to clear on every plan.
static size_t graph_nodes(const HParams & hp, size_t n_seq) {
    const int64_t moe = hp.moe() ? 24 + 2 * hp.n_expert_used : 0;
    return 64 + 8 * n_seq + hp.n_layer * (40 + moe + 24 * n_seq);
}

// ---- KVCache ----

static std::atomic<uint64_t> next_cache_id{1};

KVCache::KVCache(const ModelImpl & model, int n_ctx) : n_ctx_(n_ctx), id_(next_cache_id.fetch_add(1)) {
    const HParams & hp = model.hparams();
    const size_t n_tensors = 2 * hp.n_layer;
    ggml_init_params ip = {ggml_tensor_overhead() * n_tensors, nullptr, /*no_alloc*/ true};
    ctx_ = ggml_init(ip);
    if (!ctx_) throw Error("cannot create the KV cache context");
    const ggml_type type = model.kv_f16() ? GGML_TYPE_F16 : GGML_TYPE_F32;
    const int64_t row = hp.head_dim * hp.n_head_kv;
    // Refused up front rather than allocated: with overcommit a too-large buffer "succeeds" and
    // the kernel's OOM killer ends the process when the pages are touched.
    const double need = 2.0 * hp.n_layer * (double) row * n_ctx * ggml_type_size(type);
    if (need > (double) physical_memory_bytes())
        throw Error("the K/V cache for " + std::to_string(n_ctx) + " positions needs " +
                    std::to_string((int64_t) (need / (1 << 20))) + " MiB, more than this machine's memory");
    for (int il = 0; il < hp.n_layer; ++il) {
        k.push_back(ggml_new_tensor_2d(ctx_, type, row, n_ctx));
        v.push_back(ggml_new_tensor_2d(ctx_, type, row, n_ctx));
    }
    buf_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, ggml_backend_cpu_buffer_type());
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

ggml_tensor * rms_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * weight, float eps) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), weight);
}

ggml_tensor * linear(ggml_context * ctx, ggml_tensor * w, ggml_tensor * b, ggml_tensor * x) {
    ggml_tensor * y = ggml_mul_mat(ctx, w, x);
    return b ? ggml_add(ctx, y, b) : y;
}

// Bidirectional attention of one sequence's queries over its cache rows [0, n_kv).
// Q: (hd, n_q, n_head); K, V: cache views (hd, n_kv, n_head_kv). Returns (hd * n_head, n_q).
ggml_tensor * attention(ggml_context * ctx, const HParams & hp, bool flash, ggml_tensor * Q, ggml_tensor * K,
                        ggml_tensor * V) {
    const int64_t hd = hp.head_dim, n_q = Q->ne[1];
    const float scale = 1.0f / std::sqrt((float) hd);
    ggml_tensor * o;
    if (flash) {
        // Scores are computed in tiles and never stored: memory O(n_q + n_kv), not O(n_q * n_kv).
        o = ggml_flash_attn_ext(ctx, Q, K, V, nullptr, scale, 0.0f, 0.0f);   // (hd, n_head, n_q)
    } else {
        ggml_tensor * kq = ggml_mul_mat(ctx, K, Q);                          // (n_kv, n_q, n_head); GQA by broadcast
        kq = ggml_soft_max_ext(ctx, kq, nullptr, scale, 0.0f);
        ggml_tensor * Vt = ggml_cont(ctx, ggml_permute(ctx, V, 1, 0, 2, 3)); // (n_kv, hd, n_head_kv)
        o = ggml_mul_mat(ctx, Vt, kq);                                       // (hd, n_q, n_head)
        o = ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3));                // (hd, n_head, n_q)
    }
    return ggml_reshape_2d(ctx, o, hd * hp.n_head, n_q);
}

// SwiGLU FFN of the k experts the router picks for each row, weighted by their router
// probabilities (softmax over all experts, not renormalised over the k: LLaDA-MoE's rule).
// x: (n_embd, n). Returns the output (n_embd, n) and the chosen experts (k, n), I32, best first.
std::pair<ggml_tensor *, ggml_tensor *> moe_ffn(ggml_context * ctx, const HParams & hp, const LayerWeights & L,
                                                 ggml_tensor * x) {
    const int64_t n = x->ne[1], k = hp.n_expert_used;
    ggml_tensor * probs = ggml_soft_max(ctx, ggml_mul_mat(ctx, L.ffn_gate_inp, x));        // (n_expert, n)
    ggml_tensor * chosen = ggml_argsort_top_k(ctx, probs, (int) k);                        // (k, n)
    ggml_tensor * weights = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, hp.n_expert, n), chosen);  // (1, k, n)
    ggml_tensor * xe = ggml_reshape_3d(ctx, x, x->ne[0], 1, n);      // (n_embd, 1, n): one input shared by its k
    ggml_tensor * gate = ggml_mul_mat_id(ctx, L.ffn_gate_exps, xe, chosen);                // (n_ff_exp, k, n)
    ggml_tensor * up = ggml_mul_mat_id(ctx, L.ffn_up_exps, xe, chosen);
    ggml_tensor * act = ggml_swiglu_split(ctx, gate, up);                                  // silu(gate) * up, one pass
    ggml_tensor * out = ggml_mul_mat_id(ctx, L.ffn_down_exps, act, chosen);                // (n_embd, k, n)
    out = ggml_mul(ctx, out, weights);
    ggml_tensor * sum = nullptr;
    for (int64_t j = 0; j < k; ++j) {
        ggml_tensor * e = ggml_view_2d(ctx, out, out->ne[0], n, out->nb[2], j * out->nb[1]);
        sum = sum ? ggml_add(ctx, sum, e) : e;
    }
    return {sum, chosen};
}

}  // namespace

// ---- ForwardRunner ----

ForwardRunner::ForwardRunner(const ModelImpl & model) : model_(model) {
    backend_ = ggml_backend_cpu_init();
    if (!backend_) throw Error("cannot initialise the ggml CPU backend");
    galloc_ = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_));
}

ForwardRunner::~ForwardRunner() {
    if (ctx_) ggml_free(ctx_);
    ggml_gallocr_free(galloc_);
    ggml_backend_free(backend_);
}

// Builds logits (n_vocab, n_out_total) for the batch. The two families differ only in the q/k/v
// biases (present in Dream), the head counts (Dream is GQA) and the rope mode, all read from the file.
void ForwardRunner::build(const std::vector<SequenceRows> & seqs) {
    const HParams & hp = model_.hparams();
    const Weights & w = model_.weights();
    const int64_t hd = hp.head_dim, kv_row = hd * hp.n_head_kv;
    const int n_seq = (int) seqs.size();
    const int n_q = std::accumulate(shape_.n_q.begin(), shape_.n_q.end(), 0);
    const int n_out = std::accumulate(shape_.n_out.begin(), shape_.n_out.end(), 0);

    if (ctx_) ggml_free(ctx_);
    const size_t n_nodes = graph_nodes(hp, seqs.size());
    graph_meta_.resize(ggml_tensor_overhead() * n_nodes + ggml_graph_overhead_custom(n_nodes, false));
    ggml_init_params ip = {graph_meta_.size(), graph_meta_.data(), /*no_alloc*/ true};
    ggml_context * ctx = ctx_ = ggml_init(ip);
    graph_ = ggml_new_graph_custom(ctx, n_nodes, false);

    in_ = Inputs{};
    in_.tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_q);
    in_.positions = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_q);
    in_.out_rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_out);
    for (int s = 0; s < n_seq; ++s) {
        in_.cache_rows.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_I64, shape_.n_q[s]));
        if (n_seq > 1) in_.gather_rows.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_I64, shape_.n_q[s]));
    }
    for (ggml_tensor * t : {in_.tokens, in_.positions, in_.out_rows}) ggml_set_input(t);
    for (ggml_tensor * t : in_.cache_rows) ggml_set_input(t);
    for (ggml_tensor * t : in_.gather_rows) ggml_set_input(t);

    ggml_tensor * x = ggml_get_rows(ctx, w.tok_embd, in_.tokens);   // (n_embd, n_q)

    for (int il = 0; il < hp.n_layer; ++il) {
        const LayerWeights & L = w.layers[il];
        ggml_tensor * cur = rms_norm(ctx, x, L.attn_norm, hp.rms_eps);

        ggml_tensor * q = ggml_reshape_3d(ctx, linear(ctx, L.wq, L.bq, cur), hd, hp.n_head, n_q);
        ggml_tensor * k = ggml_reshape_3d(ctx, linear(ctx, L.wk, L.bk, cur), hd, hp.n_head_kv, n_q);
        ggml_tensor * v = linear(ctx, L.wv, L.bv, cur);                 // (kv_row, n_q)
        if (hp.qk_norm) {   // over each head's hd values, one weight for all heads
            q = rms_norm(ctx, q, L.attn_q_norm, hp.rms_eps);
            k = rms_norm(ctx, k, L.attn_k_norm, hp.rms_eps);
        }
        q = ggml_rope_ext(ctx, q, in_.positions, nullptr, hd, hp.rope_mode, 0, hp.rope_theta,
                          1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
        k = ggml_reshape_2d(ctx, ggml_rope_ext(ctx, k, in_.positions, nullptr, hd, hp.rope_mode, 0, hp.rope_theta,
                                               1.0f, 0.0f, 1.0f, 0.0f, 0.0f), kv_row, n_q);

        // Per sequence: store its rows' K/V in its cache, attend over its first n_kv cache rows.
        ggml_tensor * attn = nullptr;   // (hd * n_head, n_q)
        for (int s = 0, off = 0; s < n_seq; off += shape_.n_q[s], ++s) {
            const int n = shape_.n_q[s], n_kv = shape_.n_kv[s];
            KVCache & cache = *seqs[s].cache;
            ggml_tensor * ks = ggml_view_2d(ctx, k, kv_row, n, k->nb[1], off * k->nb[1]);
            ggml_tensor * vs = ggml_view_2d(ctx, v, kv_row, n, v->nb[1], off * v->nb[1]);
            ggml_tensor * kc = ggml_set_rows(ctx, cache.k[il], ks, in_.cache_rows[s]);
            ggml_tensor * vc = ggml_set_rows(ctx, cache.v[il], vs, in_.cache_rows[s]);
            const size_t el = ggml_element_size(kc);
            // (hd, n_kv, n_head_kv) views of the cache; (hd, n, n_head) of this sequence's queries.
            ggml_tensor * K = ggml_view_3d(ctx, kc, hd, n_kv, hp.n_head_kv, kc->nb[1], el * hd, 0);
            ggml_tensor * V = ggml_view_3d(ctx, vc, hd, n_kv, hp.n_head_kv, vc->nb[1], el * hd, 0);
            ggml_tensor * Q = ggml_view_3d(ctx, q, hd, n, hp.n_head, q->nb[2], q->nb[1], off * q->nb[2]);
            ggml_tensor * o = attention(ctx, hp, model_.flash_attn(), Q, K, V);
            if (n_seq == 1) attn = o;
            else {
                if (!attn) attn = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hd * hp.n_head, n_q);
                attn = ggml_set_rows(ctx, attn, o, in_.gather_rows[s]);   // back to its rows of the batch
            }
        }
        ggml_tensor * o = ggml_mul_mat(ctx, L.wo, attn);

        if (il == hp.n_layer - 1) {
            // Only rows whose logits are wanted go through the last FFN and the head.
            o = ggml_get_rows(ctx, o, in_.out_rows);
            x = ggml_get_rows(ctx, x, in_.out_rows);
        }
        x = ggml_add(ctx, x, o);

        cur = rms_norm(ctx, x, L.ffn_norm, hp.rms_eps);
        if (hp.moe()) {
            auto [ffn, chosen] = moe_ffn(ctx, hp, L, cur);
            // chosen views the first k of each row of the router's full ranking: kept for
            // routing() as an output (n_expert ints per row), so the allocator never reuses it.
            ggml_set_output(chosen->view_src);
            in_.experts.push_back(chosen->view_src);
            x = ggml_add(ctx, x, ffn);
        } else {
            ggml_tensor * gate = ggml_silu(ctx, ggml_mul_mat(ctx, L.ffn_gate, cur));
            ggml_tensor * up = ggml_mul_mat(ctx, L.ffn_up, cur);
            x = ggml_add(ctx, x, ggml_mul_mat(ctx, L.ffn_down, ggml_mul(ctx, gate, up)));
        }
    }

    x = rms_norm(ctx, x, w.output_norm, hp.rms_eps);
    in_.logits = ggml_mul_mat(ctx, w.output, x);                       // (n_vocab, n_out)
    ggml_set_output(in_.logits);
    ggml_build_forward_expand(graph_, in_.logits);
}

// Every node of a graph ends in a barrier, where sleeping OpenMP threads must be woken: tens of
// microseconds each on a VM (a 1-row pass of the 4-layer demo model took 5 ms on 2 threads, 0.2 ms
// on 1). A pass gets one more thread per PER_THREAD_FLOPS_PER_NODE x nodes of work, so small passes
// (cached steps of small models) run on fewer threads and large ones on all n_threads.
static constexpr double PER_THREAD_FLOPS_PER_NODE = 4e6;

int ForwardRunner::threads_for_pass(int n_threads) const {
    const HParams & hp = model_.hparams();
    double flops = 0;
    for (size_t s = 0; s < shape_.n_q.size(); ++s) {
        flops += 2.0 * (double) model_.layer_matmul_params() * shape_.n_q[s];
        flops += 4.0 * hp.n_layer * (double) shape_.n_q[s] * shape_.n_kv[s] * hp.head_dim * hp.n_head;
        flops += 2.0 * (double) hp.n_embd * hp.n_vocab * shape_.n_out[s];
    }
    const double per_thread = PER_THREAD_FLOPS_PER_NODE * ggml_graph_n_nodes(graph_);
    return (int) std::clamp(flops / per_thread, 1.0, (double) std::max(1, n_threads));
}

void ForwardRunner::run(const std::vector<SequenceRows> & seqs, int n_threads, float * logits) {
    const HParams & hp = model_.hparams();
    if (seqs.empty()) throw Error("empty forward batch");
    Shape shape;
    for (const SequenceRows & s : seqs) {
        if (!s.cache) throw Error("forward batch: a sequence has no KV cache");
        if (s.tokens.empty() || s.out_rows.empty()) throw Error("empty forward batch");
        if (s.positions.size() != s.tokens.size()) throw Error("forward batch: positions and tokens differ in length");
        if (s.n_kv <= 0 || s.n_kv > s.cache->n_ctx()) throw Error("forward batch: n_kv out of range");
        model_.check_tokens(s.tokens.data(), s.tokens.size());
        for (int32_t p : s.positions)
            if (p < 0 || p >= s.n_kv) throw Error("forward batch: position " + std::to_string(p) + " outside the context");
        for (int32_t r : s.out_rows)
            if (r < 0 || r >= (int) s.tokens.size()) throw Error("forward batch: output row out of range");
        for (uint64_t id : shape.caches)
            if (id == s.cache->id()) throw Error("forward batch: two sequences share a KV cache");
        shape.caches.push_back(s.cache->id());
        shape.n_q.push_back((int) s.tokens.size());
        shape.n_kv.push_back(s.n_kv);
        shape.n_out.push_back((int) s.out_rows.size());
    }

    if (!ctx_ || !(shape == shape_)) {
        shape_ = std::move(shape);
        build(seqs);
        if (!ggml_gallocr_alloc_graph(galloc_, graph_)) {
            ggml_free(ctx_);
            ctx_ = nullptr;
            throw Error("out of memory allocating the compute graph (" +
                        std::to_string(std::accumulate(shape_.n_q.begin(), shape_.n_q.end(), 0)) + " positions)");
        }
    }

    // Inputs: the sequences' rows one after another.
    std::vector<int32_t> tokens, positions, out_rows;
    std::vector<int64_t> rows;
    for (size_t s = 0, off = 0; s < seqs.size(); off += seqs[s].tokens.size(), ++s) {
        const SequenceRows & q = seqs[s];
        tokens.insert(tokens.end(), q.tokens.begin(), q.tokens.end());
        positions.insert(positions.end(), q.positions.begin(), q.positions.end());
        for (int32_t r : q.out_rows) out_rows.push_back((int32_t) off + r);
        rows.assign(q.positions.begin(), q.positions.end());
        ggml_backend_tensor_set(in_.cache_rows[s], rows.data(), 0, sizeof(int64_t) * rows.size());
        if (!in_.gather_rows.empty()) {
            std::iota(rows.begin(), rows.end(), (int64_t) off);
            ggml_backend_tensor_set(in_.gather_rows[s], rows.data(), 0, sizeof(int64_t) * rows.size());
        }
    }
    ggml_backend_tensor_set(in_.tokens, tokens.data(), 0, sizeof(int32_t) * tokens.size());
    ggml_backend_tensor_set(in_.positions, positions.data(), 0, sizeof(int32_t) * positions.size());
    ggml_backend_tensor_set(in_.out_rows, out_rows.data(), 0, sizeof(int32_t) * out_rows.size());

    ggml_backend_cpu_set_n_threads(backend_, threads_for_pass(n_threads));
    const ggml_status st = ggml_backend_graph_compute(backend_, graph_);
    if (st != GGML_STATUS_SUCCESS) throw Error("forward pass failed (ggml status " + std::to_string((int) st) + ")");
    ggml_backend_tensor_get(in_.logits, logits, 0, out_rows.size() * (size_t) hp.n_vocab * sizeof(float));
}

void ForwardRunner::routing(size_t s, const std::vector<int32_t> & out_rows, std::vector<int32_t> & experts) const {
    const HParams & hp = model_.hparams();
    const int64_t k = hp.n_expert_used;
    const int n_q = shape_.n_q.at(s);
    experts.assign((size_t) hp.n_layer * n_q * k, -1);
    // Rows of sequence s: in the batch from `off` in every layer but the last; the last layer ran
    // over the sequences' out_rows only, from `out_off`.
    int off = 0, out_off = 0;
    for (size_t i = 0; i < s; ++i) {
        off += shape_.n_q[i];
        out_off += shape_.n_out[i];
    }
    // The chosen experts are the first k of each row of the router's ranking (rows of n_expert):
    // rows [first, first + n) of a layer, k values each, into dst rows.
    std::vector<int32_t> ranked;
    auto read = [&](const ggml_tensor * ranking, int first, int n, const auto & dst_row) {
        const int64_t E = ranking->ne[0];
        ranked.resize((size_t) n * E);
        ggml_backend_tensor_get(ranking, ranked.data(), first * ranking->nb[1], ranked.size() * sizeof(int32_t));
        for (int j = 0; j < n; ++j) std::copy_n(ranked.begin() + j * E, k, dst_row(j));
    };
    for (int64_t il = 0; il + 1 < hp.n_layer; ++il)
        read(in_.experts[il], off, n_q, [&](int j) { return experts.begin() + (il * n_q + j) * k; });
    read(in_.experts.back(), out_off, (int) out_rows.size(),
         [&](int j) { return experts.begin() + ((hp.n_layer - 1) * n_q + out_rows[j]) * k; });
}

}  // namespace diffuse
