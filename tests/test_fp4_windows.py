"""fp4 weight formats (mxfp4, nvfp4), experts in a format of their own, and sliding-window attention:
their bytes, their kernels by device, their KV, and gpt-oss as released (bf16 attention, mxfp4 experts)."""

import json
import math

import pytest

from roofline.io.fields import ConfigError
from roofline.measure.devices import get_datasheet
from roofline.model.accounting import expert_bytes, forward_cost, resident_weight_bytes
from roofline.model.formats import parse_format, parse_precision, precision
from roofline.model.presets import get_preset, scaled_down
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import Pass, Setting, WhatIf, _fmt_kind, matmul_dtype
from tests.helpers import composed


def test_fp4_formats_count_their_scales():
    mx, nv = parse_format("mxfp4"), parse_format("nvfp4")
    # 4 bits a weight + one 1-byte scale per 32 (mxfp4, e8m0) or per 16 (nvfp4, e4m3) + nvfp4's fp32 per tensor
    assert mx.matrix_bytes(2880, 2880, 2) == 2880 * 2880 // 2 + 2880 * 90
    assert nv.matrix_bytes(2048, 7168, 2) == 2048 * 7168 // 2 + 2048 * 448 + 4
    assert 8 * mx.matrix_bytes(4096, 4096, 2) / 4096 ** 2 == 4.25
    with pytest.raises(ConfigError, match="kv='mxfp4'"):
        parse_format("mxfp4", "kv")


def test_experts_take_the_weights_format_unless_given_their_own():
    assert parse_precision("bfloat16+weights=int8").experts.name == "int8"
    p = precision("bfloat16", experts="mxfp4")
    assert (p.weights.name, p.experts.name, p.label) == ("bfloat16", "mxfp4", "bfloat16+experts=mxfp4")
    assert parse_precision(p.label) == p
    # weights=native on a release that quantizes only its experts (gpt-oss)
    n = precision("bfloat16", weights="native", native="", native_experts="mxfp4")
    assert (n.weights.name, n.experts.name) == ("bfloat16", "mxfp4")
    # new weights keep experts that had their own format, move experts that followed the weights
    assert precision("bfloat16+experts=mxfp4", weights="fp8").experts.name == "mxfp4"
    assert precision("bfloat16+weights=int8", weights="fp8").experts.name == "fp8_e4m3"


