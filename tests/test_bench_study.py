"""The performance study's commands (bench batch, context, steps, report) on tiny models. llama.cpp's
llama-batched-bench is stood in for by a script that prints its JSONL records."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from diffuse.bench import cost
from diffuse.cli import main

DEMO = Path(__file__).resolve().parents[1] / "models" / "diffuse-demo-3m.gguf"

# One JSONL record per -npl value: decoding 4 tokens per sequence takes 0.1 s whatever the batch.
FAKE_BATCHED_BENCH = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -npl) npl="$2";; esac; shift; done
for pl in $(echo "$npl" | tr , ' '); do
  echo '{"pl": '$pl', "t_pp": 0.05, "speed_pp": 100.0, "t_tg": 0.1, "speed_tg": '$((pl * 40))'.0}'
done
"""


@pytest.fixture(scope="module")
def fake_batched(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama-bin")
    (folder / "llama-batched-bench").write_text(FAKE_BATCHED_BENCH)
    (folder / "llama-batched-bench").chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def study_dir(tiny_gguf, fake_batched, tmp_path_factory):
    """Every study command run once into one folder, as the report reads it."""
    out = tmp_path_factory.mktemp("study")
    dream, llada = str(tiny_gguf("dream", "f32")), str(tiny_gguf("llada", "f32"))
    assert main(["bench", "batch", dream, "--ar-model", dream, "--llama-bin", str(fake_batched), "--batch", "1,2",
                 "--threads", "1", "--gen-length", "8", "--steps", "2", "--block-length", "8",
                 "--json", str(out / "batch.json")]) == 0
    assert main(["bench", "context", llada, "--lengths", "8,16", "--block-length", "8", "--threads", "1",
                 "--steps", "1", "--json", str(out / "context.json")]) == 0
    assert main(["bench", "steps", llada, "--budgets", "2,8", "--prompts", "1", "--gen-length", "8",
                 "--block-length", "8", "--threads", "1", "--json", str(out / "steps.json")]) == 0
    assert main(["bench", "grid", dream, str(tiny_gguf("dream", "q8_0")), llada, "--threads", "1", "--steps", "2",
                 "--gen-lengths", "8,16", "--prompts", "1,3", "--reps", "1", "--no-plots",
                 "--ar-model", dream, "--ar-backend", "llama-bench", "--llama-bin", str(_fake_llama_bench(out)),
                 "-o", str(out / "grid")]) == 0
    return out


def _fake_llama_bench(out: Path) -> Path:
    folder = out / "llama-bench-bin"
    folder.mkdir()
    (folder / "llama-bench").write_text(
        "#!/bin/sh\necho '[{\"avg_ns\": 20000000, \"stddev_ns\": 1, \"samples_ns\": [20000000]}]'\n")
    (folder / "llama-bench").chmod(0o755)
    return folder


def test_batch_records_both_engines(study_dir):
    rows = json.loads((study_dir / "batch.json").read_text())
    assert [(r["engine"], r["batch"]) for r in rows] == [("diffusion", 1), ("ar", 1), ("diffusion", 2), ("ar", 2)]
    for r in rows:
        assert r["threads"] == 1 and r["tokens_per_s"] > 0 and r["command"].startswith("diffuse bench batch")
    assert [r["tokens_per_s"] for r in rows if r["engine"] == "ar"] == [40.0, 80.0]
    assert all(r["agreement"] == 1.0 for r in rows if r["engine"] == "diffusion")


def test_batch_without_batched_bench_says_how_to_get_it(tiny_gguf, tmp_path, capsys):
    (tmp_path / "llama-bench").write_text("#!/bin/sh\n")
    (tmp_path / "llama-bench").chmod(0o755)
    assert main(["bench", "batch", str(tiny_gguf("dream", "f32")), "--ar-model", "AR.gguf",
                 "--llama-bin", str(tmp_path)]) == 1
    assert "llama-batched-bench" in capsys.readouterr().err


def test_context_full_vs_blockwise(study_dir):
    rows = json.loads((study_dir / "context.json").read_text())
    assert [(r["mode"], r["length"]) for r in rows] == [("full", 8), ("blockwise", 8), ("full", 16), ("blockwise", 16)]
    for r in rows:
        assert r["ms_per_step"] > 0 and r["peak_rss_bytes"] > 0 and r["arithmetic_intensity"] > 0
    full16, blk16 = rows[2], rows[3]
    assert full16["block_length"] == 16 and blk16["block_length"] == 8
    assert blk16["active_rows"] < full16["active_rows"] <= full16["kv_positions"]


def test_step_cost_counts_attention_and_kv():
    hp = {"n_layer": 2, "n_head": 4, "n_head_kv": 2, "head_dim": 8}
    mms = [cost.MatMul("blk.0.attn_q.weight", 0, 32, 32, 4096), cost.MatMul("output.weight", 0, 32, 100, 12800)]
    c = cost.step_cost(mms, hp, n_rows=4, n_kv=10, n_logits=3)
    assert c["flops"] == 2 * (32 * 32 * 4 + 32 * 100 * 3) + 4 * 2 * 4 * 10 * 8 * 4
    assert c["bytes"] == 4096 + 12800 + 2 * 2 * 14 * 2 * 8 * 2     # weights + F16 K/V of 10 read, 4 written
    assert c["ai"] == c["flops"] / c["bytes"]


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "12", "--block-length", "8"], "multiples of --block-length"),
    (["--lengths", "4096", "--block-length", "8"], "exceeds the model's context"),
])
def test_context_refuses_bad_lengths(tiny_gguf, argv, message, capsys):
    assert main(["bench", "context", str(tiny_gguf("llada", "f32")), *argv]) == 1
    assert message in capsys.readouterr().err


