"""What one DiffusionGemma denoising step costs on this CPU: a random model with the real layer
shapes of diffusiongemma-26B-A4B-it (d 2816, 16 heads; sliding layers 8 KV heads of 256, full layers
2 of 512 with K = V; dense GELU MLP of 2112 beside 128 experts of 704, top 8; vocabulary 262144,
tied), one sliding and one full layer, in the types of Unsloth's Q4_K_M (gate/up and attention
Q4_K, attn_v and token_embd Q6_K, the down projections Q8_0 since 704 and 2112 are no multiple of
256, router F32). A step is a decoder pass over the canvas (256 rows) with self-conditioning;
the encoder pass over the prompt happens once per canvas.

    python -m diffuse.bench.diffusion_gemma [--threads 2] [--context 512] [--reps 3] [--dir /tmp/dg-bench]

Prints ms per pass of the decoder over 256 rows (with and without self-conditioning), of the
encoder over the context, and of a 1-row pass (which reads every weight once). The arithmetic for
the real 30 layers is in docs/benchmarks.md (section 13)."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from diffuse import _core

D, HEADS, FF, E, TOP, FF_EXP, VOCAB, CANVAS = 2816, 16, 2112, 128, 8, 704, 262144, 256
LAYERS = [(True, 256, 8), (False, 512, 2)]     # (sliding, head_dim, KV heads): one of each kind
F32, Q8_0, Q4_K, Q6_K = 0, 8, 12, 14


def tensors() -> list[tuple[str, int, tuple]]:
    """(name, ggml type, ggml shape) of the model, PR #24423's names."""
    out = [("token_embd.weight", Q6_K, (D, VOCAB)), ("output_norm.weight", F32, (D,)),
           ("rope_freqs.weight", F32, (256,)), ("self_cond_pre_norm.weight", F32, (D,)),
           ("self_cond_gate.weight", Q4_K, (D, FF)), ("self_cond_up.weight", Q4_K, (D, FF)),
           ("self_cond_down.weight", Q8_0, (FF, D))]
    for i, (sliding, hd, kv) in enumerate(LAYERS):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", F32, (D,)), (b + "attn_q.weight", Q4_K, (D, HEADS * hd)),
                (b + "attn_k.weight", Q4_K, (D, kv * hd))]
        if sliding:
            out.append((b + "attn_v.weight", Q6_K, (D, kv * hd)))
        out += [(b + "attn_q_norm.weight", F32, (hd,)), (b + "attn_k_norm.weight", F32, (hd,)),
                (b + "attn_output.weight", Q4_K, (HEADS * hd, D)), (b + "post_attention_norm.weight", F32, (D,)),
                (b + "ffn_norm.weight", F32, (D,)), (b + "ffn_gate.weight", Q4_K, (D, FF)),
                (b + "ffn_up.weight", Q4_K, (D, FF)), (b + "ffn_down.weight", Q8_0, (FF, D)),
                (b + "post_ffw_norm_1.weight", F32, (D,)), (b + "pre_ffw_norm_2.weight", F32, (D,)),
                (b + "ffn_gate_inp.weight", F32, (D, E)), (b + "ffn_gate_inp.scale", F32, (D,)),
                (b + "ffn_gate_up_exps.weight", Q4_K, (D, 2 * FF_EXP, E)),
                (b + "ffn_down_exps.weight", Q8_0, (FF_EXP, D, E)), (b + "ffn_down_exps.scale", F32, (E,)),
                (b + "post_ffw_norm_2.weight", F32, (D,)), (b + "post_ffw_norm.weight", F32, (D,)),
                (b + "layer_output_scale.weight", F32, (1,)), (b + "enc_layer_output_scale.weight", F32, (1,))]
    return out


