"""RunState: the per-step arrays every view draws from, built once per event."""
from __future__ import annotations

import numpy as np

from diffuse.studio.run_state import MASK_GLYPH, RunState


def test_arrays_follow_the_events(each_recorded_run):
    rec = each_recorded_run
    run = RunState.from_recording(rec)
    p, g, n = run.prompt_length, run.gen_length, len(rec.events)
    assert run.n_steps == n and g == rec.result.gen_length and run.done
    # decided step per position: as the result says, and as the events say
    assert np.array_equal(run.decided_step, rec.result.decided_step)
    for e in rec.events:
        assert np.all(run.decided_step[np.asarray(e.unmasked) - p] == e.step)
    # entropy rows: the evaluated values, NaN elsewhere; "latest" carries values forward
    for k, e in enumerate(rec.events):
        assert np.array_equal(run.entropy[k], e.entropy[p:], equal_nan=True)
    k = 5
    i = int(np.flatnonzero(np.isfinite(run.entropy[2]) & np.isnan(run.entropy[k]))[0])
    last = max(j for j in range(k + 1) if np.isfinite(run.entropy[j, i]))
    assert run.latest_entropy[k, i] == run.entropy[last, i]
    # cache rows: 2 recomputed, 1 cached
    e = rec.events[3]
    assert np.all(run.cache[3, e.active] == 2) and np.all(run.cache[3, e.cached] == 1)
    assert run.active_fraction[3] == len(e.active) / (len(e.active) + len(e.cached))
    assert np.allclose(run.step_ms[:n], rec.result.step_ms)


def test_cell_values_freeze_at_commit(recorded_run):
    run = RunState.from_recording(recorded_run("blocks_cache"))
    final = run.cell_values(run.n_steps - 1, "entropy")
    i = int(np.flatnonzero(run.decided_step == 3)[0])
    assert final[i] == run.entropy[3, i]                  # the entropy it had when committed
    early = run.cell_values(1, "confidence")
    assert early[i] == run.latest_confidence[1, i]        # still masked at step 1


def test_text_at_shows_masks_and_stops_at_end_of_text(recorded_run):
    rec = recorded_run("blocks_cache")
    run = RunState.from_recording(rec)
    assert rec.result.useful_length < run.gen_length        # end-of-text inside the buffer
    assert MASK_GLYPH in run.text_at(2)
    assert run.text_at(run.n_steps - 1) == rec.result.text


def test_grows_past_the_step_budget(recorded_run):
    rec = recorded_run("no_cache")
    run = RunState("x", {}, {})
    for e in rec.events + rec.events:          # 32 events against a budget of 16
        run.add(e)
    assert rec.result.steps_allowed == 16
    assert run.n_steps == 32 and run.entropy.shape[0] >= 32
    assert np.isfinite(run.step_ms[:32]).all()


def test_differs_from(recorded_run):
    a = RunState.from_recording(recorded_run("blocks_cache"))
    b = RunState.from_recording(recorded_run("entropy_exit"))   # same prompt, other scheduler
    assert not a.differs_from(a).any()
    diff = a.differs_from(b)
    assert diff.shape == (48,) and diff.any()


def test_a_tokenizer_that_fails_to_decode_shows_ids():
    """A damaged tokenizer from a model file must not break drawing: pieces fall back to ids."""
    from diffuse import DiffuseError
    from diffuse.studio.run_state import RunState

    def broken(ids):
        raise DiffuseError("the model's tokenizer failed")

    run = RunState("prompt", {}, {"arch": "llada"}, broken)
    assert run.piece(7) == "<7>"
