"""diffuse.recording: a run's events and result survive a file round trip; bad files are refused;
recorded and synthetic runs follow the engine's inter-step cache rule."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from diffuse import DiffuseError
from diffuse.events import StepEvent
from diffuse.recording import Recording, write_atomic


def assert_events_equal(a: list[StepEvent], b: list[StepEvent]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for name in StepEvent.__dataclass_fields__:
            u, v = getattr(x, name), getattr(y, name)
            if isinstance(u, np.ndarray):
                assert v.dtype == np.asarray(u).dtype, name
                assert np.array_equal(u, v, equal_nan=True), name
            else:
                assert u == v and type(v) is type(u), name


def test_round_trip_keeps_every_field(each_recorded_run, tmp_path):
    rec = each_recorded_run
    path = tmp_path / "run.npz"
    rec.save(path)
    back = Recording.load(path)
    assert_events_equal(rec.events, back.events)
    assert back.prompt == rec.prompt and back.options == rec.options and back.model == rec.model
    assert back.pieces == rec.pieces and set(back.pieces) == set(rec.token_ids())
    r, s = rec.result, back.result
    for name in ("text", "steps", "steps_allowed", "stop_reason", "total_ms", "gen_length",
                 "useful_length"):
        assert getattr(r, name) == getattr(s, name)
    for name in ("tokens", "prompt_tokens", "step_ms", "forward_ms", "sample_ms", "decided_step"):
        assert np.array_equal(getattr(r, name), getattr(s, name))
    assert s.buffer_tokens_per_s == pytest.approx(r.buffer_tokens_per_s)


def test_file_is_compact(synthetic_recording, tmp_path):
    rec = synthetic_recording(gen_length=256, steps=128, block_length=32)
    rec.save(tmp_path / "run.npz")
    raw = sum(e.tokens.nbytes + e.entropy.nbytes + e.confidence.nbytes + e.mask.nbytes
              for e in rec.events)
    assert (tmp_path / "run.npz").stat().st_size < raw / 4


def test_replay_feeds_events_and_honours_cancel(recorded_run):
    rec = recorded_run("no_cache")
    seen = []
    assert rec.replay(seen.append) is rec.result          # None from the callback: go on
    assert [e.step for e in seen] == list(range(16))
    cut = rec.replay(lambda e: e.step < 4)
    assert cut.stop_reason == "cancelled" and cut.steps == 5
    assert cut.step_ms.shape == (5,) and cut.total_ms == pytest.approx(cut.step_ms.sum())
    decided = cut.decided_step
    assert set(decided[decided >= 0].tolist()) <= set(range(5))
    with pytest.raises(ZeroDivisionError):                # a failing listener ends the replay
        rec.replay(lambda e: 1 / 0)


def cache_rule_active(rec: Recording) -> list[np.ndarray]:
    """Per step, the positions the engine's inter-step cache recomputes: all of them at step 0,
    every refresh_every-th step and with the cache off; otherwise the masked positions of the
    current block and those changed within the last keep_active steps."""
    opts, first = rec.options, rec.events[0]
    pos = np.arange(first.tokens.shape[0])
    mask = pos >= first.prompt_length           # before step 0 the whole buffer is masked
    changed = np.full(pos.shape, -1)            # step that last changed it; -1: never
    active = []
    for e in rec.events:
        full = (not opts["cache"] or e.step == 0
                or (opts["refresh_every"] > 0 and e.step % opts["refresh_every"] == 0))
        in_block = (pos >= e.block_start) & (pos < e.block_end)
        recent = (changed >= 0) & (e.step - changed <= opts["keep_active"])
        active.append(pos if full else pos[(mask & in_block) | recent])
        changed[e.unmasked] = e.step
        mask = e.mask
    return active


def assert_follows_cache_rule(rec: Recording) -> None:
    for e, want in zip(rec.events, cache_rule_active(rec), strict=True):
        assert np.array_equal(e.active, want), e.step
        assert np.array_equal(np.sort(np.concatenate([e.active, e.cached])),
                              np.arange(e.tokens.shape[0])), e.step


def test_recorded_runs_follow_the_cache_rule(each_recorded_run):
    """The real engine's rule; when it changes, cache_rule_active and synthetic_run follow."""
    assert_follows_cache_rule(each_recorded_run)


