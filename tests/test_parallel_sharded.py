"""The sharded forward (2 gloo ranks, float32) equals the single-device forward, and every
rank holds exactly the bytes the per-rank accounting says. One process group for all cases."""

import pytest

from roofline.model.presets import get_preset, scaled_down
from roofline.parallel.cost import memory_per_rank, params_per_rank
from roofline.parallel.launch import run
from roofline.parallel.layout import Layout
from roofline.parallel.sharded import parity_all

B, PROMPT, Q = 4, 6, 3
CASES = {
    "dense": (scaled_down(get_preset("llama-3.1-8b")), Layout(tp=2)),
    "gqa_kv_heads_below_tp": (scaled_down(get_preset("tiny")).scaled(kv_heads=1), Layout(tp=2)),
    "moe_ep": (scaled_down(get_preset("mixtral-8x7b")), Layout(tp=2, ep=2)),
    "moe_tp_experts_split_by_width": (scaled_down(get_preset("qwen3-30b-a3b")), Layout(tp=2, ep=1)),
    "mla_moe_ep": (scaled_down(get_preset("deepseek-v3")), Layout(tp=2, ep=2)),
    "mla_dp_attention_all_to_all": (scaled_down(get_preset("deepseek-v3")), Layout(tp=2, ep=2, dp_attention=True)),
    # DeepSeek Sparse Attention: the indexer and its key cache replicated; 9 positions, 8 selected
    "mla_sparse_attention_tp": (scaled_down(get_preset("deepseek-v3.2")), Layout(tp=2, ep=2)),
    # MiniMax-M2's QK-norm over all heads: each rank's sums of squares all-reduced
    "per_layer_qk_norm_tp": (scaled_down(get_preset("minimax-m2.5")), Layout(tp=2, ep=1)),
    # a two-matrix MLP in a parallel block (GPT-J; Falcon-180B with grouped KV heads): up column-, down row-parallel
    "two_matrix_parallel_block_tp": (scaled_down(get_preset("gpt-j-6b")), Layout(tp=2)),
    "falcon_parallel_block_tp": (scaled_down(get_preset("falcon-180b")), Layout(tp=2)),
}


@pytest.fixture(scope="module")
def results():
    cases = [(cfg, lay, B, PROMPT, Q) for cfg, lay in CASES.values()]
    return dict(zip(CASES, run(parity_all, 2, "cpu", (cases,), timeout_s=300)))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_tp2_forward_equals_tp1(results, name):
    r = results[name]
    assert r["ref_max_abs"] > 1.0  # logits of a real spread, not zeros
    assert r["max_abs_err"] <= 2e-5 * r["ref_max_abs"], r


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_rank_bytes_equal_instantiated_shards(results, name):
    cfg, lay = CASES[name]
    weights, kv = memory_per_rank(cfg, lay, "float32", B, PROMPT + Q, with_mtp=True)
    assert results[name]["param_bytes"] == [weights] * 2
    assert results[name]["kv_bytes"] == [kv] * 2
    assert weights == params_per_rank(cfg, lay, with_mtp=True) * 4


@pytest.mark.slow
def test_kv_heads_below_tp_are_replicated_not_split(results):
    cfg, lay = CASES["gqa_kv_heads_below_tp"]
    one = 2 * 1 * cfg.head_dim * 4 * (cfg.layers + cfg.mtp_layers) * B * (PROMPT + Q)  # one KV head per rank
    assert results["gqa_kv_heads_below_tp"]["kv_bytes"] == [one, one]


@pytest.mark.slow
def test_tp_ranks_end_with_identical_logits(results):
    assert all(results[n]["replicas_agree"] for n in CASES if not CASES[n][1].dp_attention)


@pytest.mark.slow
def test_each_ep_rank_runs_only_its_own_experts(results):
    cfg, lay = CASES["moe_ep"]
    for touched in results["moe_ep"]["touched"]:
        assert 0 < touched <= cfg.experts // lay.ep
