// Internal model state: hyper-parameters, memory-mapped weights, load options and the pool of contexts.
#pragma once

#include "architectures.h"
#include "diffuse.h"
#include "gguf_file.h"
#include "head_product.h"

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

struct ggml_tensor;
struct ggml_backend;
struct ggml_backend_buffer;

namespace diffuse {

// Weight shapes in ggml order (fastest dimension first).
struct LayerWeights {
    ggml_tensor * attn_norm;   // (n_embd)
    ggml_tensor * wq;          // (n_embd, n_head * head_dim)
    ggml_tensor * wk;          // (n_embd, n_head_kv * head_dim)
    ggml_tensor * wv;          // (n_embd, n_head_kv * head_dim)
    ggml_tensor * wqkv;        // (n_embd, (n_head + 2 n_head_kv) * head_dim), fused_qkv archs in place of wq/wk/wv
    ggml_tensor * bq;          // (n_head * head_dim), Dream only
    ggml_tensor * bk;          // (n_head_kv * head_dim), Dream only
    ggml_tensor * bv;          // (n_head_kv * head_dim), Dream only
    ggml_tensor * wo;          // (n_head * head_dim, n_embd)
    ggml_tensor * wo_lora_a;   // (n_head * head_dim, rank), the draft LoRA (HParams::draft_lora_rank), or nullptr
    ggml_tensor * wo_lora_b;   // (rank, n_embd)
    ggml_tensor * attn_q_norm; // (head_dim), LLaDA-MoE only: shared by every head
    ggml_tensor * attn_k_norm; // (head_dim), LLaDA-MoE only
    ggml_tensor * ffn_norm;    // (n_embd)
    ggml_tensor * ffn_gate;    // (n_embd, n_ff), dense layers only
    ggml_tensor * ffn_up;      // (n_embd, n_ff), dense only
    ggml_tensor * ffn_down;    // (n_ff, n_embd), dense only
    ggml_tensor * ffn_gate_inp;  // (n_embd, n_expert), MoE only: the router
    ggml_tensor * ffn_gate_exps; // (n_embd, n_ff_exp, n_expert), MoE only
    ggml_tensor * ffn_up_exps;   // (n_embd, n_ff_exp, n_expert), MoE only
    ggml_tensor * ffn_down_exps; // (n_ff_exp, n_embd, n_expert), MoE only
    ggml_tensor * exp_probs_b;   // (n_expert), router_bias archs: added to the scores for the choice only
    ggml_tensor * ffn_gate_shexp;  // (n_embd, n_ff_shexp), shared experts
    ggml_tensor * ffn_up_shexp;    // (n_embd, n_ff_shexp)
    ggml_tensor * ffn_down_shexp;  // (n_ff_shexp, n_embd)
    // DiffusionGemma (Gemma 4 blocks): four post-norms, the MoE's own pre-norm, the router's learned
    // scale, fused expert gate_up (gate rows first), the per-expert output scale; layer scalars.
    ggml_tensor * attn_post_norm;   // (n_embd)
    ggml_tensor * ffn_post_norm_1;  // (n_embd) after the dense MLP
    ggml_tensor * ffn_pre_norm_2;   // (n_embd) before the experts
    ggml_tensor * ffn_post_norm_2;  // (n_embd) after the experts
    ggml_tensor * ffn_post_norm;    // (n_embd) after their sum
    ggml_tensor * ffn_gate_inp_s;   // (n_embd) router input scale
    ggml_tensor * ffn_gate_up_exps; // (n_embd, 2 n_ff_exp, n_expert)
    ggml_tensor * ffn_down_exps_s;  // (n_expert) per-expert scale of the routing weights
    float out_scale = 1.0f;         // the decoder's layer_scalar (layer_output_scale)
    float enc_out_scale = 1.0f;     // the encoder's (enc_layer_output_scale)
};

// A layer's attention geometry: every layer alike except in DiffusionGemma, whose sliding and full
// layers differ in head size, KV heads and RoPE.
struct LayerShape {
    int64_t head_dim;
    int64_t n_head_kv;
    int64_t n_rot;          // RoPE over the first n_rot dims of each head
    float   rope_theta;
    float   kq_scale;       // attention scores x this (1 / sqrt(head_dim), Gemma 4: 1)
    bool    swa;            // sliding window of hp.n_swa positions
    bool    kv_shared;      // K = V: no V projection (Gemma 4's full layers)
    int64_t kv_row() const { return head_dim * n_head_kv; }
};

struct Weights {
    ggml_tensor * tok_embd;    // (n_embd, n_vocab)
    ggml_tensor * output_norm; // (n_embd)
    ggml_tensor * output;      // (n_embd, n_vocab); tok_embd when tied
    std::vector<LayerWeights> layers;
    // DiffusionGemma: RoPE frequency factors of the full layers (head_dim / 2), self-conditioning.
    ggml_tensor * rope_freqs = nullptr;
    ggml_tensor * sc_pre_norm = nullptr, * sc_gate = nullptr, * sc_up = nullptr, * sc_down = nullptr;
    // The embedding transposed, (n_vocab, n_embd): the self-conditioning's softmax(logits) E is a
    // product over the vocabulary, which ggml's mat-mul runs along rows only. F32 for an F32
    // embedding, else F16; built at load (n_vocab x n_embd x 2 bytes: 1.4 GiB for the real model).
    ggml_tensor * tok_embd_t = nullptr;
};

// Read-only memory map of the whole file.
class FileMapping {
public:
    explicit FileMapping(const GGUFFile & file);
    ~FileMapping();
    void * addr() const { return addr_; }
    size_t size() const { return size_; }
    // Drops pages of a range from this process's resident set (they stay in the page cache).
    void release(const void * addr, size_t size) const;
private:
    void * addr_ = nullptr;
    size_t size_ = 0;
#ifdef _WIN32
    void * mapping_ = nullptr;
#endif
};

class Context;
class ContextLease;

// RAM of this machine, bytes (a large number when it cannot be read).
size_t physical_memory_bytes();

// Threads a call uses: `requested` capped at the logical CPU count, or the default (physical cores) when <= 0.
int thread_count(int requested);

// Immutable after load (weights, hyper-parameters, options), but for the default thread count
// (atomic) and the pool of contexts (locked): every const method is safe from any thread.
class ModelImpl final : public Model {
public:
    ModelImpl(const std::string & path, const LoadParams & params);
    ~ModelImpl() override;

