#include "graph.h"

#include "forward.h"
#include "head_product.h"

#include "ggml.h"

#include <cmath>
#include <numeric>
#include <string>

namespace diffuse {

int BatchShape::total_q() const { return std::accumulate(n_q.begin(), n_q.end(), 0); }
int BatchShape::total_out() const { return std::accumulate(n_out.begin(), n_out.end(), 0); }

GraphBuilder::GraphBuilder(ggml_context * ctx_, const ModelImpl & model, const BatchShape & shape,
                           const std::vector<KVCache *> & caches, GraphInputs & in)
    : ctx(ctx_), hp(model.hparams()), w(model.weights()), model_(model), shape_(shape), caches_(caches), in_(in) {
    const int n_seq = (int) shape.n_q.size();
    in = GraphInputs{};
    in.tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, shape.total_q());
    in.positions = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, shape.total_q());
    in.out_rows = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, shape.total_out());
    for (ggml_tensor * t : {in.tokens, in.positions, in.out_rows}) ggml_set_input(t);
    if (model.hparams().moe()) in.experts.assign(model.hparams().n_layer, nullptr);
    for (int s = 0; s < n_seq; ++s) {
        in.cache_rows.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_I64, shape.n_q[s]));
        ggml_set_input(in.cache_rows.back());
        if (n_seq > 1) {
            in.gather_rows.push_back(ggml_new_tensor_1d(ctx, GGML_TYPE_I64, shape.n_q[s]));
            ggml_set_input(in.gather_rows.back());
        }
        ggml_tensor * mask = nullptr, * swa = nullptr;
        if (shape.masked[s]) {
            mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, shape.n_kv[s], shape.n_q[s]);
            ggml_set_input(mask);
            if (model.hparams().n_swa > 0) {
                swa = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, shape.n_kv[s], shape.n_q[s]);
                ggml_set_input(swa);
            }
        }
        in.masks.push_back(mask);
        in.masks_swa.push_back(swa);
    }
    if (shape.self_cond) {
        in.self_cond = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, model.hparams().n_vocab, shape.total_q());
        in.self_cond_on = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 1, shape.total_q());
        ggml_set_input(in.self_cond);
        ggml_set_input(in.self_cond_on);
    }
}

void GraphBuilder::name(ggml_tensor * t, const char * what, int il) {
    if (il < 0) ggml_set_name(t, what);
    else ggml_format_name(t, "%s-%d", what, il);
}

ggml_tensor * GraphBuilder::embed() {
    ggml_tensor * x = ggml_get_rows(ctx, w.tok_embd, in_.tokens);
    name(x, "embd");
    return x;
}

ggml_tensor * GraphBuilder::norm(ggml_tensor * x, ggml_tensor * weight) {
    return ggml_mul(ctx, ggml_rms_norm(ctx, x, hp.rms_eps), weight);
}

ggml_tensor * GraphBuilder::linear(ggml_tensor * wt, ggml_tensor * b, ggml_tensor * x) {
    ggml_tensor * y = ggml_mul_mat(ctx, wt, x);
    return b ? ggml_add(ctx, y, b) : y;
}

std::tuple<ggml_tensor *, ggml_tensor *, ggml_tensor *> GraphBuilder::qkv(const LayerWeights & L, ggml_tensor * x) {
    const int64_t n_q = x->ne[1], hd = hp.head_dim;
    if (L.wqkv) {
        // Rows [q heads, k heads, v heads] of one product (n_head + 2 n_head_kv) * hd per row.
        ggml_tensor * qkv = ggml_mul_mat(ctx, L.wqkv, x);
        const size_t es = ggml_element_size(qkv);
        ggml_tensor * q = ggml_view_3d(ctx, qkv, hd, hp.n_head, n_q, hd * es, qkv->nb[1], 0);
        ggml_tensor * k = ggml_view_3d(ctx, qkv, hd, hp.n_head_kv, n_q, hd * es, qkv->nb[1], hp.n_head * hd * es);
        ggml_tensor * v = ggml_view_2d(ctx, qkv, hd * hp.n_head_kv, n_q, qkv->nb[1], (hp.n_head + hp.n_head_kv) * hd * es);
        return {q, k, ggml_cont(ctx, v)};   // the cache write takes whole rows
    }
    ggml_tensor * q = ggml_reshape_3d(ctx, linear(L.wq, L.bq, x), hp.head_dim, hp.n_head, n_q);
    ggml_tensor * k = ggml_reshape_3d(ctx, linear(L.wk, L.bk, x), hp.head_dim, hp.n_head_kv, n_q);
    ggml_tensor * v = linear(L.wv, L.bv, x);
    return {q, k, v};
}

