#include "model_impl.h"

#include "context.h"
#include "gguf_dialects.h"
#include "repack.h"

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "gguf.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <cstring>
#include <thread>

#ifdef _WIN32
#include <windows.h>
#else
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace diffuse {

// ---- FileMapping ----

FileMapping::FileMapping(const GGUFFile & file) : size_(file.file_size()) {
#ifdef _WIN32
    HANDLE h = CreateFileA(file.path().c_str(), GENERIC_READ, FILE_SHARE_READ, nullptr, OPEN_EXISTING,
                           FILE_ATTRIBUTE_NORMAL, nullptr);
    if (h == INVALID_HANDLE_VALUE) file.fail("cannot open for mapping");
    mapping_ = CreateFileMappingA(h, nullptr, PAGE_READONLY, 0, 0, nullptr);
    CloseHandle(h);
    if (!mapping_) file.fail("cannot map the file");
    addr_ = MapViewOfFile(mapping_, FILE_MAP_READ, 0, 0, 0);
    if (!addr_) file.fail("cannot map the file");
#else
    const int fd = open(file.path().c_str(), O_RDONLY);
    if (fd < 0) file.fail("cannot open for mapping");
    void * a = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (a == MAP_FAILED) file.fail("cannot map the file");
    addr_ = a;
#endif
}

void FileMapping::release(const void * addr, size_t size) const {
#ifndef _WIN32
    // Whole pages inside [addr, addr + size) only.
    const uintptr_t page = (uintptr_t) sysconf(_SC_PAGESIZE);
    const uintptr_t begin = ((uintptr_t) addr + page - 1) & ~(page - 1);
    const uintptr_t end = ((uintptr_t) addr + size) & ~(page - 1);
    if (end > begin) madvise((void *) begin, end - begin, MADV_DONTNEED);
#else
    (void) addr; (void) size;
#endif
}

FileMapping::~FileMapping() {
#ifdef _WIN32
    if (addr_) UnmapViewOfFile(addr_);
    if (mapping_) CloseHandle(mapping_);
#else
    if (addr_) munmap(addr_, size_);
#endif
}

// ---- loading ----

std::unique_ptr<Model> Model::load(const std::string & path, const LoadParams & params) {
    return std::make_unique<ModelImpl>(path, params);
}

ModelImpl::ModelImpl(const std::string & path, const LoadParams & params) {
    file_ = std::make_unique<GGUFFile>(path, /*with_tensors*/ true);
    read_hparams();
    bind_weights(params.repack);
    flash_attn_ = params.flash_attn;
    kv_f16_ = params.kv_f16;
    set_n_threads(params.n_threads);
}

ModelImpl::~ModelImpl() {
    pool_.clear();
    if (repack_buf_) ggml_backend_buffer_free(repack_buf_);
    if (widened_buf_) ggml_backend_buffer_free(widened_buf_);
    if (widened_ctx_) ggml_free(widened_ctx_);
    if (transposed_buf_) ggml_backend_buffer_free(transposed_buf_);
    if (transposed_ctx_) ggml_free(transposed_ctx_);
    if (weight_buf_) ggml_backend_buffer_free(weight_buf_);
}

int physical_cores() {
    const int logical = (int) std::max(1u, std::thread::hardware_concurrency());
#ifdef __linux__
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return logical;
    std::set<std::pair<std::string, std::string>> cores;   // (package, core) of each allowed CPU
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &allowed)) continue;
        const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
        std::ifstream pkg(dir + "physical_package_id"), core(dir + "core_id");
        std::string p, c;
        if (!(pkg >> p) || !(core >> c)) return std::min(logical, CPU_COUNT(&allowed));
        cores.insert({p, c});
    }
    return cores.empty() ? logical : (int) cores.size();
#else
    return logical;
#endif
}

size_t physical_memory_bytes() {
#if defined(_SC_PHYS_PAGES) && defined(_SC_PAGESIZE)
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return (size_t) pages * (size_t) page;
#endif
    return SIZE_MAX;
}

int thread_count(int requested) {
    // More threads than logical CPUs only adds synchronisation (10000 threads made a 0.09 s step
    // take 13.8 s): the count is capped there.
    static const int logical = (int) std::max(1u, std::thread::hardware_concurrency());
    static const int default_threads = physical_cores();
    return requested > 0 ? std::min(requested, logical) : default_threads;
}

void ModelImpl::set_n_threads(int n) { n_threads_ = thread_count(n); }

static int64_t bounded(const GGUFFile & f, const std::string & key, std::optional<int64_t> v,
                       int64_t lo, int64_t hi) {
    if (!v) f.fail("missing key " + key);
    if (*v < lo || *v > hi)
        f.fail("key " + key + " = " + std::to_string(*v) + " is outside [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "]");
    return *v;
}

