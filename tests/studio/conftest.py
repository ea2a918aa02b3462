"""Fixtures for the Diffuse Studio tests: offscreen Qt, a private app home, and a synthetic engine.

The synthetic engine produces event streams shaped like real runs (semi-autoregressive blocks,
masks resolving, entropy falling, active/cached sets of the inter-step cache, an end-of-text tail)
so every panel can be driven without a model.
"""
from __future__ import annotations

import os
import threading
import time

os.environ["QT_QPA_PLATFORM"] = "offscreen"   # before any QApplication exists

import numpy as np
import pytest

from diffuse.events import GenerateResult, StepEvent
from diffuse.recording import Recording

VOCAB = ["<|mdm_mask|>", "<|endoftext|>"] + [
    " the", " a", " of", " and", " to", " in", " is", " that", " it", " was", " for", " on",
    " diffusion", " model", " tokens", " masked", " step", " each", " position", " text", " as",
    " we", " can", " see", ",", ".", "\n", " quick", " brown", " fox", " jumps", " over", " lazy",
    " dog", " Hello", "!", " world", " denoise", " entropy", " cache", " block", " answer"]
MASK_ID, EOS_ID = 0, 1


def synthetic_run(prompt="Hello", *, gen_length=48, steps=24, block_length=16, seed=0,
                  scheduler="low_confidence", threshold=1.5, cache=True, keep_active=1,
                  refresh_every=8, step_ms=12.0, answer=None, vocab=VOCAB, **_ignored):
    """(events, result) of a made-up run with the engine's semantics.

    answer: token ids (into `vocab`) the run converges to, end-of-text after them; by default
    random words for 70% of the buffer."""
    rng = np.random.default_rng(seed)
    p = max(2, len(prompt.split()) + 4)
    g, n = gen_length, p + gen_length
    tokens = np.full(n, MASK_ID, np.int32)
    tokens[:p] = rng.integers(2, len(vocab), p)
    if answer is None:
        answer = rng.integers(2, len(vocab), int(g * 0.7))
    end = min(len(answer), g)
    target = np.full(g, EOS_ID, np.int32)
    target[:end] = answer[:end]
    difficulty = rng.uniform(0.5, 3.5, g).astype(np.float32)
    difficulty[end:] = 0.2                                # the end-of-text tail is easy
    n_blocks = max(1, g // block_length)
    per_block = max(1, steps // n_blocks)
    changed = np.full(n, -10**6)
    decided = np.full(g, -1, np.int32)
    events, step = [], 0
    for b in range(n_blocks):
        s0, s1 = p + b * block_length, p + (b + 1) * block_length
        quota = np.full(per_block, block_length // per_block)
        quota[:block_length % per_block] += 1
        for j in range(per_block):
            masked = np.flatnonzero(tokens[s0:s1] == MASK_ID) + s0
            if masked.size == 0:
                break
            entropy = np.full(n, np.nan, np.float32)
            fade = 1.0 - j / per_block
            entropy[masked] = difficulty[masked - p] * fade + rng.uniform(0, 0.3, masked.size)
            confidence = np.where(np.isnan(entropy), np.nan, np.exp(-entropy)).astype(np.float32)
            k = int(quota[j])
            if scheduler == "entropy_exit":
                k = max(k, int((entropy[masked] < threshold).sum()))
            pick = masked[np.argsort(entropy[masked])[:max(1, min(k, masked.size))]]
            if j == per_block - 1:
                pick = masked
            tokens[pick] = target[pick - p]
            changed[pick] = step
            decided[pick - p] = step
            mask = tokens == MASK_ID
            if cache and step % refresh_every != 0:
                active = np.flatnonzero(mask | (step - changed <= keep_active)).astype(np.int32)
                cached = np.setdiff1d(np.arange(n, dtype=np.int32), active)
            else:
                active, cached = np.arange(n, dtype=np.int32), np.zeros(0, np.int32)
            fwd = step_ms * (0.25 + 0.75 * active.size / n)
            events.append(StepEvent(
                step=step, block=b, n_blocks=n_blocks, steps_allowed=steps, prompt_length=p,
                block_start=s0, block_end=s1, tokens=tokens.copy(), mask=mask,
                unmasked=np.sort(pick).astype(np.int32), entropy=entropy, confidence=confidence,
                active=active, cached=cached, forward_ms=fwd, sample_ms=1.0,
                total_ms=fwd + 1.0))
            step += 1
    useful = end
    text = "".join(vocab[t] for t in target[:useful])
    ms = np.array([e.total_ms for e in events])
    result = GenerateResult(
        text=text, tokens=tokens[p:].copy(), prompt_tokens=tokens[:p].copy(), steps=len(events),
        steps_allowed=steps, stop_reason="done", step_ms=ms,
        forward_ms=np.array([e.forward_ms for e in events]),
        sample_ms=np.array([e.sample_ms for e in events]), total_ms=float(ms.sum()),
        gen_length=g, useful_length=useful, decided_step=decided)
    return events, result


class FakeTokenizer:
    eos_token_ids = (EOS_ID,)
    special_tokens = {MASK_ID: VOCAB[MASK_ID], EOS_ID: VOCAB[EOS_ID]}

    def decode(self, ids, skip_special_tokens=False):
        return "".join(VOCAB[i] for i in ids)

    def apply_chat_template(self, messages):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def encode(self, text):
        return [2 + (ord(c) % (len(VOCAB) - 2)) for c in text]


class FakeModel:
    """Stands in for diffuse.Model: generate() replays a synthetic run at engine pace."""

    arch = "llada"
    n_vocab = len(VOCAB)
    n_ctx_train = 4096
    mask_token_id = MASK_ID
    dialect = "ours"

    def __init__(self, path="fake.gguf", step_delay=0.01):
        self.path = str(path)
        self.step_delay = step_delay
        self.tokenizer = FakeTokenizer()
        self.calls = []
        self.threads_seen = set()

    def generate(self, prompt, *, on_step=None, chat=True, **options):
        self.calls.append(dict(options, prompt=prompt, chat=chat))
        self.threads_seen.add(threading.get_ident())
        opts = {k: v for k, v in options.items() if v is not None}
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        events, result = synthetic_run(text, **opts)
        rec = Recording(events=events, result=result)
        return rec.replay(on_step, delay_s=self.step_delay)


@pytest.fixture(autouse=True)
def studio_home(tmp_path, monkeypatch):
    """Every test gets its own app folder: settings, conversations and runs never leak."""
    home = tmp_path / "studio-home"
    monkeypatch.setenv("DIFFUSE_STUDIO_HOME", str(home))
    return home


@pytest.fixture(scope="session", autouse=True)
def studio_theme(qapp):
    """The app's real look (bundled fonts, style sheet, plot colours) for every test."""
    from diffuse.studio import theme
    theme.apply(qapp)
    return qapp


@pytest.fixture
def fake_model():
    return FakeModel


@pytest.fixture
def make_recording():
    def make(prompt="Hello", **kw):
        events, result = synthetic_run(prompt, **kw)
        rec = Recording(prompt=prompt, options=kw, events=events, result=result,
                        model={"name": "synthetic", "arch": "llada", "eos_ids": [EOS_ID],
                               "special_ids": [MASK_ID, EOS_ID]})
        return rec.finish(result, FakeTokenizer().decode)
    return make


class GapMeter:
    """A 10 ms GUI-thread timer; `gaps()` are the intervals (ms) between its ticks since
    `start()`, and `cpu_gaps()` the GUI thread's CPU time within each interval. A late tick
    with little CPU time in its gap was held up by the OS (other processes), not by our code."""

    def __init__(self):
        from PySide6.QtCore import QTimer
        self.stamps: list[float] = []
        self.cpu: list[float] = []
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)

    def _tick(self):
        self.stamps.append(time.perf_counter())
        self.cpu.append(time.thread_time())

    def start(self):
        self.stamps.clear()
        self.cpu.clear()
        self.timer.start()

    def stop(self):
        self.timer.stop()

    def gaps(self) -> np.ndarray:
        return np.diff(np.array(self.stamps)) * 1000.0

    def cpu_gaps(self) -> np.ndarray:
        return np.diff(np.array(self.cpu)) * 1000.0

    def assert_responsive(self) -> None:
        """The timer ticked with gaps under 50 ms.

        Our code's share is checked always: the GUI thread spent under 40 ms of CPU between any
        two ticks. The wall-clock bound is checked in full when the machine is not
        oversubscribed; when other processes keep every core busy (load average above the core
        count) the OS alone delays ticks, and the bound applies to 95% of the gaps.
        """
        gaps, cpu = self.gaps(), self.cpu_gaps()
        load = os.getloadavg()[0]
        summary = (f"{len(gaps)} ticks, wall gap max {gaps.max():.1f} ms (p95 "
                   f"{np.percentile(gaps, 95):.1f}), GUI CPU per gap max {cpu.max():.1f} ms, "
                   f"load {load:.1f} on {os.cpu_count()} cores")
        print(summary)
        assert len(gaps) > 30, summary
        assert cpu.max() < 40.0, summary
        if load <= os.cpu_count():
            assert gaps.max() < 50.0, summary
        else:
            assert np.percentile(gaps, 95) < 50.0, summary



@pytest.fixture
def gap_meter(qapp):
    meter = GapMeter()
    yield meter
    meter.stop()
