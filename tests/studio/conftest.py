"""Fixtures for the Diffuse Studio tests: offscreen Qt, a private app home, recorded runs of the
demo model, and a synthetic engine for sizes the recordings do not cover.

The recordings (tests/fixtures/runs/*.npz) are real runs of models/diffuse-demo-3m.gguf, made by
tests/fixtures/record_runs.py, which says what each one shows; rerun it when the engine changes.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

os.environ["QT_QPA_PLATFORM"] = "offscreen"   # before any QApplication exists

import numpy as np
import pytest

import diffuse
from diffuse.events import GenerateResult, StepEvent
from diffuse.generation import resolve_options
from diffuse.recording import Recording

RUNS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
DEMO = Path(__file__).resolve().parents[2] / "models" / "diffuse-demo-3m.gguf"
DEMO_RECIPE = diffuse.load(DEMO, threads=1).recipe     # what the recorded runs' model suggests
RUN_NAMES = ("blocks_cache", "entropy_exit", "no_cache", "eos", "cancelled")
REPLAYED = RUN_NAMES[:-1]        # what FakeModel.generate may return: runs that were not stopped


def recorded(name: str) -> Recording:
    """A real run of the demo model, freshly loaded (tests may change it)."""
    return Recording.load(RUNS_DIR / f"{name}.npz")


VOCAB = ["<|mdm_mask|>", "<|endoftext|>"] + [
    " the", " a", " of", " and", " to", " in", " is", " that", " it", " was", " for", " on",
    " diffusion", " model", " tokens", " masked", " step", " each", " position", " text", " as",
    " we", " can", " see", ",", ".", "\n", " quick", " brown", " fox", " jumps", " over", " lazy",
    " dog", " Hello", "!", " world", " denoise", " entropy", " cache", " block", " answer"]
MASK_ID, EOS_ID = 0, 1


def synthetic_run(prompt="Hello", *, gen_length=48, steps=24, block_length=16, seed=0,
                  scheduler="low_confidence", threshold=1.5, cache=True, keep_active=2,
                  refresh_every=0, step_ms=12.0, answer=None, vocab=VOCAB, **_ignored):
    """(events, result) of a made-up run of any size, with the engine's block schedule and
    inter-step cache rules; for size sweeps (the recorded runs stand for real ones) and the
    README screenshots.

    answer: token ids (into `vocab`) the run converges to, end-of-text after them; by default
    random words for 70% of the buffer."""
    rng = np.random.default_rng(seed)
    p = max(2, len(prompt.split()) + 4)
    g, n = gen_length, p + gen_length
    block = block_length if 0 < block_length <= g else g
    tokens = np.full(n, MASK_ID, np.int32)
    tokens[:p] = rng.integers(2, len(vocab), p)
    if answer is None:
        answer = rng.integers(2, len(vocab), int(g * 0.7))
    end = min(len(answer), g)
    target = np.full(g, EOS_ID, np.int32)
    target[:end] = answer[:end]
    difficulty = rng.uniform(0.5, 3.5, g).astype(np.float32)
    difficulty[end:] = 0.2                                # the end-of-text tail is easy
    n_blocks = g // block
    per_block = max(1, steps // n_blocks)
    positions = np.arange(n, dtype=np.int32)
    changed = np.full(n, -1)                              # step that last changed it; -1: never
    decided = np.full(g, -1, np.int32)
    events, step = [], 0
    for b in range(n_blocks):
        s0, s1 = p + b * block, p + (b + 1) * block
        quota = np.full(per_block, block // per_block)
        quota[:block % per_block] += 1
        for j in range(per_block):
            masked = np.flatnonzero(tokens[s0:s1] == MASK_ID) + s0
            if masked.size == 0:
                break
            # As the engine plans it before the step: masked in this block or changed within
            # the last keep_active steps; everything at step 0 and every refresh_every-th step.
            if not cache or step == 0 or (refresh_every > 0 and step % refresh_every == 0):
                active = positions
            else:
                recent = (changed >= 0) & (step - changed <= keep_active)
                active = np.union1d(masked, np.flatnonzero(recent)).astype(np.int32)
            cached = np.setdiff1d(positions, active)
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
            fwd = step_ms * (0.25 + 0.75 * active.size / n)
            events.append(StepEvent(
                step=step, block=b, n_blocks=n_blocks, steps_allowed=per_block * n_blocks,
                prompt_length=p, block_start=s0, block_end=s1, tokens=tokens.copy(),
                mask=tokens == MASK_ID, unmasked=np.sort(pick).astype(np.int32),
                entropy=entropy, confidence=confidence, active=active, cached=cached,
                forward_ms=fwd, sample_ms=1.0, total_ms=fwd + 1.0))
            step += 1
    text = "".join(vocab[t] for t in target[:end])
    ms = np.array([e.total_ms for e in events])
    result = GenerateResult(
        text=text, tokens=tokens[p:].copy(), prompt_tokens=tokens[:p].copy(), steps=len(events),
        steps_allowed=per_block * n_blocks, stop_reason="done", step_ms=ms,
        forward_ms=np.array([e.forward_ms for e in events]),
        sample_ms=np.array([e.sample_ms for e in events]), total_ms=float(ms.sum()),
        gen_length=g, useful_length=end, decided_step=decided)
    return events, result


class FakeTokenizer:
    """Decodes with a table of token texts: a recording's pieces, or VOCAB."""

    chat_template = "<role>content, per message"   # has one: multi-turn chats go through it

    def __init__(self, pieces: dict[int, str], eos_ids, special_ids):
        self.pieces = pieces
        self.eos_token_ids = tuple(eos_ids)
        self.special_tokens = {i: pieces[i] for i in special_ids}
        self._ids = sorted(pieces)

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids
                       if not (skip_special_tokens and i in self.special_tokens))

    def apply_chat_template(self, messages):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def encode(self, text):
        return [self._ids[ord(c) % len(self._ids)] for c in text]

    def encode_chat(self, messages):
        return self.encode(self.apply_chat_template(messages))


