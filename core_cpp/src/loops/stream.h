// The steps every decoding loop (loops/*.cpp, one file per loop of architectures.h) shares: the
// plan of a request, the admission of new items at a step boundary, the K/V cache slots of the
// context, sampling a pass's rows, the timing of a step.
#pragma once

#include "../model_impl.h"
#include "../sampling.h"

#include <chrono>
#include <cmath>
#include <list>
#include <string>
#include <vector>

namespace diffuse {

// What a loop will run for a request, or diffuse::Error with the reason it refuses it: the same
// code builds a loop's sequences, checks generate_batch's items and answers _core.plan (the CLI's
// and the Studio's schedule line).
struct Plan {
    Loop loop;
    int origin = 0, n_total = 0;   // the answer's positions [origin, n_total) (block diffusion: from the prompt's last whole block)
    int block = 0, n_blocks = 0;   // its blocks (uniform state: canvases; ar and self_spec: blocks of one)
    int sub = 0, n_subs = 1;       // each block's sub-blocks (one of the whole block when none)
    int steps_per_sub = 0;         // the steps each sub-block gets (uniform state: each canvas at most)
    std::string rounded;           // what the plan changed of the steps option ("steps 6 -> 4: ..."), "" when nothing
};

// The loop an item of this architecture runs in: its table's, but ar and self_spec run over a
// causal cache for every model that has them (the uniform-state loop refuses them).
Loop loop_of(const ArchInfo & arch, const GenerateParams & p);

// The plan of each loop (loops/*.cpp) from the model's hyper-parameters, a prompt length and the
// options; plan_run chooses the loop.
Plan plan_masked(const ArchInfo & arch, const HParams & hp, int64_t n_prompt, const GenerateParams & p);
Plan plan_uniform_state(const HParams & hp, int64_t n_prompt, const GenerateParams & p);
Plan plan_causal(const HParams & hp, int64_t n_prompt, const GenerateParams & p);
Plan plan_run(const ArchInfo & arch, const HParams & hp, int64_t n_prompt, const GenerateParams & p);

// A request against a loaded model: the prompt (not empty, ids in the vocabulary), the options,
// then the plan of its loop.
Plan check_request(const ModelImpl & model, const std::vector<int32_t> & prompt, const GenerateParams & p);

// "prompt (n tokens) + gen_length (g)[, in whole <unit>s of <size>] exceeds the model's context of c positions"
Error context_error(int64_t n_prompt, const GenerateParams & p, const std::string & unit, int size, int64_t n_ctx);

// feed.admit()'s items join `running` (a Seq is built from (index, model, prompt, params) and
// throws diffuse::Error to refuse one); a refused item goes to feed.finished() at once with
// stop_reason "error" and the reason, the others run on. Returns whether admit() gave any item;
// the ones that joined are appended to `joined`.
template <typename Seq>
bool admit_items(const BatchFeed & feed, const ModelImpl & model, std::list<Seq> & running, int & n_admitted,
                 std::vector<Seq *> & joined) {
    const std::vector<BatchItem> items = feed.admit();
    for (const BatchItem & item : items) {
        const int index = n_admitted++;
        try {
            running.emplace_back(index, model, item.prompt, item.params);
        } catch (const Error & e) {
            GenerateOutput out;
            out.stop_reason = "error";
            out.error = e.what();
            feed.finished(index, std::move(out));
            continue;
        }
        joined.push_back(&running.back());
    }
    return !items.empty();
}

// The context's K/V caches by index: a sequence takes one (or two) when it starts and gives them
// back when it ends, for the next to reuse; count() is how many the stream used.
class CacheSlots {
public:
    size_t take() {
        if (free_.empty()) return n_++;
        const size_t s = free_.back();
        free_.pop_back();
        return s;
    }
    void give_back(size_t s) { free_.push_back(s); }
    size_t count() const { return n_; }

private:
    std::vector<size_t> free_;
    size_t n_ = 0;
};

// sample_rows over a pass's logits; rows that are not finite mean a broken model, said as such.
inline void sample_pass(const ModelImpl & model, const float * logits, int n_rows, const std::vector<int32_t> & keys,
                        const SampleConfig & cfg, int n_threads, std::vector<RowStats> & stats) {
    sample_rows(logits, n_rows, model.hparams().n_vocab, keys, cfg, n_threads, stats);
    for (const RowStats & s : stats)
        if (!std::isfinite(s.entropy))
            throw Error(model.path() + ": the forward pass produced NaN/Inf logits (corrupt weights?)");
}

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace diffuse
