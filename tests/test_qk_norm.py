"""A QK-norm over all heads at once (MiniMax-M2's per_layer): its weights, and what it costs under tensor parallelism
(one all-reduce of the q and k sums of squares a layer). The forward against transformers' minimax_m2 is in
tests/test_checkpoint.py; a tp = 2 forward against tp = 1 in tests/test_parallel_sharded.py."""

import pytest

from roofline.io.fields import ConfigError
from roofline.measure.devices import get_datasheet
from roofline.model.accounting import param_count
from roofline.model.presets import get_preset
from roofline.parallel.cost import rank_forward_cost
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import Pass, Setting, WhatIf


def test_per_layer_needs_a_qk_norm_on_a_gqa_model():
    with pytest.raises(ConfigError, match="allowed"):
        get_preset("minimax-m2.5").scaled(qk_norm_type="per_token")
    with pytest.raises(ConfigError, match="needs qk_norm on a GQA model"):
        get_preset("llama-3.1-8b").scaled(qk_norm_type="per_layer")
    with pytest.raises(ConfigError, match="needs qk_norm on a GQA model"):
        get_preset("deepseek-v3").scaled(qk_norm=True, qk_norm_type="per_layer")


def test_a_per_layer_norm_holds_a_weight_per_element_of_every_head():
    mm = get_preset("minimax-m2.5")
    per_head = mm.scaled(qk_norm_type="per_head")
    extra = param_count(mm).total - param_count(per_head).total
    assert extra == mm.layers * ((48 + 8) * 128 - 2 * 128)
    assert param_count(mm).matmul_active == param_count(per_head).matmul_active  # norms multiply nothing


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_tensor_parallel_ranks_all_reduce_the_sums_of_squares_once_a_layer(tp):
    mm = get_preset("minimax-m2.5")
    for cfg, extra in ((mm, tp > 1), (mm.scaled(qk_norm_type="per_head"), False)):
        c = rank_forward_cost(cfg, Layout(tp=tp), "bfloat16", 4, 1, 1000)
        small = [x for x in c.collectives if x.kind == "all_reduce" and x.size_bytes == 4 * 2 * 4]
        assert [(x.count, x.size_bytes) for x in small] == ([(cfg.layers, 32)] if extra else [])


def test_the_what_if_prices_that_all_reduce():
    mm = get_preset("minimax-m2.5")

    def comm(cfg):
        w = WhatIf(cfg, get_datasheet("h200_sxm"), "bfloat16", Layout(tp=8), Setting(engine="vllm"))
        return w.pass_detail(Pass(1, 1, 1000), 1, "vllm")["terms"]["comm"]

    extra = comm(mm) - comm(mm.scaled(qk_norm_type="per_head"))
    assert 0 < extra < 62 * 50e-6  # one small-message all-reduce (latency-bound: tens of us at most) a layer
