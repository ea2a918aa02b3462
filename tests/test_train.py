"""`diffuse train` end to end on a few KB of text: a handful of steps, a checkpoint in LLaDA's (or
SDAR's) Hugging Face layout, our converter, our engine. Skipped without PyTorch (the `train` extra)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import diffuse  # noqa: E402
from diffuse.cli import main  # noqa: E402

SENTENCES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "The family of Dashwood had long been settled in Sussex, and their estate was large.",
    "Emma Woodhouse, handsome, clever, and rich, seemed to unite some of the best blessings of existence.",
    "A fool and his money are soon parted, and a penny saved is a penny earned.",
    "She was the youngest of the two daughters of a most affectionate, indulgent father.",
]
TINY = ["--vocab-size", "320", "--d-model", "32", "--layers", "2", "--heads", "2", "--ffn", "64",
        "--seq-len", "48", "--batch", "4", "--eval-every", "3", "--threads", "1"]


def _train(tmp: Path, *options: str) -> tuple[Path, Path]:
    """(run folder, GGUF) after 6 steps on ~6 KB of text."""
    docs = [" ".join(SENTENCES[(i + j) % 5] for j in range(1 + i % 3)) for i in range(60)]
    (tmp / "data").mkdir()
    (tmp / "data" / "text.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    gguf = tmp / "tiny.gguf"
    assert main(["train", str(tmp / "data"), "--out", str(tmp / "run"), "--gguf", str(gguf), "--outtype", "f32",
                 *TINY, "--steps", "6", *options]) == 0
    return tmp / "run", gguf


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    return _train(tmp_path_factory.mktemp("train"))


@pytest.fixture(scope="module")
def trained_sdar(tmp_path_factory) -> tuple[Path, Path]:
    return _train(tmp_path_factory.mktemp("train-sdar"), "--arch", "sdar", "--block-size", "2")


def test_checkpoint_has_the_llada_layout(trained):
    run, _ = trained
    hf = run / "hf"
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["LLaDAModelLM"] and config["block_type"] == "llama"
    assert (config["d_model"], config["n_layers"], config["n_heads"], config["mlp_hidden_size"]) == (32, 2, 2, 64)
    from safetensors import safe_open

    with safe_open(hf / "model.safetensors", "np") as f:
        names = set(f.keys())
    per_block = {"attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out"}
    want = {"model.transformer.wte.weight", "model.transformer.ln_f.weight", "model.transformer.ff_out.weight"}
    want |= {f"model.transformer.blocks.{i}.{n}.weight" for i in range(2) for n in per_block}
    assert names == want
    tok_config = json.loads((hf / "tokenizer_config.json").read_text())
    assert "<|start_header_id|>" in tok_config["chat_template"]
    info = json.loads((hf / "training_info.json").read_text())
    assert info["step"] == 6 and set(info["heldout"]) == {"0.25", "0.5", "0.75"}


def test_engine_matches_the_trained_torch_model(trained):
    run, gguf = trained
    from safetensors.torch import load_file

    from diffuse.train.model import LLaDA, Shape

    config = json.loads((run / "hf" / "config.json").read_text())
    shape = Shape(config["vocab_size"], config["d_model"], config["n_layers"], config["n_heads"],
                  config["mlp_hidden_size"], config["max_sequence_length"])
    model = LLaDA(shape)
    model.load_state_dict(load_file(run / "hf" / "model.safetensors"))
    m = diffuse.load(gguf, threads=1, kv_f16=False)   # F32 K/V cache: float32 rounding only
    assert (m.arch, m.n_vocab, m.n_ctx_train) == ("llada", 320, 48)
    assert m.mask_token_id == config["mask_token_id"] == m.tokenizer.token_to_id("<|mdm_mask|>")
    ids = np.random.default_rng(0).integers(0, 314, 40)
    ids[10:30] = m.mask_token_id
    with torch.no_grad():
        want = model(torch.from_numpy(ids)[None])[0].numpy()
    np.testing.assert_allclose(m.forward(ids), want, atol=1e-4)


def test_sdar_checkpoint_converts_and_runs_as_the_torch_model(trained_sdar):
    """An SDAR-layout run: SDAR-4B-Chat's config and tensor names, converted as arch sdar with its
    block and mask, and the engine's block-causal forward equal to the torch model's."""
    run, gguf = trained_sdar
    from safetensors.torch import load_file

    from diffuse.train.model import SDAR, Shape

    config = json.loads((run / "hf" / "config.json").read_text())
    assert config["architectures"] == ["SDARForCausalLM"] and config["block_size"] == 2
    shape = Shape(config["vocab_size"], config["hidden_size"], config["num_hidden_layers"],
                  config["num_attention_heads"], config["intermediate_size"], config["max_position_embeddings"],
                  rope_theta=config["rope_theta"], rms_norm_eps=config["rms_norm_eps"])
    model = SDAR(shape, config["block_size"])
    model.load_state_dict(load_file(run / "hf" / "model.safetensors"))   # strict: every name is SDAR's
    m = diffuse.load(gguf, threads=1, kv_f16=False)
    assert (m.arch, m.hparams["block_size"], m.n_ctx_train) == ("sdar", 2, 48)
    assert m.mask_token_id == config["mask_token_id"] == m.tokenizer.token_to_id("<|mdm_mask|>")
    assert m.recipe["scheduler"] == "low_confidence_dynamic" and m.recipe["block_length"] == 2
    ids = np.random.default_rng(0).integers(0, 314, 41)
    ids[20:30] = m.mask_token_id
    with torch.no_grad():
        want = model(torch.from_numpy(ids)[None])[0].numpy()
    np.testing.assert_allclose(m.forward(ids), want, atol=1e-4)
    r = m.generate("Repeat after me: a penny saved", gen_length=8, seed=0)
    assert r.steps >= 1 and 8 <= len(r.tokens) <= 9   # the answer ends on a block boundary


def test_block_diffusion_training_mask():
    """[noisy ; clean] over blocks of 2: noisy block b sees itself and clean blocks < b, clean rows
    are block-causal among themselves and never see a noisy row."""
    from diffuse.train.model import block_diffusion_mask

    m = block_diffusion_mask(6, 2).numpy()
    noisy_row_of_block_1 = m[2]
    assert noisy_row_of_block_1[:6].tolist() == [False, False, True, True, False, False]
    assert noisy_row_of_block_1[6:].tolist() == [True, True, False, False, False, False]
    clean_row_of_block_1 = m[6 + 3]
    assert clean_row_of_block_1[:6].tolist() == [False] * 6
    assert clean_row_of_block_1[6:].tolist() == [True, True, True, True, False, False]


def test_chat_rows_use_the_engines_prompt_tokens(trained):
    """Training tokenizes the chat prompt exactly as generation does before appending masks."""
    run, gguf = trained
    from tokenizers import Tokenizer

    from diffuse.train.data import Batches

    tok = Tokenizer.from_file(str(run / "hf" / "tokenizer.json"))
    batches = Batches(tok, SENTENCES, 160, 2, 1.0, seed=3)
    engine_tok = diffuse.load(gguf, threads=1).tokenizer
    for _ in range(5):
        row, start = batches._chat_row()
        prompt = tok.decode(row[:start].tolist(), skip_special_tokens=False)
        user = prompt.split("<|end_header_id|>\n\n")[1].split("<|eot_id|>")[0]
        assert row[:start].tolist() == engine_tok.encode_chat(user)


@pytest.mark.parametrize("arch", ["llada", "sdar"])
def test_loss_counts_only_maskable_positions(arch):
    from diffuse.train.loop import diffusion_loss
    from diffuse.train.model import SDAR, LLaDA, Shape

    torch.manual_seed(0)
    shape = Shape(vocab_size=40, d_model=16, n_layers=1, n_heads=2, mlp_hidden_size=32, max_sequence_length=8)
    model = SDAR(shape, 4) if arch == "sdar" else LLaDA(shape)
    ids = torch.randint(0, 39, (3, 8))
    none = torch.zeros(3, 8, dtype=torch.bool)
    assert diffusion_loss(model, ids, none, mask_id=39, bf16=False).item() == 0.0
    loss = diffusion_loss(model, ids, ~none, mask_id=39, bf16=False)
    assert 0.0 < loss.item() < 100.0


def test_bad_data_is_a_clean_error(tmp_path, capsys):
    (tmp_path / "one.txt").write_text("only one document\n", encoding="utf-8")
    assert main(["train", str(tmp_path), "--out", str(tmp_path / "run"), *TINY]) == 1
    assert "at least two documents" in capsys.readouterr().err


def test_a_second_run_resumes(trained, tmp_path, capsys):
    run, _ = trained
    shutil.copytree(run, tmp_path / "run")
    assert main(["train", str(run.parent / "data"), "--out", str(tmp_path / "run"), *TINY, "--steps", "8"]) == 0
    assert "resumed at step 6" in capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "hf" / "training_info.json").read_text())["step"] == 8


def test_gguf_is_named_after_the_run(trained):
    _, gguf = trained
    assert diffuse.gguf_file.read(gguf).kv["general.name"] == "run"


def test_resume_takes_the_stored_hyper_parameters(trained, tmp_path, capsys):
    run, _ = trained
    shutil.copytree(run, tmp_path / "run")
    argv = ["train", str(run.parent / "data"), "--out", str(tmp_path / "run"), "--threads", "1", "--eval-every", "3"]
    assert main([*argv, "--d-model", "64", "--heads", "2", "--steps", "8"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"diffuse: error: {tmp_path / 'run'} is a run with other settings: "
                                        "--d-model 64 (the run has 32); leave them out to resume it, "
                                        "or choose a new --out folder"]
    assert main([*argv, "--steps", "8", "--gguf", str(tmp_path / "m.gguf"), "--name", "tiny-demo"]) == 0
    assert "resumed at step 6" in capsys.readouterr().out
    assert diffuse.gguf_file.read(tmp_path / "m.gguf").kv["general.name"] == "tiny-demo"


def test_init_starts_from_the_weights_and_tokenizer_of_a_gguf(trained, tmp_path, capsys):
    """--init reads a GGUF back into the trainer's names: q/k rows un-permuted, the same tokenizer."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer

    from diffuse.train import from_gguf

    run, gguf = trained
    shape, tok, state = from_gguf.load(gguf)
    saved = load_file(run / "hf" / "model.safetensors")
    assert set(state) == set(saved)
    for name, tensor in saved.items():      # an F32 file: exact
        assert torch.equal(state[name], tensor), name
    assert tok.to_str() == Tokenizer.from_file(str(run / "tokenizer.json")).to_str()
    assert (shape.d_model, shape.n_layers, shape.n_heads, shape.mlp_hidden_size) == (32, 2, 2, 64)

    data = str(run.parent / "data")
    out = tmp_path / "more"
    assert main(["train", data, "--out", str(out), "--init", str(gguf), "--steps", "1", "--threads", "1",
                 "--batch", "2", "--eval-every", "1"]) == 0
    assert f"starting from {gguf}" in capsys.readouterr().out
    assert (out / "tokenizer.json").read_text() == (run / "tokenizer.json").read_text()
    # a run folder that holds a run, a shape the file does not have, a quantised file: one line each
    for argv, said in (([], "already holds a run"), (["--d-model", "64"], "--d-model 64 (the file has 32)")):
        where = out if not argv else tmp_path / "new"
        assert main(["train", data, "--out", str(where), "--init", str(gguf), *argv]) == 1
        assert said in capsys.readouterr().err
    q8 = tmp_path / "q8.gguf"
    assert main(["quantize", str(gguf), str(q8), "Q8_0"]) == 0
    capsys.readouterr()
    assert main(["train", data, "--out", str(tmp_path / "q"), "--init", str(q8), "--steps", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs an F32 or F16 file" in err[0]


@pytest.mark.parametrize("change, message", [
    ({"kv": {"tokenizer.huggingface.json": "{"}}, "tokenizer.huggingface.json does not load"),
    ({"drop": ("tokenizer.huggingface.json",)}, "no tokenizer.huggingface.json inside"),
    ({"kv": {"llada.rope.freq_base": 500000.0}}, "RoPE base 500000"),
    ({"drop": ("llada.block_count",)}, "no llada.block_count key"),
    ({"tensors": {"blk.1.ffn_up.weight": None}}, "tensor blk.1.ffn_up.weight is missing"),
])
def test_a_file_training_cannot_start_from_is_one_line(trained, tmp_path, capsys, change, message):
    from test_bad_input import rewrite

    run, gguf = trained
    bad = rewrite(gguf, tmp_path / "bad.gguf", **change)
    assert main(["train", str(run.parent / "data"), "--out", str(tmp_path / "run"), "--init", str(bad),
                 "--steps", "1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run" / "state.pt").exists()


def test_corpus_keeps_prose_fortunes(tmp_path, monkeypatch):
    from diffuse.train import corpus

    (tmp_path / "fortunes").write_text(
        "A penny saved\n\tis a penny earned.\n\t\t-- Benjamin Franklin\n%\n"
        "   /\\_/\\\n  ( o.o )\n   > ^ <   ===|||===\n%\nshort\n%\n", encoding="utf-8")
    monkeypatch.setattr(corpus, "FORTUNE_DIR", tmp_path)
    assert corpus.fortunes() == ["A penny saved is a penny earned. -- Benjamin Franklin"]


@pytest.mark.parametrize("where", ["state", "checkpoint"])
def test_a_full_disk_keeps_the_last_checkpoint(trained, tmp_path, capsys, monkeypatch, where):
    run, _ = trained
    shutil.copytree(run, tmp_path / "run")
    before = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in sorted(tmp_path.rglob("*"))
              if p.is_file() and p.name != "train.log"}

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:603] . PytorchStreamWriter failed "
                           "writing file data/0: file write failed")
    if where == "state":
        monkeypatch.setattr(torch, "save", full)
    else:
        monkeypatch.setattr("diffuse.train.export.save_file", full)
    assert main(["train", str(run.parent / "data"), "--out", str(tmp_path / "run"), *TINY, "--steps", "9"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot save the checkpoint" in err and "the last complete one is kept" in err
    after = {p.relative_to(tmp_path).as_posix(): p.read_bytes() for p in sorted(tmp_path.rglob("*"))
             if p.is_file() and p.name != "train.log"}
    if where == "state":
        assert after == before                                   # no state.pt.part, state.pt as it was
    else:
        assert not list(tmp_path.rglob("*.part")) and after.keys() == before.keys()


def test_a_fifo_as_data_is_refused(tmp_path, capsys):
    import os
    os.mkfifo(tmp_path / "pipe")
    assert main(["train", str(tmp_path / "pipe"), "--out", str(tmp_path / "run"), *TINY]) == 1
    assert "is a FIFO" in capsys.readouterr().err and not (tmp_path / "run").exists()
