// The three GGUF dialects as tables: which arch names, keys and rope mode each one uses.
// Tensor names are llama.cpp's in all three (see docs/ARCHITECTURE.md).
#pragma once

#include "architectures.h"
#include "diffuse.h"

#include <string>

namespace diffuse {

class GGUFFile;

struct DialectKeys {
    Dialect     dialect;
    const char * name;               // for messages and `diffuse info`
    // Key templates; "{arch}" is replaced by the general.architecture value.
    const char * block_count;
    const char * head_count;
    const char * head_count_kv;
    const char * embedding_length;
    const char * feed_forward_length;
    const char * context_length;
    const char * rope_freq_base;
    const char * rms_eps;
    const char * mask_token_id;
    const char * shift_logits;       // nullptr: decided by the family
    const char * expert_count;       // MoE keys; nullptr where the dialect has no MoE models
    const char * expert_used_count;
    const char * expert_ff_length;
    const char * head_dim;           // nullptr or absent: n_embd / n_head
    const char * block_size;         // block diffusion: the trained block length
    // nullptr where the dialect has none (diffuse-cpp): RoPE over the whole head, LLaDA-MoE's router.
    const char * rope_dim;           // dimensions RoPE rotates (partial RoPE: fewer than head_dim)
    const char * expert_gating_func; // 1 softmax, 2 sigmoid (llama.cpp's llama_expert_gating_func_type)
    const char * expert_group_count;
    const char * expert_group_used_count;
    const char * expert_weights_norm;
    const char * expert_weights_scale;
    const char * expert_shared_count;
    const char * expert_shared_ff_length;
    const char * leading_dense_block_count;
};

// Identify the dialect and family of an opened file (throws diffuse::Error when neither fits).
struct Identity {
    const DialectKeys * keys;
    const ArchInfo * arch;           // the architecture (architectures.h)
    std::string arch_key;            // value that replaces {arch}
};
Identity identify(const GGUFFile & file);

std::string key_for(const char * tmpl, const std::string & arch_key);

const char * dialect_name(Dialect d);

// Tensor names (llama.cpp's, shared by every dialect).
namespace tensor_names {
    constexpr const char * token_embd  = "token_embd.weight";
    constexpr const char * output_norm = "output_norm.weight";
    constexpr const char * output      = "output.weight";
    std::string blk(int il, const char * what);   // blk.{il}.{what}
}

}  // namespace diffuse
