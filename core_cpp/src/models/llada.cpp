// LLaDA (Nie et al. 2025, "Large Language Diffusion Models"): a Llama block without the causal
// mask. Multi-head attention, RMSNorm, RoPE, SwiGLU, no biases; position i predicts token i.
#include "../graph.h"

#include "ggml.h"

namespace diffuse {

ggml_tensor * build_llada(GraphBuilder & g) {
    ggml_tensor * x = g.embed();                                    // (n_embd, n_q)
    for (int il = 0; il < g.hp.n_layer; ++il) {
        const LayerWeights & L = g.w.layers[il];
        auto [q, k, v] = g.qkv(L, g.norm(x, L.attn_norm));
        ggml_tensor * attn = g.attention(il, L, g.rope(q), g.rope(k), v);
        x = g.residual(il, x, attn);
        x = ggml_add(g.ctx, x, g.swiglu(L, g.norm(x, L.ffn_norm)));
        g.name(x, "l_out", il);
    }
    return g.head(x);
}

}  // namespace diffuse
