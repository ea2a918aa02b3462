"""`diffuse info`: the summary of files in each dialect, and the command line."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_bad_input import rewrite

from diffuse import gguf_file
from diffuse.cli import main
from diffuse.info import describe, escaped, format_info
from diffuse.quantize import quantize_file

VOCAB_QWEN2 = Path("/tmp/dl/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf")


def as_diffuse_cpp(src: Path, dst: Path) -> Path:
    """The metadata layout of the paper's engine: arch "diffuse", diffuse.* keys, no tokenizer."""
    info = gguf_file.read(src)
    arch = info.architecture
    keys = ["block_count", "attention.head_count", "attention.head_count_kv", "embedding_length",
            "feed_forward_length", "context_length", "rope.freq_base", "attention.layer_norm_rms_epsilon"]
    kv = {f"diffuse.{k}": info.kv[f"{arch}.{k}"] for k in keys}
    types = {f"diffuse.{k}": info.kv_types[f"{arch}.{k}"] for k in keys}
    kv.update({"general.architecture": "diffuse", "diffuse.model_type": arch,
               "diffuse.mask_token_id": info.kv["tokenizer.ggml.mask_token_id"]})
    types["diffuse.mask_token_id"] = "u32"
    drop = [k for k in info.kv if k.startswith((f"{arch}.", "tokenizer.", "diffusion.", "diffuse."))]
    return rewrite(src, dst, kv, drop=drop, types=types)


def test_describe_our_file(tiny_gguf):
    path = tiny_gguf("llada", "f32")
    d = describe(path)
    json.dumps(d)   # plain data
    info = gguf_file.read(path)
    assert (d["architecture"], d["family"], d["dialect"]) == ("llada", "llada", "diffuse")
    assert (d["file_type"], d["file_type_name"]) == (0, "ALL_F32")
    assert d["tensor_count"] == len(info.tensors) == 21
    assert d["types"] == {"f32": {"count": 21, "bytes": sum(t.nbytes for t in info.tensors)}}
    assert d["parameters"] == sum(t.n_elements for t in info.tensors)
    assert [t["name"] for t in d["tensors"]] == [t.name for t in info.tensors]
    hp = d["hparams"]
    assert (hp["n_layer"], hp["n_embd"], hp["n_head"], hp["n_vocab"], hp["rope_mode"]) == (2, 256, 4, 448, "norm")
    tok = d["tokenizer"]
    assert tok["source"] == "embedded tokenizer.json" and tok["vocab_size"] == 406
    assert tok["mask"] == {"id": hp["mask_token_id"], "text": "<|mdm_mask|>"}
    assert [t["text"] for t in tok["eos"]] == ["<|endoftext|>", "<|eot_id|>"]
    assert tok["bos"]["text"] == "<|startoftext|>"
    assert tok["chat_template"] and tok["chat_template_in_file"]
    assert tok["special_count"] == 6

    text = format_info(d)
    assert "architecture  llada (family llada, dialect diffuse)" in text
    assert "layers 2, d_model 256, ffn 512, heads 4 (kv 4, dim 64), vocab 448" in text
    assert "mask 402 '<|mdm_mask|>'" in text and "chat template in the file" in text
    assert "blk.1.ffn_down.weight" not in text
    assert "blk.1.ffn_down.weight" in format_info(d, tensors=True)


def test_describe_quantized_file(tiny_gguf, tmp_path):
    path = quantize_file(tiny_gguf("dream", "f32"), tmp_path / "q.gguf", "Q4_K_M")
    d = describe(path)
    assert d["file_type_name"] == "Q4_K_M"
    # 3 layers: layer 2's attn_v and ffn_down and the output in Q6_K; 3x3 biases + 7 norms in F32.
    assert {k: v["count"] for k, v in d["types"].items()} == {"q4_K": 20, "q6_K": 3, "f32": 16}
    assert sum(v["bytes"] for v in d["types"].values()) == d["weights_bytes"]
    assert list(d["types"]) == sorted(d["types"], key=lambda k: -d["types"][k]["bytes"])
    assert "Q4_K_M (15)" in format_info(d)


def test_describe_llama_cpp_and_diffuse_cpp_files(tiny_gguf, tmp_path):
    src = tiny_gguf("dream", "f32")
    llama_cpp = rewrite(src, tmp_path / "llama_cpp.gguf", drop=["diffuse.format_version", "tokenizer.huggingface.json"])
    d = describe(llama_cpp)
    assert d["dialect"] == "llama.cpp" and d["hparams"]["dialect"] == "llama.cpp"
    assert d["tokenizer"]["source"] == "llama.cpp vocabulary (pre-tokenizer qwen2)"

    (tmp_path / "paper").mkdir()
    paper = as_diffuse_cpp(src, tmp_path / "paper" / "model.gguf")
    d = describe(paper)
    assert (d["architecture"], d["family"], d["dialect"]) == ("diffuse", "dream", "diffuse-cpp")
    assert d["hparams"]["n_head_kv"] == 2 and d["tokenizer"] is None
    assert "model.gguf: the file carries no tokenizer" in d["tokenizer_error"]
    assert "tokenizer.json" in format_info(d)

    tokenizer_json = tmp_path / "tokenizer.json"
    tokenizer_json.write_text(gguf_file.read(src).kv["tokenizer.huggingface.json"], encoding="utf-8")
    d = describe(paper, tokenizer=tokenizer_json)
    assert d["tokenizer"]["source"] == str(tokenizer_json)
    assert not d["tokenizer"]["chat_template_in_file"] and d["tokenizer"]["chat_template"]   # Dream's default
    assert "chat template family default" in format_info(d)