void ModelImpl::read_hparams() {
    const GGUFFile & f = *file_;
    const Identity id = identify(f);
    const DialectKeys & K = *id.keys;
    auto key = [&](const char * tmpl) { return key_for(tmpl, id.arch_key); };
    auto int_key = [&](const char * tmpl, int64_t lo, int64_t hi) {
        const std::string k = key(tmpl);
        return bounded(f, k, f.get_int(k), lo, hi);
    };

    arch_ = id.arch;
    hp_.family = id.arch->family;
    hp_.arch = id.arch->name;
    hp_.dialect = K.dialect;
    if (hp_.family == Family::DiffusionGemma) return read_gemma_hparams(id.arch_key);
    hp_.n_layer = int_key(K.block_count, 1, 1024);
    hp_.n_embd = int_key(K.embedding_length, 1, 1 << 17);
    hp_.n_head = int_key(K.head_count, 1, 4096);
    hp_.n_head_kv = f.has(key(K.head_count_kv)) ? int_key(K.head_count_kv, 1, 4096) : hp_.n_head;
    // A MoE file's feed_forward_length (the unused dense width) may be absent.
    hp_.n_ff = arch_->moe && !f.has(key(K.feed_forward_length)) ? 0 : int_key(K.feed_forward_length, 1, 1 << 20);
    hp_.n_ctx_train = f.has(key(K.context_length)) ? int_key(K.context_length, 1, 1 << 24) : 4096;
    // Qwen3 (SDAR) states its head size, which need not be n_embd / n_head (SDAR-4B: 2560 / 32 heads of 128).
    if (K.head_dim && f.has(key(K.head_dim))) {
        hp_.head_dim = int_key(K.head_dim, 2, 1 << 12);
    } else {
        if (hp_.n_embd % hp_.n_head != 0) f.fail("embedding length is not a multiple of the head count");
        hp_.head_dim = hp_.n_embd / hp_.n_head;
    }
    if (hp_.n_head % hp_.n_head_kv != 0) f.fail("head count is not a multiple of the KV head count");
    if (hp_.head_dim % 2 != 0) f.fail("head dimension must be even for RoPE");

    const std::string theta_key = key(K.rope_freq_base);
    const std::string eps_key = key(K.rms_eps);
    hp_.rope_theta = (float) f.get_float(theta_key).value_or(hp_.family == Family::LLaDA ? 500000.0 : 1000000.0);
    hp_.rms_eps = (float) f.get_float(eps_key).value_or(hp_.family == Family::LLaDA ? 1e-5 : 1e-6);
    if (!(hp_.rope_theta > 0 && std::isfinite(hp_.rope_theta))) f.fail("key " + theta_key + " must be a positive number");
    if (!(hp_.rms_eps > 0 && hp_.rms_eps < 1)) f.fail("key " + eps_key + " must be in (0, 1)");

    // An optional key of this dialect, within bounds, or its default.
    auto opt_int = [&](const char * tmpl, int64_t lo, int64_t hi, int64_t dflt) {
        return tmpl && f.has(key(tmpl)) ? int_key(tmpl, lo, hi) : dflt;
    };
    hp_.expert_weights_scale = 1.0f;
    hp_.n_expert_groups = hp_.n_group_used = 1;
    if (arch_->moe) {
        // Bounds first, so a hostile header never sizes a tensor: 0 experts, more used than exist.
        hp_.n_expert = int_key(K.expert_count, 1, 4096);
        hp_.n_expert_used = int_key(K.expert_used_count, 1, hp_.n_expert);
        // llama.cpp falls back to n_ff / n_expert_used when the expert width is not stated.
        hp_.n_ff_exp = f.has(key(K.expert_ff_length)) ? int_key(K.expert_ff_length, 1, 1 << 20)
                                                      : hp_.n_ff / hp_.n_expert_used;
        if (hp_.n_ff_exp < 1) f.fail("missing key " + key(K.expert_ff_length));
        hp_.router_sigmoid = opt_int(K.expert_gating_func, 1, 2, arch_->router_bias ? 2 : 1) == 2;
        if (arch_->router_bias != hp_.router_sigmoid)
            f.fail("key " + key(K.expert_gating_func) + ": " + arch_->name + " routes by " +
                   (arch_->router_bias ? "sigmoid (2)" : "softmax (1)"));
        // Group-limited top-k: groups scored by the sum of their best two, top-k inside the kept ones.
        hp_.n_expert_groups = opt_int(K.expert_group_count, 1, hp_.n_expert, 1);
        hp_.n_group_used = opt_int(K.expert_group_used_count, 1, hp_.n_expert_groups, hp_.n_expert_groups);
        const int64_t group = hp_.n_expert / hp_.n_expert_groups;
        if (hp_.n_expert % hp_.n_expert_groups != 0)
            f.fail(std::to_string(hp_.n_expert) + " experts do not split into " + std::to_string(hp_.n_expert_groups) +
                   " equal groups (" + key(K.expert_group_count) + ")");
        if (hp_.n_expert_groups > 1 && group < 2)
            f.fail(key(K.expert_group_count) + " = " + std::to_string(hp_.n_expert_groups) +
                   ": a group is scored by its best two experts, so it needs at least two");
        if (hp_.n_expert_used > hp_.n_group_used * group)
            f.fail(key(K.expert_used_count) + " = " + std::to_string(hp_.n_expert_used) + " exceeds the " +
                   std::to_string(hp_.n_group_used * group) + " experts of the " + std::to_string(hp_.n_group_used) +
                   " groups kept (" + key(K.expert_group_used_count) + ")");
        hp_.expert_weights_norm = K.expert_weights_norm && f.has(key(K.expert_weights_norm)) &&
                                  *f.get_bool(key(K.expert_weights_norm));
        if (K.expert_weights_scale && f.has(key(K.expert_weights_scale))) {
            const double scale = *f.get_float(key(K.expert_weights_scale));
            if (!(scale > 0 && scale < 1e6)) f.fail("key " + key(K.expert_weights_scale) + " must be in (0, 1e6)");
            hp_.expert_weights_scale = (float) scale;
        }
        hp_.n_expert_shared = opt_int(K.expert_shared_count, 0, 64, 0);
        // As llama.cpp: the shared experts run as one SwiGLU of their widths together.
        hp_.n_ff_shexp = opt_int(K.expert_shared_ff_length, 1, 1 << 20, hp_.n_ff_exp) * hp_.n_expert_shared;
        hp_.n_layer_dense = opt_int(K.leading_dense_block_count, 0, hp_.n_layer, 0);
        if (hp_.n_layer_dense > 0 && hp_.n_ff < 1) f.fail("missing key " + key(K.feed_forward_length));
    }
    hp_.qk_norm = arch_->qk_norm;
    hp_.n_rot = opt_int(K.rope_dim, 2, hp_.head_dim, hp_.head_dim);
    if (hp_.n_rot % 2 != 0) f.fail("key " + key(K.rope_dim) + " must be even");
    read_rope_scaling(key);

    // llama.cpp's LLaDA converter permutes q/k like Llama, so those files (and ours, which follow
    // them, Stable-DiffCoder's Llama blocks too) rotate interleaved pairs; diffuse-cpp's unpermuted LLaDA, LLaDA-MoE and every Dream
    // use NEOX.
    const bool permuted = arch_->build == build_llada && K.dialect != Dialect::DiffuseCpp;
    hp_.rope_mode = permuted ? 0 : GGML_ROPE_TYPE_NEOX;

    hp_.shift_logits = arch_->shift_logits;
    if (K.shift_logits && f.has(K.shift_logits)) hp_.shift_logits = *f.get_bool(K.shift_logits);

    const std::string mask_key = key(K.mask_token_id);
    if (f.has(mask_key)) {
        hp_.mask_token_id = (int32_t) bounded(f, mask_key, f.get_int(mask_key), 0, INT32_MAX);
    } else if (arch_->default_mask_id >= 0) {
        hp_.mask_token_id = arch_->default_mask_id;
    } else {
        f.fail("missing mask token id (" + mask_key + ")");
    }
    hp_.file_type = (int32_t) f.get_int("general.file_type").value_or(-1);

    hp_.block_size = 0;
    hp_.sub_block_size = 0;
    if (arch_->block_diffusion) {
        const std::string block_key = K.block_size ? key(K.block_size) : "diffusion.block_size";
        if (!f.has(block_key)) f.fail("missing key " + block_key + ": a block-diffusion model must state its block size");
        hp_.block_size = (int) int_key(K.block_size, 1, hp_.n_ctx_train);
        if (f.has("diffusion.sub_block_size"))
            hp_.sub_block_size = (int) int_key("diffusion.sub_block_size", 1, hp_.block_size);
    }
    // The block it was trained on, for the causal-cache loops (loops/causal.cpp), not a block-causal mask.
    hp_.trained_block = arch_->build == build_nemotron_diffusion ? (int) int_key("diffusion.block_size", 1, hp_.n_ctx_train) : 0;
    // The draft LoRA's scale (its rank comes with its tensors, bind_weights).
    hp_.draft_lora_rank = 0;
    hp_.draft_lora_scale = 0.0f;
    if (f.has("diffusion.draft_lora.scale")) {
        const double scale = *f.get_float("diffusion.draft_lora.scale");
        if (!(std::isfinite(scale) && std::fabs(scale) < 1e6)) f.fail("key diffusion.draft_lora.scale must be a finite number");
        hp_.draft_lora_scale = (float) scale;
    }
    const LayerShape every{hp_.head_dim, hp_.n_head_kv, hp_.n_rot, hp_.rope_theta,
                           1.0f / std::sqrt((float) hp_.head_dim), false, false};
    layers_.assign(hp_.n_layer, every);
}