ggml_tensor * GraphBuilder::rope(ggml_tensor * t, int il) {
    const LayerShape & s = model_.layer(il);
    // DiffusionGemma's full layers: proportional RoPE as frequency factors (1e30: a pair left alone).
    ggml_tensor * factors = s.kv_shared ? w.rope_freqs : nullptr;
    if (!hp.rope_yarn)
        return ggml_rope_ext(ctx, t, in_.positions, factors, (int) s.n_rot, hp.rope_mode, 0, s.rope_theta,
                             1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    // YaRN: ggml multiplies cos and sin by 1 + 0.1 ln(1 / freq_scale) itself; transformers multiplies
    // them by the attention factor the file records (Ministral3's mscale = mscale_all_dim: 1), so
    // ggml's own factor is divided out.
    const float ggml_mscale = 1.0f + 0.1f * std::log(1.0f / hp.rope_freq_scale);
    return ggml_rope_ext(ctx, t, in_.positions, factors, (int) s.n_rot, hp.rope_mode, (int) hp.rope_orig_ctx,
                         s.rope_theta, hp.rope_freq_scale, 1.0f, hp.rope_attn_factor / ggml_mscale,
                         hp.rope_beta_fast, hp.rope_beta_slow);
}

ggml_tensor * GraphBuilder::scale_queries(ggml_tensor * q) {
    if (!in_.q_scale) {
        in_.q_scale = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, 1, shape_.total_q());
        ggml_set_input(in_.q_scale);
    }
    return ggml_mul(ctx, q, in_.q_scale);
}

// Attention of one sequence's queries over its cache rows [0, n_kv), through `mask` (F16
// (n_kv, n_q), 0 or -inf) when there is one. Q: (hd, n_q, n_head); K, V: cache views
// (hd, n_kv, n_head_kv). Returns (hd * n_head, n_q).
static ggml_tensor * attend(ggml_context * ctx, int64_t n_head, float scale, bool flash, ggml_tensor * Q,
                            ggml_tensor * K, ggml_tensor * V, ggml_tensor * mask) {
    const int64_t hd = Q->ne[0], n_q = Q->ne[1];
    ggml_tensor * o;
    if (flash) {
        // Scores are computed in tiles and never stored: memory O(n_q + n_kv), not O(n_q * n_kv).
        o = ggml_flash_attn_ext(ctx, Q, K, V, mask, scale, 0.0f, 0.0f);    // (hd, n_head, n_q)
    } else {
        ggml_tensor * kq = ggml_mul_mat(ctx, K, Q);                          // (n_kv, n_q, n_head); GQA by broadcast
        kq = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);
        ggml_tensor * Vt = ggml_cont(ctx, ggml_permute(ctx, V, 1, 0, 2, 3)); // (n_kv, hd, n_head_kv)
        o = ggml_mul_mat(ctx, Vt, kq);                                       // (hd, n_q, n_head)
        o = ggml_cont(ctx, ggml_permute(ctx, o, 0, 2, 1, 3));                // (hd, n_head, n_q)
    }
    return ggml_reshape_2d(ctx, o, hd * n_head, n_q);
}

