// The three GGUF dialects as tables: which arch names, keys and rope mode each one uses.
// Tensor names are llama.cpp's in all three (see docs/ARCHITECTURE.md).
#pragma once

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
};

// Identify the dialect and family of an opened file (throws diffuse::Error when neither fits).
struct Identity {
    const DialectKeys * keys;
    Arch arch;
    bool moe = false;                // LLaDA-MoE ("llada-moe"): the LLaDA family with routed experts
    std::string arch_key;            // value that replaces {arch}
};
Identity identify(const GGUFFile & file);

std::string key_for(const char * tmpl, const std::string & arch_key);

// LLaDA's mask id when a llama.cpp-converted file does not record one.
constexpr int32_t LLADA_DEFAULT_MASK_ID = 126336;
// LLaDA-MoE-7B-A1B's mask id (the id llama.cpp's converter writes).
constexpr int32_t LLADA_MOE_DEFAULT_MASK_ID = 156895;

const char * arch_name(Arch a);
const char * dialect_name(Dialect d);

// Tensor names (llama.cpp's, shared by every dialect).
namespace tensor_names {
    constexpr const char * token_embd  = "token_embd.weight";
    constexpr const char * output_norm = "output_norm.weight";
    constexpr const char * output      = "output.weight";
    std::string blk(int il, const char * what);   // blk.{il}.{what}
}

}  // namespace diffuse