    const HParams & hparams() const override { return hp_; }
    const std::string & path() const override { return file_->path(); }
    int n_threads() const override { return n_threads_.load(); }
    void set_n_threads(int n) override;
    void forward_into(const std::vector<int32_t> & tokens, const std::vector<int32_t> & rows,
                      float * out, int block_size = -1) const override;
    void forward_canvas(const std::vector<int32_t> & context, const std::vector<int32_t> & canvas,
                        const float * self_cond, float * out) const override;
    void forward_causal_into(const std::vector<int32_t> & tokens, int open_block, float * out,
                             bool draft_lora = false) const override;
    size_t weights_bytes() const override { return weights_bytes_; }
    size_t repacked_bytes() const override { return repacked_bytes_; }
    bool flash_attn() const override { return flash_attn_; }
    bool kv_f16() const override { return kv_f16_; }

    const Weights & weights() const { return w_; }
    const ArchInfo & arch() const { return *arch_; }
    const LayerShape & layer(int il) const { return layers_[il]; }
    int64_t layer_matmul_params() const { return layer_matmul_params_; }   // all layers' matrices one position uses
    const GGUFFile & file() const { return *file_; }
    const HeadChoice & head_choice() const { return head_choice_; }   // which product computes the logits

    // A context of its own for the caller (from the pool, or new); it goes back when the lease ends.
    ContextLease lease() const;
    void give_back(std::unique_ptr<Context> ctx) const;

    // Checks ids are in [0, n_vocab); throws diffuse::Error naming the culprit.
    void check_tokens(const int32_t * ids, size_t n) const;

private:
    void read_hparams();
    void read_gemma_hparams(const std::string & arch_key);
    void read_rope_scaling(const std::function<std::string(const char *)> & key);   // YaRN, the query scale
    void bind_weights(bool repack);
    void widen_vectors(std::vector<ggml_tensor **> & slots, const std::map<ggml_tensor *, char *> & data);
    void transpose_embedding(const char * data);

    std::unique_ptr<GGUFFile> file_;
    std::unique_ptr<FileMapping> map_;
    ggml_backend_buffer * weight_buf_ = nullptr;   // the mapping, wrapped
    ggml_backend_buffer * repack_buf_ = nullptr;   // repacked copies of quantised matrices
    ggml_context * widened_ctx_ = nullptr;         // F32 copies of F16/BF16 norms and biases
    ggml_backend_buffer * widened_buf_ = nullptr;
    ggml_context * transposed_ctx_ = nullptr;      // DiffusionGemma's transposed embedding
    ggml_backend_buffer * transposed_buf_ = nullptr;
    const ArchInfo * arch_ = nullptr;
    HParams hp_{};
    std::vector<LayerShape> layers_;
    Weights w_{};
    size_t weights_bytes_ = 0;
    size_t repacked_bytes_ = 0;
    int64_t layer_matmul_params_ = 0;
    bool flash_attn_ = true;
    bool kv_f16_ = true;
    std::atomic<int> n_threads_{1};
    HeadChoice head_choice_;
    mutable std::mutex pool_mutex_;
    mutable std::vector<std::unique_ptr<Context>> pool_;   // idle contexts
};


}  // namespace diffuse
