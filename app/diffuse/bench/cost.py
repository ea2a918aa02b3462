"""What a forward pass costs on paper: its matrix products, FLOPs and weight bytes (and, for a
denoising step, its attention and K/V bytes), and how fast ggml's own mat-mul runs those products
on this machine (the ceiling a forward pass can reach)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from diffuse import _core, gguf_file

# Rows of a weight used to time its product: the head (n_vocab rows) is timed on a slice and
# scaled, as ggml splits a product by rows and its time is linear in them.
CEILING_MAX_ROWS = 16384


@dataclass(frozen=True)
class MatMul:
    """One weight matrix y = W x of the forward pass: W (m, k) of ggml type `type`."""
    name: str
    type: int
    k: int          # input features
    m: int          # output features
    nbytes: int

    @property
    def params(self) -> int:
        return self.k * self.m


def matmuls(path: str) -> list[MatMul]:
    """Every weight that goes through a mat-mul, from the file's tensor table: the layer matrices
    and the head (`output.weight`, or the tied `token_embd.weight`). The routed experts of an MoE
    layer, (k, m, n_expert), count as the product each position does: with expert_used_count of
    them, (k, m * used), while their bytes are all of them (a pass of many rows reads every one)."""
    info = gguf_file.read(path)
    names = {t.name for t in info.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    used = int(info.kv.get(f"{info.kv.get('general.architecture')}.expert_used_count", 0))
    out = []
    for t in info.tensors:
        if len(t.shape) == 2 and (t.name.startswith("blk.") or t.name == head):
            out.append(MatMul(t.name, t.type, t.shape[0], t.shape[1], t.nbytes))
        elif len(t.shape) == 3 and t.name.startswith("blk.") and used:
            out.append(MatMul(t.name, t.type, t.shape[0], t.shape[1] * used, t.nbytes))
    return out


def attention_flops(hp: dict, n_q: int, n_kv: int) -> float:
    """Q K^T and (softmax) V over all layers: 2 products of n_q x n_kv x head_dim per head."""
    return 4.0 * hp["n_layer"] * n_q * n_kv * hp["head_dim"] * hp["n_head"]


def forward_flops(mms: list[MatMul], hp: dict, n_tokens: int) -> dict:
    """FLOPs of a forward pass of n_tokens positions with logits for every row (what
    Model.forward computes): matmul = 2 * params * n_tokens, attention as above."""
    matmul = 2.0 * sum(mm.params for mm in mms) * n_tokens
    attention = attention_flops(hp, n_tokens, n_tokens)
    return {"matmul": matmul, "attention": attention, "total": matmul + attention}


def weight_bytes(mms: list[MatMul]) -> int:
    return sum(mm.nbytes for mm in mms)


def head(mms: list[MatMul]) -> MatMul:
    """The output head: the product with the most rows (n_vocab)."""
    return max(mms, key=lambda mm: mm.m)


def kv_bytes(hp: dict, n_positions: int, kv_f16: bool = True) -> float:
    """Keys and values of n_positions over all layers (n_head_kv heads of head_dim each)."""
    return 2.0 * hp["n_layer"] * n_positions * hp["n_head_kv"] * hp["head_dim"] * (2 if kv_f16 else 4)


def step_cost(mms: list[MatMul], hp: dict, n_rows: int, n_kv: int, n_logits: int, kv_f16: bool = True) -> dict:
    """One denoising step on paper: n_rows recomputed positions go through the layers and attend
    over n_kv positions, n_logits of them through the head. Bytes: every weight read once, the
    K/V of the n_kv positions read and those of the n_rows written (flash attention keeps the
    scores in cache). Arithmetic intensity = FLOPs / bytes."""
    out = head(mms)
    body = sum(mm.params for mm in mms) - out.params
    flops = 2.0 * (body * n_rows + out.params * n_logits) + attention_flops(hp, n_rows, n_kv)
    nbytes = weight_bytes(mms) + kv_bytes(hp, n_kv + n_rows, kv_f16)
    return {"flops": flops, "bytes": nbytes, "ai": flops / nbytes}


def matmul_ceiling(mms: list[MatMul], n_tokens: int, threads: int, reps: int = 3) -> dict:
    """ggml's own y = W x at every distinct (type, k, m) of the model, n_tokens columns: the
    seconds all the model's products take at that speed, and the GFLOP/s it amounts to."""
    seconds = 0.0
    for (type_, k, m), count in Counter((mm.type, mm.k, mm.m) for mm in mms).items():
        rows = min(m, CEILING_MAX_ROWS)
        s = _core.bench_matmul(type_, k, rows, n_tokens, threads=threads, reps=reps)
        seconds += count * s * m / rows
    flops = 2.0 * sum(mm.params for mm in mms) * n_tokens
    return {"seconds": seconds, "gflops": flops / seconds / 1e9}


def type_mix(mms: list[MatMul]) -> str:
    """'Q4_K 61%, Q6_K 27%, ...' by weight bytes."""
    by_type = Counter()
    for mm in mms:
        by_type[_core.type_info(mm.type)["name"]] += mm.nbytes
    total = sum(by_type.values())
    return ", ".join(f"{name.upper()} {100 * b / total:.0f}%" for name, b in by_type.most_common())
