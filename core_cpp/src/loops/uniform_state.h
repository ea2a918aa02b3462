// Uniform-state diffusion (DiffusionGemma): the canvas starts as uniform random tokens; each step
// accepts the lowest-entropy draws and re-draws the rest at random; a canvas's output is its
// argmax. Its own loop over the shared steps (a ForwardRunner pass over the rows of every running
// sequence, sample_rows, the entropy-bounded rule), beside loops/masked.cpp. Its plan is
// plan_uniform_state (stream.h).
#pragma once

#include "../model_impl.h"

namespace diffuse {

// generate_stream for a DiffusionGemma model: same contract (admit / finished at step boundaries,
// one event per sequence per step, False cancels that sequence).
int uniform_state_stream(const ModelImpl & model, const BatchFeed & feed, const StepCallback & on_step);

}  // namespace diffuse
