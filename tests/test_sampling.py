"""Per-row sampling (_core.sample_rows) against straightforward full-vocabulary implementations:
Dream's categorical over the whole sorted distribution, LLaDA's Gumbel noise on every token. The
engine sorts only the prefix it reads and skips hopeless Gumbel scores; the tokens must not change."""
from __future__ import annotations

import numpy as np
import pytest

from diffuse import DiffuseError, _core

BANNED = np.float32(-1e30)
STATS = ("conf", "margin", "neg_entropy")


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(seed: int, step: int, key: int, index: np.ndarray) -> np.ndarray:
    """rng.h's uniform01(rng_key(seed, step, key), index)."""
    with np.errstate(over="ignore"):
        k = _splitmix64(_splitmix64(_splitmix64(np.array([seed], np.uint64)) ^ np.uint64(step)) ^ np.uint64(key))
        r = _splitmix64(k ^ _splitmix64(np.asarray(index, np.uint64)))
    return ((r >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)


def _banned(l: np.ndarray, mask: int) -> np.ndarray:
    l = l.copy()
    if 0 <= mask < l.size:
        l[mask] = BANNED
    return l


def dream_full_sort(l, temperature, top_k, top_p, u):
    """Dream's sample_tokens on the whole vocabulary sorted by (value descending, token id)."""
    inv_t = np.float32(1) / np.float32(temperature) if temperature > 0 else np.float32(1)
    v = np.maximum(l * inv_t, BANNED)
    order = np.lexsort((np.arange(v.size), -v))
    d = v[order].astype(np.float64) - np.float64(v[order[0]])
    e = np.exp(d)
    keep = v.size
    if top_p < 1:
        over = np.nonzero(np.cumsum(e / e.sum()) > np.float64(np.float32(top_p)))[0]
        keep = int(over[0]) + 1 if over.size else v.size
    if top_k > 0:
        keep = min(keep, top_k)
    e, d = e[:keep], d[:keep]
    z = e.sum()
    pick = 0
    if temperature > 0:
        pick = min(int(np.searchsorted(np.cumsum(e), u * z)), keep - 1)   # first cum >= u z
    p = e / z
    return {"x0": int(order[pick]), "conf": p[pick], "margin": p[0] - (p[1] if keep > 1 else 0.0),
            "neg_entropy": float((e * d).sum() / z - np.log(z))}


def gumbel_full_pass(l, temperature, u):
    return int(np.argmax(l.astype(np.float64) - temperature * np.log(-np.log(u))))


def logits(kind: str, rows: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "flat":     # random-weight models: N(0, 1), mass spread over the whole vocabulary
        return rng.standard_normal((rows, vocab), np.float32)
    if kind == "peaked":   # trained models: a few tokens far above the rest
        l = rng.standard_normal((rows, vocab), np.float32) * 3
        for r in range(rows):
            l[r, rng.integers(0, vocab, 8)] += rng.uniform(5, 25, 8).astype(np.float32)
        return l
    if kind == "wide":     # a spread of hundreds of nats: the buckets' open tail holds most tokens
        return (rng.standard_normal((rows, vocab)) * 60).astype(np.float32)
    if kind == "ties":     # a few distinct values: the order among equal values decides the draw
        return (rng.integers(-6, 3, (rows, vocab)) * 0.5).astype(np.float32)
    raise ValueError(kind)


def check_dream(l, keys, seed, step, mask, temperature, top_k, top_p, threads=1):
    got = _core.sample_rows(l, keys, temperature=temperature, top_k=top_k, top_p=top_p, gumbel=False,
                            seed=seed, step=step, mask_token_id=mask, threads=threads)
    for r in range(l.shape[0]):
        u = _uniform(seed, step, int(keys[r]), np.array([0]))[0]
        want = dream_full_sort(_banned(l[r], mask), temperature, top_k, top_p, u)
        assert got["x0"][r] == want["x0"], (r, temperature, top_k, top_p)
        for name in STATS:
            assert got[name][r] == pytest.approx(want[name], rel=1e-5, abs=1e-6), (name, r)
    for name in ("x0", *STATS, "p_x0", "top1", "entropy"):
        assert np.all(np.isfinite(got[name]))
    return got


DREAM_CONFIGS = [  # temperature, top_k, top_p
    (0.7, 0, 1.0), (0.7, 50, 0.95), (0.7, 0, 0.95), (0.7, 50, 1.0), (1.5, 0, 0.5), (0.2, 0, 1.0),
    (0.7, 1, 1.0), (0.7, 0, 1e-6), (0.7, 10_000, 1.0), (0.7, 3, 0.999), (0.0, 10, 1.0), (0.0, 0, 0.9),
    (0.0, 10_000, 1.0), (50.0, 0, 1.0),
]


@pytest.mark.parametrize("kind", ["flat", "peaked", "wide", "ties"])
@pytest.mark.parametrize("temperature,top_k,top_p", DREAM_CONFIGS)
def test_dream_matches_full_sort(kind, temperature, top_k, top_p):
    for seed in range(3):
        l = logits(kind, 6, 3000, seed)
        keys = np.arange(6, dtype=np.int32) * 7 + seed
        check_dream(l, keys, seed=seed, step=seed + 1, mask=-1, temperature=temperature, top_k=top_k, top_p=top_p)


def test_dream_draws_follow_the_tempered_softmax():
    """Many draws of one flat row (the same logits under 100 keys and 40 steps): deep picks agree
    with the full sort too, and the frequencies are softmax(l / T)."""
    l = np.repeat(logits("flat", 1, 40, 5), 100, axis=0)
    keys = np.arange(100, dtype=np.int32)
    counts = np.zeros(40)
    for step in range(40):
        got = check_dream(l, keys, seed=9, step=step, mask=-1, temperature=2.0, top_k=0, top_p=1.0)
        counts += np.bincount(got["x0"], minlength=40)
    p = np.exp(l[0] / 2.0)
    assert np.abs(counts / counts.sum() - p / p.sum()).max() < 0.01


def test_mask_token_is_never_sampled():
    l = logits("peaked", 8, 2000, 1)
    mask = 1234
    l[:, mask] = 80.0   # the mask would win every row
    l[0, :] = -5.0
    l[0, mask] = 80.0   # the mask holds all the mass; the rest tie
    for temperature, top_k, top_p in [(0.7, 0, 1.0), (0.7, 1, 1.0), (0.7, 0, 1e-6), (0.0, 5, 1.0), (1.0, 50, 0.95)]:
        got = check_dream(l, np.arange(8, dtype=np.int32), seed=4, step=2, mask=mask, temperature=temperature,
                          top_k=top_k, top_p=top_p)
        assert mask not in got["x0"].tolist()
        assert got["x0"][0] == 0 if temperature == 0 or top_k == 1 or top_p < 1e-3 else True
    got = _core.sample_rows(l, np.arange(8, dtype=np.int32), temperature=0.7, gumbel=True, seed=4, mask_token_id=mask)
    assert mask not in got["x0"].tolist()


@pytest.mark.parametrize("temperature", [0.01, 0.7, 5.0, 100.0])
@pytest.mark.parametrize("kind", ["flat", "peaked", "wide", "ties"])
def test_gumbel_matches_full_pass(kind, temperature):
    mask = 17
    for seed in range(4):
        l = logits(kind, 12, 3000, seed)
        keys = np.arange(12, dtype=np.int32) + 100 * seed
        got = _core.sample_rows(l, keys, temperature=temperature, gumbel=True, seed=seed, step=3, mask_token_id=mask)
        for r in range(12):
            u = _uniform(seed, 3, int(keys[r]), np.arange(3000))
            assert got["x0"][r] == gumbel_full_pass(_banned(l[r], mask), temperature, u), (r, seed)


def test_rows_are_independent_of_threads_and_batching():
    l = logits("ties", 12, 3000, 2)
    keys = np.arange(12, dtype=np.int32)[::-1].copy()
    for kw in [dict(temperature=0.7, gumbel=False, top_p=0.9), dict(temperature=0.7, gumbel=True)]:
        one = _core.sample_rows(l, keys, threads=1, seed=8, **kw)
        two = _core.sample_rows(l, keys, threads=2, seed=8, **kw)
        alone = _core.sample_rows(l[5:6], keys[5:6], threads=1, seed=8, **kw)
        for name in ("x0", *STATS):
            assert one[name].tolist() == two[name].tolist()
            assert alone[name][0] == one[name][5]


def test_greedy_is_the_raw_argmax_with_ties_to_the_lower_id():
    l = np.zeros((1, 50), np.float32)
    l[0, [7, 3, 40]] = 2.0
    assert _core.sample_rows(l, np.zeros(1, np.int32))["x0"].tolist() == [3]
    assert _core.sample_rows(l, np.zeros(1, np.int32), gumbel=False, top_k=2)["x0"].tolist() == [3]
    signed = np.zeros((2, 40), np.float32)
    signed[:, 1::3] = -0.0   # -0 == +0: a tie like any other
    for temperature, top_k, top_p in [(0.0, 5, 1.0), (0.7, 0, 0.5), (0.7, 7, 1.0)]:
        check_dream(signed, np.arange(2, dtype=np.int32), seed=1, step=0, mask=-1, temperature=temperature,
                    top_k=top_k, top_p=top_p)


@pytest.mark.parametrize("shape,keys,match", [
    ((3,), 3, "rows, vocab"), ((2, 0), 2, "rows, vocab"), ((2, 5), 3, "one entry per row"),
])
def test_bad_arrays_raise(shape, keys, match):
    with pytest.raises(DiffuseError, match=match):
        _core.sample_rows(np.zeros(shape, np.float32), np.zeros(keys, np.int32))