SYNTHETIC_TOKENIZER = FakeTokenizer(dict(enumerate(VOCAB)), [EOS_ID], [MASK_ID, EOS_ID])


class FakeModel:
    """Stands in for diffuse.Model with the demo model loaded: generate() replays the recorded
    run that best matches the options, at engine pace."""

    dialect = "ours"
    n_expert = 0        # dense
    recipe_problem = None

    def __init__(self, path="diffuse-demo-3m.gguf", step_delay=0.01):
        self.path = str(path)
        self.step_delay = step_delay
        self.calls = []
        self.threads_seen = set()
        self._describe()

    def _describe(self):
        self.runs = [recorded(name) for name in REPLAYED]
        info = self.runs[0].model
        self.arch, self.n_vocab = info["arch"], info["n_vocab"]
        self.n_ctx_train, self.mask_token_id = info["n_ctx_train"], info["mask_token_id"]
        self.recipe = dict(DEMO_RECIPE)
        pieces = {tid: text for rec in self.runs for tid, text in rec.pieces.items()}
        self.tokenizer = FakeTokenizer(pieces, info["eos_ids"], info["special_ids"])

    def generate(self, prompt, *, on_step=None, chat=True, threads=None, **options):
        self.calls.append(dict(options, prompt=prompt, chat=chat))
        self.threads_seen.add(threading.get_ident())
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        rec = self.run_for(text, resolve_options(self.arch, self.recipe, **options))
        return rec.replay(on_step, delay_s=self.step_delay)

    def run_for(self, prompt: str, opts: dict) -> Recording:
        """The recording with the scheduler and cache setting asked for, closest in size."""
        same = [r for r in self.runs if r.options["scheduler"] == opts["scheduler"]
                and r.options["cache"] == opts["cache"]]
        if not same:
            raise LookupError(f"no recorded run with scheduler={opts['scheduler']} "
                              f"cache={opts['cache']}: add one in tests/fixtures/record_runs.py")
        return max(same, key=lambda r: sum(r.options[k] == opts[k]
                                           for k in ("gen_length", "steps", "block_length")))


