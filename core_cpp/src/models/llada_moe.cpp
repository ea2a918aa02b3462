// LLaDA-MoE (inclusionAI, LLaDA-MoE-7B-A1B): LLaDA with per-head q/k RMSNorm and a routed
// mixture of SwiGLU experts in place of the dense FFN (top-k of a softmax router, weights not
// renormalised over the k).
#include "../graph.h"

#include "ggml.h"

namespace diffuse {

ggml_tensor * build_llada_moe(GraphBuilder & g) {
    ggml_tensor * x = g.embed();                                    // (n_embd, n_q)
    for (int il = 0; il < g.hp.n_layer; ++il) {
        const LayerWeights & L = g.w.layers[il];
        auto [q, k, v] = g.qkv(L, g.norm(x, L.attn_norm));
        q = g.norm(q, L.attn_q_norm);
        k = g.norm(k, L.attn_k_norm);
        ggml_tensor * attn = g.attention(il, L, g.rope(q), g.rope(k), v);
        x = g.residual(il, x, attn);
        x = ggml_add(g.ctx, x, g.moe(il, L, g.norm(x, L.ffn_norm)));   // experts chosen per row
        g.name(x, "l_out", il);
    }
    return g.head(x);
}

}  // namespace diffuse
