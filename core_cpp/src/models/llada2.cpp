// LLaDA2.0/2.1 (inclusionAI, modeling_llada2_moe.py; llama.cpp's bailingmoe2 layout), trained
// block-causally. Against LLaDA-MoE: one fused QKV product, RoPE over the first n_rot dims of each
// head only (partial_rotary_factor), the first n_layer_dense layers a dense SwiGLU, the others a
// sigmoid router (selection bias, group-limited top-k, normalised and scaled weights; see
// GraphBuilder::route) plus a shared expert on the same input. No logit shift.
#include "../graph.h"

#include "ggml.h"

namespace diffuse {

ggml_tensor * build_llada2(GraphBuilder & g) {
    ggml_tensor * x = g.embed();                                    // (n_embd, n_q)
    for (int il = 0; il < g.hp.n_layer; ++il) {
        const LayerWeights & L = g.w.layers[il];
        auto [q, k, v] = g.qkv(L, g.norm(x, L.attn_norm));          // views of one attn_qkv product
        q = g.norm(q, L.attn_q_norm);                               // (hd, n_head, n_q), per head
        k = g.norm(k, L.attn_k_norm);                               // (hd, n_head_kv, n_q)
        ggml_tensor * attn = g.attention(il, L, g.rope(q), g.rope(k), v);
        x = g.residual(il, x, attn);
        ggml_tensor * h = g.norm(x, L.ffn_norm);
        x = ggml_add(g.ctx, x, il < g.hp.n_layer_dense ? g.swiglu(L, h) : g.moe(il, L, h));
        g.name(x, "l_out", il);
    }
    return g.head(x);
}

}  // namespace diffuse