class SyntheticModel(FakeModel):
    """A FakeModel for size sweeps past the demo model's 256 positions: generate() makes up a
    run of the size asked for (synthetic_run)."""

    def _describe(self):
        self.arch, self.n_vocab, self.n_ctx_train = "llada", len(VOCAB), 4096
        self.recipe = {}
        self.mask_token_id, self.tokenizer = MASK_ID, SYNTHETIC_TOKENIZER

    def run_for(self, prompt: str, opts: dict) -> Recording:
        events, result = synthetic_run(prompt, **opts)
        return Recording(events=events, result=result)


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
def synthetic_model():
    return SyntheticModel


@pytest.fixture
def recorded_run():
    """recorded_run(name) -> a fresh Recording of tests/fixtures/runs/<name>.npz."""
    return recorded


@pytest.fixture(params=RUN_NAMES)
def each_recorded_run(request):
    return recorded(request.param)


@pytest.fixture
def window(qtbot):
    """The main window, shown; after the test it is closed and its engine thread has ended."""
    from diffuse.studio.main_window import MainWindow

    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()
    qtbot.waitUntil(lambda: not w.engine._thread.isRunning(), timeout=10000)


@pytest.fixture
def model_panel(qtbot):
    """A Models panel after its first listing; shut down after the test."""
    from diffuse.studio.model_panel import ModelPanel

    p = ModelPanel()
    qtbot.addWidget(p)
    qtbot.waitUntil(lambda: p._scan is None, timeout=10000)
    yield p
    p.shutdown()


@pytest.fixture
def synthetic_recording():
    """synthetic_recording(prompt, **options) -> a Recording of synthetic_run, for size sweeps."""
    def make(prompt="Hello", **kw):
        events, result = synthetic_run(prompt, **kw)
        rec = Recording(prompt=prompt, options=kw, events=events, result=result,
                        model={"name": "synthetic", "arch": "llada", "eos_ids": [EOS_ID],
                               "special_ids": [MASK_ID, EOS_ID]})
        return rec.finish(result, SYNTHETIC_TOKENIZER.decode)
    return make


WALL_P95_MS = 50.0     # 95% of the 10 ms timer's gaps, wall clock
# 95% of the gaps, the GUI thread's own CPU time: 12-22 ms measured on a quiet 2-core machine, 27-35 ms
# with a training run beside (load 2.2-3; 1.5x the bound then applies); a GUI that redraws too much
# per tick lands far above
CPU_P95_MS = 40.0
WEDGE_MS = 250.0       # any one gap: a GUI that stops this long is wedged
MIN_GAPS = 60          # gaps a measurement needs (its p95 is then the 4th largest); tests wait
                       # for them (`measured`), not a time


def _cpu_now() -> tuple[float, float, float]:
    """(wall s, the machine's busy CPU s over all cores, this process's CPU s)."""
    import psutil
    t, own = psutil.cpu_times(), psutil.Process().cpu_times()
    return time.perf_counter(), t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0), \
        own.user + own.system