@pytest.mark.parametrize("cache,refresh_every", [(True, 0), (True, 5), (False, 0)])
def test_synthetic_runs_follow_the_cache_rule(synthetic_recording, cache, refresh_every):
    assert_follows_cache_rule(synthetic_recording(
        gen_length=64, steps=32, block_length=16, cache=cache, keep_active=2,
        refresh_every=refresh_every))


def test_empty_recording_round_trips(tmp_path):
    Recording(prompt="nothing").save(tmp_path / "empty.npz")
    back = Recording.load(tmp_path / "empty.npz")
    assert back.events == [] and back.result is None and back.prompt == "nothing"


@pytest.mark.parametrize("content", [b"", b"not a zip at all", b"PK\x03\x04broken"])
def test_garbage_files_are_refused(tmp_path, content):
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(DiffuseError, match="bad.npz"):
        Recording.load(path)


def test_other_npz_and_wrong_version_are_refused(recorded_run, tmp_path):
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(DiffuseError, match="other.npz"):
        Recording.load(tmp_path / "other.npz")
    with pytest.raises(DiffuseError, match="no such recording"):
        Recording.load(tmp_path / "missing.npz")
    path = tmp_path / "run.npz"
    recorded_run("no_cache").save(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(bytes(arrays["meta"]))
    meta["version"] = 99
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
    np.savez(path, **arrays)
    with pytest.raises(DiffuseError, match="version 99"):
        Recording.load(path)


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "conv.json"
    write_atomic(target, b"old")

    def boom(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(DiffuseError, match="disk full; nothing was written"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["conv.json"]     # no temporary left


def test_records_a_real_run(tiny_gguf, tmp_path):
    import diffuse
    model = diffuse.load(tiny_gguf("llada", "f32"), threads=1)
    rec = Recording(prompt="Hello", options={"steps": 8})
    result = model.generate("Hello", gen_length=16, steps=8, block_length=8, threads=1,
                            on_step=rec.add)
    rec.finish(result, model.tokenizer.decode)
    rec.save(tmp_path / "real.npz")
    back = Recording.load(tmp_path / "real.npz")
    assert_events_equal(rec.events, back.events)
    assert len(back.events) == result.steps == 8
    assert np.array_equal(back.result.tokens, result.tokens)
    assert back.pieces[int(result.tokens[0])] == model.tokenizer.decode([int(result.tokens[0])])


def test_the_scheduled_count_is_kept_and_older_recordings_still_load(demo_run, recorded_run,
                                                                     tmp_path):
    rec = demo_run(scheduler="entropy_exit", threshold=1.5, seed=0)
    assert all(e.scheduled >= 1 for e in rec.events)
    assert any(len(e.unmasked) > e.scheduled for e in rec.events)    # tau committed more
    rec.save(tmp_path / "new.npz")
    assert [e.scheduled for e in Recording.load(tmp_path / "new.npz").events] == \
        [e.scheduled for e in rec.events]
    old = recorded_run("entropy_exit")       # recorded before events carried the count
    assert old.events and all(e.scheduled == -1 for e in old.events)
    old.save(tmp_path / "old.npz")
    assert all(e.scheduled == -1 for e in Recording.load(tmp_path / "old.npz").events)
    with np.load(tmp_path / "new.npz") as z:
        arrays = {k: z[k] for k in z.files}
    arrays["step_scheduled"][0] = -2
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DiffuseError, match="step_scheduled"):
        Recording.load(tmp_path / "bad.npz")
