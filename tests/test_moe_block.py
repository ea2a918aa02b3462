"""The MoE block study (diffuse.bench.moe_block) on a small LLaDA2-layout file: the Q4_K_M mixture
it writes, the in-place relabelling between llada2 and bailingmoe2, the bytes a step reads, and
the routing the block-step benchmark returns. Nothing here is timed."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

import diffuse
from diffuse import DiffuseError, _core, gguf_file
from diffuse.bench import moe_block as mb
from gguf import GGMLQuantizationType as T

# The mini's layout at widths a test writes in a second (rows multiples of 256 for Q4_K).
SMALL = dict(mb.MINI, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=32, n_expert_used=4,
             n_ff_exp=256, n_expert_groups=4, n_group_used=2, n_ff=512, n_vocab=1024, mask_id=1000)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return mb.write_model(tmp_path_factory.mktemp("moe-block") / "small.gguf", n_layer=3, m=SMALL, pool_rows=64)


def _tail_hash(path) -> str:
    with open(path, "rb") as f:
        f.seek(4096)
        return hashlib.sha256(f.read()).hexdigest()


def test_writes_the_q4_k_m_mixture_in_the_llada2_layout(small):
    info = gguf_file.read(small)
    assert info.architecture == "llada2"
    types = {t.name: T(t.type) for t in info.tensors}
    assert types["blk.1.ffn_gate_exps.weight"] == T.Q4_K and types["blk.1.ffn_up_exps.weight"] == T.Q4_K
    assert types["blk.0.attn_qkv.weight"] == T.Q5_K          # the fused QKV one step up
    assert types["output.weight"] == T.Q6_K
    assert types["blk.1.ffn_gate_inp.weight"] == T.F32 and types["blk.1.exp_probs_b.bias"] == T.F32
    assert "blk.0.ffn_gate.weight" in types and "blk.0.ffn_gate_exps.weight" not in types   # dense first layer
    model = diffuse.load(str(small), threads=1)
    hp = model.hparams
    assert (hp["n_expert"], hp["n_expert_used"], hp["n_expert_groups"], hp["n_group_used"], hp["n_layer_dense"],
            hp["n_expert_shared"], hp["n_rot"], hp["block_size"]) == (32, 4, 4, 2, 1, 1, 32, 32)


def test_relabel_rewrites_the_architecture_in_place(small):
    size, tail = small.stat().st_size, _tail_hash(small)
    mb.relabel(small, "bailingmoe2")
    info = gguf_file.read(small)
    assert info.architecture == "bailingmoe2"
    assert info.kv["bailingmoe2.expert_group_count"] == 4 and info.kv["bailingmoe2.leading_dense_block_count"] == 1
    assert small.stat().st_size == size and _tail_hash(small) == tail     # tensors untouched
    mb.relabel(small, "llada2")
    assert gguf_file.read(small).architecture == "llada2" and _tail_hash(small) == tail
    with pytest.raises(DiffuseError, match="none of"):
        mb.relabel(small, "llama")


def test_relabel_refuses_a_file_it_did_not_write(tiny_gguf, tmp_path):
    other = tmp_path / "other.gguf"
    other.write_bytes(tiny_gguf("llada2", "f32").read_bytes())
    with pytest.raises(DiffuseError, match="not written by moe_block"):
        mb.relabel(other, "bailingmoe2")


def test_weight_bytes_add_up_to_the_file(small):
    wb = mb.weight_bytes(small)
    assert sorted(wb["per_expert"]) == [1, 2]
    info = gguf_file.read(small)
    expert_tensors = sum(gguf_file.OutTensor(t.name, t.type, t.shape).nbytes for t in info.tensors
                         if t.name.endswith(mb._EXPERT_TENSORS))
    assert sum(wb["per_expert"].values()) * SMALL["n_expert"] == expert_tensors
    embedding = gguf_file.OutTensor("e", info.tensor("token_embd.weight").type, info.tensor("token_embd.weight").shape)
    assert wb["fixed"] + expert_tensors + embedding.nbytes < wb["file"] < wb["fixed"] + expert_tensors + embedding.nbytes + 65536
    # a step reads the always-read weights, w embedding rows and the touched experts
    assert mb.step_bytes(wb, {1: 4, 2: 32}, 2) == wb["fixed"] + 2 * wb["embedding_row"] + \
        4 * wb["per_expert"][1] + 32 * wb["per_expert"][2]


def test_block_steps_return_the_routing_of_their_rows(small):
    model = diffuse.load(str(small), threads=1)
    cases = [(1, 0, 1), (8, 0, 1), (8, 8, 1), (32, 0, 1)]
    out = mb.steps(model, 64, cases, reps=1)
    assert len(out) == len(cases)
    for (w, _, _), (ms, touched) in zip(cases, out):
        assert len(ms) == 1 and ms[0] > 0
        assert sorted(touched) == [1, 2]                      # MoE layers only: the dense layer routes nothing
        for n in touched.values():
            assert 4 <= n <= min(32, 4 * w)                   # top 4: at least one row's, at most every row's
    assert all(n == 4 for n in out[0][1].values())           # one row: exactly its top 4
    ms, flat = _core.bench_block_step(model._core, 64, 8, threads=1, reps=1, masked=8, routing=True)
    experts = np.asarray(flat).reshape(3, 8, 4)
    assert (experts[0] == -1).all() and (experts[1:] >= 0).all()
    assert mb.touched_per_layer(experts) == out[2][1]        # the same rows route the same way
    with pytest.raises(DiffuseError, match="masked"):
        _core.bench_block_steps(model._core, 64, [(8, 9, 1)], reps=1)
    with pytest.raises(DiffuseError, match="divide depth"):
        _core.bench_block_steps(model._core, 64, [(24, 0, 1)], reps=1)


def test_touched_per_layer():
    experts = np.array([[[-1, -1], [-1, -1]], [[3, 1], [1, 2]]])
    assert mb.touched_per_layer(experts) == {1: 3}
