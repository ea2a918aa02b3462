"""The training loop: masked diffusion on a byte-level BPE tokenizer of our own.

`arch="llada"` (LLaDA's objective): per row t ~ U(0, 1), p = (1 - eps) t + eps; each maskable
token is replaced by <|mdm_mask|> with probability p; loss = sum over masked positions of
cross-entropy / p, divided by the number of maskable tokens in the row (LLaDA pre-training and
SFT, eqs. 3 and 5 of the paper).

`arch="sdar"` (block diffusion, BD3-LM's objective as SDAR trains it): the same masking with one
p per block of `block_size`, and each block scored against the clean blocks before it in one pass
over [noisy ; clean] (model.block_diffusion_mask); the same loss.

The learning rate follows warm-up then cosine decay over `progress`, the larger of steps done /
`steps` and minutes used / `minutes`, so a time-limited run still ends at the low learning rate.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from diffuse import DiffuseError
from diffuse.train import from_gguf
from diffuse.train.bpe import EOS, MASK, train_bpe
from diffuse.train.data import Batches, heldout_windows, read_documents, split_heldout
from diffuse.train.evaluate import masked_accuracy, torch_logits_fn
from diffuse.train.export import save_hf
from diffuse.train.model import SDAR, LLaDA, Shape

EPS = 1e-3

# What a resumed run must keep: the model's shape, the tokenizer and the recipe. Stored in state.pt,
# so a resume needs none of them again (steps, minutes, threads and eval_every may change).
HPARAMS = ("arch", "block_size", "vocab_size", "d_model", "n_layers", "n_heads", "mlp_hidden_size", "seq_len", "batch",
           "lr", "warmup", "weight_decay", "chat_fraction", "bf16", "seed")
ARCHS = ("llada", "sdar")


@dataclass
class TrainConfig:
    data: Path
    out: Path  # receives hf/ (the checkpoint), state.pt (to resume) and train.log
    arch: str = "llada"  # or "sdar": block diffusion (SDAR's layout and objective)
    block_size: int = 4  # sdar: the blocks it is trained (and decodes) with
    vocab_size: int = 4096
    # The demo recipe: sized so an hour on 2 shared CPU cores sees enough tokens (about 3.3M params)
    d_model: int = 192
    n_layers: int = 4
    n_heads: int = 3
    mlp_hidden_size: int = 512
    seq_len: int = 256
    batch: int = 16
    steps: int = 8000
    minutes: float = 0.0  # 0: no time limit
    lr: float = 2e-3
    warmup: int = 200
    weight_decay: float = 0.1
    chat_fraction: float = 0.25
    bf16: bool = True  # autocast matmuls to bfloat16 (2-3x faster on CPUs with AVX512-BF16/AMX)
    threads: int = 2
    seed: int = 0
    eval_every: int = 500  # steps between held-out scores and checkpoints
    eval_windows: int = 128
    init: Path | None = None  # a float LLaDA GGUF to start from (its shapes and tokenizer; from_gguf.py)


def _lr(cfg: TrainConfig, step: int, progress: float) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def diffusion_loss(model: LLaDA | SDAR, ids: torch.Tensor, maskable: torch.Tensor, mask_id: int,
                   bf16: bool) -> torch.Tensor:
    """ids, maskable: (B, T). Returns the scalar loss: LLaDA's, or per block for SDAR."""
    B, T = ids.shape
    if isinstance(model, SDAR):   # one noise level per block: (B, T / block) -> (B, T)
        p = ((1 - EPS) * torch.rand(B, T // model.block) + EPS).repeat_interleave(model.block, dim=1)
    else:
        p = (1 - EPS) * torch.rand(B, 1) + EPS  # (B, 1)
    masked = (torch.rand(B, T) < p) & maskable
    noisy = torch.where(masked, mask_id, ids)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model.train_logits(noisy, ids) if isinstance(model, SDAR) else model(noisy)
    ce = F.cross_entropy(logits.float()[masked], ids[masked], reduction="none")  # (n_masked,)
    weighted = torch.zeros(B, T).masked_scatter_(masked, ce) / p  # (B, T)
    return (weighted.sum(1) / maskable.sum(1).clamp(min=1)).mean()


def _tokenizer(cfg: TrainConfig, train_docs: list[str], start: Tokenizer | None) -> Tokenizer:
    path = cfg.out / "tokenizer.json"  # reused on resume so the ids never change
    if path.exists() and start is None:     # (a start's own replaces one left by a run never saved)
        return Tokenizer.from_file(str(path))
    tok = start or train_bpe(train_docs, cfg.vocab_size)
    tok.save(str(path))
    return tok


def saved_hparams(out: Path) -> dict | None:
    """The hyper-parameters of the run in `out`; None when there is no run there, or for a run saved
    before they were stored."""
    path = out / "state.pt"
    if not path.exists():
        return None
    try:
        state = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, ValueError) as e:
        raise DiffuseError(f"{path}: cannot read this run's state ({e}); delete the run folder to start over") from e
    return state.get("hparams")


def check(cfg: TrainConfig) -> None:
    """DiffuseError when the model these settings describe cannot be built."""
    if cfg.d_model % cfg.n_heads or (cfg.d_model // cfg.n_heads) % 2:
        raise DiffuseError(f"d_model {cfg.d_model} must split into {cfg.n_heads} heads of even size")
    if cfg.arch not in ARCHS:
        raise DiffuseError(f"arch {cfg.arch!r}: not one of {', '.join(ARCHS)}")
    # windows are seq_len or cut to multiples of seq_len // 8 (data.SHORT_BATCHES): whole blocks each
    if cfg.arch == "sdar" and (cfg.block_size <= 0 or cfg.seq_len % cfg.block_size
                               or (cfg.seq_len // 8) % cfg.block_size):
        raise DiffuseError(f"block size {cfg.block_size} must divide seq_len / 8 ({cfg.seq_len // 8}): every "
                           "training window is a whole number of blocks")


def train(cfg: TrainConfig, log: Callable[[str], None] = print) -> Path:
    """Train (or resume from cfg.out/state.pt); returns the Hugging Face checkpoint folder."""
    check(cfg)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    cfg.out.mkdir(parents=True, exist_ok=True)
    train_docs, held_docs = split_heldout(read_documents(cfg.data))
    state_path = cfg.out / "state.pt"
    start = from_gguf.load(cfg.init) if cfg.init is not None and not state_path.exists() else None
    tok = _tokenizer(cfg, train_docs, start and start[1])
    mask_id = tok.token_to_id(MASK)
    batches = Batches(tok, train_docs, cfg.seq_len, cfg.batch, cfg.chat_fraction, cfg.seed)
    held = heldout_windows(lambda text: tok.encode(text).ids, tok.token_to_id(EOS), held_docs, cfg.seq_len,
                           cfg.eval_windows)
    shape = Shape(tok.get_vocab_size(), cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.mlp_hidden_size, cfg.seq_len)
    model = SDAR(shape, cfg.block_size) if cfg.arch == "sdar" else LLaDA(shape)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() == 1]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    step, used_s = 0, 0.0
    if start is not None:
        if start[0] != shape:
            raise DiffuseError(f"{cfg.init}: shapes {start[0]} differ from the run's {shape}")
        model.load_state_dict(start[2])
        log(f"starting from {cfg.init}")
    if state_path.exists():
        try:
            state = torch.load(state_path, weights_only=True)
            stored = state.get("hparams") or {}
            changed = [f"{k} {getattr(cfg, k)} (the run has {v})" for k, v in stored.items() if getattr(cfg, k) != v]
            if changed:
                raise ValueError(", ".join(changed))
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            step, used_s = state["step"], state["seconds"]
        except (OSError, RuntimeError, KeyError, ValueError) as e:
            raise DiffuseError(f"{state_path}: cannot resume this run with these settings ({e}); "
                               "delete the run folder to start over") from e
        log(f"resumed at step {step} ({used_s / 60:.1f} min)")
    log(f"{cfg.arch} model {n_params / 1e6:.2f}M params, vocab {shape.vocab_size}, "
        f"{len(batches.stream)} training tokens, {held.shape[0]} held-out windows")

    scores: dict = {}

    def checkpoint() -> Path:
        # Into state.pt.part, renamed when complete: a disk that fills mid-save keeps the last checkpoint.
        part = state_path.with_name(state_path.name + ".part")
        try:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "seconds": used_s,
                        "hparams": {k: getattr(cfg, k) for k in HPARAMS}}, part)
            os.replace(part, state_path)
        except (OSError, RuntimeError) as e:     # torch reports a failed write as RuntimeError
            part.unlink(missing_ok=True)
            raise DiffuseError(f"{state_path}: cannot save the checkpoint ({e}); the last complete one is "
                               "kept, run the same command again to resume from it") from None
        info = {"config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
                "step": step, "tokens_seen": step * cfg.batch * cfg.seq_len, "train_minutes": round(used_s / 60, 1),
                "n_params": n_params, "heldout": {str(r): v for r, v in scores.items()}}
        hf = cfg.out / "hf"
        save_hf(model, tok, hf, info)
        return hf

    t_last, loss_sum, n_loss = time.time(), 0.0, 0
    while True:
        progress = max(step / cfg.steps, used_s / (60 * cfg.minutes) if cfg.minutes else 0.0)
        if progress >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step, progress)
        ids, maskable = (torch.from_numpy(a) for a in batches.next())
        loss = diffusion_loss(model, ids, maskable, mask_id, cfg.bf16)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        now = time.time()
        used_s += now - t_last
        t_last = now
        loss_sum, n_loss = loss_sum + loss.item(), n_loss + 1
        if step % 50 == 0:
            log(f"step {step} loss {loss_sum / n_loss:.3f} lr {opt.param_groups[0]['lr']:.2e} "
                f"{used_s / 60:.1f} min {step * cfg.batch * cfg.seq_len / used_s:.0f} tok/s")
            loss_sum, n_loss = 0.0, 0
        if step % cfg.eval_every == 0:
            scores = masked_accuracy(torch_logits_fn(model), held, mask_id)
            log("held-out " + _format(scores))
            checkpoint()
            t_last = time.time()  # scoring and saving are not training time
    if step % cfg.eval_every or not scores:
        scores = masked_accuracy(torch_logits_fn(model), held, mask_id)
    log("final held-out " + _format(scores))
    hf = checkpoint()
    log(f"saved {hf} after {step} steps, {used_s / 60:.1f} min")
    return hf


def _format(scores: dict) -> str:
    return " ".join(f"r={r} acc {v['acc']:.3f} loss {v['loss']:.3f}" for r, v in scores.items())
