"""Layouts: bad ones rejected naming the field; per-rank accounting reduces to the one-device model."""

import random

import pytest

from roofline.model.accounting import forward_cost, mtp_cost, param_count
from roofline.io.fields import ConfigError
from roofline.model.presets import get_preset
from roofline.parallel.cost import params_per_rank, rank_forward_cost, rank_mtp_cost
from roofline.parallel.layout import Layout, experts_touched_busiest_rank, experts_touched_per_rank, kv_head_of_rank
from roofline.parallel.sharded import busiest_rank_touched


@pytest.mark.parametrize("layout, world, field", [
    (dict(tp=3), 8, "layout.tp=3: must divide model.heads"),
    (dict(tp=8), 4, "layout.tp=8: larger than the world"),
    (dict(tp=4, ep=4), 4, "layout.ep=4: model 'llama-3.1-8b' has no experts"),
])
def test_bad_layouts_name_the_field_dense(layout, world, field):
    with pytest.raises(ConfigError, match=field):
        Layout(**layout).check(get_preset("llama-3.1-8b"), world)


def test_ep_must_divide_experts():
    cfg = get_preset("mixtral-8x7b")  # 8 experts
    with pytest.raises(ConfigError, match="layout.ep=3: must divide model.experts=8"):
        Layout(tp=3, ep=3).check(cfg.scaled(heads=6, kv_heads=3, ffn=6 * 1024, moe_ffn=3 * 1024))


@pytest.mark.parametrize("kw, field", [(dict(tp=0), "layout.tp"), (dict(tp=4, ep=3), "layout.ep=3: must divide tp"),
                                       (dict(tp=4, ep=2, dp_attention=True), "layout.dp_attention")])
def test_bad_layout_fields(kw, field):
    with pytest.raises(ConfigError, match=field):
        Layout(**kw)


def test_kv_heads_neither_dividing_nor_multiple_rejected():
    cfg = get_preset("llama-3.1-8b").scaled(heads=24, kv_heads=8)
    with pytest.raises(ConfigError, match="kv_heads=8"):
        Layout(tp=12).check(cfg)


def test_kv_head_of_rank_replicates_below_tp():
    cfg = get_preset("llama-3.1-70b")  # 64 heads, 8 KV heads
    assert kv_head_of_rank(cfg, 16, 0) == [0] and kv_head_of_rank(cfg, 16, 1) == [0] and kv_head_of_rank(cfg, 16, 15) == [7]
    assert kv_head_of_rank(cfg, 4, 1) == [2, 3]


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b", "deepseek-v3", "glm-4.5-air"])
def test_tp1_rank_cost_is_the_one_device_cost(name):
    cfg = get_preset(name)
    one = forward_cost(cfg, "bfloat16", 4, 3, 1000)
    r = rank_forward_cost(cfg, Layout(), "bfloat16", 4, 3, 1000)
    for f in ("weight_bytes", "kv_read_bytes", "kv_write_bytes", "embed_bytes", "flops_matmul", "flops_attention"):
        assert getattr(r, f) == pytest.approx(getattr(one, f), rel=1e-12), f
    assert r.collectives == ()
    if cfg.mtp_layers:
        m1, mr = mtp_cost(cfg, "bfloat16", 2, 1, 50), rank_mtp_cost(cfg, Layout(), "bfloat16", 2, 1, 50)
        assert (mr.weight_bytes, mr.flops_matmul, mr.blocks) == (pytest.approx(m1.weight_bytes),
                                                                 pytest.approx(m1.flops_matmul), 1)
    assert params_per_rank(cfg, Layout()) == param_count(cfg).total


def test_tp_splits_flops_and_adds_two_all_reduces_per_layer():
    cfg = get_preset("llama-3.1-70b")
    one, r = forward_cost(cfg, "bfloat16", 8, 1, 100), rank_forward_cost(cfg, Layout(tp=8), "bfloat16", 8, 1, 100)
    assert r.flops_attention == one.flops_attention / 8
    assert r.kv_read_bytes == one.kv_read_bytes / 8  # 8 KV heads over 8 ranks
    ar = [c for c in r.collectives if c.kind == "all_reduce"][0]
    assert (ar.size_bytes, ar.count) == (8 * cfg.d * 2, 2 * cfg.layers)
    assert [c.size_bytes for c in r.collectives if c.kind == "all_gather"] == [8 * cfg.vocab * 2]


def test_dp_attention_exchanges_tokens_by_all_to_all():
    cfg = get_preset("deepseek-v3")
    r = rank_forward_cost(cfg, Layout(tp=8, ep=8, dp_attention=True), "bfloat16", 64, 2, 100)
    rows = [c for c in r.collectives if c.kind == "all_to_all" and c.size_bytes > 10**5]
    assert rows and rows[0].size_bytes == 8 * 2 * cfg.experts_per_token * cfg.d * 2  # B/8 sequences x q x k x d
    assert rows[0].count == 2 * (cfg.layers - cfg.first_dense_layers)  # dispatch + combine per MoE layer
    assert not any(c.kind == "all_reduce" for c in r.collectives)


def test_experts_touched_per_rank():
    cfg = get_preset("deepseek-v3")
    assert experts_touched_per_rank(cfg, 1, 8) == pytest.approx(8 / 8)  # one token: k experts over 8 ranks
    assert experts_touched_per_rank(cfg, 10**6, 8) == pytest.approx(256 / 8)
    assert experts_touched_per_rank(cfg, 64 * 2, 8) < experts_touched_per_rank(cfg, 64 * 4, 8)


@pytest.mark.parametrize("ep, tokens", [(8, 1), (8, 8), (32, 2), (2, 64)])
def test_busiest_rank_expectation_matches_a_simulation_of_routing(ep, tokens):
    """Uniform top-k routing drawn token by token (k distinct experts each), the busiest rank's
    count averaged over draws, against the closed form (which treats experts as independent)."""
    cfg = get_preset("deepseek-v3")
    E, k, n = cfg.experts, cfg.experts_per_token, cfg.experts // ep
    gen = random.Random(0)
    draws = 3000
    total = 0
    for _ in range(draws):
        hit = set()
        for _ in range(tokens):
            hit.update(gen.sample(range(E), k))
        total += max(sum(1 for e in hit if e // n == r) for r in range(ep))
    assert experts_touched_busiest_rank(cfg, tokens, ep) == pytest.approx(total / draws, rel=0.02)
    assert experts_touched_busiest_rank(cfg, tokens, ep) >= experts_touched_per_rank(cfg, tokens, ep)


def test_busiest_rank_is_the_mean_on_one_rank_and_bounded_by_the_rank_size():
    cfg = get_preset("deepseek-v3")
    assert experts_touched_busiest_rank(cfg, 5, 1) == pytest.approx(experts_touched_per_rank(cfg, 5, 1))
    assert experts_touched_busiest_rank(cfg, 10**4, 8) == pytest.approx(32)


def test_measured_busiest_rank_is_taken_layer_by_layer():
    # rank 0 ran 2 then 0 experts, rank 1 0 then 2: each rank's mean is 1, but each layer waited for 2
    assert busiest_rank_touched([[2, 0], [0, 2]]) == 2
    assert busiest_rank_touched([[1, 3], [2, 1]]) == 2.5
    assert busiest_rank_touched([[], []]) is None
