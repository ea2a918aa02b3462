#include "architectures.h"

#include <algorithm>

namespace diffuse {

// LLaDA's mask id when a llama.cpp-converted file does not record one; LLaDA-MoE-7B-A1B's is the
// id llama.cpp's converter writes, and LLaDA2's <|mask|> too.
constexpr int32_t LLADA_MASK_ID = 126336;
constexpr int32_t LLADA_MOE_MASK_ID = 156895;
// WeDLM's config.json has mask_token_id null; Tencent's engine then uses 151665 (model_runner.py).
constexpr int32_t WEDLM_MASK_ID = 151665;

static const ArchInfo ARCHS[] = {
    // name            family              loop           graph            bias   qknorm moe    fused  rbias  shift  block  mask
    {"llada",          Family::LLaDA,      Loop::Masked,  build_llada,     false, false, false, false, false, false, false, LLADA_MASK_ID},
    {"llada-moe",      Family::LLaDA,      Loop::Masked,  build_llada_moe, false, true,  true,  false, false, false, false, LLADA_MOE_MASK_ID},
    {"dream",          Family::Dream,      Loop::Masked,  build_dream,     true,  false, false, false, false, true,  false, -1},
    // SDAR and TraDo: Qwen3 blocks, trained block-causal (JetAstra/SDAR modeling_sdar.py).
    {"sdar",           Family::SDAR,       Loop::Masked,  build_sdar,      false, true,  false, false, false, false, true,  -1},
    // Fast-dLLM v2: Qwen2.5 blocks (Dream's graph), block-causal, shifted logits.
    {"fast-dllm-v2",   Family::FastDLLMv2, Loop::Masked,  build_dream,     true,  false, false, false, false, true,  true,  -1},
    // LLaDA2.0/2.1: BailingMoeV2 blocks trained block-causal; SDAR's family (block rules, defaults).
    {"llada2",         Family::SDAR,       Loop::Masked,  build_llada2,    false, true,  true,  true,  true,  false, true,  LLADA_MOE_MASK_ID},
    // Stable-DiffCoder (ByteDance-Seed): Seed-Coder's Llama blocks (LLaDA's graph, GQA, q/k permuted
    // like llama.cpp's llama), trained block-causally from position 0; SDAR's family, its
    // generate_block's mask id 5 and blocks of the answer's positions (answer_blocks).
    {"stable-diffcoder", Family::SDAR,     Loop::Masked,  build_llada,     false, false, false, false, false, false, true,  5, true},
    // DiffusionGemma (llama.cpp PR #24423's arch): Gemma 4 MoE blocks, a causal encoder and a canvas
    // decoder; loaded by model.cpp's read_gemma_hparams / bind_gemma_weights (per-layer shapes). No
    // mask token: the canvas starts as random tokens.
    {"diffusion-gemma", Family::DiffusionGemma, Loop::UniformState, build_diffusion_gemma, false, true, true, false, false, false, false, 0},
    // Nemotron-Labs-Diffusion: Ministral3 blocks (Llama with YaRN and the llama-4 query scale), one
    // causal K/V cache for its AR, diffusion and self-speculation modes (no GGUF name exists: ours).
    {"nemotron-diffusion", Family::NemotronDiffusion, Loop::Causal, build_nemotron_diffusion, false, false, false, false, false, false, false, -1},
    // WeDLM (Tencent): WeDLM-8B on Qwen3 blocks (SDAR's graph), WeDLM-7B on Qwen2.5 blocks (Dream's);
    // plain causal attention, its window reordered per pass (loops/wedlm.h). No GGUF name exists: ours.
    {"wedlm",          Family::WeDLM,      Loop::Causal,  build_sdar,      false, true,  false, false, false, false, false, WEDLM_MASK_ID},
    {"wedlm-qwen2",    Family::WeDLM,      Loop::Causal,  build_dream,     true,  false, false, false, false, false, false, WEDLM_MASK_ID},
};

const ArchInfo * arch_by_name(const std::string & name) {
    for (const ArchInfo & a : ARCHS)
        if (name == a.name) return &a;
    return nullptr;
}

const ArchInfo & arch_of_family(Family family) {
    for (const ArchInfo & a : ARCHS)
        if (a.family == family && !a.moe) return a;
    throw Error("no architecture for this family");
}

std::vector<const ArchInfo *> all_archs() {
    std::vector<const ArchInfo *> v;
    for (const ArchInfo & a : ARCHS) v.push_back(&a);
    return v;
}

std::string arch_names() {
    std::string s;
    for (const ArchInfo & a : ARCHS) s += (s.empty() ? "" : ", ") + std::string(a.name);
    return s;
}

const char * family_name(Family f) {
    switch (f) {
        case Family::LLaDA:      return "llada";
        case Family::Dream:      return "dream";
        case Family::SDAR:       return "sdar";
        case Family::FastDLLMv2: return "fast-dllm-v2";
        case Family::DiffusionGemma: return "diffusion-gemma";
        case Family::NemotronDiffusion: return "nemotron-diffusion";
        case Family::WeDLM:      return "wedlm";
    }
    return "?";
}

std::vector<Family> all_families() {
    std::vector<Family> v;
    for (const ArchInfo & a : ARCHS)
        if (std::find(v.begin(), v.end(), a.family) == v.end()) v.push_back(a.family);
    return v;
}

const char * loop_name(Loop l) {
    switch (l) {
        case Loop::Masked:       return "masked";
        case Loop::UniformState: return "uniform-state";
        case Loop::Causal:       return "causal";
    }
    return "?";
}

}  // namespace diffuse
