// generate_stream, generate_batch and generate: each request runs in the decoding loop of its
// architecture (architectures.h's loop column, one file each under loops/): masked diffusion
// (loops/masked.cpp), uniform-state diffusion (loops/uniform_state.cpp), or over a causal K/V cache
// (loops/causal.cpp: a model's ar and self_spec modes, and Nemotron-Labs-Diffusion's diffusion,
// beside the masked loop). Here: the families' defaults, the choice of loop, a request's plan.
#include "diffuse.h"

#include "loops/causal.h"
#include "loops/masked.h"
#include "loops/stream.h"
#include "loops/uniform_state.h"
#include "model_impl.h"
#include "options.h"

namespace diffuse {

GenerateParams default_generate_params(Family family) {
    GenerateParams p;
    switch (family) {
        case Family::LLaDA: break;
        case Family::Dream:
            // Dream's reference: whole-sequence denoising with the entropy rule and eps schedule.
            p.scheduler = Scheduler::Entropy;
            p.block_length = 0;
            break;
        case Family::SDAR:
        case Family::FastDLLMv2:
            // SDAR's recipe: the model's block (block_length 0), one step per position at most,
            // the dynamic rule at 0.9 (SDAR uses 0.85-0.9; Fast-dLLM v2 0.9).
            p.scheduler = Scheduler::LowConfidenceDynamic;
            p.block_length = 0;
            p.confidence_threshold = 0.9f;
            p.eos_stop = EosStop::Prefix;
            break;
        case Family::DiffusionGemma:
            // generation_config.json of diffusiongemma-26B-A4B-it: 48 steps per canvas, entropy
            // bound 0.1, temperature 0.8 -> 0.4, stability 1, confidence 0.005, 256 new tokens.
            p.gen_length = 256;
            p.steps = 48;
            p.block_length = 0;   // the model's canvas
            p.entropy_budget = 0.1f;
            p.temperature = 0.8f;
            p.temperature_end = 0.4f;
            p.stability = 1;
            p.stop_entropy = 0.005f;
            break;
        case Family::NemotronDiffusion:
            // Its generate_diffusion: blocks of the model's 32, threshold 0.9 (at least one per step).
            p.scheduler = Scheduler::ConfidenceThreshold;
            p.block_length = 0;
            p.steps = 32;
            p.confidence_threshold = 0.9f;
            p.eos_stop = EosStop::Prefix;
            break;
        case Family::WeDLM:
            // Tencent's SamplingParams: entropy threshold 0.4, position penalty 0.02; window 16
            // (Config). Greedy, as its README and example.py run it (SamplingParams says 0.2).
            p.threshold = 0.4f;
            p.block_length = 0;   // no blocks: the answer is gen_length positions
            p.eos_stop = EosStop::Prefix;
            break;
    }
    return p;
}


Loop loop_of(const ArchInfo & arch, const GenerateParams & p) {
    if (arch.loop == Loop::UniformState || p.mode == Decoding::Diffusion) return arch.loop;
    return Loop::Causal;
}

Plan plan_run(const ArchInfo & arch, const HParams & hp, int64_t n_prompt, const GenerateParams & p) {
    switch (loop_of(arch, p)) {
        case Loop::Masked: return plan_masked(arch, hp, n_prompt, p);
        case Loop::UniformState: return plan_uniform_state(hp, n_prompt, p);
        case Loop::Causal: return plan_causal(hp, n_prompt, p);
    }
    throw Error("unknown decoding loop");
}

Plan check_request(const ModelImpl & model, const std::vector<int32_t> & prompt, const GenerateParams & p) {
    if (prompt.empty()) throw Error("the prompt is empty");
    model.check_tokens(prompt.data(), prompt.size());
    check_options(p);
    return plan_run(model.arch(), model.hparams(), (int64_t) prompt.size(), p);
}

Error context_error(int64_t n_prompt, const GenerateParams & p, const std::string & unit, int size, int64_t n_ctx) {
    return Error("prompt (" + std::to_string(n_prompt) + (n_prompt == 1 ? " token" : " tokens") + ") + gen_length (" +
                 std::to_string(p.gen_length) + ")" +
                 (unit.empty() ? "" : ", in whole " + unit + "s of " + std::to_string(size) + ",") +
                 " exceeds the model's context of " + std::to_string(n_ctx) + " positions");
}

int generate_stream(const Model & base, const BatchFeed & feed, const StepCallback & on_step) {
    const ModelImpl & model = static_cast<const ModelImpl &>(base);
    switch (model.arch().loop) {
        case Loop::UniformState: return uniform_state_stream(model, feed, on_step);
        case Loop::Masked:
        case Loop::Causal: {
            // ar and self_spec (a causal-cache model: every mode) run over a causal cache beside the
            // masked loop, which gets only its own items (loops/causal.h).
            CausalSide causal(model, feed, on_step);
            return masked_stream(model, causal.feed(), causal.on_step());
        }
    }
    throw Error("unknown decoding loop");
}

std::vector<GenerateOutput> generate_batch(const Model & base, const std::vector<BatchItem> & items,
                                           const StepCallback & on_step) {
    const ModelImpl & model = static_cast<const ModelImpl &>(base);
    if (items.empty()) throw Error("generate_batch: no prompts");
    // Checked before any step: a batch with a bad prompt fails as a whole, naming it.
    for (size_t s = 0; s < items.size(); ++s) {
        try {
            check_request(model, items[s].prompt, items[s].params);
        } catch (const Error & e) {
            throw Error(items.size() == 1 ? e.what() : "prompt " + std::to_string(s) + ": " + e.what());
        }
    }
    std::vector<GenerateOutput> outs(items.size());
    bool admitted = false;
    const BatchFeed feed{[&] {
                             if (admitted) return std::vector<BatchItem>{};
                             admitted = true;
                             return items;
                         },
                         [&](int s, GenerateOutput && out) { outs[s] = std::move(out); }};
    generate_stream(model, feed, on_step);
    return outs;
}

GenerateOutput generate(const Model & model, const std::vector<int32_t> & prompt, const GenerateParams & params,
                        const StepCallback & on_step) {
    return std::move(generate_batch(model, {BatchItem{prompt, params}}, on_step).front());
}

}  // namespace diffuse