def test_describe_file_the_engine_refuses(tiny_gguf, tmp_path):
    bad = rewrite(tiny_gguf("llada", "f32"), tmp_path / "bad.gguf", {"llada.attention.head_count": 3})
    d = describe(bad)
    assert d["hparams"] is None and "bad.gguf: embedding length is not a multiple of the head count" in d["load_error"]
    assert d["tokenizer"]["vocab_size"] == 406   # everything else is still shown
    assert "cannot load" in format_info(d)


def test_describe_vocab_only_file():
    if not VOCAB_QWEN2.exists():
        pytest.skip(f"{VOCAB_QWEN2} not present")
    d = describe(VOCAB_QWEN2)
    assert (d["architecture"], d["dialect"], d["tensor_count"]) == ("qwen2", "other", 0)
    assert "not a diffusion model" in d["load_error"]
    assert d["tokenizer"]["vocab_size"] == 151936 and d["tokenizer"]["mask"] is None


def test_cli(tiny_gguf, capsys):
    path = str(tiny_gguf("llada", "q8_0"))
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    assert "file type     Q8_0 (7)" in out and "blk.0.attn_q.weight" not in out
    assert main(["info", path, "--tensors"]) == 0
    assert re.search(r"\nblk\.0\.attn_q\.weight +q8_0 +256 x 256 ", capsys.readouterr().out)
    assert main(["info", path, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(describe(path)))
    assert main(["info", path + ".missing"]) == 1
    assert "missing: no such file" in capsys.readouterr().err


def test_cli_fails_on_a_truncated_model_after_describing_it(tiny_gguf, tmp_path, capsys):
    data = tiny_gguf("llada", "f32").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:len(data) - 1000])     # a download that stopped
    assert main(["info", str(tmp_path / "cut.gguf")]) == 1
    out, err = capsys.readouterr()
    assert "cannot load" in out                                      # still described as far as it goes
    assert err.strip().splitlines() == [f"diffuse: error: the engine cannot load it: {tmp_path / 'cut.gguf'}: "
                                        "tensor output.weight lies past the end of the file (truncated download?)"]


def test_a_recordings_options_are_all_shown_those_changed_first_and_its_answer_as_printed(tiny_gguf, tmp_path,
                                                                                           capsys):
    """Every option, wrapped (none cut off), the ones that differ from the defaults first; the answer
    is the one generate printed (cut at the length asked for, not the whole blocks the engine ran)."""
    run = tmp_path / "run.npz"
    assert main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hello", "--gen-length", "10",
                 "--steps", "4", "--block-length", "8", "--temperature", "0.7", "--seed", "3", "--threads", "1",
                 "--record", str(run)]) == 0
    answer = capsys.readouterr().out[:-1]
    assert main(["info", str(run)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("options"))
    block = [lines[start]] + [line for line in lines[start + 1:] if line.startswith(" " * 14)]
    shown = " ".join(line[14:] for line in block)
    assert all(len(line) <= 100 for line in block) and "characters)" not in shown
    assert shown.index("temperature 0.7") < shown.index("scheduler ") and "eps " in shown
    assert f"answer        {escaped(answer)}\n" in out


def test_cli_summarises_a_recording(tiny_gguf, tmp_path, capsys):
    run = tmp_path / "run.npz"
    assert main(["generate", "-m", str(tiny_gguf("llada", "f32")), "-p", "Hello", "--gen-length", "8",
                 "--steps", "4", "--block-length", "8", "--threads", "1", "--record", str(run)]) == 0
    answer = capsys.readouterr().out[:-1]
    assert main(["info", str(run)]) == 0
    out = capsys.readouterr().out
    assert "a recording of a run, not a GGUF model" in out and "invalid magic" not in out
    assert "prompt        Hello" in out and "steps         4 recorded, 4/4 (done)" in out
    assert main(["info", str(run), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["kind"], d["prompt"], d["steps_recorded"], d["text"]) == ("recording", "Hello", 4, answer)
    run.write_bytes(run.read_bytes()[:200])
    assert main(["info", str(run)]) == 1
    assert "not a diffuse recording" in capsys.readouterr().err
