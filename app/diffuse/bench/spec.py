"""Self-speculation against AR decode on the same weights, in the same engine (issue 30).

Per iteration, self-speculation (mode self_spec) runs a draft pass of k rows (the seed and k - 1
masks over the cache, bidirectional inside the block) and a verify pass of the same k rows
(causal), and commits A tokens: the drafts the verify pass agrees with, plus its bonus token, so
1 <= A <= k. AR decode commits one token per one-row pass. So at acceptance A:

    tok/s = A / (draft ms + verify ms),   against AR's 1 / decode ms,

and self-speculation pays off when A exceeds the break-even (draft ms + verify ms) / decode ms.

llama.cpp's AR decode of the same weights stands beside ours: `llama-bench` decoding --ar-tokens
tokens after --depth cached ones (its `tg` at depth, flash attention and F16 K/V as ours), run
between our repetitions so both see the same load. A Nemotron-Labs-Diffusion file is written
for it as llama.cpp's `mistral3` (the Ministral3 graph: YaRN and the llama-4 query scale; the
same tensors, q/k rows reordered for its NORM RoPE) in a temporary folder, removed after; for
other families --llama-model names a llama.cpp GGUF of the same weights. Without llama-bench
(--llama-bin DIR or $DIFFUSE_LLAMA_BIN) the column is left out and the output says why.

`_core.bench_spec_passes` times the three passes at a cached depth (alternating, so all see the
same load); a real AR run of the loop (graph re-planned every token as the context grows) gives
the decode tok/s users get. Acceptance comes from the command line: no diffusion-trained weights
are reachable here, so the default is the published one: Nemotron-Labs-Diffusion-8B, draft of 32,
6.82 tokens per iteration with its draft LoRA and 5.46 without (NVIDIA's model card; whether the
bonus token is counted is not stated: we take it as counted). A is capped at k: for other draft
lengths no figure is published, and the cap is only an upper bound.

A file with the draft LoRA (convert/draft_lora.py) has its draft pass timed both ways; an
iteration costs the LoRA draft (self_spec's default) except at the published no-LoRA acceptance.
On another family's file (WeDLM, SDAR, ...) the published figures are Nemotron's, applied there as
an assumption: the output says so. DiffusionGemma has no causal decode to draft for: refused in
one line before anything runs (`bench knee` times its canvas step).

    diffuse bench spec MODEL.gguf [--depth 512] [--draft-lengths 4,8,16,32] [--acceptance 5.46,6.82]
                                  [--llama-bin DIR] [--llama-model LLAMA.gguf]
    python -m diffuse.bench.spec make OUT.gguf --shape 8b --layers 4    # a random model of real shapes
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from diffuse import DiffuseError

# acceptance -> (what it is, whether it was measured with the draft LoRA); NVIDIA's model card
PUBLISHED = {5.46: ("Nemotron-Labs-Diffusion-8B, draft 32, no LoRA (published)", False),
             6.82: ("Nemotron-Labs-Diffusion-8B, draft 32, draft LoRA (published)", True)}
PUBLISHED_ARCH = "nemotron-diffusion"     # the family those figures were measured on
DRAFT_LENGTHS = (4, 8, 16, 32)
COLUMNS = [("k", "draft length k", "{}"), ("draft_ms", "draft ms", "{:.1f}"),
           ("draft_lora_ms", "draft + LoRA ms", "{:.1f}"), ("verify_ms", "verify ms", "{:.1f}"),
           ("iteration_ms", "iteration ms", "{:.1f}"),
           ("break_even", "break-even A (iteration / decode)", "{:.2f}"),
           ("break_even_llama", "break-even A vs llama.cpp", "{:.2f}")]
# our architecture -> llama.cpp's architecture of the same graph, for the twin file llama-bench runs
LLAMA_TWINS = {"nemotron-diffusion": "mistral3"}


def run(path: str, depth: int, draft_lengths: list[int], acceptance: list[float], threads: int, reps: int,
        ar_tokens: int = 32, llama_bin: str | None = None, llama_model: str | None = None,
        log=lambda line: None) -> dict:
    import diffuse
    from diffuse.bench.llama_ref import find_bins, llama_bench
    from diffuse.bench.machine import describe

    if depth < 1 or reps < 1 or ar_tokens < 1:
        raise DiffuseError("--depth, --reps and --ar-tokens must be at least 1")
    if any(a < 1 for a in acceptance):
        raise DiffuseError("an acceptance length is tokens per iteration: at least 1 (the bonus token)")
    model = diffuse.load(path, threads=threads or None)
    if model._core.hparams.get("canvas_length", 0):
        raise DiffuseError(f"{Path(path).name}: self-speculation does not apply to DiffusionGemma: its decoder "
                           "denoises a whole canvas over the encoded context, with no causal decode to draft for "
                           "or to compare with (diffuse bench knee times its canvas step)")
    bench = find_bins(llama_bin).bench
    with ExitStack() as stack:
        llama_file, llama_note = _llama_file(path, model.arch, bench, llama_model, stack, log)
        load_before = os.getloadavg()[0]
        log(f"passes at depth {depth}, draft lengths {draft_lengths}, {reps} reps each"
            + (f", alternated with llama-bench's decode of {ar_tokens} tokens" if llama_file else ""))
        t = {"decode_ms": [], **{key: [[] for _ in draft_lengths] for key in ("draft_ms", "verify_ms", "draft_lora_ms")}}
        llama_samples = []
        for _ in range(reps):   # one rep of ours, then one of llama.cpp's: both see the same load
            one = diffuse._core.bench_spec_passes(model._core, depth, list(draft_lengths), threads=threads, reps=1)
            t["decode_ms"] += one["decode_ms"]
            for key in ("draft_ms", "verify_ms", "draft_lora_ms"):
                for mine, got in zip(t[key], one[key]):
                    mine += got
            if llama_file:
                try:
                    tg = llama_bench(bench, llama_file, n_prompt=0, n_gen=ar_tokens, threads=model.threads,
                                     reps=1, flash_attn=True, depth=depth)
                    llama_samples.append(tg["ms"] / ar_tokens)
                except DiffuseError as e:   # an older build without the architecture: our numbers still count
                    llama_file, llama_samples = None, []
                    llama_note = f"llama.cpp: failed, left out: {str(e).splitlines()[0]}"
                    log(str(e))
    decode_ms = statistics.median(t["decode_ms"])
    llama_ms = statistics.median(llama_samples) if llama_samples else None
    log(f"a real AR run: {ar_tokens} tokens after a {depth}-token prompt")
    prompt = [int(i) for i in np.random.default_rng(0).integers(101, min(model.n_vocab, 30000), depth)]
    events = []
    model.generate(prompt, mode="ar", gen_length=ar_tokens + 1, chat=False, threads=threads or None,
                   on_step=events.append)
    loop = [e.forward_ms + e.sample_ms for e in events[1:]]   # the prefill's first token excluded
    loop_ms = statistics.median(loop) if loop else None      # None: end-of-text came first
    rows, speed = [], []
    lora = model._core.hparams["draft_lora_rank"] > 0
    assumed = model.arch != PUBLISHED_ARCH
    for i, k in enumerate(draft_lengths):
        draft = statistics.median(t["draft_ms"][i]) if t["draft_ms"][i] else 0.0
        draft_lora = statistics.median(t["draft_lora_ms"][i]) if t["draft_lora_ms"][i] else None
        verify = statistics.median(t["verify_ms"][i])
        iteration = (draft if draft_lora is None else draft_lora) + verify   # self_spec's default draft
        row = dict(k=k, draft_ms=draft, verify_ms=verify, iteration_ms=iteration, break_even=iteration / decode_ms)
        rows.append(row | ({"draft_lora_ms": draft_lora} if draft_lora is not None else {})
                    | ({"break_even_llama": iteration / llama_ms} if llama_ms else {}))
        for a in acceptance:
            used = min(a, k)
            source, with_lora = PUBLISHED.get(a, ("given", True))
            if assumed and a in PUBLISHED:
                source += f", assumed for this {model.arch} file"
            cost = iteration if with_lora or draft_lora is None else draft + verify
            draft_kind = "LoRA" if lora and with_lora else "base, no LoRA in this file" if with_lora else "base"
            speed.append(dict(k=k, acceptance=a, source=source, draft=draft_kind,
                              used=used, tok_s=1000.0 * used / cost, ar_tok_s=1000.0 / decode_ms,
                              speedup=decode_ms * used / cost)
                         | ({"llama_tok_s": 1000.0 / llama_ms, "vs_llama": llama_ms * used / cost}
                            if llama_ms else {}))
    llama = dict(bench=str(bench), note=llama_note, decode_ms=llama_ms, samples_ms=llama_samples, ar_tokens=ar_tokens)
    return dict(model=str(path), hparams=model._core.hparams, depth=depth, threads=model.threads, reps=reps,
                decode_ms=decode_ms, decode_samples_ms=t["decode_ms"], ar_loop_ms=loop_ms, rows=rows, speed=speed,
                machine=describe(), llama=llama,
                acceptance_note=(f"The published acceptance lengths are Nemotron-Labs-Diffusion-8B's (NVIDIA's model "
                                 f"card), applied to this {model.arch} file as an assumption: none is published for it."
                                 if assumed and any(a in PUBLISHED for a in acceptance) else None),
                load_average=[load_before, os.getloadavg()[0]], when=time.strftime("%Y-%m-%d %H:%M"))


def _llama_file(path: str, arch: str, bench: Path | None, llama_model: str | None, stack: ExitStack,
                log) -> tuple[str | None, str]:
    """The GGUF llama-bench decodes (None: it cannot run) and what the output says of it."""
    if bench is None:
        return None, "llama.cpp: absent (llama-bench not found: --llama-bin DIR or $DIFFUSE_LLAMA_BIN)"
    if llama_model:
        return llama_model, f"llama.cpp: {bench} on {llama_model}"
    twin = LLAMA_TWINS.get(arch)
    if twin is None:
        return None, (f"llama.cpp: not run: no llama.cpp architecture takes a {arch} file as it is "
                      f"(--llama-model LLAMA.gguf: a llama.cpp GGUF of the same weights)")
    size = os.path.getsize(path)
    folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="diffuse-spec-")))
    free = shutil.disk_usage(folder).free
    if free < size + 2**28:
        return None, (f"llama.cpp: not run: its {twin} copy of the weights needs {size / 2**30:.1f} GiB in "
                      f"{folder.parent}, {free / 2**30:.1f} GiB free (--llama-model LLAMA.gguf: one made before)")
    log(f"the same weights as llama.cpp's {twin} ({size / 2**30:.1f} GiB, in {folder}, removed after)")
    out = write_llama_twin(path, folder / f"{Path(path).stem}-{twin}.gguf", twin)
    return str(out), f"llama.cpp: {bench} on the same weights as its {twin} architecture"


def write_llama_twin(src: str | os.PathLike, out: Path, twin: str) -> Path:
    """`src`'s weights as llama.cpp's architecture `twin`: the same tensors, bytes as they are (any
    type), but q/k rows reordered from rotate-half RoPE pairs to llama.cpp's adjacent ones (NORM
    mode, as its converter for Ministral3 writes them); the hyperparameters under `twin.*`; no
    tokenizer, only the vocabulary's size (llama-bench decodes random token ids). Only the `.weight`
    tensors: a draft LoRA's (`.lora_a`, `.lora_b`) serves the draft pass, which AR decode never runs."""
    from diffuse import gguf_file
    from diffuse.convert.families import qk_row_order
    info = gguf_file.read(src)
    tensors = [t for t in info.tensors if t.name.endswith(".weight")]
    prefix = f"{info.architecture}."
    kv, types = {}, {}
    for key, value in info.kv.items():
        if key.startswith(prefix) or key.startswith("general."):
            new = f"{twin}." + key[len(prefix):] if key.startswith(prefix) else key
            kv[new], types[new] = value, info.kv_types[key]
    n_vocab = next(t.shape[1] for t in tensors if t.name == "token_embd.weight")
    extra = {"general.architecture": (twin, "str"), "tokenizer.ggml.model": ("none", "str"),
             f"{twin}.vocab_size": (n_vocab, "u32")}
    if f"{twin}.attention.key_length" in kv and f"{twin}.attention.value_length" not in kv:
        extra[f"{twin}.attention.value_length"] = (kv[f"{twin}.attention.key_length"], "u32")
    for key, (value, kind) in extra.items():
        kv[key], types[key] = value, kind
    heads = {"attn_q": kv[f"{twin}.attention.head_count"], "attn_k": kv[f"{twin}.attention.head_count_kv"]}

    def data():
        for t in tensors:
            kind = t.name.split(".")[-2]
            yield t.raw()[qk_row_order(t.shape[1], heads[kind])] if kind in heads else t.raw()

    gguf_file.write(out, kv, types, [gguf_file.OutTensor(t.name, t.type, t.shape) for t in tensors], data())
    return out


