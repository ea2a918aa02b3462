#include "options.h"

#include "schedulers.h"

#include <cmath>
#include <limits>
#include <sstream>

namespace diffuse {

namespace {

constexpr double BIG = 1 << 20;   // bounds counts that only memory and time limit
constexpr double SEED_MAX = 18446744073709551615.0;

#define NUM_FIELD(field, type)                                                         \
    [](const GenerateParams & p) { return (double) p.field; },                         \
    [](GenerateParams & p, double v) { p.field = (type) v; }, nullptr, nullptr, nullptr

// A choice between the values of an enum, by name: NAMES lists them in the enum's order.
template <typename E, const char * const * NAMES, size_t N>
struct EnumChoice {
    static std::vector<std::string> names() { return {NAMES, NAMES + N}; }
    static std::string name(E e) { return NAMES[(size_t) e]; }
    static E parse(const char * option, const std::string & v) {
        for (size_t i = 0; i < N; ++i)
            if (v == NAMES[i]) return (E) i;
        std::string all;
        for (size_t i = 0; i < N; ++i) all += (i ? ", " : "") + std::string(NAMES[i]);
        throw Error("unknown " + std::string(option) + " '" + v + "' (choose one of: " + all + ")");
    }
};

constexpr const char * CACHE_POLICY_NAMES[] = {"active", "prefix", "dual"};
constexpr const char * EOS_STOP_NAMES[] = {"none", "all_eos", "holds_eos", "prefix"};
constexpr const char * DECODING_NAMES[] = {"diffusion", "ar", "self_spec"};
using CachePolicyChoice = EnumChoice<CachePolicy, CACHE_POLICY_NAMES, 3>;
using EosStopChoice = EnumChoice<EosStop, EOS_STOP_NAMES, 4>;
using DecodingChoice = EnumChoice<Decoding, DECODING_NAMES, 3>;

#define ENUM_FIELD(field, Choice)                                                      \
    nullptr, nullptr, [](const GenerateParams & p) { return Choice::name(p.field); },  \
    [](GenerateParams & p, const std::string & v) { p.field = Choice::parse(#field, v); }, Choice::names

}  // namespace

const std::vector<OptionInfo> & generate_options() {
    static const std::vector<OptionInfo> table = {
        {"gen_length", OptionKind::Int, 1, BIG, false, false,
         "positions to generate after the prompt", NUM_FIELD(gen_length, int)},
        {"steps", OptionKind::Int, 1, BIG, false, false,
         "denoising step budget of the whole run (rounded down to a multiple of the block count; at most one step per position); "
         "block-diffusion models: steps per block",
         NUM_FIELD(steps, int)},
        {"block_length", OptionKind::Int, 0, BIG, false, false,
         "semi-autoregressive block size; 0 = one block over the whole answer (block-diffusion models: "
         "the model's own block size)", NUM_FIELD(block_length, int)},
        {"sub_block_length", OptionKind::Int, 0, BIG, false, false,
         "block-diffusion models: decode each block's masks one sub-block of this many positions after another, "
         "every pass still over the whole block (Fast-dLLM v2); 0 = the model's own (none for most models)",
         NUM_FIELD(sub_block_length, int)},
        {"scheduler", OptionKind::Choice, 0, 0, false, false, "which masked positions each step commits",
         nullptr, nullptr,
         [](const GenerateParams & p) { return std::string(scheduler_info(p.scheduler).name); },
         [](GenerateParams & p, const std::string & v) { p.scheduler = scheduler_by_name(v).id; },
         scheduler_names},
        {"threshold", OptionKind::Float, 0, 1e6, false, false,
         "entropy_exit tau, nats: commit every masked position whose entropy is below it (WeDLM: its entropy "
         "threshold, the position penalty added; none below it: the lowest alone)",
         NUM_FIELD(threshold, float)},
        {"confidence_threshold", OptionKind::Float, 0, 1, false, false,
         "low_confidence_dynamic and confidence_threshold tau, a probability: commit the positions whose "
         "x0 is at least this likely", NUM_FIELD(confidence_threshold, float)},
        {"entropy_budget", OptionKind::Float, 0, 1e6, false, false,
         "entropy_bounded budget, nats: commit the positions of lowest entropy while the sum of their entropies "
         "minus the largest stays within it", NUM_FIELD(entropy_budget, float)},
        {"factor", OptionKind::Float, 0, 1e6, true, false,
         "confidence_factor (Fast-dLLM's factor rule): commit the n most confident positions while the n-th is at "
         "least 1 - factor / (n + 1) likely", NUM_FIELD(factor, float)},
        {"carry_first", OptionKind::Bool, 0, 1, false, false,
         "models with shifted logits (Dream): commit each block's first position alone, from the row before it, "
         "before the block's other steps (Fast-dLLM's Dream; always on for Fast-dLLM v2)", NUM_FIELD(carry_first, bool)},
        {"cache", OptionKind::Bool, 0, 1, false, false,
         "inter-step K/V cache: recompute only active positions (block-diffusion models: exact, finished "
         "blocks are never recomputed)", NUM_FIELD(cache, bool)},
        {"keep_active", OptionKind::Int, 1, BIG, false, false,
         "steps a changed position stays recomputed after its change",
         NUM_FIELD(keep_active, int)},
        {"refresh_every", OptionKind::Int, 0, BIG, false, false,
         "full recompute every N steps; 0 = only at step 0, 1 = every step (exact)", NUM_FIELD(refresh_every, int)},
        {"cache_policy", OptionKind::Choice, 0, 0, false, false,
         "full-attention models, cache on: active = recompute masked and recently changed positions (the paper's); "
         "prefix = a full pass at each block's start, then the block and everything after it (Fast-dLLM PrefixCache); "
         "dual = a full pass at each block's start, then only the block (Fast-dLLM DualCache)",
         ENUM_FIELD(cache_policy, CachePolicyChoice)},
        {"suffix_window", OptionKind::Int, -1, BIG, false, false,
         "full-attention models: masked positions after the current block a step attends to (DPad); -1 = all, 0 = none",
         NUM_FIELD(suffix_window, int)},
        {"eos_stop", OptionKind::Choice, 0, 0, false, false,
         "when end-of-text ends the run early: none; all_eos = a finished block that is all end-of-text; holds_eos = a "
         "finished block holding one (dInfer); prefix = as soon as everything before an end-of-text is decided",
         ENUM_FIELD(eos_stop, EosStopChoice)},
        {"editing_threshold", OptionKind::Float, 0, 1, false, false,
         "block-diffusion models (LLaDA2.1's token-to-token editing): each step also replaces a committed answer "
         "token of the current block by x0 when x0 differs and is more than this likely; 1 = off",
         NUM_FIELD(editing_threshold, float)},
        {"max_post_steps", OptionKind::Int, 0, BIG, false, false,
         "with editing on: passes over a block after its last mask is committed, ending at the first that edits "
         "nothing; 0 = none", NUM_FIELD(max_post_steps, int)},
        {"temperature_end", OptionKind::Float, 0, 100, false, false,
         "DiffusionGemma: the temperature at a canvas's last step (it falls linearly from temperature)",
         NUM_FIELD(temperature_end, float)},
        {"stability", OptionKind::Int, 0, BIG, false, false,
         "DiffusionGemma: a canvas may stop once its argmax has not changed for this many steps (0: at once)",
         NUM_FIELD(stability, int)},
        {"stop_entropy", OptionKind::Float, 0, 1e6, true, false,
         "DiffusionGemma: ... and the mean entropy of its positions is below this, nats",
         NUM_FIELD(stop_entropy, float)},
        {"temperature", OptionKind::Float, 0, 100, false, false, "sampling temperature; 0 = greedy",
         NUM_FIELD(temperature, float)},
        {"top_k", OptionKind::Int, 0, 1 << 24, false, false, "keep the k most likely tokens; 0 = off",
         NUM_FIELD(top_k, int)},
        {"top_p", OptionKind::Float, 0, 1, true, false, "nucleus sampling mass; 1 = off", NUM_FIELD(top_p, float)},
        {"alg_temp", OptionKind::Float, 0, 100, false, false,
         "Dream: > 0 samples which positions to commit instead of taking the most confident",
         NUM_FIELD(alg_temp, float)},
        {"cfg_scale", OptionKind::Float, 0, 100, false, false,
         "classifier-free guidance scale (LLaDA); 0 = off, > 0 doubles the work per step",
         NUM_FIELD(cfg_scale, float)},
        {"eps", OptionKind::Float, 0, 1, true, true, "Dream timestep floor of the eps schedule",
         NUM_FIELD(eps, float)},
        {"seed", OptionKind::Seed, 0, SEED_MAX, false, false, "random seed (same tokens at any thread count)",
         NUM_FIELD(seed, uint64_t)},
        {"mode", OptionKind::Choice, 0, 0, false, false,
         "diffusion = the model's own loop; ar = one token per causal pass over the K/V cache (the same weights "
         "as an autoregressive model); self_spec = a bidirectional pass drafts a block, a causal pass verifies it "
         "(linear_spec_generate of NVIDIA's Nemotron diffusion models): exactly ar's answer, in fewer passes when "
         "drafts match",
         ENUM_FIELD(mode, DecodingChoice)},
        {"draft_length", OptionKind::Int, 1, BIG, false, false,
         "self_spec: rows of each draft and verify pass, the seed and draft_length - 1 drafted tokens "
         "(32 as NVIDIA's; 1 = ar)", NUM_FIELD(draft_length, int)},
        {"draft_lora", OptionKind::Bool, 0, 1, false, false,
         "self_spec: draft with the model's draft LoRA (Nemotron-Labs-Diffusion's linear_spec_lora, on o_proj) "
         "when its file has one; verify passes never use it, so the answer is the same either way",
         NUM_FIELD(draft_lora, bool)},
        {"window_size", OptionKind::Int, 1, BIG, false, false,
         "WeDLM: positions of the sliding window each causal pass decodes, beside the filled ones it commits "
         "(16 as Tencent's)", NUM_FIELD(window_size, int)},
        {"pos_penalty", OptionKind::Float, 0, 1e6, false, false,
         "WeDLM: added to a mask's entropy per position after the window's first mask before it is compared "
         "with threshold (0.02 as Tencent's)", NUM_FIELD(pos_penalty, float)},
    };
    return table;
}

#undef NUM_FIELD
#undef ENUM_FIELD

const OptionInfo & generate_option(const std::string & name) {
    for (const OptionInfo & o : generate_options())
        if (name == o.name) return o;
    std::string names;
    for (const OptionInfo & o : generate_options()) names += (names.empty() ? "" : ", ") + std::string(o.name);
    throw Error("unknown generation option '" + name + "' (options: " + names + ")");
}

std::string option_range_text(const OptionInfo & o) {
    std::ostringstream s;
    s.precision(10);
    switch (o.kind) {
        case OptionKind::Bool: return "true or false";
        case OptionKind::Choice: {
            std::string names;
            for (const std::string & n : o.choices()) names += (names.empty() ? "" : ", ") + n;
            return "one of: " + names;
        }
        case OptionKind::Seed: return "an integer in [0, 2^64 - 1]";
        case OptionKind::Int: s << "an integer in [" << (int64_t) o.lo << ", " << (int64_t) o.hi << "]"; break;
        case OptionKind::Float:
            s << "a number in " << (o.lo_open ? "(" : "[") << o.lo << ", " << o.hi << (o.hi_open ? ")" : "]");
            break;
    }
    return s.str();
}

void check_option(const OptionInfo & o, double v) {
    if (o.kind == OptionKind::Choice || o.kind == OptionKind::Bool) return;
    const bool integral = o.kind != OptionKind::Float;
    const bool ok = std::isfinite(v) && (integral ? v == std::floor(v) : true) &&
                    (o.lo_open ? v > o.lo : v >= o.lo) && (o.hi_open ? v < o.hi : v <= o.hi);
    if (!ok) {
        std::ostringstream s;
        s.precision(10);
        if (integral && std::fabs(v) < 9e18) s << (long long) v;   // 99999999999, not 1e+11
        else s << v;
        throw Error(std::string(o.name) + " = " + s.str() + " is out of range: expected " + option_range_text(o));
    }
}

void check_options(const GenerateParams & p) {
    for (const OptionInfo & o : generate_options())
        if (o.get) check_option(o, o.get(p));
}

}  // namespace diffuse
