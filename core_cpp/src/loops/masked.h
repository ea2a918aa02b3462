// Masked diffusion (loops/masked.cpp): the answer starts as masks and each step commits some of
// them, by a scheduler's rule, block by block; full attention (LLaDA, Dream: the inter-step cache)
// or block diffusion (SDAR, Fast-dLLM v2, LLaDA2: an exact cache, sub-blocks, editing).
#pragma once

#include "../model_impl.h"

namespace diffuse {

// generate_stream for the items of this loop (generate.cpp hands the causal ones to a CausalSide
// first): same contract (admit / finished at step boundaries, one event per sequence per step,
// False cancels that sequence). Returns the number of K/V caches it held.
int masked_stream(const ModelImpl & model, const BatchFeed & feed, const StepCallback & on_step);

}  // namespace diffuse
