"""DiffusionGemma's official generate loop (transformers 5.24 generation_diffusion_gemma.py) for one
prompt, driven by a forward of our choosing and by injected noise, so that the engine's loop can be
checked against it step for step.

The denoising step is the official code itself (DiffusionGemmaGenerationMixin._denoising_step with
its EntropyBoundSampler, LinearTemperatureScheduleLogitsProcessor and
StableAndConfidentStoppingCriteria); the outer loop over canvases is ported from generate() (the
encoder's cache is the forward's business: `forward(context, canvas, self_conditioning)` returns the
canvas's raw logits). Noise: torch.multinomial and the sampler's uniform canvases are replaced by
the tokens `noise(step)` gives (the engine's next canvas: accepted positions hold its draws, the
others its re-draws), and each canvas starts from `initial(canvas)`.
"""
from __future__ import annotations

import warnings
from types import SimpleNamespace
from unittest import mock

import numpy as np
import torch

with warnings.catch_warnings():   # transformers.generation imports torch.jit code that warns of its deprecation
    warnings.simplefilter("ignore", DeprecationWarning)
    from transformers.generation import EosTokenCriteria, LogitsProcessorList, StoppingCriteriaList
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationMixin, EntropyBoundSampler, EntropyBoundSamplerConfig,
        LinearTemperatureScheduleLogitsProcessor, StableAndConfidentStoppingCriteria)


def official_generate(forward, prompt: list[int], *, canvas_length: int, vocab_size: int, max_new_tokens: int,
                      steps: int, entropy_bound: float, t_min: float, t_max: float, stability: int,
                      confidence: float, eos_ids: list[int], pad_id: int, initial, noise):
    """Returns (sequence without the prompt, trace: one dict per step with the accepted mask, the
    argmax canvas and whether the canvas stopped)."""
    sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=entropy_bound), canvas_length,
                                  vocab_size, steps)
    processors = LogitsProcessorList([LinearTemperatureScheduleLogitsProcessor(t_min, t_max, steps)])
    stopping = StableAndConfidentStoppingCriteria(stability, confidence)
    ar_stop = StoppingCriteriaList([EosTokenCriteria(eos_ids)])
    fake = SimpleNamespace(config=SimpleNamespace(text_config=SimpleNamespace(vocab_size=vocab_size)),
                           model=SimpleNamespace(decoder=SimpleNamespace(embed_tokens=SimpleNamespace(
                               weight=torch.zeros(1, dtype=torch.float32)))))
    generation_config = SimpleNamespace(pad_token_id=pad_id, eos_token_id=eos_ids)
    input_ids = torch.tensor([prompt])
    trace, step = [], 0

    for canvas_no in range(-(-max_new_tokens // canvas_length)):
        context = input_ids[0].tolist()

        def decoder_forward(decoder_input_ids, self_conditioning_logits, **_):
            sc = None if self_conditioning_logits is None else self_conditioning_logits[0].numpy()
            logits = forward(context, decoder_input_ids[0].tolist(), sc)
            return SimpleNamespace(logits=torch.from_numpy(np.asarray(logits, np.float32))[None])

        current = torch.tensor([initial(canvas_no)])
        argmax, sc, finished = current, None, torch.zeros(1, dtype=torch.bool)
        stopping.reset()
        for cur_step in reversed(range(1, steps + 1)):
            injected = torch.tensor([noise(step)])
            # (cudagraph_mark_step_begin serves compiled runs only; importing inductor warns)
            with mock.patch.object(torch, "multinomial", lambda probs, num_samples: injected.view(-1, 1)), \
                    mock.patch.object(sampler, "initialize_canvas", lambda batch_size, device: injected), \
                    mock.patch.object(torch.compiler, "cudagraph_mark_step_begin", lambda: None):
                current, argmax, sc, finished = DiffusionGemmaGenerationMixin._denoising_step(
                    fake, decoder_forward=decoder_forward, current_canvas=current, argmax_canvas=argmax,
                    input_ids=input_ids, decoder_position_ids=None, self_conditioning_logits=sc, mask_mapping=None,
                    cache=None, finished_denoising=finished, cur_step=cur_step, sampler=sampler,
                    logits_processor=processors, diffusion_stopping_criteria=stopping)
            trace.append({"accepted": sampler.accepted_token_mask[0].numpy().copy(),
                          "argmax": argmax[0].numpy().copy(), "stopped": bool(finished[0])})
            step += 1
            if torch.all(finished):
                break
        input_ids = torch.cat([input_ids, argmax], dim=-1)
        input_ids, done = DiffusionGemmaGenerationMixin._finalize_canvas(
            input_ids=input_ids, finished_sequences=torch.zeros(1, dtype=torch.bool),
            generation_config=generation_config, stopping_criteria=ar_stop, canvas_length=canvas_length,
            eos_tensor=torch.tensor(eos_ids))
        if torch.all(done):
            break
    return input_ids[0, len(prompt):].tolist(), trace
