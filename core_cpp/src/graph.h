// The shared blocks every architecture's graph is built from (core_cpp/src/models/*.cpp compose
// them, as llama.cpp's src/models/ do over llama-graph.cpp). A graph computes one forward pass over
// a batch of sequences: each sequence's rows go through the network together (the mat-muls see
// every row of every sequence), their post-RoPE K/V are written into that sequence's cache at their
// positions, and their queries attend over that cache's rows [0, n_kv), bidirectionally or
// block-causally.
#pragma once

#include "model_impl.h"

#include <cstdint>
#include <tuple>
#include <vector>

struct ggml_context;
struct ggml_tensor;

namespace diffuse {

class KVCache;

// What fixes a graph's shape: a pass of the same shape reuses the graph, only its inputs change.
struct BatchShape {
    std::vector<uint64_t> caches;   // KVCache ids, one per sequence
    std::vector<int> n_q, n_kv, n_out;
    std::vector<uint8_t> masked;    // 1: attention through a mask (block-causal, sliding), 0: over all n_kv rows
    bool own_head = false;          // the head by head_product (head_product.h), not ggml's mat-mul
    bool canvas = false;            // DiffusionGemma's decoder pass (SequenceRows::canvas)
    bool self_cond = false;         // ... with self-conditioning logits for some of its rows
    bool draft_lora = false;        // o_proj adds the draft LoRA (SequenceRows::draft_lora, the model has one)
    bool operator==(const BatchShape & o) const {
        return caches == o.caches && n_q == o.n_q && n_kv == o.n_kv && n_out == o.n_out && masked == o.masked &&
               own_head == o.own_head && canvas == o.canvas && self_cond == o.self_cond &&
               draft_lora == o.draft_lora;
    }
    int total_q() const;
    int total_out() const;
};

// The graph's inputs, written before every run.
struct GraphInputs {
    ggml_tensor * tokens = nullptr;          // I32 (n_q_total)
    ggml_tensor * positions = nullptr;       // I32 (n_q_total)
    std::vector<ggml_tensor *> cache_rows;   // per sequence, I64 (n_q): cache rows to write
    std::vector<ggml_tensor *> gather_rows;  // per sequence, I64 (n_q): its rows in the batch (B > 1)
    std::vector<ggml_tensor *> masks;        // per sequence, F16 (n_kv, n_q) additive, or nullptr
    std::vector<ggml_tensor *> masks_swa;    // the same for the sliding layers (models with a window)
    ggml_tensor * self_cond = nullptr;       // F32 (n_vocab, n_q_total): the previous step's logits
    ggml_tensor * self_cond_on = nullptr;    // F32 (1, n_q_total): 1 where a row has them, else 0
    ggml_tensor * out_rows = nullptr;        // I32 (n_out_total), into the batch
    ggml_tensor * logits = nullptr;          // (n_vocab, n_out_total)
    // MoE, per layer (nullptr for a dense one): the router's ranking, I32 (n_expert, rows) best
    // first; rows = n_q_total (last layer: n_out_total)
    std::vector<ggml_tensor *> experts;
    ggml_tensor * q_scale = nullptr;         // F32 (1, 1, n_q_total): scale_queries' factor per row, or nullptr
};

class GraphBuilder {
public:
    GraphBuilder(ggml_context * ctx, const ModelImpl & model, const BatchShape & shape,
                 const std::vector<KVCache *> & caches, GraphInputs & in);

    ggml_context * const ctx;
    const HParams & hp;
    const Weights & w;

    ggml_tensor * embed();                                            // (n_embd, n_q)
    ggml_tensor * norm(ggml_tensor * x, ggml_tensor * weight);        // RMSNorm times weight
    ggml_tensor * linear(ggml_tensor * w, ggml_tensor * b, ggml_tensor * x);   // w x (+ b)
    // Q (hd, n_head, n_q), K (hd, n_head_kv, n_q), V (hd * n_head_kv, n_q) of a layer, biases
    // added where the layer has them; a fused attn_qkv is split by views (Q and K may be strided).
    std::tuple<ggml_tensor *, ggml_tensor *, ggml_tensor *> qkv(const LayerWeights & L, ggml_tensor * x);
    // (hd, heads, n_q) at the rows' positions: NEOX or NORM over the first n_rot dims of each head,
    // the others passed through (partial RoPE); layer il's RoPE (only DiffusionGemma's layers
    // differ: the full ones with the file's frequency factors, its proportional RoPE); YaRN's
    // interpolation where the file has it (hp.rope_yarn).
    ggml_tensor * rope(ggml_tensor * t, int il = 0);
    // Ministral3's llama-4 query scale, per row: q (hd, n_head, n_q) * (1 + beta ln(1 + floor(pos / L))).
    ggml_tensor * scale_queries(ggml_tensor * q);
    // Writes K/V into each sequence's cache, attends over it (layer il's heads, scale and mask:
    // the sliding one on a sliding layer), projects (plus the draft LoRA on a draft pass): (n_embd, n_q).
    ggml_tensor * attention(int il, const LayerWeights & L, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v);
    // x + attn (n_embd, n_q); at the last layer only over the rows whose logits are wanted (their
    // FFN and the head alone run on): (n_embd, n_out).
    ggml_tensor * residual(int il, ggml_tensor * x, ggml_tensor * attn);
    ggml_tensor * swiglu(ggml_tensor * gate, ggml_tensor * up, ggml_tensor * down, ggml_tensor * x);  // down(silu(gate x) * up x)
    ggml_tensor * swiglu(const LayerWeights & L, ggml_tensor * x);    // the layer's dense FFN
    // GELU with the tanh approximation from exact float ops (ggml_gelu reads an F16 table, 1e-3 off).
    ggml_tensor * gelu_tanh(ggml_tensor * x);
    ggml_tensor * geglu(ggml_tensor * gate, ggml_tensor * up, ggml_tensor * down, ggml_tensor * x);  // down(gelu(gate x) * up x)
    // Layer il's routed experts (the router as the file says: softmax, or sigmoid with a selection
    // bias and group-limited top-k), the routing kept; plus the shared experts when it has them.
    // router_in: what the router reads when it is not x (Gemma 4: the scaled, normalised residual);
    // Gemma 4's experts are GELU-tanh with one fused gate_up and a per-expert weight scale.
    ggml_tensor * moe(int il, const LayerWeights & L, ggml_tensor * x, ggml_tensor * router_in = nullptr);
    ggml_tensor * head(ggml_tensor * x);                              // logits (n_vocab, n_out), softcapped when the model says
    // DiffusionGemma's decoder pass: whether this is one, and the self-conditioning's soft embeddings
    // softmax(previous logits) E * sqrt(n_embd) (n_embd, n_q), zero for rows without them, or
    // nullptr when no row has them.
    bool canvas() const { return shape_.canvas; }
    const ModelImpl & model() const { return model_; }
    ggml_tensor * soft_embeddings();
    void name(ggml_tensor * t, const char * what, int il = -1);       // "attn_out-3", for dumps

private:
    ggml_tensor * route(const LayerWeights & L, ggml_tensor * x, ggml_tensor ** weights);
    const ModelImpl & model_;
    const BatchShape & shape_;
    const std::vector<KVCache *> & caches_;
    GraphInputs & in_;
};

}  // namespace diffuse