SPEED_COLUMNS = [("k", "k", "{}"), ("acceptance", "A", "{:.2f}"), ("source", "A from", "{}"),
                 ("draft", "draft", "{}"), ("used", "A used (<= k)", "{:.2f}"), ("tok_s", "self_spec tok/s", "{:.1f}"),
                 ("ar_tok_s", "AR tok/s", "{:.1f}"), ("speedup", "vs AR", "{:.2f}"),
                 ("llama_tok_s", "llama.cpp tok/s", "{:.1f}"), ("vs_llama", "vs llama.cpp", "{:.2f}")]


def header(result: dict) -> str:
    hp = result["hparams"]
    lora = f", draft LoRA of rank {hp['draft_lora_rank']}" if hp.get("draft_lora_rank") else ", no draft LoRA"
    return (f"{Path(result['model']).name}: {hp['arch']}, {hp['n_layer']} layers of {hp['n_embd']}, "
            f"vocabulary {hp['n_vocab']}{lora}; depth {result['depth']}, {result['threads']} threads, "
            f"median of {result['reps']}; AR decode {result['decode_ms']:.1f} ms/token at fixed depth, "
            + (f"{result['ar_loop_ms']:.1f} ms/token in the real loop" if result["ar_loop_ms"] is not None
               else "none from the real loop (its answer ended at end-of-text first)")
            + f"; load average {result['load_average'][0]:.1f} -> {result['load_average'][1]:.1f}\n"
            + llama_line(result)
            + (f"\n{result['acceptance_note']}" if result.get("acceptance_note") else ""))


def llama_line(result: dict) -> str:
    llama = result["llama"]
    if llama["decode_ms"] is None:
        return llama["note"]
    return (f"{llama['note']}: {llama['decode_ms']:.1f} ms/token decoding {llama['ar_tokens']} tokens after "
            f"{result['depth']} (median of {len(llama['samples_ms'])}, alternated with ours)")


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
