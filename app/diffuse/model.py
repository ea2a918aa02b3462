"""The Python face of a loaded model: hyper-parameters, tokenizer, forward pass."""
from __future__ import annotations

import itertools
import numbers
import os
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from diffuse import _core, gguf_file, recipe
from diffuse._core import DiffuseError
from diffuse.convert import diffusion_gemma
from diffuse.events import GenerateResult, StepEvent
from diffuse.generation import ARCHITECTURES, resolve_options


class Model:
    """A GGUF model, memory-mapped. Use :func:`diffuse.load`.

    Thread-safe: forward, generate, generate_batch and generate_stream may run on one Model from
    several threads at once (each call borrows its own engine context: compute buffers, K/V caches,
    thread count; the engine releases the GIL while it computes). Setting `threads` changes the default of later calls.
    A StepEvent's arrays are copies: they stay valid after the callback returns.
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None,
                 tokenizer: str | os.PathLike | None = None, repack: bool = False,
                 flash_attn: bool = True, kv_f16: bool = True):
        self.path = str(path)
        self._core = _core.Model(self.path, threads=_threads(threads), repack=repack, flash_attn=flash_attn,
                                 kv_f16=kv_f16)
        hp = self._core.hparams
        self.hparams: dict = hp
        self.arch: str = hp["arch"]         # the architecture ("llada2"): what labels show, what options take
        self.family: str = hp["family"]     # whose loop, defaults and chat conventions apply ("sdar")
        self.dialect: str = hp["dialect"]
        self.n_vocab: int = hp["n_vocab"]
        self.n_layer: int = hp["n_layer"]
        self.n_ctx_train: int = hp["n_ctx_train"]
        self.mask_token_id: int = hp["mask_token_id"]
        self.n_expert: int = hp["n_expert"]   # routed experts per layer; 0 for a dense model
        # The options the file suggests (diffuse.recipe): with the family's defaults under them,
        # the defaults of every call that leaves an option to None.
        self.recipe: dict = {}
        self.recipe_problem: str | None = None     # why the file's recipe was ignored
        info = gguf_file.read(self.path)
        gemma = self.arch == diffusion_gemma.ARCH
        # Image tokens a text-only model refuses (DiffusionGemma: its vision tower is not converted).
        self.image_token_ids: frozenset[int] = diffusion_gemma.image_token_ids(info.kv) if gemma else frozenset()
        try:
            self.recipe = recipe.from_metadata(info.kv, info.kv_types, self.arch, self.n_ctx_train, hp)
            if gemma and not self.recipe:   # PR #24423's files: its sampler keys
                self.recipe = recipe.check(diffusion_gemma.recipe_from_pr_keys(info.kv), self.arch,
                                           self.n_ctx_train, hp)
        except DiffuseError as e:
            self.recipe_problem = (f"{self.path}: {e}; the file's recipe is ignored, the "
                                   f"{self.arch} defaults apply (diffuse recipe MODEL --clear removes it)")
            warnings.warn(self.recipe_problem, recipe.RecipeWarning, stacklevel=3)
        self._tokenizer_path = tokenizer
        self._tokenizer = None

    @property
    def tokenizer(self):
        """The model's tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            from diffuse.tokenizer import Tokenizer
            self._tokenizer = Tokenizer.for_model(self.path, self._tokenizer_path, self.hparams)
        return self._tokenizer

    @property
    def threads(self) -> int:
        return self._core.threads

    @threads.setter
    def threads(self, n: int) -> None:
        self._core.threads = _threads(n)

    @property
    def weights_bytes(self) -> int:
        return self._core.weights_bytes

    @property
    def repacked_bytes(self) -> int:
        return self._core.repacked_bytes

    def forward(self, token_ids, positions=None, block_size: int | None = None, mode: str = "diffusion", *,
                canvas=None, self_conditioning=None, draft_lora: bool = False) -> np.ndarray:
        """Raw logits float32, before any logit shift.

        (n_tokens, n_vocab) for every position, or (len(positions), n_vocab) for the positions given
        (the head then runs over those rows only, as in a denoising step). mode "diffusion": the
        model's attention pattern. Full-attention models attend bidirectionally; block-diffusion
        models block-causally, in blocks of their own block size or of `block_size` (what a run with
        that block_length sees); Nemotron-Labs-Diffusion causally, but for its last block (its
        trained 32 or `block_size` positions, at most all), whose positions see each other (a
        diffusion step over the cached prefix); WeDLM causally. mode "ar": causal (the ar and self_spec
        modes' verify). draft_lora: Nemotron-Labs-Diffusion's last block with its draft LoRA (self_spec's
        draft pass).

        DiffusionGemma: token_ids is the context, encoded causally into the cache; `canvas` the
        canvas's ids; the result the canvas's (softcapped) logits (len(canvas), n_vocab).
        self_conditioning: the previous step's logits of the canvas (its temperature-scaled ones,
        as the official loop passes), or None at the first step.
        """
        if canvas is not None or self_conditioning is not None:
            if positions is not None or block_size is not None or mode != "diffusion":
                raise DiffuseError("forward: positions, block_size and mode do not apply to a canvas")
            context, canvas = self._ids(token_ids, "the context"), self._ids(canvas, "the canvas")
            sc = None if self_conditioning is None else np.asarray(self_conditioning, dtype=np.float32)
            if sc is not None and not np.isfinite(sc).all():
                raise DiffuseError("forward: self_conditioning holds NaN or infinite logits")
            return self._core.forward_canvas(context, canvas, sc)
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0:
            raise DiffuseError("forward: expected a non-empty 1-D sequence of token ids")
        if not np.issubdtype(ids.dtype, np.integer):
            raise DiffuseError("forward: token ids must be integers")
        self._check_ids(ids)
        rows = [] if positions is None else [int(p) for p in positions]
        if positions is not None and not rows:
            raise DiffuseError("forward: positions is empty")
        if mode not in ("diffusion", "ar"):
            raise DiffuseError(f"forward: mode must be 'diffusion' or 'ar' (got {mode!r})")
        trained_block = self._core.hparams["trained_block"]
        if draft_lora and (mode != "diffusion" or not self._core.hparams["draft_lora_rank"]):
            raise DiffuseError("forward: draft_lora applies to mode 'diffusion' of a model with a draft LoRA")
        # The engine's table: a model its causal loop decodes, with no bidirectional last block
        # (WeDLM: its window attends causally, in its own order), attends causally in any mode.
        causal_loop = ARCHITECTURES[self.arch]["loop"] == "causal"
        if causal_loop and not trained_block and mode == "diffusion":
            if block_size is not None:
                raise DiffuseError(f"forward: {self.arch} attends causally: block_size does not apply")
            mode = "ar"
        if mode == "diffusion" and not trained_block:
            return self._core.forward(ids.astype(np.int32), rows, -1 if block_size is None else block_size)
        if mode == "ar" and block_size is not None:
            raise DiffuseError("forward: block_size applies to mode 'diffusion' only")
        if block_size is not None and block_size < 1:
            raise DiffuseError(f"forward: block_size must be at least 1 (got {block_size})")
        open_block = 0 if mode == "ar" else min(ids.size, block_size or trained_block)
        if any(not 0 <= r < ids.size for r in rows):
            raise DiffuseError(f"forward: positions must lie in [0, {ids.size})")
        logits = self._core.forward_causal(ids.astype(np.int32), open_block, draft_lora)
        return logits[rows] if rows else logits

    def _ids(self, token_ids, what: str) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
            raise DiffuseError(f"forward: {what} must be a non-empty 1-D sequence of token ids")
        self._check_ids(ids)
        return ids.astype(np.int32)

    def _check_ids(self, ids: np.ndarray) -> None:
        # Checked before the cast to int32, which would wrap 2**32 + 5 into a valid id.
        bad = (ids < 0) | (ids >= self.n_vocab)
        if bad.any():
            i = int(np.argmax(bad))
            raise DiffuseError(f"token id {int(ids[i])} at index {i} is outside the vocabulary [0, {self.n_vocab})")

    def encode_prompt(self, prompt: str | list[int], chat: bool = True) -> list[int]:
        """Token ids for a text prompt (chat template applied unless chat=False) or a list of ids."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise DiffuseError("the prompt is empty")
            if chat:
                return self.tokenizer.encode_chat(prompt)
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        ids = [int(t) for t in prompt]
        if not ids:
            raise DiffuseError("the prompt is empty")
        self._check_ids(np.asarray(ids))
        # A prompt's image tokens would stand for pictures the model cannot see (forward, the raw
        # pass, takes any token: a random canvas or a generated one may hold them).
        image = [i for i, t in enumerate(ids) if t in self.image_token_ids]
        if image:
            raise DiffuseError(f"token id {ids[image[0]]} at index {image[0]} is an image token: diffuse runs "
                               f"{self.arch}'s text model only (its vision tower is not converted)")
        return ids

    def generate(self, prompt: str | list[int], *, chat: bool = True, threads: int | None = None,
                 on_step: Callable[[StepEvent], bool | None] | None = None, expert_routing: bool | None = None,
                 **options) -> GenerateResult:
        """Denoise `gen_length` masked positions after the prompt.

        Options (None = the model's default: its file's recipe, else the family's; see
        diffuse.generation.OPTIONS for kinds, ranges and help): gen_length, steps, block_length, scheduler, threshold, cache, keep_active,
        refresh_every, temperature, top_k, top_p, alg_temp, cfg_scale, eps, seed (unset: a fresh
        random one per run; result.options["seed"] says which, to repeat the run). on_step(event)
        runs once per step on the calling thread; returning False cancels; an exception ends the
        run and propagates here. expert_routing: see generate_batch.
        """
        return self.generate_batch([prompt], chat=chat, threads=threads, on_step=on_step,
                                   expert_routing=expert_routing, **options)[0]

    def generate_batch(self, prompts: Sequence[str | list[int]], *, chat: bool = True, threads: int | None = None,
                       on_step: Callable[[StepEvent], bool | None] | None = None,
                       per_prompt: Sequence[dict] | None = None, expert_routing: bool | None = None,
                       **options) -> list[GenerateResult]:
        """Denoise several prompts together: one forward pass per step over every unfinished one.

        `options` apply to every prompt; `per_prompt[i]` (a dict) overrides them for prompt i, so
        each sequence may have its own length, scheduler, seed... (one without a seed draws its
        own; its result's options hold it). Every sequence keeps its own
        schedule, cache and early stop. Events carry `sequence` (the prompt's index); on_step
        returning False cancels that sequence only. Results in prompt order; with greedy decoding
        each matches generate() of the same prompt up to float ties. expert_routing: MoE events
        carry `experts` (which experts each active position used); None: on for an MoE model with
        an on_step listener.
        """
        prompts = list(prompts)
        if not prompts:
            raise DiffuseError("generate_batch: no prompts")
        if per_prompt is not None and len(per_prompt) != len(prompts):
            raise DiffuseError(f"per_prompt has {len(per_prompt)} entries for {len(prompts)} prompts")
        resolved, ids = [], []
        for i, prompt in enumerate(prompts):
            try:
                resolved.append(resolve_options(self.arch, self.recipe, **{**options, **(per_prompt[i] if per_prompt else {})}))
                ids.append(self.encode_prompt(prompt, chat))
            except DiffuseError as e:
                raise DiffuseError(f"prompt {i}: {e}" if len(prompts) > 1 else str(e)) from None
        tok = self.tokenizer if any(isinstance(p, str) for p in prompts) else self._tokenizer_or_none()
        eos_ids = list(tok.eos_token_ids) if tok is not None else []

        callback = None
        if on_step is not None:
            def callback(d: dict) -> bool:
                return on_step(StepEvent(**d)) is not False

        t0 = time.perf_counter()
        outs = _core.generate_batch(self._core, [np.asarray(i, dtype=np.int32) for i in ids], options=resolved,
                                    threads=_threads(threads), eos_ids=eos_ids, on_step=callback,
                                    expert_routing=self._routing(on_step, expert_routing))
        total_ms = (time.perf_counter() - t0) * 1000.0
        return [self._result(out, prompt_ids, tok, eos_ids, total_ms, opts)
                for out, prompt_ids, opts in zip(outs, ids, resolved)]

    def generate_stream(self, admit: Callable[[], Sequence[tuple[str | list[int], dict]]],
                        on_finish: Callable[[int, GenerateResult | DiffuseError], None], *, chat: bool = True,
                        threads: int | None = None, on_step: Callable[[StepEvent], bool | None] | None = None,
                        expert_routing: bool | None = None, **options) -> int:
        """Denoise sequences that join and leave one running batch (a server's requests).

        At every step boundary, after the sequences that ended have gone to on_finish, admit()
        returns new (prompt, overrides) pairs ([] for none): each is numbered on from the earlier
        ones (0, 1, 2... over the stream) and joins that step's forward pass; `options` apply to
        every one, `overrides` to it alone. on_finish(sequence, result) runs as soon as a sequence
        ends, with its GenerateResult (total_ms counted from its admission), or with a DiffuseError
        when its prompt or options were refused: the others run on. Events carry `sequence`;
        on_step returning False cancels that sequence only; an exception in any callback ends the
        stream and propagates here. Returns, once none runs and admit() gives none, the number of
        K/V caches the stream held (one per sequence of its busiest step, two with cfg_scale): an
        ended sequence's cache is reused. With greedy decoding each result matches generate() of
        the same prompt up to float ties.
        """
        tok = self._tokenizer_or_none()
        eos_ids = list(tok.eos_token_ids) if tok is not None else []
        numbers = itertools.count()                 # ours: every admitted pair, refused ones too
        engine_numbers = itertools.count()          # the engine's: the pairs it was given
        # engine's number -> (ours, prompt ids, options, start)
        running: dict[int, tuple[int, list[int], dict, float]] = {}

        def engine_admit() -> list:
            items = []
            for prompt, overrides in admit():
                sequence = next(numbers)
                try:
                    resolved = resolve_options(self.arch, self.recipe, **{**options, **overrides})
                    ids = self.encode_prompt(prompt, chat)
                except DiffuseError as e:
                    on_finish(sequence, e)
                    continue
                running[next(engine_numbers)] = (sequence, ids, resolved, time.perf_counter())
                items.append((np.asarray(ids, dtype=np.int32), resolved))
            return items

        def engine_finished(index: int, out: dict) -> None:
            sequence, ids, resolved, t0 = running.pop(index)
            if out["stop_reason"] == "error":
                on_finish(sequence, DiffuseError(out["error"]))
            else:
                on_finish(sequence, self._result(out, ids, tok, eos_ids, (time.perf_counter() - t0) * 1000.0,
                                                 resolved))

        callback = None
        if on_step is not None:
            def callback(d: dict) -> bool:
                return on_step(StepEvent(**{**d, "sequence": running[d["sequence"]][0]})) is not False

        return _core.generate_stream(self._core, engine_admit, engine_finished, threads=_threads(threads),
                                     eos_ids=eos_ids, on_step=callback,
                                     expert_routing=self._routing(on_step, expert_routing))

    def _routing(self, on_step, expert_routing: bool | None) -> bool:
        """Whether MoE events carry `experts`: asked for, or by default when someone listens."""
        return self.n_expert > 0 and (on_step is not None if expert_routing is None else bool(expert_routing))

    def _result(self, out: dict, prompt_ids: list[int], tok, eos_ids: list[int], total_ms: float,
                options: dict) -> GenerateResult:
        tokens = out["tokens"]
        eos = set(eos_ids)
        eos_at = [i for i, t in enumerate(tokens) if t in eos]
        answer = tokens[:eos_at[0] if eos_at else len(tokens)]
        # A cancelled run leaves positions masked: they are not tokens anyone can use.
        useful = int(np.count_nonzero(answer != self.mask_token_id))
        text = tok.decode(answer.tolist(), skip_special_tokens=True) if tok is not None else ""
        return GenerateResult(
            text=text, tokens=tokens, prompt_tokens=np.asarray(prompt_ids, dtype=np.int32), steps=out["steps"],
            steps_allowed=out["steps_allowed"], stop_reason=out["stop_reason"], step_ms=out["step_ms"],
            forward_ms=out["forward_ms"], sample_ms=out["sample_ms"], total_ms=total_ms,
            gen_length=len(tokens), useful_length=useful, decided_step=out["decided_step"],
            prefill_ms=out["prefill_ms"], forward_passes=out["forward_passes"], options=dict(options))

    def _tokenizer_or_none(self):
        try:
            return self.tokenizer
        except DiffuseError:
            return None

    def __repr__(self) -> str:
        return f"<diffuse.Model {self.arch} ({self.dialect}) {Path(self.path).name}>"


def _threads(n) -> int:
    """A thread count for the engine: None or 0 means the default; the engine caps it at the
    logical CPU count."""
    if n is None:
        return 0
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise DiffuseError(f"threads must be a non-negative integer (got {n!r})")
    return min(int(n), 2**31 - 1)


def load(path: str | os.PathLike, threads: int | None = None,
         tokenizer: str | os.PathLike | None = None, repack: bool = False,
         flash_attn: bool = True, kv_f16: bool = True) -> Model:
    """Load a GGUF model (ours, llama.cpp's or diffuse-cpp's dialect), memory-mapped.

    threads: CPU threads for the forward pass (default: the physical cores, diffuse.physical_cores();
    hyper-threads cost more than they give). tokenizer: a tokenizer.json for
    files that carry none (diffuse-cpp's); by default one beside the model file is used.
    repack: copy quantised matrices into ggml's interleaved CPU layout (faster on AVX2-only and
    ARM CPUs, slower for Q4_K on AVX512-VNNI: time both with `model.forward` on your CPU).
    flash_attn: tiled attention whose memory grows O(n) with the context (False: the materialised
    score matrix, O(n^2)). kv_f16: keep the K/V cache in F16 (False: F32, twice the memory).
    """
    return Model(path, threads=threads, tokenizer=tokenizer, repack=repack, flash_attn=flash_attn, kv_f16=kv_f16)
