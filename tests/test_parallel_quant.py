"""Per-rank costs in quantized precisions, the layouts' capacity plan in the served precision,
the anchors priced in the precision their deployments served."""

import re

import pytest

from roofline.commands.capacity import plan_layouts, request_from_config
from roofline.measure.devices import get_datasheet
from roofline.model.accounting import block_weight_bytes, forward_cost, mtp_cost
from roofline.model.formats import parse_precision
from roofline.model.presets import get_preset
from roofline.parallel import anchors
from roofline.parallel.cost import rank_block_bytes, rank_forward_cost, rank_mtp_cost
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import Pass, WhatIf
from tests.helpers import composed

INT4_FP8KV = "bfloat16+weights=int4_g128+kv=fp8_e4m3"
FP8_B128 = "bfloat16+weights=fp8_e4m3_b128"
FIELDS = ("weight_bytes", "expert_bytes", "kv_read_bytes", "kv_write_bytes", "embed_bytes", "flops_matmul",
          "flops_attention")


@pytest.mark.parametrize("name,label", [("llama-3.1-70b", INT4_FP8KV), ("deepseek-v3", FP8_B128),
                                        ("deepseek-v3", FP8_B128 + "+kv=fp8_e4m3"),  # MLA: one latent cache, one scale
                                        ("deepseek-v3.2", FP8_B128 + "+kv=int8"),  # + the indexer's keys and scales
                                        ("mixtral-8x7b", "bfloat16+weights=int8+kv=int8")])
def test_tp1_rank_cost_in_a_quantized_precision_is_the_one_device_cost(name, label):
    cfg = get_preset(name)
    one, r = forward_cost(cfg, label, 4, 3, 700), rank_forward_cost(cfg, Layout(), label, 4, 3, 700)
    for f in FIELDS:
        assert getattr(r, f) == pytest.approx(getattr(one, f), rel=1e-12), f
    if cfg.mtp_layers:
        m1, mr = mtp_cost(cfg, label, 2, 2, 50), rank_mtp_cost(cfg, Layout(), label, 2, 2, 50)
        for f in FIELDS:
            assert getattr(mr, f) == pytest.approx(getattr(m1, f), rel=1e-12), f


def test_tp8_shards_of_a_128_block_format_add_up_to_the_block_but_the_replicated_norms():
    """Every llama-3.1-70b block matrix divides into 128x128 blocks on each of 8 ranks, so the
    shards hold exactly the block's fp8 bytes and scales; only the two RMSNorm vectors are
    replicated (7 extra copies of 2·d bf16)."""
    cfg = get_preset("llama-3.1-70b")
    prec = parse_precision(FP8_B128)
    shard, _ = rank_block_bytes(cfg, Layout(tp=8), False, prec)
    assert 8 * shard - block_weight_bytes(cfg, False, prec) == 7 * 2 * cfg.d * 2


def test_rank_kv_in_its_format_and_fp8_weights_halve_the_weight_term(whatif_fixture_data):
    cfg = get_preset("llama-3.1-70b")
    lay = Layout(tp=8)
    bf = rank_forward_cost(cfg, lay, "bfloat16", 8, 1, 2048)
    q = rank_forward_cost(cfg, lay, "bfloat16+weights=fp8_e4m3_channel+kv=fp8_e4m3", 8, 1, 2048)
    assert q.kv_write_bytes * 2 == bf.kv_write_bytes  # one fp8 byte per cached element instead of two
    assert q.kv_read_bytes - q.blocks * 2 * 4 == bf.kv_read_bytes / 2  # + one fp32 K and V scale per layer
    assert q.flops == bf.flops and q.collectives == bf.collectives  # activations stay bf16
    dev = get_datasheet("h100_sxm")
    t_bf = WhatIf(cfg, dev, "bfloat16", lay).pass_detail(Pass(8, 1, 2048), 1, "vllm")["terms"]
    t_q = WhatIf(cfg, dev, "bfloat16+weights=fp8_e4m3_channel+kv=fp8_e4m3", lay).pass_detail(Pass(8, 1, 2048), 1,
                                                                                           "vllm")["terms"]
    # batch 8 is far below the ridge: the dense term is the weight bytes over the same bandwidth (the
    # fixture's fp8 kernel streams at the dense fraction)
    assert t_q["dense"] / t_bf["dense"] == pytest.approx(0.5, rel=0.03)
    assert t_q["attention"] < 0.6 * t_bf["attention"]  # half the KV bytes, attention memory-bound


def test_fp8_matmuls_run_at_the_fp8_rate(whatif_fixture_data):
    """Compute-bound, the GEMMs of fp8 weights are priced at the datasheet's fp8 FLOP/s."""
    cfg = get_preset("llama-3.1-8b")
    dev = get_datasheet("h100_sxm")
    p = Pass(256, 16, 0)
    t_bf = WhatIf(cfg, dev, "bfloat16").pass_detail(p, 1, "vllm")["terms"]["dense"]
    t_q = WhatIf(cfg, dev, "bfloat16+weights=fp8_e4m3").pass_detail(p, 1, "vllm")["terms"]["dense"]
    assert t_q == pytest.approx(t_bf * dev.peak_flops("bfloat16") / dev.peak_flops("float8_e4m3fn"), rel=0.02)


