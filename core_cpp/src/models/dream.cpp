// Dream (Ye et al. 2025) and Fast-dLLM v2 (Wu et al. 2025): Qwen2.5 blocks. Against LLaDA: q/k/v
// projections with biases (qkv adds them), grouped-query attention, and shifted logits (position i
// takes the output of i - 1; the loop applies the shift). Fast-dLLM v2 attends block-causally,
// Dream to the whole sequence: the attention pattern comes from the file (diffusion.block_size).
#include "../graph.h"

#include "ggml.h"

namespace diffuse {

ggml_tensor * build_dream(GraphBuilder & g) {
    ggml_tensor * x = g.embed();                                    // (n_embd, n_q)
    for (int il = 0; il < g.hp.n_layer; ++il) {
        const LayerWeights & L = g.w.layers[il];
        auto [q, k, v] = g.qkv(L, g.norm(x, L.attn_norm));          // + bq, bk, bv
        ggml_tensor * attn = g.attention(il, L, g.rope(q), g.rope(k), v);   // n_head / n_head_kv groups
        x = g.residual(il, x, attn);
        x = ggml_add(g.ctx, x, g.swiglu(L, g.norm(x, L.ffn_norm)));
        g.name(x, "l_out", il);
    }
    return g.head(x);
}

}  // namespace diffuse