class GapMeter:
    """A 10 ms GUI-thread timer; `gaps()` are the intervals (ms) between its ticks since
    `start()`, and `cpu_gaps()` the GUI thread's CPU time within each interval. A late tick
    with little CPU time in its gap was held up by the OS (other processes), not by our code."""

    def __init__(self):
        from PySide6.QtCore import QTimer
        self.stamps: list[float] = []
        self.cpu: list[float] = []
        self._machine = None      # (wall s, the whole machine's busy CPU s, this process's CPU s) at start
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)

    def _tick(self):
        self.stamps.append(time.perf_counter())
        self.cpu.append(time.thread_time())

    def start(self):
        self.stamps.clear()
        self.cpu.clear()
        self._machine = _cpu_now()
        self.timer.start()

    def stop(self):
        self.timer.stop()

    def others_cores(self) -> float:
        """Cores other processes kept busy since start(): a load that the load average, a
        one-minute mean, shows only long after it began (a p95 of 55 ms was seen at "load 1.1"
        with two busy loops started 20 s before)."""
        (w0, busy0, own0), (w1, busy1, own1) = self._machine, _cpu_now()
        return max(0.0, (busy1 - busy0) - (own1 - own0)) / max(w1 - w0, 1e-3)

    def measured(self) -> bool:
        """Enough gaps for a percentile: on a loaded machine the ticks come late, so a test waits
        for this rather than for a time."""
        return len(self.stamps) > MIN_GAPS + 1

    def gaps(self) -> np.ndarray:
        return np.diff(np.array(self.stamps)) * 1000.0

    def cpu_gaps(self) -> np.ndarray:
        return np.diff(np.array(self.cpu)) * 1000.0

    def assert_responsive(self) -> None:
        """The GUI thread kept ticking: most gaps short, none long enough to call it wedged.

        Speed is the benchmarks' business. On a shared machine one tick can come tens of ms late
        for reasons outside our code (a view painted for the first time, the OS running another
        process), so the usual gaps are held to a percentile and single gaps only to the wedge
        bound. The GUI thread's CPU time per gap is our code's doing: both bounds always apply,
        the p95's 1.5x looser on an oversubscribed machine (a busy sibling core slows the GUI
        thread's own work too). A wall-clock gap can also be the OS's: its bounds apply only while
        the machine is not oversubscribed (load average at most the core count; a p95 of 61 ms
        was seen at load 6.3).
        """
        gaps, cpu = self.gaps(), self.cpu_gaps()
        load, cores, others = os.getloadavg()[0], os.cpu_count(), self.others_cores()
        summary = (f"{len(gaps)} ticks, wall gap p95 {np.percentile(gaps, 95):.1f} ms, max "
                   f"{gaps.max():.1f}; GUI CPU per gap p95 {np.percentile(cpu, 95):.1f} ms, max "
                   f"{cpu.max():.1f}; load {load:.1f} on {cores} cores, other processes {others:.2f} cores")
        print(summary)
        assert len(gaps) > MIN_GAPS, summary
        # a machine other processes share: an oversubscribed one by its load average, or one where
        # they kept a quarter core busy during the measurement
        shared = load > cores or others > 0.25
        # it slows the GUI thread's own work as well (shared cores and caches)
        cpu_p95 = CPU_P95_MS * (1.5 if shared else 1.0)
        assert np.percentile(cpu, 95) < cpu_p95 and cpu.max() < WEDGE_MS, summary
        if not shared:
            assert np.percentile(gaps, 95) < WALL_P95_MS and gaps.max() < WEDGE_MS, summary


@pytest.fixture
def gap_meter(qapp):
    meter = GapMeter()
    yield meter
    meter.stop()


@pytest.fixture(scope="session")
def demo_model():
    """The demo model itself, loaded once: its runs take milliseconds."""
    return diffuse.load(DEMO, threads=1)


@pytest.fixture
def demo_run(demo_model):
    """demo_run(**options) -> a Recording of a fresh demo-model run, made the way
    tests/fixtures/record_runs.py makes the recorded ones: for what those predate (the
    schedule's count in every event) and the threshold rules."""
    m = demo_model

    def make(prompt="Tell me about Mr. Darcy.", **options) -> Recording:
        # resolved once: the recording's options (the drawn seed too) are the run's
        options = resolve_options(m.arch, m.recipe, **options)
        rec = Recording(prompt=prompt, options=options,
                        model={"name": DEMO.name, "arch": m.arch, "path": str(DEMO),
                               "n_vocab": m.n_vocab, "n_ctx_train": m.n_ctx_train,
                               "mask_token_id": m.mask_token_id,
                               "eos_ids": [int(i) for i in m.tokenizer.eos_token_ids],
                               "special_ids": sorted(int(i) for i in m.tokenizer.special_tokens)})
        return rec.finish(m.generate(prompt, on_step=rec.add, **options), m.tokenizer.decode)
    return make