def _capacity_config(model: str, device: str, **over) -> dict:
    c = dict(model=get_preset(model).to_dict(), dtype="bfloat16", weights=None, kv=None, lm_head=None, fit=None,
             device=device, engine=None, tp=1, ep=1, dp_attention=False, calibrate=None, memory_gb=None, context=1024,
             output=256, itl_target_ms=50.0, target_tok_s=10000.0, B=[1, 2], speculative=True, alpha=0.8, k=2,
             drafter="ngram", draft_model=None, out_dir="", allow_other_model=False, price_per_device_hour=None)
    c.update(over)
    return c


def test_layout_plan_takes_the_precision_overrides(whatif_fixture_data):
    bf, s_bf = plan_layouts(_capacity_config("llama-3.1-70b", "h100_sxm"))
    q, s_q = plan_layouts(_capacity_config("llama-3.1-70b", "h100_sxm", weights="int4_g128"))
    assert s_q["weights_format"] == "int4_g128" and s_bf["weights_format"] == "bfloat16"
    fits = lambda t: set(t[t["batch"].notna()]["layout"])  # noqa: E731
    assert "tp1" not in fits(bf) and "tp1" in fits(q)  # 141 GB vs 40.6 GB of weights
    assert bf.set_index("layout").loc["tp1", "note"] == "does not fit the device at any batch"
    bf, q = bf[bf["batch"].notna()], q[q["batch"].notna()]
    assert s_q["speculation"] is None and "drafter='ngram'" in s_q["note"]  # only MTP is priced per rank
    for t in (bf, q):
        assert (t["tok_s_per_replica_pessimistic"] <= t["tok_s_per_replica"]).all()
        assert (t["tok_s_per_replica"] <= t["tok_s_per_replica_optimistic"]).all()
        assert (t["devices_optimistic"] <= t["devices"]).all() and (t["devices"] <= t["devices_pessimistic"]).all()


def test_layout_plan_prices_deepseek_in_its_native_fp8_with_mtp(whatif_fixture_data):
    t, s = plan_layouts(_capacity_config("deepseek-v3", "h200_sxm", weights="native", drafter="mtp"))
    assert s["weights_format"] == "fp8_e4m3_b128" and s["speculation"]["drafter"] == "mtp"
    assert t["speculative"].any() and (~t["speculative"]).any()
    assert t[t["batch"].notna()]["devices_per_replica"].min() == 8  # 686 GB of fp8 weights: one 8-GPU node, not one GPU


def test_request_from_config_applies_overrides():
    req = request_from_config(_capacity_config("deepseek-v3", "h200_sxm", weights="native", kv="fp8"))
    assert req.dtype == "bfloat16+weights=fp8_e4m3_b128+kv=fp8_e4m3" and req.speculation.drafter.kind == "ngram"


def test_pricing_commands_price_a_preset_as_released_unless_told_and_a_fit_in_its_dtype(whatif_fixture_data):
    """weights= not given: card, predict's what-if and capacity (with and without layouts) price the release
    format (DeepSeek-V3 in block fp8, Llama in bf16); weights=bf16 asks for bf16; with a fit the dtype stays."""
    from roofline.commands import priced_weights
    from roofline.commands.card import CardRequest, card_record
    from roofline.commands.predict import predict_command
    from roofline.model.formats import with_overrides
    assert request_from_config(_capacity_config("deepseek-v3", "h200_sxm")).dtype == FP8_B128
    assert request_from_config(_capacity_config("deepseek-v3", "h200_sxm", weights="bf16")).dtype == "bfloat16"
    assert request_from_config(_capacity_config("llama-3.1-70b", "h100_sxm")).dtype == "bfloat16"
    _, s = plan_layouts(_capacity_config("deepseek-v3", "h200_sxm", speculative=False))
    assert s["weights_format"] == "fp8_e4m3_b128"
    assert priced_weights(dict(weights=None, fit="fit.json")) is None  # a fit: what it measured
    c = composed("card", "model=deepseek-v3", "device=h200_sxm", "tp=8")
    ds = get_preset("deepseek-v3")
    label = with_overrides([c["dtype"]], priced_weights(c), c["kv"], c["lm_head"], ds.native_weights)[0]
    rec = card_record(CardRequest(model=ds, dtype=label, device=get_datasheet("h200_sxm"), tp=8))
    assert rec["weights_format"] == "fp8_e4m3_b128" and rec["quality_note"] is None  # as released: no note
    assert card_record(CardRequest(model=ds, dtype="bfloat16+kv=fp8", device=None))["quality_note"]
    p = composed("predict", "model=deepseek-v3", "device=h200_sxm", "tp=8", "B=[1]", "L=[1024]", "alphas=[0.8]",
                 "k=[1]", device_as="datasheet")
    _, summary = predict_command(p)
    assert summary["dtype"] == FP8_B128