def test_steps_on_the_demo_model_with_heldout_text(tmp_path):
    docs = [f"Document {i}. " + "It is a truth universally acknowledged that a single man wants a wife. " * 12
            for i in range(120)]
    (tmp_path / "text.txt").write_text("\n\n".join(docs))
    assert main(["bench", "steps", str(DEMO), "--budgets", "4,64", "--prompts", "1", "--gen-length", "64",
                 "--block-length", "16", "--heldout", str(tmp_path), "--json", str(tmp_path / "s.json")]) == 0
    rows = json.loads((tmp_path / "s.json").read_text())
    assert [(r["scheduler"], r["steps"]) for r in rows] == [
        ("low_confidence", 4), ("low_confidence", 64), ("entropy_exit", 4), ("entropy_exit", 64)]
    assert rows[1]["agreement"] == 1.0     # the many-step answer itself
    for r in rows:
        assert 0 <= r["agreement"] <= 1 and r["ms"] > 0
        # held-out filling does not depend on the scheduler: on the low_confidence rows only
        assert (0 <= r["heldout_accuracy"] <= 1) if r["scheduler"] == "low_confidence" else "heldout_accuracy" not in r


def test_report_tables_and_plots(study_dir, capsys):
    pytest.importorskip("matplotlib")
    assert main(["bench", "report", str(study_dir)]) == 0
    md = (study_dir / "study.md").read_text()
    for n in range(2, 9):
        assert f"## Table {n} (paper)" in md
    assert "| Model | Weights | Size MiB | low_confidence tok/s | Per-step ms | vs F16 |" in md
    assert "Not in this folder: needs a grid over two or more thread counts" in md    # one thread here
    assert "| Prompt | Dream tok/s | Steps | LLaDA tok/s |" in md
    assert "| Easy prompts (EE) |" in md and "| **Average** |" in md
    assert "Fig. 3" in md and "1 thread(s), B=1 to B=2: AR decoding gains x2.00 in throughput" in md     # the fake's 40 -> 80 tok/s
    assert "diffuse bench context" in md and "diffuse bench steps" in md and "diffuse bench grid" in md
    for png in ("fig3_waterfall.png", "batch.png", "context.png", "steps.png"):
        assert (study_dir / png).read_bytes()[:4] == b"\x89PNG"


def test_report_of_an_empty_folder_names_the_commands(tmp_path):
    assert main(["bench", "report", str(tmp_path), "--no-plots"]) == 0
    md = (tmp_path / "study.md").read_text()
    assert "diffuse bench batch MODEL --ar-model AR.gguf" in md and "diffuse bench context MODEL" in md
    assert main(["bench", "report", str(tmp_path / "missing")]) == 1
