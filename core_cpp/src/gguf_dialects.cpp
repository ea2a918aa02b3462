#include "gguf_dialects.h"
#include "gguf_file.h"

namespace diffuse {

// llama.cpp's names; our own files use them too and add diffuse.format_version + tokenizer.json.
static const DialectKeys LLAMA_CPP_KEYS = {
    Dialect::LlamaCpp, "llama.cpp",
    "{arch}.block_count", "{arch}.attention.head_count", "{arch}.attention.head_count_kv",
    "{arch}.embedding_length", "{arch}.feed_forward_length", "{arch}.context_length",
    "{arch}.rope.freq_base", "{arch}.attention.layer_norm_rms_epsilon",
    "tokenizer.ggml.mask_token_id", "diffusion.shift_logits",
    "{arch}.expert_count", "{arch}.expert_used_count", "{arch}.expert_feed_forward_length",
    "{arch}.attention.key_length", "diffusion.block_size",
    "{arch}.rope.dimension_count", "{arch}.expert_gating_func", "{arch}.expert_group_count",
    "{arch}.expert_group_used_count", "{arch}.expert_weights_norm", "{arch}.expert_weights_scale",
    "{arch}.expert_shared_count", "{arch}.expert_shared_feed_forward_length", "{arch}.leading_dense_block_count",
};

static const DialectKeys OURS_KEYS = [] {
    DialectKeys k = LLAMA_CPP_KEYS;
    k.dialect = Dialect::Ours;
    k.name = "diffuse";
    return k;
}();

// The paper's engine (diffuse-cpp): arch "diffuse", family in diffuse.model_type.
static const DialectKeys DIFFUSE_CPP_KEYS = {
    Dialect::DiffuseCpp, "diffuse-cpp",
    "diffuse.block_count", "diffuse.attention.head_count", "diffuse.attention.head_count_kv",
    "diffuse.embedding_length", "diffuse.feed_forward_length", "diffuse.context_length",
    "diffuse.rope.freq_base", "diffuse.attention.layer_norm_rms_epsilon",
    "diffuse.mask_token_id", nullptr,
    nullptr, nullptr, nullptr,
    nullptr, nullptr,
};

const char * arch_name(Arch a) {
    switch (a) {
        case Arch::LLaDA:      return "llada";
        case Arch::Dream:      return "dream";
        case Arch::SDAR:       return "sdar";
        case Arch::FastDLLMv2: return "fast-dllm-v2";
        case Arch::DiffusionGemma: return "diffusion-gemma";
        case Arch::NemotronDiffusion: return "nemotron-diffusion";
        case Arch::WeDLM:      return "wedlm";
    }
    return "?";
}

const char * dialect_name(Dialect d) {
    switch (d) {
        case Dialect::Ours:       return OURS_KEYS.name;
        case Dialect::LlamaCpp:   return LLAMA_CPP_KEYS.name;
        case Dialect::DiffuseCpp: return DIFFUSE_CPP_KEYS.name;
    }
    return "?";
}

std::string key_for(const char * tmpl, const std::string & arch_key) {
    std::string s = tmpl;
    const std::string pat = "{arch}";
    const size_t at = s.find(pat);
    if (at != std::string::npos) s.replace(at, pat.size(), arch_key);
    return s;
}

std::string tensor_names::blk(int il, const char * what) {
    return "blk." + std::to_string(il) + "." + what;
}

Identity identify(const GGUFFile & file) {
    const auto arch = file.get_string("general.architecture");
    if (!arch) file.fail("no general.architecture key: not a model file");
    Identity id;
    id.arch_key = *arch;
    if (*arch == "diffuse") {
        const auto type = file.get_string("diffuse.model_type");
        if (type != "llada" && type != "dream")
            file.fail("diffuse-cpp file with unknown diffuse.model_type '" + type.value_or("") +
                      "' (expected llada or dream)");
        id.arch = &arch_of_family(*type == "llada" ? Arch::LLaDA : Arch::Dream);
        id.keys = &DIFFUSE_CPP_KEYS;
        return id;
    }
    id.arch = arch_by_name(*arch);
    if (!id.arch)
        file.fail("unsupported architecture '" + *arch + "': diffuse runs diffusion models (" + arch_names() +
                  ", or diffuse-cpp files)");
    id.keys = file.has("diffuse.format_version") ? &OURS_KEYS : &LLAMA_CPP_KEYS;
    return id;
}

}  // namespace diffuse
