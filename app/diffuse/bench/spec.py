"""Self-speculation against AR decode on the same weights, in the same engine (issue 30).

Per iteration, self-speculation (mode self_spec) runs a draft pass of k rows (the seed and k - 1
masks over the cache, bidirectional inside the block) and a verify pass of the same k rows
(causal), and commits A tokens: the drafts the verify pass agrees with, plus its bonus token, so
1 <= A <= k. AR decode commits one token per one-row pass. So at acceptance A:

    tok/s = A / (draft ms + verify ms),   against AR's 1 / decode ms,

and self-speculation pays off when A exceeds the break-even (draft ms + verify ms) / decode ms.

`_core.bench_spec_passes` times the three passes at a cached depth (alternating, so all see the
same load); a real AR run of the loop (graph re-planned every token as the context grows) gives
the decode tok/s users get. Acceptance comes from the command line: no diffusion-trained weights
are reachable here, so the default is the published one: Nemotron-Labs-Diffusion-8B, draft of 32,
6.82 tokens per iteration with its draft LoRA and 5.46 without (NVIDIA's model card; whether the
bonus token is counted is not stated: we take it as counted). A is capped at k: for other draft
lengths no figure is published, and the cap is only an upper bound.

A file with the draft LoRA (convert/draft_lora.py) has its draft pass timed both ways; an
iteration costs the LoRA draft (self_spec's default) except at the published no-LoRA acceptance.

    diffuse bench spec MODEL.gguf [--depth 512] [--draft-lengths 4,8,16,32] [--acceptance 5.46,6.82]
    python -m diffuse.bench.spec make OUT.gguf --shape 8b --layers 4    # a random model of real shapes
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from diffuse import DiffuseError

# acceptance -> (what it is, whether it was measured with the draft LoRA)
PUBLISHED = {5.46: ("8B, draft 32, no LoRA (published)", False), 6.82: ("8B, draft 32, draft LoRA (published)", True)}
DRAFT_LENGTHS = (4, 8, 16, 32)
COLUMNS = [("k", "draft length k", "{}"), ("draft_ms", "draft ms", "{:.1f}"),
           ("draft_lora_ms", "draft + LoRA ms", "{:.1f}"), ("verify_ms", "verify ms", "{:.1f}"),
           ("iteration_ms", "iteration ms", "{:.1f}"),
           ("break_even", "break-even A (iteration / decode)", "{:.2f}")]


def run(path: str, depth: int, draft_lengths: list[int], acceptance: list[float], threads: int, reps: int,
        ar_tokens: int = 32, log=lambda line: None) -> dict:
    import diffuse
    from diffuse.bench.machine import describe

    if depth < 1 or reps < 1 or ar_tokens < 1:
        raise DiffuseError("--depth, --reps and --ar-tokens must be at least 1")
    if any(a < 1 for a in acceptance):
        raise DiffuseError("an acceptance length is tokens per iteration: at least 1 (the bonus token)")
    model = diffuse.load(path, threads=threads or None)
    load_before = os.getloadavg()[0]
    log(f"passes at depth {depth}, draft lengths {draft_lengths}, {reps} reps each")
    t = diffuse._core.bench_spec_passes(model._core, depth, list(draft_lengths), threads=threads, reps=reps)
    decode_ms = statistics.median(t["decode_ms"])
    log(f"a real AR run: {ar_tokens} tokens after a {depth}-token prompt")
    prompt = [int(i) for i in np.random.default_rng(0).integers(101, min(model.n_vocab, 30000), depth)]
    events = []
    model.generate(prompt, mode="ar", gen_length=ar_tokens + 1, chat=False, threads=threads or None,
                   on_step=events.append)
    loop_ms = statistics.median(e.forward_ms + e.sample_ms for e in events[1:])   # the prefill's first token excluded
    rows, speed = [], []
    lora = model._core.hparams["draft_lora_rank"] > 0
    for i, k in enumerate(draft_lengths):
        draft = statistics.median(t["draft_ms"][i]) if t["draft_ms"][i] else 0.0
        draft_lora = statistics.median(t["draft_lora_ms"][i]) if t["draft_lora_ms"][i] else None
        verify = statistics.median(t["verify_ms"][i])
        iteration = (draft if draft_lora is None else draft_lora) + verify   # self_spec's default draft
        row = dict(k=k, draft_ms=draft, verify_ms=verify, iteration_ms=iteration, break_even=iteration / decode_ms)
        rows.append(row if draft_lora is None else row | {"draft_lora_ms": draft_lora})
        for a in acceptance:
            used = min(a, k)
            source, with_lora = PUBLISHED.get(a, ("given", True))
            cost = iteration if with_lora or draft_lora is None else draft + verify
            speed.append(dict(k=k, acceptance=a, source=source, draft="LoRA" if lora and with_lora else "base",
                              used=used, tok_s=1000.0 * used / cost, ar_tok_s=1000.0 / decode_ms,
                              speedup=decode_ms * used / cost))
    return dict(model=str(path), hparams=model._core.hparams, depth=depth, threads=model.threads, reps=reps,
                decode_ms=decode_ms, ar_loop_ms=loop_ms, rows=rows, speed=speed, machine=describe(),
                load_average=[load_before, os.getloadavg()[0]], when=time.strftime("%Y-%m-%d %H:%M"))


SPEED_COLUMNS = [("k", "k", "{}"), ("acceptance", "A", "{:.2f}"), ("source", "A from", "{}"),
                 ("draft", "draft", "{}"), ("used", "A used (<= k)", "{:.2f}"), ("tok_s", "self_spec tok/s", "{:.1f}"),
                 ("ar_tok_s", "AR tok/s", "{:.1f}"), ("speedup", "vs AR", "{:.2f}")]


def header(result: dict) -> str:
    hp = result["hparams"]
    lora = f", draft LoRA of rank {hp['draft_lora_rank']}" if hp.get("draft_lora_rank") else ", no draft LoRA"
    return (f"{Path(result['model']).name}: {hp['arch']}, {hp['n_layer']} layers of {hp['n_embd']}, "
            f"vocabulary {hp['n_vocab']}{lora}; depth {result['depth']}, {result['threads']} threads, "
            f"median of {result['reps']}; AR decode {result['decode_ms']:.1f} ms/token at fixed depth, "
            f"{result['ar_loop_ms']:.1f} ms/token in the real loop; load average "
            f"{result['load_average'][0]:.1f} -> {result['load_average'][1]:.1f}")


def markdown(result: dict) -> str:
    from diffuse.bench.machine import describe_line
    from diffuse.bench.tables import md_table
    return "\n\n".join([header(result), describe_line(result["machine"]), md_table(result["rows"], COLUMNS),
                        md_table(result["speed"], SPEED_COLUMNS)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diffuse.bench.spec")
    sub = p.add_subparsers(dest="command", required=True)
    mk = sub.add_parser("make", help="a random Nemotron-Labs-Diffusion GGUF of the 3B or 8B layer shapes (F16)")
    mk.add_argument("out", type=Path)
    mk.add_argument("--shape", choices=["3b", "8b"], default="8b")
    mk.add_argument("--layers", type=int, default=4)
    mk.add_argument("--draft-lora-rank", type=int, default=0,
                    help="with a random draft LoRA of this rank on o_proj (0: none; the real rank is not published)")
    args = p.parse_args(argv)
    from diffuse.bench.random_models import NEMOTRON_SHAPES, write_random_nemotron
    if args.layers < 1 or args.draft_lora_rank < 0:
        raise SystemExit("--layers must be at least 1 and --draft-lora-rank at least 0")
    write_random_nemotron(args.out, args.layers, **NEMOTRON_SHAPES[args.shape], draft_lora_rank=args.draft_lora_rank)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
