// SDAR (JetLM, "SDAR: a synergistic diffusion-autoregression paradigm") and TraDo: Qwen3 blocks
// trained block-causally. Against Qwen2: no biases, and RMSNorm of every q and k head (one weight
// of head_dim shared by the heads) before RoPE; head_dim is stated, not n_embd / n_head.
#include "../graph.h"

#include "ggml.h"

namespace diffuse {

ggml_tensor * build_sdar(GraphBuilder & g) {
    ggml_tensor * x = g.embed();                                    // (n_embd, n_q)
    for (int il = 0; il < g.hp.n_layer; ++il) {
        const LayerWeights & L = g.w.layers[il];
        auto [q, k, v] = g.qkv(L, g.norm(x, L.attn_norm));
        q = g.norm(q, L.attn_q_norm);                               // (hd, n_head, n_q), per head
        k = g.norm(k, L.attn_k_norm);                               // (hd, n_head_kv, n_q)
        ggml_tensor * attn = g.attention(il, L, g.rope(q), g.rope(k), v);
        x = g.residual(il, x, attn);
        x = ggml_add(g.ctx, x, g.swiglu(L, g.norm(x, L.ffn_norm)));
        g.name(x, "l_out", il);
    }
    return g.head(x);
}

}  // namespace diffuse
