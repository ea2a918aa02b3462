// Nemotron-Labs-Diffusion (NVIDIA, 2026; remote code modeling_nemotron_labs_diffusion.py): a
// Ministral3 stack run as Llama (no biases, no q/k norm, SwiGLU), with YaRN RoPE (GraphBuilder::rope
// follows the file's rope.scaling keys) and the llama-4 query scale after RoPE, and an untied
// diffusion_head. One graph for every mode: the attention pattern (causal, or a block that sees
// itself over a causal prefix) comes from the loop (loops/causal.cpp).
#include "../graph.h"

#include "ggml.h"

namespace diffuse {

ggml_tensor * build_nemotron_diffusion(GraphBuilder & g) {
    ggml_tensor * x = g.embed();                                    // (n_embd, n_q)
    for (int il = 0; il < g.hp.n_layer; ++il) {
        const LayerWeights & L = g.w.layers[il];
        auto [q, k, v] = g.qkv(L, g.norm(x, L.attn_norm));
        q = g.scale_queries(g.rope(q));                             // transformers: after RoPE, by position
        ggml_tensor * attn = g.attention(il, L, q, g.rope(k), v);
        x = g.residual(il, x, attn);
        x = ggml_add(g.ctx, x, g.swiglu(L, g.norm(x, L.ffn_norm)));
        g.name(x, "l_out", il);
    }
    return g.head(x);
}

}  // namespace diffuse
