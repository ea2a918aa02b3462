// The architectures the engine runs, as one table (llama.cpp's llama-arch.cpp in small): the GGUF
// general.architecture name, the family whose schedules and defaults apply, the decoding loop that
// runs it (core_cpp/src/loops/), the graph that computes it (core_cpp/src/models/) and what the
// loader requires of the file. Everything else a model differs by (head counts, block size, mask
// id, logit shift) is read from its GGUF. Python reads this table as _core.ARCHITECTURES.
#pragma once

#include "diffuse.h"

#include <string>
#include <vector>

struct ggml_tensor;

namespace diffuse {

class GraphBuilder;
using BuildGraph = ggml_tensor * (*)(GraphBuilder & g);   // returns the logits (n_vocab, n_out)

// The decoding loops, one file each under loops/ (generate.cpp dispatches on this column).
enum class Loop {
    Masked,        // loops/masked.cpp: unmask masked positions, full attention or block diffusion
    UniformState,  // loops/uniform_state.cpp: a canvas of random tokens re-drawn until it settles
    Causal,        // loops/causal.cpp: diffusion over one causal K/V cache (and every model's ar / self_spec)
};

struct ArchInfo {
    const char * name;         // general.architecture
    Family       family;       // whose defaults, schedules and chat conventions apply (shared: LLaDA2 is SDAR's)
    Loop         loop;         // the loop of its diffusion mode (a new one: a case in generate.cpp's
                               // generate_stream and plan_run, and in loop_name)
    BuildGraph   build;
    bool         qkv_bias;     // q/k/v projections carry biases (Qwen2)
    bool         qk_norm;      // per-head RMSNorm of q and k before RoPE (Qwen3, LLaDA-MoE)
    bool         moe;          // routed experts instead of a dense FFN
    bool         fused_qkv;    // one attn_qkv matrix, rows [q heads, k heads, v heads] (BailingMoeV2)
    bool         router_bias;  // sigmoid router whose selection bias exp_probs_b must be present (LLaDA2)
    bool         shift_logits; // position i takes the logits of i - 1, when the file does not say
    bool         block_diffusion;  // causal across blocks, bidirectional inside: diffusion.block_size required
    int32_t      default_mask_id;  // when the file records none; -1: the file must record it
    // Block diffusion over the answer's own positions (Stable-DiffCoder's generate_block): the
    // answer ends at gen_length, the last block cut there, not run on to a whole block; a step's
    // scheduled count spreads the block's answer positions (its masks), not its length (SDAR's
    // generate.py), over the steps: they differ in a first block shared with the prompt.
    bool         answer_blocks = false;
};

// nullptr for a name the engine does not run.
const ArchInfo * arch_by_name(const std::string & name);
// diffuse-cpp files name only the family (diffuse.model_type): its dense architecture.
const ArchInfo & arch_of_family(Family family);
// Every row, in the table's order.
std::vector<const ArchInfo *> all_archs();
// Every architecture name, for messages.
std::string arch_names();

const char * family_name(Family f);   // "llada", "sdar", ...: a family is named by its first architecture
std::vector<Family> all_families();
const char * loop_name(Loop l);       // "masked", "uniform-state", "causal"

// The graphs (core_cpp/src/models/*.cpp).
ggml_tensor * build_llada(GraphBuilder & g);
ggml_tensor * build_llada_moe(GraphBuilder & g);
ggml_tensor * build_dream(GraphBuilder & g);
ggml_tensor * build_sdar(GraphBuilder & g);
ggml_tensor * build_llada2(GraphBuilder & g);
ggml_tensor * build_diffusion_gemma(GraphBuilder & g);
ggml_tensor * build_nemotron_diffusion(GraphBuilder & g);

}  // namespace diffuse