ggml_tensor * GraphBuilder::attention(int il, const LayerWeights & L, ggml_tensor * q, ggml_tensor * k,
                                      ggml_tensor * v) {
    const LayerShape & shape = model_.layer(il);
    const int64_t hd = shape.head_dim, n_head_kv = shape.n_head_kv, kv_row = shape.kv_row(), n_q = q->ne[2];
    const std::vector<ggml_tensor *> & masks = shape.swa ? in_.masks_swa : in_.masks;
    const int n_seq = (int) shape_.n_q.size();
    k = ggml_reshape_2d(ctx, k, kv_row, n_q);
    ggml_tensor * out = nullptr;   // (hd * n_head, n_q)
    for (int s = 0, off = 0; s < n_seq; off += shape_.n_q[s], ++s) {
        const int n = shape_.n_q[s], n_kv = shape_.n_kv[s];
        KVCache & cache = *caches_[s];
        ggml_tensor * ks = ggml_view_2d(ctx, k, kv_row, n, k->nb[1], off * k->nb[1]);
        ggml_tensor * vs = ggml_view_2d(ctx, v, kv_row, n, v->nb[1], off * v->nb[1]);
        ggml_tensor * kc = ggml_set_rows(ctx, cache.k[il], ks, in_.cache_rows[s]);
        ggml_tensor * vc = ggml_set_rows(ctx, cache.v[il], vs, in_.cache_rows[s]);
        const size_t el = ggml_element_size(kc);
        // (hd, n_kv, n_head_kv) views of the cache; (hd, n, n_head) of this sequence's queries.
        ggml_tensor * K = ggml_view_3d(ctx, kc, hd, n_kv, n_head_kv, kc->nb[1], el * hd, 0);
        ggml_tensor * V = ggml_view_3d(ctx, vc, hd, n_kv, n_head_kv, vc->nb[1], el * hd, 0);
        ggml_tensor * Q = ggml_view_3d(ctx, q, hd, n, hp.n_head, q->nb[2], q->nb[1], off * q->nb[2]);
        ggml_tensor * o = attend(ctx, hp.n_head, shape.kq_scale, model_.flash_attn(), Q, K, V, masks[s]);
        if (n_seq == 1) out = o;
        else {
            if (!out) out = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hd * hp.n_head, n_q);
            out = ggml_set_rows(ctx, out, o, in_.gather_rows[s]);   // back to its rows of the batch
        }
    }
    name(out, "kqv_out", il);
    ggml_tensor * o = ggml_mul_mat(ctx, L.wo, out);
    if (shape_.draft_lora)   // PEFT's LoRA: W x + (alpha / r) B (A x)
        o = ggml_add(ctx, o, ggml_scale(ctx, ggml_mul_mat(ctx, L.wo_lora_b, ggml_mul_mat(ctx, L.wo_lora_a, out)),
                                        hp.draft_lora_scale));
    return o;
}

ggml_tensor * GraphBuilder::residual(int il, ggml_tensor * x, ggml_tensor * attn) {
    if (il == hp.n_layer - 1) {
        x = ggml_get_rows(ctx, x, in_.out_rows);
        attn = ggml_get_rows(ctx, attn, in_.out_rows);
    }
    return ggml_add(ctx, x, attn);
}

ggml_tensor * GraphBuilder::swiglu(ggml_tensor * gate_w, ggml_tensor * up_w, ggml_tensor * down_w, ggml_tensor * x) {
    ggml_tensor * gate = ggml_silu(ctx, ggml_mul_mat(ctx, gate_w, x));
    ggml_tensor * up = ggml_mul_mat(ctx, up_w, x);
    return ggml_mul_mat(ctx, down_w, ggml_mul(ctx, gate, up));
}

ggml_tensor * GraphBuilder::swiglu(const LayerWeights & L, ggml_tensor * x) {
    return swiglu(L.ffn_gate, L.ffn_up, L.ffn_down, x);
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), transformers' gelu_pytorch_tanh.
ggml_tensor * GraphBuilder::gelu_tanh(ggml_tensor * x) {
    const float c = 0.7978845608028654f;   // sqrt(2 / pi)
    ggml_tensor * x3 = ggml_mul(ctx, ggml_sqr(ctx, x), x);
    ggml_tensor * t = ggml_tanh(ctx, ggml_scale(ctx, ggml_add(ctx, x, ggml_scale(ctx, x3, 0.044715f)), c));
    return ggml_mul(ctx, ggml_scale_bias(ctx, t, 0.5f, 0.5f), x);
}

