"""RunState: the per-step arrays every view draws from, built once per event."""
from __future__ import annotations

import numpy as np

from diffuse.studio.run_state import MASK_GLYPH, RunState


def test_arrays_follow_the_events(make_recording):
    rec = make_recording(gen_length=48, steps=24, block_length=16)
    run = RunState.from_recording(rec)
    p, g = run.prompt_length, run.gen_length
    assert run.n_steps == 24 and g == 48 and run.done
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
    assert np.allclose(run.step_ms[:24], rec.result.step_ms)


def test_cell_values_freeze_at_commit(make_recording):
    run = RunState.from_recording(make_recording(gen_length=32, steps=16, block_length=16))
    final = run.cell_values(run.n_steps - 1, "entropy")
    i = int(np.flatnonzero(run.decided_step == 3)[0])
    assert final[i] == run.entropy[3, i]                  # the entropy it had when committed
    early = run.cell_values(1, "confidence")
    assert early[i] == run.latest_confidence[1, i]        # still masked at step 1


def test_text_at_shows_masks_and_stops_at_end_of_text(make_recording):
    rec = make_recording(gen_length=32, steps=16, block_length=16)
    run = RunState.from_recording(rec)
    assert MASK_GLYPH in run.text_at(2)
    assert run.text_at(run.n_steps - 1) == rec.result.text


def test_grows_past_the_step_budget(make_recording):
    rec = make_recording(gen_length=16, steps=8, block_length=16)
    run = RunState("x", {}, {})
    for e in rec.events + rec.events:          # 16 events against a budget of 8
        run.add(e)
    assert run.n_steps == 16 and run.entropy.shape[0] >= 16
    assert np.isfinite(run.step_ms[:16]).all()


def test_differs_from(make_recording):
    a = RunState.from_recording(make_recording(seed=1, gen_length=32, steps=16, block_length=16))
    b = RunState.from_recording(make_recording(seed=2, gen_length=32, steps=16, block_length=16))
    assert not a.differs_from(a).any()
    diff = a.differs_from(b)
    assert diff.shape == (32,) and diff.any()