// DiffusionGemma's keys (llama.cpp PR #24423): per-layer KV heads and sliding pattern, the full
// layers' head size / RoPE under the plain keys and the sliding layers' under *_swa.
void ModelImpl::read_gemma_hparams(const std::string & arch_key) {
    const GGUFFile & f = *file_;
    auto key = [&](const char * tmpl) { return key_for(tmpl, arch_key); };
    auto int_key = [&](const char * tmpl, int64_t lo, int64_t hi) {
        return bounded(f, key(tmpl), f.get_int(key(tmpl)), lo, hi);
    };
    auto float_key = [&](const char * tmpl, double dflt, double lo, double hi) {
        const double v = f.get_float(key(tmpl)).value_or(dflt);
        if (!(v > lo && v <= hi)) f.fail("key " + key(tmpl) + " = " + std::to_string(v) + " is outside (" +
                                         std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return (float) v;
    };
    hp_.n_layer = int_key("{arch}.block_count", 1, 1024);
    hp_.n_embd = int_key("{arch}.embedding_length", 1, 1 << 17);
    hp_.n_head = int_key("{arch}.attention.head_count", 1, 4096);
    hp_.n_ff = int_key("{arch}.feed_forward_length", 1, 1 << 20);
    hp_.n_ctx_train = f.has(key("{arch}.context_length")) ? int_key("{arch}.context_length", 1, 1 << 24) : 131072;
    hp_.n_expert = int_key("{arch}.expert_count", 1, 4096);
    hp_.n_expert_used = int_key("{arch}.expert_used_count", 1, hp_.n_expert);
    hp_.n_ff_exp = int_key("{arch}.expert_feed_forward_length", 1, 1 << 20);
    hp_.n_expert_groups = hp_.n_group_used = 1;
    hp_.expert_weights_norm = true;   // top-k renormalised, then x per_expert_scale
    hp_.expert_weights_scale = 1.0f;
    hp_.qk_norm = true;
    hp_.rope_mode = GGML_ROPE_TYPE_NEOX;
    hp_.rms_eps = float_key("{arch}.attention.layer_norm_rms_epsilon", 1e-6, 0, 1);
    hp_.logit_softcap = f.has(key("{arch}.final_logit_softcapping"))
                            ? float_key("{arch}.final_logit_softcapping", 0, 0, 1e6) : 0.0f;
    hp_.n_swa = (int) int_key("{arch}.attention.sliding_window", 1, hp_.n_ctx_train);
    // PR #24423's converter writes Gemma 4's KV sharing and per-layer inputs as 0: Gemma 3n's
    // features, which DiffusionGemma (and this graph) has not.
    for (const char * off : {"{arch}.attention.shared_kv_layers", "{arch}.embedding_length_per_layer_input"})
        if (f.has(key(off)) && int_key(off, 0, INT32_MAX) != 0)
            f.fail("key " + key(off) + " is not 0: a Gemma 3n feature DiffusionGemma does not have");
    hp_.canvas_length = (int) bounded(f, "diffusion.canvas_length", f.get_int("diffusion.canvas_length"), 1,
                                      hp_.n_ctx_train);
    const std::string mask_key = "tokenizer.ggml.mask_token_id";
    hp_.mask_token_id = f.has(mask_key) ? (int32_t) bounded(f, mask_key, f.get_int(mask_key), 0, INT32_MAX) : 0;
    hp_.file_type = (int32_t) f.get_int("general.file_type").value_or(-1);

    const size_t n = (size_t) hp_.n_layer;
    const auto kv = f.get_int_array(key("{arch}.attention.head_count_kv"), n);
    const auto swa = f.get_int_array(key("{arch}.attention.sliding_window_pattern"), n);
    if (!kv) f.fail("missing key " + key("{arch}.attention.head_count_kv"));
    if (!swa) f.fail("missing key " + key("{arch}.attention.sliding_window_pattern"));
    const int64_t hd = int_key("{arch}.attention.key_length", 2, 1 << 12);
    const int64_t hd_swa = int_key("{arch}.attention.key_length_swa", 2, 1 << 12);
    for (const char * v : {"{arch}.attention.value_length", "{arch}.attention.value_length_swa"})
        if (f.has(key(v)) && int_key(v, 1, 1 << 12) != (std::string(v).find("swa") != std::string::npos ? hd_swa : hd))
            f.fail("key " + key(v) + " differs from the key length: diffuse runs K and V of one size");
    const float theta = float_key("{arch}.rope.freq_base", 1e6, 0, 1e12);
    const float theta_swa = float_key("{arch}.rope.freq_base_swa", 1e4, 0, 1e12);
    const int64_t rot = f.has(key("{arch}.rope.dimension_count")) ? int_key("{arch}.rope.dimension_count", 2, hd) : hd;
    const int64_t rot_swa = f.has(key("{arch}.rope.dimension_count_swa"))
                                ? int_key("{arch}.rope.dimension_count_swa", 2, hd_swa) : hd_swa;
    if (hd % 2 || hd_swa % 2 || rot % 2 || rot_swa % 2) f.fail("head and RoPE dimensions must be even");
    for (size_t il = 0; il < n; ++il) {
        const bool sliding = (*swa)[il] != 0;
        const int64_t heads = (*kv)[il];
        if (heads < 1 || heads > hp_.n_head || hp_.n_head % heads)
            f.fail("layer " + std::to_string(il) + ": " + std::to_string(heads) + " KV heads do not divide the " +
                   std::to_string(hp_.n_head) + " heads (" + key("{arch}.attention.head_count_kv") + ")");
        layers_.push_back({sliding ? hd_swa : hd, heads, sliding ? rot_swa : rot, sliding ? theta_swa : theta,
                           1.0f, sliding, !sliding});
    }
    if (swa->back()) f.fail("the last layer is a sliding one; DiffusionGemma's last layer attends to everything");
    // The full layers' geometry stands for the model where one value is asked for (info, the cache).
    const LayerShape & full = layers_.back();
    hp_.head_dim = full.head_dim;
    hp_.n_head_kv = full.n_head_kv;
    hp_.n_rot = full.n_rot;
    hp_.rope_theta = full.rope_theta;
    read_rope_scaling(key);
}

// llama.cpp's keys: {arch}.rope.scaling.type "yarn" with factor, original_context_length,
// yarn_beta_fast/slow and attn_factor (transformers' attention_factor: cos and sin are multiplied by
// it); {arch}.attention.temperature_scale / temperature_length for the llama-4 query scale.
// Nemotron-Labs-Diffusion's file must have both (its converter refuses a config without them).
void ModelImpl::read_rope_scaling(const std::function<std::string(const char *)> & key) {
    const GGUFFile & f = *file_;
    hp_.rope_yarn = false;
    hp_.rope_freq_scale = hp_.rope_attn_factor = 1.0f;
    hp_.attn_temp_scale = 0.0f;
    hp_.attn_temp_length = 1;
    const bool nemotron = hp_.family == Family::NemotronDiffusion;
    auto number = [&](const char * tmpl, double lo, double hi) {
        const std::string k = key(tmpl);
        const std::optional<double> v = f.get_float(k);
        if (!v) f.fail("missing key " + k + (nemotron ? " (Nemotron-Labs-Diffusion uses YaRN RoPE)" : ""));
        if (!(*v >= lo && *v <= hi)) f.fail("key " + k + " = " + std::to_string(*v) + " is outside [" +
                                            std::to_string(lo) + ", " + std::to_string(hi) + "]");
        return *v;
    };
    const std::string type_key = key("{arch}.rope.scaling.type");
    const std::optional<std::string> type = f.get_string(type_key);
    if (type && *type != "yarn" && *type != "none")
        f.fail("key " + type_key + " = '" + *type + "': the engine runs YaRN or plain RoPE only");
    if (nemotron && type != std::string("yarn"))
        f.fail("missing key " + type_key + " = 'yarn': Nemotron-Labs-Diffusion uses YaRN RoPE");
    if (type == std::string("yarn")) {
        hp_.rope_yarn = true;
        hp_.rope_freq_scale = (float) (1.0 / number("{arch}.rope.scaling.factor", 1.0, 1e6));
        hp_.rope_orig_ctx = (int64_t) number("{arch}.rope.scaling.original_context_length", 1, 1 << 24);
        hp_.rope_beta_fast = (float) number("{arch}.rope.scaling.yarn_beta_fast", 0, 1e6);
        hp_.rope_beta_slow = (float) number("{arch}.rope.scaling.yarn_beta_slow", 0, 1e6);
        hp_.rope_attn_factor = (float) number("{arch}.rope.scaling.attn_factor", 1e-6, 1e6);
    }
    if (nemotron || f.has(key("{arch}.attention.temperature_scale"))) {
        hp_.attn_temp_scale = (float) number("{arch}.attention.temperature_scale", 0, 1e6);
        hp_.attn_temp_length = (int64_t) number("{arch}.attention.temperature_length", 1, 1 << 24);
    }
}

// Types the CPU matrix product handles for weights; anything else is refused at load.
static bool is_supported_weight_type(ggml_type t) {
    switch (t) {
        case GGML_TYPE_F32: case GGML_TYPE_F16: case GGML_TYPE_BF16:
        case GGML_TYPE_Q4_0: case GGML_TYPE_Q4_1: case GGML_TYPE_Q5_0: case GGML_TYPE_Q5_1: case GGML_TYPE_Q8_0:
        case GGML_TYPE_Q2_K: case GGML_TYPE_Q3_K: case GGML_TYPE_Q4_K: case GGML_TYPE_Q5_K: case GGML_TYPE_Q6_K:
            return true;
        default:
            return false;
    }
}

void ModelImpl::bind_weights(bool repack) {
    const GGUFFile & f = *file_;
    ggml_context * meta = f.tensors();
    gguf_context * g = f.gguf();

    map_ = std::make_unique<FileMapping>(f);
    weight_buf_ = ggml_backend_cpu_buffer_from_ptr(map_->addr(), map_->size());
    if (!weight_buf_) f.fail("cannot wrap the mapped file in a ggml buffer");

    // Where each tensor's data starts in the mapping; all of it must lie inside the file.
    std::map<ggml_tensor *, char *> data;
    const size_t data_offset = f.data_offset();
    const int64_t n_tensors = gguf_get_n_tensors(g);
    for (int64_t i = 0; i < n_tensors; ++i) {
        const char * name = gguf_get_tensor_name(g, i);
        ggml_tensor * t = ggml_get_tensor(meta, name);
        const uint64_t begin = (uint64_t) data_offset + gguf_get_tensor_offset(g, i);
        const uint64_t nbytes = ggml_nbytes(t);
        if (begin > map_->size() || nbytes > map_->size() - begin)
            f.fail(std::string("tensor ") + name + " lies past the end of the file (truncated download?)");
        data[t] = (char *) map_->addr() + begin;
        weights_bytes_ += nbytes;
    }

    const HParams & hp = hp_;
    // Looks a tensor up and checks its shape (ggml order) and type.
    auto get = [&](const std::string & name, std::initializer_list<int64_t> shape, bool matrix,
                   bool required = true) -> ggml_tensor * {
        ggml_tensor * t = ggml_get_tensor(meta, name.c_str());
        if (!t) {
            if (required) f.fail("missing tensor " + name);
            return nullptr;
        }
        int d = 0;
        for (int64_t n : shape) {
            if (t->ne[d] != n) {
                std::string want, got;
                for (int64_t s : shape) want += (want.empty() ? "" : ", ") + std::to_string(s);
                for (int k = 0; k < ggml_n_dims(t); ++k) got += (got.empty() ? "" : ", ") + std::to_string(t->ne[k]);
                f.fail("tensor " + name + " has shape [" + got + "], expected [" + want + "]");
            }
            ++d;
        }
        for (; d < GGML_MAX_DIMS; ++d)
            if (t->ne[d] != 1) f.fail("tensor " + name + " has too many dimensions");
        const bool vector_ok = t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_BF16;
        if (matrix ? !is_supported_weight_type(t->type) : !vector_ok)
            f.fail("tensor " + name + " has unsupported type " + ggml_type_name(t->type));
        return t;
    };

    // The vocabulary size is the embedding's row count.
    ggml_tensor * embd = ggml_get_tensor(meta, tensor_names::token_embd);
    if (!embd) f.fail(std::string("missing tensor ") + tensor_names::token_embd);
    hp_.n_vocab = embd->ne[1];
    if (hp_.n_vocab < 2 || hp_.n_vocab > (1 << 24)) f.fail("vocabulary size out of range");
    if (hp_.mask_token_id >= hp_.n_vocab)
        f.fail("mask token id " + std::to_string(hp_.mask_token_id) + " is outside the vocabulary (" +
               std::to_string(hp_.n_vocab) + ")");

    const int64_t n_embd = hp.n_embd, n_q = hp.n_head * hp.head_dim, n_kv = hp.n_head_kv * hp.head_dim;
    w_.tok_embd = get(tensor_names::token_embd, {n_embd, hp.n_vocab}, true);
    w_.output_norm = get(tensor_names::output_norm, {n_embd}, false);
    w_.output = get(tensor_names::output, {n_embd, hp.n_vocab}, true, /*required*/ false);
    if (!w_.output) w_.output = w_.tok_embd;   // tied embeddings
    const bool biases = arch_->qkv_bias;
    const bool gemma = hp.family == Family::DiffusionGemma;
    // A 1-element F32/F16 tensor's value (DiffusionGemma's layer scalars).
    auto scalar = [&](ggml_tensor * t) {
        const char * p = data.at(t);
        return t->type == GGML_TYPE_F32 ? *(const float *) p
             : t->type == GGML_TYPE_F16 ? ggml_fp16_to_fp32(*(const ggml_fp16_t *) p)
                                        : ggml_bf16_to_fp32(*(const ggml_bf16_t *) p);
    };
    if (gemma) {
        w_.rope_freqs = get("rope_freqs.weight", {hp.head_dim / 2}, false);
        if (w_.rope_freqs->type != GGML_TYPE_F32) f.fail("tensor rope_freqs.weight must be F32");
        w_.sc_pre_norm = get("self_cond_pre_norm.weight", {n_embd}, false);
        w_.sc_gate = get("self_cond_gate.weight", {n_embd, hp.n_ff}, true);
        w_.sc_up = get("self_cond_up.weight", {n_embd, hp.n_ff}, true);
        w_.sc_down = get("self_cond_down.weight", {hp.n_ff, n_embd}, true);
    }
    for (int il = 0; il < hp.n_layer; ++il) {
        auto n = [&](const char * what) { return tensor_names::blk(il, what); };
        LayerWeights L{};
        if (gemma) {
            // Gemma 4 block (models/diffusion_gemma.cpp): its own geometry per layer.
            const LayerShape & s = layers_[il];
            const int64_t q = hp.n_head * s.head_dim, kv = s.kv_row(), E = hp.n_expert, ff = hp.n_ff_exp;
            L.attn_norm = get(n("attn_norm.weight"), {n_embd}, false);
            L.wq = get(n("attn_q.weight"), {n_embd, q}, true);
            L.wk = get(n("attn_k.weight"), {n_embd, kv}, true);
            L.wv = get(n("attn_v.weight"), {n_embd, kv}, true, /*required*/ !s.kv_shared);
            if (s.kv_shared && L.wv)
                f.fail("layer " + std::to_string(il) + " is a full-attention layer (K = V) but has tensor " +
                       n("attn_v.weight"));
            L.attn_q_norm = get(n("attn_q_norm.weight"), {s.head_dim}, false);
            L.attn_k_norm = get(n("attn_k_norm.weight"), {s.head_dim}, false);
            L.wo = get(n("attn_output.weight"), {q, n_embd}, true);
            L.attn_post_norm = get(n("post_attention_norm.weight"), {n_embd}, false);
            L.ffn_norm = get(n("ffn_norm.weight"), {n_embd}, false);
            L.ffn_gate = get(n("ffn_gate.weight"), {n_embd, hp.n_ff}, true);
            L.ffn_up = get(n("ffn_up.weight"), {n_embd, hp.n_ff}, true);
            L.ffn_down = get(n("ffn_down.weight"), {hp.n_ff, n_embd}, true);
            L.ffn_post_norm_1 = get(n("post_ffw_norm_1.weight"), {n_embd}, false);
            L.ffn_pre_norm_2 = get(n("pre_ffw_norm_2.weight"), {n_embd}, false);
            L.ffn_gate_inp = get(n("ffn_gate_inp.weight"), {n_embd, E}, true);
            L.ffn_gate_inp_s = get(n("ffn_gate_inp.scale"), {n_embd}, false);
            L.ffn_gate_up_exps = get(n("ffn_gate_up_exps.weight"), {n_embd, 2 * ff, E}, true);
            L.ffn_down_exps = get(n("ffn_down_exps.weight"), {ff, n_embd, E}, true);
            L.ffn_down_exps_s = get(n("ffn_down_exps.scale"), {E}, false);
            L.ffn_post_norm_2 = get(n("post_ffw_norm_2.weight"), {n_embd}, false);
            L.ffn_post_norm = get(n("post_ffw_norm.weight"), {n_embd}, false);
            L.out_scale = scalar(get(n("layer_output_scale.weight"), {1}, false));
            L.enc_out_scale = scalar(get(n("enc_layer_output_scale.weight"), {1}, false));
            for (ggml_tensor * t : {L.wq, L.wk, L.wv, L.wo, L.ffn_gate, L.ffn_up, L.ffn_down})
                if (t) layer_matmul_params_ += t->ne[0] * t->ne[1];
            layer_matmul_params_ += n_embd * E + 3 * hp.n_expert_used * n_embd * ff;
            w_.layers.push_back(L);
            continue;
        }
        L.attn_norm = get(n("attn_norm.weight"), {n_embd}, false);
        if (arch_->fused_qkv) {
            L.wqkv = get(n("attn_qkv.weight"), {n_embd, n_q + 2 * n_kv}, true);
            layer_matmul_params_ += L.wqkv->ne[0] * L.wqkv->ne[1];
        } else {
            L.wq = get(n("attn_q.weight"), {n_embd, n_q}, true);
            L.wk = get(n("attn_k.weight"), {n_embd, n_kv}, true);
            L.wv = get(n("attn_v.weight"), {n_embd, n_kv}, true);
            for (ggml_tensor * t : {L.wq, L.wk, L.wv}) layer_matmul_params_ += t->ne[0] * t->ne[1];
        }
        L.bq = get(n("attn_q.bias"), {n_q}, false, biases);
        L.bk = get(n("attn_k.bias"), {n_kv}, false, biases);
        L.bv = get(n("attn_v.bias"), {n_kv}, false, biases);
        L.wo = get(n("attn_output.weight"), {n_q, n_embd}, true);
        // The draft LoRA: in every layer or in none, of one rank (the first layer's).
        ggml_tensor * lora_a = ggml_get_tensor(meta, n("attn_output.weight.lora_a").c_str());
        if (il == 0) hp_.draft_lora_rank = lora_a ? (int) lora_a->ne[1] : 0;
        if ((lora_a != nullptr) != (hp_.draft_lora_rank > 0))
            f.fail("a draft LoRA in some layers only: tensor " + n("attn_output.weight.lora_a") +
                   (lora_a ? " is there, layer 0's is not" : " is missing") + " (it must be in every layer or in none)");
        if (lora_a) {
            L.wo_lora_a = get(n("attn_output.weight.lora_a"), {n_q, hp_.draft_lora_rank}, true);
            L.wo_lora_b = get(n("attn_output.weight.lora_b"), {hp_.draft_lora_rank, n_embd}, true);
        }
        L.ffn_norm = get(n("ffn_norm.weight"), {n_embd}, false);
        if (hp.qk_norm) {
            L.attn_q_norm = get(n("attn_q_norm.weight"), {hp.head_dim}, false);
            L.attn_k_norm = get(n("attn_k_norm.weight"), {hp.head_dim}, false);
        }
        layer_matmul_params_ += L.wo->ne[0] * L.wo->ne[1];
        if (hp.moe() && il >= hp.n_layer_dense) {
            const int64_t E = hp.n_expert, ff = hp.n_ff_exp;
            L.ffn_gate_inp = get(n("ffn_gate_inp.weight"), {n_embd, E}, true);
            L.exp_probs_b = get(n("exp_probs_b.bias"), {E}, false, arch_->router_bias);
            L.ffn_gate_exps = get(n("ffn_gate_exps.weight"), {n_embd, ff, E}, true);
            L.ffn_up_exps = get(n("ffn_up_exps.weight"), {n_embd, ff, E}, true);
            L.ffn_down_exps = get(n("ffn_down_exps.weight"), {ff, n_embd, E}, true);
            // What one position multiplies: the router and its k experts.
            layer_matmul_params_ += n_embd * E + 3 * hp.n_expert_used * n_embd * ff;
            if (hp.n_expert_shared > 0) {
                L.ffn_gate_shexp = get(n("ffn_gate_shexp.weight"), {n_embd, hp.n_ff_shexp}, true);
                L.ffn_up_shexp = get(n("ffn_up_shexp.weight"), {n_embd, hp.n_ff_shexp}, true);
                L.ffn_down_shexp = get(n("ffn_down_shexp.weight"), {hp.n_ff_shexp, n_embd}, true);
                layer_matmul_params_ += 3 * n_embd * hp.n_ff_shexp;
            }
        } else {
            L.ffn_gate = get(n("ffn_gate.weight"), {n_embd, hp.n_ff}, true);
            L.ffn_up = get(n("ffn_up.weight"), {n_embd, hp.n_ff}, true);
            L.ffn_down = get(n("ffn_down.weight"), {hp.n_ff, n_embd}, true);
            for (ggml_tensor * t : {L.ffn_gate, L.ffn_up, L.ffn_down}) layer_matmul_params_ += t->ne[0] * t->ne[1];
        }
        w_.layers.push_back(L);
    }
    if (hp_.draft_lora_rank > 0 && !f.has("diffusion.draft_lora.scale"))
        f.fail("missing key diffusion.draft_lora.scale: the file has a draft LoRA");

    // Norms and biases take part in element-wise ops with F32 activations: diffuse-cpp's F16 files
    // store them in F16, so such vectors get F32 copies.
    std::vector<ggml_tensor **> vectors = {&w_.output_norm};
    if (w_.sc_pre_norm) vectors.push_back(&w_.sc_pre_norm);
    if (gemma) transpose_embedding(data.at(w_.tok_embd));
    for (LayerWeights & L : w_.layers)
        for (ggml_tensor ** v : {&L.attn_norm, &L.ffn_norm, &L.bq, &L.bk, &L.bv, &L.attn_q_norm, &L.attn_k_norm,
                                 &L.exp_probs_b, &L.attn_post_norm, &L.ffn_post_norm_1, &L.ffn_pre_norm_2,
                                 &L.ffn_post_norm_2, &L.ffn_post_norm, &L.ffn_gate_inp_s, &L.ffn_down_exps_s})
            if (*v) vectors.push_back(v);
    widen_vectors(vectors, data);

    // Placement: quantised matrices that ggml can repack are copied into the repack buffer; every
    // other tensor is used in place from the mapping. The token embedding stays mapped (get_rows).
    std::vector<ggml_tensor *> to_repack;
    if (repack) {
        std::vector<ggml_tensor *> matrices;
        for (const LayerWeights & L : w_.layers)
            for (ggml_tensor * t : {L.wq, L.wk, L.wv, L.wqkv, L.wo, L.ffn_gate, L.ffn_up, L.ffn_down,
                                    L.ffn_gate_shexp, L.ffn_up_shexp, L.ffn_down_shexp})
                if (t) matrices.push_back(t);   // the 3-D expert tensors stay mapped
        if (w_.output != w_.tok_embd) matrices.push_back(w_.output);
        for (ggml_tensor * t : matrices)
            if (can_repack(t)) to_repack.push_back(t);
    }
    for (auto & [t, addr] : data)
        if (std::find(to_repack.begin(), to_repack.end(), t) == to_repack.end())
            ggml_backend_tensor_alloc(weight_buf_, t, addr);
    if (to_repack.empty()) return;

    ggml_backend_buffer_type * buft = cpu_repack_buffer_type();
    const size_t align = ggml_backend_buft_get_alignment(buft);
    size_t total = align;
    for (ggml_tensor * t : to_repack) total += GGML_PAD(ggml_backend_buft_get_alloc_size(buft, t), align);
    repack_buf_ = ggml_backend_buft_alloc_buffer(buft, total);
    if (!repack_buf_) f.fail("out of memory repacking the weights (" + std::to_string(total >> 20) + " MiB)");
    ggml_tallocr talloc = ggml_tallocr_new(repack_buf_);
    for (ggml_tensor * t : to_repack) ggml_tallocr_alloc(&talloc, t);

    // Convert in parallel, one tensor per task; then drop the source pages from this process's
    // resident set (they stay in the page cache) so memory is counted once.
    const int n_workers = (int) std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
    std::vector<std::thread> workers;
    std::atomic<size_t> next{0};
    for (int wkr = 0; wkr < n_workers; ++wkr) {
        workers.emplace_back([&] {
            for (size_t i; (i = next.fetch_add(1)) < to_repack.size();) {
                ggml_tensor * t = to_repack[i];
                ggml_backend_tensor_set(t, data[t], 0, ggml_nbytes(t));
                map_->release(data[t], ggml_nbytes(t));
            }
        });
    }
    for (std::thread & th : workers) th.join();
    for (ggml_tensor * t : to_repack) repacked_bytes_ += ggml_nbytes(t);
}

void ModelImpl::widen_vectors(std::vector<ggml_tensor **> & slots, const std::map<ggml_tensor *, char *> & data) {
    std::vector<ggml_tensor **> narrow;
    for (ggml_tensor ** slot : slots)
        if ((*slot)->type != GGML_TYPE_F32) narrow.push_back(slot);
    if (narrow.empty()) return;
    ggml_init_params ip = {ggml_tensor_overhead() * narrow.size(), nullptr, /*no_alloc*/ true};
    widened_ctx_ = ggml_init(ip);
    std::vector<ggml_tensor *> wide;
    for (ggml_tensor ** slot : narrow) wide.push_back(ggml_new_tensor_1d(widened_ctx_, GGML_TYPE_F32, (*slot)->ne[0]));
    widened_buf_ = ggml_backend_alloc_ctx_tensors_from_buft(widened_ctx_, ggml_backend_cpu_buffer_type());
    if (!widened_buf_) file_->fail("out of memory widening norm weights");
    for (size_t i = 0; i < narrow.size(); ++i) {
        const ggml_tensor * src = *narrow[i];
        const char * from = data.at(const_cast<ggml_tensor *>(src));
        float * to = (float *) wide[i]->data;
        if (src->type == GGML_TYPE_F16) ggml_fp16_to_fp32_row((const ggml_fp16_t *) from, to, src->ne[0]);
        else ggml_bf16_to_fp32_row((const ggml_bf16_t *) from, to, src->ne[0]);
        *narrow[i] = wide[i];
    }
}

void ModelImpl::transpose_embedding(const char * data) {
    const ggml_tensor * E = w_.tok_embd;
    const int64_t d = E->ne[0], V = E->ne[1];
    const ggml_type type = E->type == GGML_TYPE_F32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    ggml_init_params ip = {ggml_tensor_overhead(), nullptr, /*no_alloc*/ true};
    transposed_ctx_ = ggml_init(ip);
    w_.tok_embd_t = ggml_new_tensor_2d(transposed_ctx_, type, V, d);
    transposed_buf_ = ggml_backend_alloc_ctx_tensors_from_buft(transposed_ctx_, ggml_backend_cpu_buffer_type());
    if (!transposed_buf_) file_->fail("out of memory transposing the embedding for the self-conditioning");
    // Rows of E dequantised a block at a time, written as columns; blocks of rows on all cores.
    const ggml_to_float_t to_float = E->type == GGML_TYPE_F32 ? nullptr : ggml_get_type_traits(E->type)->to_float;
    const int64_t block = 256;
    const int n_workers = (int) std::max(1u, std::thread::hardware_concurrency());
    std::atomic<int64_t> next{0};
    std::vector<std::thread> workers;
    for (int k = 0; k < n_workers; ++k) {
        workers.emplace_back([&] {
            std::vector<float> rows((size_t) block * d);
            for (int64_t v0; (v0 = next.fetch_add(block)) < V;) {
                const int64_t n = std::min(block, V - v0);
                for (int64_t r = 0; r < n; ++r) {
                    const char * src = data + (v0 + r) * E->nb[1];
                    if (to_float) to_float(src, rows.data() + r * d, d);
                    else std::memcpy(rows.data() + r * d, src, d * sizeof(float));
                }
                for (int64_t j = 0; j < d; ++j) {
                    char * dst = (char *) w_.tok_embd_t->data + j * w_.tok_embd_t->nb[1] + v0 * ggml_type_size(type);
                    for (int64_t r = 0; r < n; ++r) {
                        const float x = rows[r * d + j];
                        if (type == GGML_TYPE_F32) ((float *) dst)[r] = x;
                        else ((ggml_fp16_t *) dst)[r] = ggml_fp32_to_fp16(x);
                    }
                }
            }
        });
    }
    for (std::thread & t : workers) t.join();
}

void ModelImpl::check_tokens(const int32_t * ids, size_t n) const {
    for (size_t i = 0; i < n; ++i)
        if (ids[i] < 0 || ids[i] >= hp_.n_vocab)
            throw Error("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                        " is outside the vocabulary [0, " + std::to_string(hp_.n_vocab) + ")");
}

void ModelImpl::forward_into(const std::vector<int32_t> & tokens, const std::vector<int32_t> & rows,
                             float * out, int block_size) const {
    const int n = (int) tokens.size();
    if (n == 0) throw Error("forward: no tokens");
    if (hp_.family == Family::DiffusionGemma)
        throw Error("forward: a DiffusionGemma model denoises a canvas over a context: give both (forward_canvas)");
    if (n > hp_.n_ctx_train)
        throw Error("forward: " + std::to_string(n) + " tokens exceed the model's context of " +
                    std::to_string(hp_.n_ctx_train));
    ContextLease ctx = lease();
    SequenceRows b;
    b.cache = &ctx->cache(0, n);
    b.tokens = tokens;
    b.n_kv = n;
    if (block_size >= 0 && !hp_.block_diffusion())
        throw Error("forward: block_size applies to block-diffusion models only");
    if (block_size == 0 || block_size > hp_.n_ctx_train) throw Error("forward: block_size out of range");
    b.attn_block = block_size > 0 ? block_size : hp_.block_size;   // the model's own pattern by default
    for (int i = 0; i < n; ++i) b.positions.push_back(i);
    b.out_rows = rows;
    if (rows.empty())
        for (int i = 0; i < n; ++i) b.out_rows.push_back(i);
    ctx->runner.run({b}, n_threads(), out);
    const size_t n_values = b.out_rows.size() * (size_t) hp_.n_vocab;
    for (size_t i = 0; i < n_values; ++i)
        if (!std::isfinite(out[i])) throw Error(path() + ": the forward pass produced NaN/Inf logits (corrupt weights?)");
}

void ModelImpl::forward_canvas(const std::vector<int32_t> & context, const std::vector<int32_t> & canvas,
                               const float * self_cond, float * out) const {
    if (hp_.family != Family::DiffusionGemma) throw Error("forward_canvas: only DiffusionGemma models denoise a canvas");
    const int L = (int) context.size(), C = (int) canvas.size();
    if (L == 0 || C == 0) throw Error("forward_canvas: the context and the canvas need at least one token each");
    if ((int64_t) L + C > hp_.n_ctx_train)
        throw Error("forward_canvas: " + std::to_string(L) + " context + " + std::to_string(C) +
                    " canvas tokens exceed the model's context of " + std::to_string(hp_.n_ctx_train));
    ContextLease ctx = lease();
    // The encoder writes the context's K/V (causal: blocks of one); the decoder's canvas rows go to
    // the rows after it, which the next encoder pass overwrites: what the context wrote is never touched.
    SequenceRows enc;
    enc.cache = &ctx->cache(0, L + C);
    enc.tokens = context;
    enc.n_kv = L;
    enc.attn_block = 1;
    for (int i = 0; i < L; ++i) enc.positions.push_back(i);
    enc.out_rows = {L - 1};
    std::vector<float> unused((size_t) hp_.n_vocab);
    ctx->runner.run({enc}, n_threads(), unused.data());
    SequenceRows dec;
    dec.cache = enc.cache;
    dec.tokens = canvas;
    dec.n_kv = L + C;
    dec.canvas = true;
    dec.self_cond = self_cond;
    for (int i = 0; i < C; ++i) {
        dec.positions.push_back(L + i);
        dec.out_rows.push_back(i);
    }
    ctx->runner.run({dec}, n_threads(), out);
    for (size_t i = 0; i < (size_t) C * hp_.n_vocab; ++i)
        if (!std::isfinite(out[i])) throw Error(path() + ": the forward pass produced NaN/Inf logits (corrupt weights?)");
}

}  // namespace diffuse
