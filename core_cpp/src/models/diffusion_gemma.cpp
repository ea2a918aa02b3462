// DiffusionGemma (Google, transformers 5.24 models/diffusion_gemma/; llama.cpp PR #24423's names):
// one Gemma 4 MoE stack run as a causal encoder over the prompt and each finished canvas (its K/V
// go to the cache) and as a bidirectional decoder over a canvas (its rows sit after the cache and
// are overwritten when the canvas is encoded). Against the other graphs:
//   embeddings x sqrt(n_embd); a canvas adds the self-conditioning (GELU MLP of the previous step's
//   soft embeddings) and is RMS-normalised without a weight;
//   per layer its own geometry (sliding: own V; full: K = V, proportional RoPE); q/k RMSNorm with
//   weights, v without; scores x 1; post-attention norm; a dense GELU-tanh MLP beside the experts
//   (the router reads the residual: unweighted RMSNorm x learned scale x n_embd^-0.5), each
//   post-normed, their sum post-normed; the layer's output x its scalar (encoder's or decoder's);
//   final logits softcapped (GraphBuilder::head).
// RMSNorm multiplies by w (not 1 + w): GraphBuilder::norm as it is.
#include "../graph.h"

#include "ggml.h"

#include <cmath>

namespace diffuse {

ggml_tensor * build_diffusion_gemma(GraphBuilder & g) {
    ggml_context * ctx = g.ctx;
    const HParams & hp = g.hp;
    const bool canvas = g.canvas();
    ggml_tensor * x = ggml_scale(ctx, g.embed(), std::sqrt((float) hp.n_embd));   // (n_embd, n_q)
    if (canvas) {
        if (ggml_tensor * soft = g.soft_embeddings())
            x = ggml_add(ctx, x, g.geglu(g.w.sc_gate, g.w.sc_up, g.w.sc_down, g.norm(soft, g.w.sc_pre_norm)));
        x = ggml_rms_norm(ctx, x, hp.rms_eps);
    }
    const int64_t n = x->ne[1];
    for (int il = 0; il < hp.n_layer; ++il) {
        const LayerWeights & L = g.w.layers[il];
        const int64_t hd = g.model().layer(il).head_dim, n_kv = g.model().layer(il).n_head_kv;
        ggml_tensor * h = g.norm(x, L.attn_norm);
        ggml_tensor * q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L.wq, h), hd, hp.n_head, n);
        ggml_tensor * k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L.wk, h), hd, n_kv, n);
        ggml_tensor * v = L.wv ? ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L.wv, h), hd, n_kv, n) : k;   // K = V: raw k
        v = ggml_reshape_2d(ctx, ggml_rms_norm(ctx, v, hp.rms_eps), hd * n_kv, n);
        q = g.rope(g.norm(q, L.attn_q_norm), il);
        k = g.rope(g.norm(k, L.attn_k_norm), il);
        ggml_tensor * attn = g.attention(il, L, q, k, v);
        x = g.residual(il, x, g.norm(attn, L.attn_post_norm));   // last layer: the wanted rows only
        ggml_tensor * dense = g.norm(g.geglu(L.ffn_gate, L.ffn_up, L.ffn_down, g.norm(x, L.ffn_norm)), L.ffn_post_norm_1);
        ggml_tensor * router_in = ggml_scale(ctx, ggml_mul(ctx, ggml_rms_norm(ctx, x, hp.rms_eps), L.ffn_gate_inp_s),
                                             1.0f / std::sqrt((float) hp.n_embd));
        ggml_tensor * experts = g.norm(g.moe(il, L, g.norm(x, L.ffn_pre_norm_2), router_in), L.ffn_post_norm_2);
        x = ggml_add(ctx, x, g.norm(ggml_add(ctx, dense, experts), L.ffn_post_norm));
        x = ggml_scale(ctx, x, canvas ? L.out_scale : L.enc_out_scale);
        g.name(x, "l_out", il);
    }
    return g.head(x);
}

}  // namespace diffuse