def test_gpt_oss_as_released_holds_mxfp4_experts_and_bf16_attention():
    cfg = get_preset("gpt-oss-120b")
    released = precision("bfloat16", weights="native", native=cfg.native_weights, native_experts=cfg.native_experts)
    assert released.label == "bfloat16+experts=mxfp4"
    assert expert_bytes(cfg, released) == 3 * (2880 * 2880 // 2 + 2880 * 90)
    held = resident_weight_bytes(cfg, released.label)
    assert 60e9 < held < 66e9  # 114.7B expert weights at 4.25 bits + 2.1B bf16 attention, embedding, head
    # every linear in mxfp4 reads fewer bytes at B=1 than the release (its bf16 attention)
    all_fp4 = precision("bfloat16", weights="mxfp4")
    assert forward_cost(cfg, all_fp4.label, 1, 1, 0).weight_bytes < forward_cost(cfg, released.label, 1, 1, 0).weight_bytes


def test_fp4_runs_on_fp4_tensor_cores_only_where_the_device_has_them():
    nv = parse_precision("bfloat16+weights=nvfp4")
    b200, h100 = get_datasheet("b200"), get_datasheet("h100_sxm")
    assert (_fmt_kind(nv.weights, b200), matmul_dtype(b200, nv)) == ("fp4", "float4_e2m1")
    assert (_fmt_kind(nv.weights, h100), matmul_dtype(h100, nv)) == ("fp4_weight_only", "bfloat16")
    assert b200.peak_flops("fp4") == 2 * b200.peak_flops("fp8")


def test_a_small_fp4_gemm_on_blackwell_costs_its_kernels_measured_floor_not_its_bytes():
    """kernels.yaml weight_only.fp4, from published fp4 GEMM benchmarks: at M = 1 an nvfp4 GEMM of Llama-3.1-8B's
    fused QKV (N = 6144, K = 4096: 14.2 MB) took 13.4 us in vLLM's CUTLASS call of July 2025 with its activation
    quantization, and 2026 kernels 6.3-7.1 us at 16.5 MB; its bytes alone stream in 1.8 us at 7.7 TB/s. The priced
    call lies inside what the kernels measured, its interval ordered, its large-M share below fp8's of its own peak."""
    from roofline.parallel import kernels as K
    kern, b200 = K.load_kernels(), get_datasheet("b200")
    nbytes = parse_format("nvfp4").matrix_bytes(6144, 4096, 2)
    assert 14.1e6 < nbytes < 14.3e6
    bw, f = b200.mem_bw_GBps * 1e9, b200.peak_flops("fp4")
    t = [K.gemm_seconds(1, 6144, 4096, nbytes, "fp4", 0, bw, f, f / 100, "b200", s, kern)["seconds"] for s in range(3)]
    assert t[0] < t[1] < t[2]
    assert 4e-6 < t[1] < 13.4e-6 and t[2] < 16e-6  # inside the measured 6.3-13.4 us, the pessimistic end near 13.4
    assert t[1] > 3 * nbytes / bw  # floor-bound, not bandwidth-bound
    # flat to M = 128 (the benchmarks' time barely moves there), compute-bound at large M
    t128 = K.gemm_seconds(128, 6144, 4096, nbytes, "fp4", 0, bw, f, f / 100, "b200", 1, kern)["seconds"]
    assert t128 < 1.2 * t[1]
    assert K.peak_fraction("fp4", 1, kern, "b200") < K.peak_fraction("fp8", 1, kern, "b200")
    # fp4 experts on Hopper take the int4 Marlin MoE curve (vLLM's Marlin MXFP4 and W4A16 MoE within 1.07x on an H20)
    args = (1e8, 1e9, 1.0, 2880, 3.35e12, 989e12, "h100_sxm", 1, kern)
    assert K.grouped_gemm_seconds(*args, "fp4_weight_only") == K.grouped_gemm_seconds(*args, "int4")


def test_nvfp4_deepseek_on_a_b200_beats_its_fp8_release_in_decode_and_in_prefill():
    cfg = get_preset("deepseek-r1")
    b200 = get_datasheet("b200")
    w = lambda fmt: WhatIf(cfg, b200, precision("bfloat16", weights=fmt).label, Layout(tp=8), Setting(engine="sglang"))  # noqa: E731
    decode, prefill = Pass(1, 1, 1024), Pass(1, 1, 1024, prefill=8192, prefill_context=4096)
    for p in (decode, prefill):
        fp4, fp8 = w("nvfp4").pass_detail(p, 1, "sglang"), w("fp8_b128").pass_detail(p, 1, "sglang")
        assert fp4["terms"]["experts"] < fp8["terms"]["experts"]
        assert fp4["seconds"] < fp8["seconds"]


def test_a_window_bounds_what_a_windowed_layer_caches_and_attends():
    cfg = get_preset("gpt-oss-20b")
    assert (cfg.sliding_window, cfg.windowed_layers) == (128, 12)
    assert cfg.kv_positions(100) == 100 and cfg.kv_positions(4096) == (4096 + 128) / 2
    full = get_preset("llama-3.1-8b")
    assert full.kv_positions(4096) == 4096 and full.attended_pairs(4096, 3) == 3 * 4096 + 6
    for L, q in ((0, 1), (100, 50), (127, 1), (4096, 1), (0, 300), (60, 2048)):
        brute_win = sum(min(L + i, 128) for i in range(1, q + 1))
        brute_full = q * L + q * (q + 1) / 2
        assert cfg.attended_pairs(L, q) == pytest.approx((brute_win + brute_full) / 2)


def test_a_windowed_model_reads_and_holds_less_kv_than_its_full_attention_twin():
    cfg = get_preset("gpt-oss-120b")
    twin = cfg.scaled(sliding_window=0, global_every=0)
    h100 = get_datasheet("h100_sxm")
    prec = precision("bfloat16", experts="mxfp4").label
    L = 32768
    a, b = (WhatIf(c, h100, prec, Layout(), Setting(engine="vllm")) for c in (cfg, twin))
    pa, pb = (w.pass_detail(Pass(64, 1, L), 1, "vllm") for w in (a, b))
    assert pa["terms"]["attention"] / pb["terms"]["attention"] == pytest.approx((L + 128) / 2 / L, rel=0.05)
    assert pa["terms"]["dense"] == pb["terms"]["dense"]
    assert a.max_running("vllm", L) > 1.8 * b.max_running("vllm", L)
    assert forward_cost(cfg, prec, 8, 1, L).kv_read_bytes < 0.51 * forward_cost(twin, prec, 8, 1, L).kv_read_bytes


def test_the_decoder_runs_a_windowed_model_only_up_to_its_window():
    import torch
    from roofline.model.decoder import Transformer, build_model
    mini = scaled_down(get_preset("gpt-oss-20b"))
    assert mini.sliding_window == 128 and mini.max_context <= 128
    model = build_model(mini, max_batch=1, max_context=mini.max_context)
    logits = model(torch.zeros(1, 4, dtype=torch.long), 0)
    assert torch.isfinite(logits).all()
    with pytest.raises(ConfigError, match="a sliding window of 16"):
        Transformer(mini.scaled(sliding_window=16), max_batch=1, max_context=64)


def test_measuring_refuses_fp4_and_experts_in_their_own_format():
    from roofline.model.decoder import Transformer
    from roofline.model.quant import Unsupported, quantize_model
    mini = scaled_down(get_preset("qwen3-30b-a3b"))
    model = Transformer(mini, max_batch=1, max_context=16)
    with pytest.raises(Unsupported, match="experts=int8 beside weights=bfloat16"):
        quantize_model(model, precision("bfloat16", experts="int8"))
    with pytest.raises(Unsupported, match="mxfp4"):
        quantize_model(model, precision("bfloat16", weights="mxfp4"), reference=True)


def test_card_takes_experts_and_names_a_bad_one(capsys):
    from roofline.commands import card
    card.run(composed("card", "model=gpt-oss-120b", "device=h100_sxm", device_as="datasheet"))
    released = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    card.run(composed("card", "model=gpt-oss-120b", "device=h100_sxm", "experts=bf16", device_as="datasheet"))
    dense = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (released["experts_format"], dense["experts_format"]) == ("mxfp4", "bfloat16")
    assert dense["resident_weight_bytes"] > 3 * released["resident_weight_bytes"]
    with pytest.raises(ConfigError, match="experts='int3'"):
        card.run(composed("card", "model=gpt-oss-120b", "experts=int3", device_as="datasheet"))
    assert not math.isnan(released["decode_floor_s"])


def test_card_places_an_fp4_step_against_the_rate_its_matmuls_run_at(capsys):
    from roofline.commands import card
    ridge = {}
    for dev in ("h100_sxm", "b200"):
        card.run(composed("card", "model=deepseek-r1", f"device={dev}", "weights=nvfp4", "tp=8", device_as="datasheet"))
        rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        ridge[dev] = (rec["ridge_dtype"], rec["ridge_flop_per_byte"])
    assert ridge["h100_sxm"] == ("bfloat16", pytest.approx(989.5e12 / 3350e9))
    assert ridge["b200"] == ("float4_e2m1", pytest.approx(9000e12 / 7700e9))


def test_chunked_attention_attends_the_current_chunk_and_moe_can_interleave():
    from roofline.model.accounting import moe_layers, param_count
    mav = get_preset("llama-4-maverick")
    assert (mav.windowed_layers, moe_layers(mav), mav.has_dense_layers) == (36, 24, True)
    assert [mav.layer_is_moe(i) for i in range(4)] == [False, True, False, True]
    assert param_count(mav).total == pytest.approx(400e9, rel=0.01)  # Meta's 400B (its vision encoder aside)
    c = mav.attention_chunk
    keys = lambda n: (n - 1) % c + 1  # noqa: E731  the n-th token (1-based) sees its chunk so far
    for L, q in ((0, 1), (8191, 1), (8192, 1), (10000, 1), (8000, 400), (0, 20000), (16384, 8192)):
        brute_local = sum(keys(L + i) for i in range(1, q + 1))
        brute_full = q * L + q * (q + 1) / 2
        assert mav.attended_pairs(L, q) == pytest.approx((3 * brute_local + brute_full) / 4)
    assert mav.kv_positions(10000) == pytest.approx(0.75 * keys(10000) + 0.25 * 10000)
    with pytest.raises(ConfigError, match="one kind of local attention"):
        mav.scaled(sliding_window=128)


def test_each_engine_reads_and_holds_windowed_layers_as_its_profile_says():
    """engines.yaml local_attention: vLLM V1's hybrid KV manager holds a window / chunk; SGLang's SWA pool 0.8 of
    the full layers' tokens; TensorRT-LLM reads and holds every token of a chunked (Llama 4) layer in decode."""
    from roofline.parallel import engines
    h200 = get_datasheet("h200_sxm")
    oss = get_preset("gpt-oss-120b")
    prec = precision("bfloat16", experts="mxfp4").label
    run = {e: WhatIf(oss, h200, prec, Layout(), Setting(engine=e)).max_running(e, 32768) for e in ("vllm", "sglang")}
    full = {e: WhatIf(oss.attending_all(), h200, prec, Layout(), Setting(engine=e)).max_running(e, 32768)
            for e in ("vllm", "sglang")}
    assert run["vllm"] > 1.8 * full["vllm"]  # the sliding half holds 128 tokens, not 32768
    assert full["sglang"] < run["sglang"] < 1.3 * full["sglang"]  # 0.8 of the tokens: ~10% more sequences
    mav = get_preset("llama-4-maverick")
    fp8 = precision("bfloat16", weights="fp8").label
    att = {(e, windowed): WhatIf(c, h200, fp8, Layout(tp=8), Setting(engine=e)).pass_detail(
        Pass(64, 1, 30000), 1, e)["terms"]["attention"]
        for e in ("vllm", "trtllm") for windowed, c in ((True, mav), (False, mav.attending_all()))}
    assert att[("trtllm", True)] == att[("trtllm", False)]  # TensorRT-LLM's decode: every cached token
    assert att[("vllm", True)] < 0.5 * att[("vllm", False)]  # vLLM's: the current chunk in 3 layers of 4
    with pytest.raises(ConfigError, match="local_attention"):
        engines.local_attention({"local_attention": {"reads": ["window"]}}, "engines.x")
    with pytest.raises(ConfigError, match="pool.sliding"):
        engines.local_attention({"local_attention": {"pool": {"sliding": 2}}}, "engines.x")


def test_fp8_on_a_part_without_fp8_tensor_cores_is_weight_only_as_vllms_fp8_marlin():
    """An A100 has no fp8 rate: fp8 weights are dequantised to bf16 (W8A16, vLLM's FP8 Marlin), priced as the 8-bit
    weight-only kernel, not refused; on an H100 they multiply on fp8 tensor cores."""
    a100, h100 = get_datasheet("a100_80gb_sxm"), get_datasheet("h100_sxm")
    f8 = parse_precision("bfloat16+weights=fp8_e4m3")
    assert (_fmt_kind(f8.weights, a100), matmul_dtype(a100, f8)) == ("fp8_weight_only", "bfloat16")
    assert (_fmt_kind(f8.weights, h100), matmul_dtype(h100, f8)) == ("fp8", "float8_e4m3fn")
    cfg = get_preset("llama-3.1-8b")
    step = {w: WhatIf(cfg, a100, precision("bfloat16", weights=w).label, Layout(), Setting(engine="vllm"))
            .pass_detail(Pass(1, 1, 1024), 1, "vllm")["seconds"] for w in ("fp8", "int8", "bf16")}
    assert step["fp8"] == pytest.approx(step["int8"], rel=0.01) and step["fp8"] < 0.8 * step["bf16"]