ggml_tensor * GraphBuilder::geglu(ggml_tensor * gate_w, ggml_tensor * up_w, ggml_tensor * down_w, ggml_tensor * x) {
    ggml_tensor * gate = gelu_tanh(ggml_mul_mat(ctx, gate_w, x));
    return ggml_mul_mat(ctx, down_w, ggml_mul(ctx, gate, ggml_mul_mat(ctx, up_w, x)));
}

ggml_tensor * GraphBuilder::soft_embeddings() {
    if (!in_.self_cond) return nullptr;
    // (n_embd, n_q) = E^T softmax(logits), through the embedding transposed at load (ggml_out_prod
    // over the stored one computes the same ~50x slower on the CPU).
    ggml_tensor * soft = ggml_mul_mat(ctx, w.tok_embd_t, ggml_soft_max(ctx, in_.self_cond));   // over the vocabulary
    soft = ggml_scale(ctx, soft, std::sqrt((float) hp.n_embd));
    return ggml_mul(ctx, soft, in_.self_cond_on);   // rows without logits: exactly zero, as at step 0
}

// The router of a layer: the k experts of each row of x (n_embd, n), best first, I32 (k, n), and
// their weights (1, k, n). All ggml ops, no custom one:
//   softmax (LLaDA-MoE): weights = the chosen probabilities over all experts, not renormalised.
//   sigmoid (LLaDA2):    s = sigmoid(W x); the choice ranks s + exp_probs_b (ggml_add);
//     groups: reshape to (E/G, G, n), each group's best two (ggml_argsort_top_k + ggml_get_rows),
//     summed (ggml_sum_rows); the n_group_used best groups (ggml_argsort_top_k) copied into a
//     -inf filled tensor (ggml_fill + ggml_set_rows), so the top-k sees only them;
//     weights = the chosen unbiased s (ggml_get_rows), / their sum (ggml_div), * the scale.
ggml_tensor * GraphBuilder::route(const LayerWeights & L, ggml_tensor * x, ggml_tensor ** weights) {
    // Gemma 4 (DiffusionGemma): softmax in F32 over all experts, top-k renormalised, then each weight
    // times its expert's per_expert_scale (ffn_down_exps.scale).
    const int64_t n = x->ne[1], E = hp.n_expert, k = hp.n_expert_used;
    ggml_tensor * logits = ggml_mul_mat(ctx, L.ffn_gate_inp, x);                            // (E, n), F32
    ggml_tensor * probs = hp.router_sigmoid ? ggml_sigmoid(ctx, logits) : ggml_soft_max(ctx, logits);
    ggml_tensor * select = L.exp_probs_b ? ggml_add(ctx, probs, L.exp_probs_b) : probs;     // bias: choice only
    if (hp.n_expert_groups > 1) {
        const int64_t G = hp.n_expert_groups, per = E / G;
        ggml_tensor * groups = ggml_reshape_3d(ctx, select, per, G, n);
        ggml_tensor * best2 = ggml_argsort_top_k(ctx, groups, 2);                           // (2, G, n)
        ggml_tensor * top2 = ggml_get_rows(ctx, ggml_reshape_4d(ctx, groups, 1, per, G, n), best2);   // (1, 2, G, n)
        ggml_tensor * score = ggml_sum_rows(ctx, ggml_reshape_3d(ctx, top2, 2, G, n));      // (1, G, n)
        ggml_tensor * kept = ggml_argsort_top_k(ctx, ggml_reshape_2d(ctx, score, G, n), (int) hp.n_group_used);  // (gu, n)
        ggml_tensor * rows = ggml_get_rows(ctx, groups, kept);                              // (per, gu, n)
        groups = ggml_set_rows(ctx, ggml_fill(ctx, groups, -INFINITY), rows, kept);        // others -inf
        select = ggml_reshape_2d(ctx, groups, E, n);
    }
    ggml_tensor * chosen = ggml_argsort_top_k(ctx, select, (int) k);                        // (k, n)
    ggml_tensor * w = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, E, n), chosen);     // (1, k, n)
    if (hp.expert_weights_norm) {
        w = ggml_reshape_2d(ctx, w, k, n);
        w = ggml_reshape_3d(ctx, ggml_div(ctx, w, ggml_sum_rows(ctx, w)), 1, k, n);        // sigmoids: sum > 0
    }
    if (hp.expert_weights_scale != 1.0f) w = ggml_scale(ctx, w, hp.expert_weights_scale);
    if (L.ffn_down_exps_s) {
        ggml_tensor * ids = ggml_reshape_1d(ctx, ggml_cont(ctx, chosen), k * n);
        ggml_tensor * scale = ggml_get_rows(ctx, ggml_reshape_2d(ctx, L.ffn_down_exps_s, 1, E), ids);   // (1, k n)
        w = ggml_mul(ctx, w, ggml_reshape_3d(ctx, scale, 1, k, n));
    }
    *weights = w;
    return chosen;
}