def write_model(path: Path) -> Path:
    from diffuse.gguf_file import OutTensor, write
    a = "diffusion-gemma"
    kv = {"general.architecture": a, "general.file_type": 15, f"{a}.context_length": 8192,
          f"{a}.embedding_length": D, f"{a}.block_count": len(LAYERS), f"{a}.feed_forward_length": FF,
          f"{a}.expert_count": E, f"{a}.expert_used_count": TOP, f"{a}.expert_feed_forward_length": FF_EXP,
          f"{a}.attention.head_count": HEADS, f"{a}.attention.head_count_kv": [kv for _, _, kv in LAYERS],
          f"{a}.attention.sliding_window_pattern": [s for s, _, _ in LAYERS], f"{a}.attention.sliding_window": 1024,
          f"{a}.attention.key_length": 512, f"{a}.attention.key_length_swa": 256, f"{a}.rope.freq_base": 1e6,
          f"{a}.rope.freq_base_swa": 1e4, f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
          f"{a}.final_logit_softcapping": 30.0, "diffusion.canvas_length": CANVAS}
    types = {k: "str" if isinstance(v, str) else "f32" if isinstance(v, float) else
             "array[i32]" if isinstance(v, list) and not isinstance(v[0], bool) else
             "array[bool]" if isinstance(v, list) else "u32" for k, v in kv.items()}
    specs = tensors()
    rng = np.random.default_rng(0)

    def data():
        for name, t, shape in specs:
            if t == F32:
                if name == "rope_freqs.weight":
                    yield np.r_[np.ones(64, np.float32), np.full(192, 1e30, np.float32)]
                elif len(shape) == 2:   # the router
                    yield (rng.standard_normal(shape[::-1], np.float32) / np.float32(np.sqrt(shape[0])))
                else:
                    yield np.ones(shape, np.float32)
                continue
            rows = int(np.prod(shape[1:]))
            chunks = []
            for r0 in range(0, rows, 8192):   # rows of shape[0] values, quantised a slab at a time
                x = rng.standard_normal((min(8192, rows - r0), shape[0]), np.float32) / np.float32(np.sqrt(shape[0]))
                chunks.append(_core.quantize_rows(x, t))
            yield np.concatenate(chunks)

    path.parent.mkdir(parents=True, exist_ok=True)
    write(path, kv, types, [OutTensor(n, t, s) for n, t, s in specs], data())
    return path


def time_canvas(model, context: list[int], threads: int) -> dict:
    """One real run of one canvas over `context`, two steps, timed by the engine: `first_ms` the
    decoder's first pass (no self-conditioning), `ms` its second (self-conditioned, as every later
    step is), `encoder_ms` the encoder's pass over the context (the run's prefill)."""
    events = []
    # stop_entropy: the least the engine takes, so that no canvas settles before its second step
    out = model.generate(context, gen_length=model._core.hparams["canvas_length"], steps=2, stop_entropy=1e-6,
                         chat=False, threads=threads, on_step=events.append)
    return {"first_ms": events[0].forward_ms, "ms": events[1].forward_ms, "encoder_ms": out.prefill_ms}


def main() -> None:
    import diffuse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/dg-bench"))
    args = ap.parse_args()
    path = args.dir / "diffusion-gemma-2layer-q4_k_m.gguf"
    if not path.exists():
        t0 = time.perf_counter()
        write_model(path)
        print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.0f} s")
    m = diffuse.load(path, threads=args.threads, flash_attn=True, kv_f16=True)
    rng = np.random.default_rng(1)
    ctx = rng.integers(0, VOCAB, args.context)
    canvas = rng.integers(0, VOCAB, CANVAS)
    sc = rng.standard_normal((CANVAS, VOCAB)).astype(np.float32)

    def best(f) -> float:
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        return 1000 * min(times)

    print(f"threads {args.threads}, {len(LAYERS)} layers (1 sliding, 1 full), Q4_K_M types, "
          f"weights {m.weights_bytes / 2**30:.2f} GiB", flush=True)
    # forward_canvas = encoder pass + decoder pass; a 1-token context or canvas isolates the other.
    cases = [("1-row encoder + 1-row decoder", lambda: m.forward(ctx[:1], canvas=canvas[:1])),
             (f"encoder over {args.context} rows (+ a 1-row decoder)", lambda: m.forward(ctx, canvas=canvas[:1])),
             (f"decoder over {CANVAS} rows (+ a 1-row encoder)", lambda: m.forward(ctx[:1], canvas=canvas)),
             ("... with self-conditioning", lambda: m.forward(ctx[:1], canvas=canvas, self_conditioning=sc))]
    for what, f in cases:
        print(f"{what}: {best(f):.0f} ms", flush=True)


if __name__ == "__main__":
    main()