@pytest.mark.parametrize("q, weights, experts", [
    (dict(quant_method="awq", bits=4, group_size=128, zero_point=True, version="gemm"), "int4_g128", ""),
    (dict(quant_method="gptq", bits=4, group_size=128, sym=True, desc_act=False), "int4_g128_sym", ""),
    (dict(quant_method="gptq", bits=8, group_size=128, sym=True), "int8", ""),
    (dict(quant_method="fp8", activation_scheme="dynamic", weight_block_size=[128, 128]), "fp8_e4m3_b128", ""),
    (dict(quant_method="fp8", activation_scheme="static"), "fp8_e4m3", ""),
    (dict(quant_method="fbgemm_fp8", activation_scale_ub=1200.0), "fp8_e4m3_channel", ""),
    (dict(quant_method="compressed-tensors", ignore=["lm_head"], config_groups=dict(group_0=dict(
        targets=["Linear"], weights=dict(num_bits=8, type="float", strategy="channel")))), "fp8_e4m3_channel", ""),
    (dict(quant_method="compressed-tensors", config_groups=dict(group_0=dict(
        targets=["Linear"], weights=dict(num_bits=4, type="int", strategy="group", group_size=128,
                                         symmetric=True)))), "int4_g128_sym", ""),
    (dict(quant_method="modelopt", quant_algo="NVFP4", group_size=16), "nvfp4", ""),
    (dict(quant_method="modelopt", quant_algo="FP8"), "fp8_e4m3", ""),
    (dict(quant_method="mxfp4"), "", "mxfp4"),
])
def test_a_quantized_release_config_is_priced_in_its_formats(q, weights, experts):
    from roofline.checkpoints.quantization import priced_formats
    assert priced_formats(q) == (weights, experts)


@pytest.mark.parametrize("q, says", [
    (dict(quant_method="bitsandbytes", load_in_4bit=True), "'bitsandbytes'): not priced"),
    (dict(quant_method="gptq", bits=3, group_size=128), "bits 3"),
    (dict(quant_method="awq", bits=4, group_size=-1), "group size -1"),
    (dict(quant_method="modelopt", quant_algo="MIXED_PRECISION"), "quant_algo 'MIXED_PRECISION'"),
    (dict(quant_method="compressed-tensors", config_groups={}), "0 config_groups"),
])
def test_a_quantization_config_not_priced_is_one_error_naming_it(q, says):
    from roofline.checkpoints.quantization import priced_formats
    from roofline.io.fields import ConfigError
    with pytest.raises(ConfigError, match=re.escape(says)):
        priced_formats(q)


def test_a_quantized_model_folder_prices_as_its_preset_with_those_weights(tmp_path):
    """An AWQ release's folder (checkpoint=, weights=native by default) prices as the base preset with
    weights=int4_g128 in capacity; the loader, which runs weights, still refuses it (the decoder holds no int4)."""
    import json
    from tests.test_parallel_whatif import LLAMA31_8B_CONFIG
    from roofline.checkpoints.loader import checkpoint_config
    from roofline.io.fields import ConfigError
    folder = tmp_path / "Llama-3.1-8B-AWQ"
    folder.mkdir()
    awq = dict(quant_method="awq", bits=4, group_size=128, zero_point=True, version="gemm")
    (folder / "config.json").write_text(json.dumps(dict(LLAMA31_8B_CONFIG, quantization_config=awq)))
    keys = ("device=h100_sxm", "engine=vllm", "B=[8]", "itl_target_ms=1e4", "out_dir=''")
    reqs = []
    for given in ((f"checkpoint={folder}",), ("model=llama-3.1-8b", "weights=int4_g128")):
        c = composed("capacity", *given, *keys, device_as="datasheet")
        c.pop("overrides"), c.pop("layouts")  # what the command's run() takes off before it plans
        reqs.append(request_from_config(c))
    assert reqs[0].dtype == reqs[1].dtype == "bfloat16+weights=int4_g128"
    assert reqs[0].model.native_weights == "int4_g128"
    with pytest.raises(ConfigError, match="not loaded; allowed fp8 block-scaled"):
        checkpoint_config(folder)


def test_anchors_are_priced_in_the_served_precision():
    models, _, rows = anchors.load()
    by_id = {a["id"]: a for a in rows}
    dsv3 = by_id["sglang-dsv3-mtp-b1"]
    assert anchors.served_precision(dsv3, models["deepseek-v3"]) == FP8_B128
    assert anchors.served_precision(by_id["gptfast-llama2-70b-tp8"], models["llama-2-70b"]) == "bfloat16"