// SwiGLU FFN of the k experts the router picks for each row, weighted as route() says, plus the
// shared experts' SwiGLU of the same input. x: (n_embd, n). The router's full ranking is kept as
// an output for ForwardRunner::routing.
ggml_tensor * GraphBuilder::moe(int il, const LayerWeights & L, ggml_tensor * x, ggml_tensor * router_in) {
    const int64_t n = x->ne[1], k = hp.n_expert_used;
    ggml_tensor * weights = nullptr;
    ggml_tensor * chosen = route(L, router_in ? router_in : x, &weights);                  // (k, n)
    ggml_tensor * xe = ggml_reshape_3d(ctx, x, x->ne[0], 1, n);      // (n_embd, 1, n): one input shared by its k
    ggml_tensor * act;                                                                     // (n_ff_exp, k, n)
    if (L.ffn_gate_up_exps) {
        // One product for gate and up (rows [gate, up] of each expert), GELU-tanh.
        ggml_tensor * gu = ggml_mul_mat_id(ctx, L.ffn_gate_up_exps, xe, chosen);          // (2 n_ff_exp, k, n)
        const int64_t ff = gu->ne[0] / 2;
        ggml_tensor * gate = ggml_view_3d(ctx, gu, ff, k, n, gu->nb[1], gu->nb[2], 0);
        ggml_tensor * up = ggml_view_3d(ctx, gu, ff, k, n, gu->nb[1], gu->nb[2], ff * gu->nb[0]);
        act = ggml_mul(ctx, gelu_tanh(ggml_cont(ctx, gate)), ggml_cont(ctx, up));
    } else {
        ggml_tensor * gate = ggml_mul_mat_id(ctx, L.ffn_gate_exps, xe, chosen);
        ggml_tensor * up = ggml_mul_mat_id(ctx, L.ffn_up_exps, xe, chosen);
        act = ggml_swiglu_split(ctx, gate, up);                                            // silu(gate) * up, one pass
    }
    ggml_tensor * out = ggml_mul_mat_id(ctx, L.ffn_down_exps, act, chosen);                // (n_embd, k, n)
    out = ggml_mul(ctx, out, weights);
    ggml_tensor * sum = nullptr;
    for (int64_t j = 0; j < k; ++j) {
        ggml_tensor * e = ggml_view_2d(ctx, out, out->ne[0], n, out->nb[2], j * out->nb[1]);
        sum = sum ? ggml_add(ctx, sum, e) : e;
    }
    if (L.ffn_gate_shexp) sum = ggml_add(ctx, sum, swiglu(L.ffn_gate_shexp, L.ffn_up_shexp, L.ffn_down_shexp, x));
    // chosen views the first k of each row of the router's full ranking: kept as an output
    // (n_expert ints per row), so the allocator never reuses it.
    ggml_set_output(chosen->view_src);
    in_.experts[il] = chosen->view_src;
    return sum;
}

ggml_tensor * GraphBuilder::head(ggml_tensor * x) {
    x = norm(x, w.output_norm);
    ggml_tensor * logits = shape_.own_head ? head_product_op(ctx, w.output, x)    // (n_vocab, n_out)
                                           : ggml_mul_mat(ctx, w.output, x);
    if (hp.logit_softcap > 0)   // Gemma: c tanh(logits / c)
        logits = ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, logits, 1.0f / hp.logit_softcap)), hp.logit_softcap);
    name(logits, "logits");
    ggml_set_output(logits);
    in_.logits = logits;
    return logits;
}

}  // namespace diffuse
