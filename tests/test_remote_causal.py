"""diffuse.remote rebuilds the fields of decoding over a causal cache from a step event: self-
speculation's draft and drafts kept, WeDLM's window and commits (StepEvent's fields of those
names, answer positions as every other field); a server that sends them damaged is refused in one
line."""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_remote import chunk, fake, sse  # noqa: F401  (fake: the fixture)

from diffuse import DiffuseError
from diffuse.remote import RemoteModel

BASE = {"index": 0, "step": 1, "block": 0, "n_blocks": 1, "steps_allowed": 4, "tokens": [7, 9, 8, 0],
        "mask": [False, False, False, True], "unmasked": [1, 2], "edited": [], "entropy": [None] * 4,
        "confidence": [None] * 4, "scheduled": 1, "block_start": 0, "block_end": 3, "active": [0, 1, 2],
        "cached": [], "pieces": {"7": "a", "9": "b", "8": "c"}, "forward_ms": 1, "sample_ms": 1, "total_ms": 2}


def events_of(fake, *steps) -> list:  # noqa: F811
    def post(h):
        sse(h)
        for d in steps:
            h.wfile.write(b"data: " + json.dumps({"choices": [], "diffusion": d}).encode() + b"\n\n")
        h.wfile.write(chunk("abc", "stop") + b"data: [DONE]\n\n")
    events = []
    RemoteModel.connect(fake(post).url).generate("Hi", on_step=events.append)
    return events


def test_drafts_and_windows_are_read_and_other_events_have_none(fake):  # noqa: F811
    spec = BASE | {"spec_draft": [7, 9, 5], "spec_accepted": 1}
    window = BASE | {"window_order": [1, 2, 0], "committed": [1]}
    first, second, plain = events_of(fake, spec, window, BASE)
    assert first.spec_draft.tolist() == [7, 9, 5] and first.spec_accepted == 1 and first.window_order is None
    assert second.window_order.tolist() == [1, 2, 0] and second.committed.tolist() == [1]
    assert second.spec_draft is None and second.spec_accepted == -1
    assert plain.spec_draft is None and plain.window_order is None and plain.committed is None


def test_the_uniform_state_fields_are_read_and_other_events_have_none(fake):  # noqa: F811
    uniform = BASE | {"draft": [7, 9, 8, 4], "redrawn": [0, 3], "entropy_cut": 0.25}
    first, plain = events_of(fake, uniform, BASE)
    assert first.draft.tolist() == [7, 9, 8, 4] and first.redrawn.tolist() == [0, 3] and first.entropy_cut == 0.25
    assert first.draft.dtype == first.redrawn.dtype == np.int32 and first.spec_draft is None
    assert plain.draft is None and plain.redrawn is None and plain.entropy_cut is None


UNIFORM = {"draft": [7, 9], "redrawn": [3], "entropy_cut": 0.5}


@pytest.mark.parametrize("extra", [{"spec_draft": [7, -1], "spec_accepted": 0},
                                   {"spec_draft": [7, 9], "spec_accepted": 2}, {"spec_draft": [], "spec_accepted": 0},
                                   {"window_order": [0, 4]}, {"window_order": [0, 1], "committed": [9]},
                                   UNIFORM | {"draft": [7, -2]}, UNIFORM | {"draft": [[7]]}, UNIFORM | {"draft": "ab"},
                                   UNIFORM | {"redrawn": [4]}, UNIFORM | {"redrawn": [-1]}, {"draft": [7, 9]},
                                   UNIFORM | {"entropy_cut": None}, UNIFORM | {"entropy_cut": "x"},
                                   UNIFORM | {"entropy_cut": float("nan")}, UNIFORM | {"draft": [2**40]}])
def test_damaged_fields_are_refused_in_one_line(fake, extra):  # noqa: F811
    with pytest.raises(DiffuseError, match="a step event that is not diffuse serve's"):
        events_of(fake, BASE | extra)
