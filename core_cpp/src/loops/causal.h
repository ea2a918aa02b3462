// The modes that decode over one causal K/V cache (loops/causal.cpp): AR, self-speculation
// (Nemotron-Labs-Diffusion's linear_spec_generate) and Nemotron-Labs-Diffusion's diffusion mode
// (its `generate`: blocks of [seed, masks] over the cached prefix). generate_stream hands their
// items to a CausalSide and runs the others itself.
#pragma once

#include "../context.h"
#include "../model_impl.h"
#include "stream.h"

#include <list>
#include <memory>
#include <vector>

namespace diffuse {

// An item runs here when loop_of (stream.h) says Loop::Causal: mode ar or self_spec, or any mode
// of a model whose diffusion is over a causal cache (Nemotron-Labs-Diffusion). Its plan is
// plan_causal.

struct CausalSequence;

// Stands between the masked loop (loops/masked.cpp) and its feed: the loop asks feed() for items and
// gets only the ones it runs, numbered its own way (numbers, finished() and events are mapped
// back); the causal items run here, one iteration of each at every step boundary of the loop, on
// a context of their own. While the loop has nothing to run, feed().admit() keeps the causal
// sequences going until an item for the loop arrives or everything has ended.
class CausalSide {
public:
    CausalSide(const ModelImpl & model, const BatchFeed & outer, const StepCallback & on_step);
    ~CausalSide();
    const BatchFeed & feed() const { return inner_feed_; }
    const StepCallback & on_step() const { return inner_on_step_; }

private:
    std::vector<BatchItem> admit();
    void start(int index, const BatchItem & item);
    void iterate();   // one iteration of every running causal sequence; the ended ones finish

    const ModelImpl & model_;
    const BatchFeed & outer_;
    const StepCallback & outer_on_step_;
    BatchFeed inner_feed_;
    StepCallback inner_on_step_;
    struct Lease;
    std::unique_ptr<Lease> lease_;                // the context, leased at the first causal item
    std::list<CausalSequence> running_;
    CacheSlots slots_;
    int n_admitted_ = 0;                          // items numbered so far (the outer numbering)
    std::vector<int> loop_index_;                 // the loop's sequence i is the outer loop_index_[i]
    int loop_finished_ = 0;                       // of them, ended
};

}  // namespace diffuse
