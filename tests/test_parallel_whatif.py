"""The one what-if model: kernels by shape, engine profiles, touched experts in every mode, one
answer behind capacity (with and without layouts) / predict / card, workload pricing, calibration,
and the anchors' split. Logic tests run on tests/fixtures/whatif (PLACEHOLDER numbers, not priors)."""

import dataclasses
import functools
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from roofline.io.fields import ConfigError
from roofline.measure.devices import get_datasheet
from roofline.measure.memory import HEADROOM
from roofline.model.presets import get_preset
from roofline.parallel import anchors, engines, kernels, whatif
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import (Pass, Setting, SpecDecode, WhatIf, candidate_layouts, capacity, memory_check,
                                      serve)
from tests.helpers import composed

FX = Path(__file__).parent / "fixtures" / "whatif"
S = Setting(kernels=str(FX / "kernels.yaml"), engines=str(FX / "engines.yaml"), engine="vllm")
KERN = kernels.load_kernels(str(FX / "kernels.yaml"))
ROOT = Path(__file__).parents[1]


@pytest.fixture
def fixture_data(monkeypatch):
    """Point the default data paths at the fixtures (the commands read the defaults)."""
    monkeypatch.setattr(kernels, "KERNELS_PATH", FX / "kernels.yaml")
    monkeypatch.setattr(engines, "ENGINES_PATH", FX / "engines.yaml")


# ---- kernels by shape ------------------------------------------------------------------------

def test_tile_quantization_wastes_the_partial_tile_and_the_partial_wave():
    # Ampere fixture tile 16x128 on 108 SMs: M=17 fills 17/32 of its two M tiles
    u16 = kernels.tile_wave_utilisation(16, 128 * 108, "a100_80gb_sxm", KERN)
    u17 = kernels.tile_wave_utilisation(17, 128 * 108, "a100_80gb_sxm", KERN)
    assert u16 == pytest.approx(1.0) and u17 == pytest.approx(17 / 32)
    # 109 CTAs on 108 SMs: two waves, the second nearly empty
    assert kernels.tile_wave_utilisation(16, 128 * 109, "a100_80gb_sxm", KERN) == pytest.approx(109 / 216)


def test_a_grouped_gemm_fills_its_waves_with_the_tiles_of_every_group():
    """MoE experts run as one grouped launch (fused_moe's grid, DeepGEMM's and CUTLASS's persistent grouped kernels):
    the wave quantization counts the tiles of every touched expert together. Priced per expert, 16 experts of 108
    tiles each ran in one wave and of 109 tiles in two, so a prefill chunk one token per expert larger took twice
    as long (Llama 4 Scout's 8192-token chunk at 512 tokens per expert on an H100)."""
    one, two = 128 * 108, 128 * 109  # N for 108 and 109 CTAs of one 16-token M tile (fixture: 16x128 tiles, 108 SMs)
    assert kernels.tile_wave_utilisation(16, two, "a100_80gb_sxm", KERN) == pytest.approx(109 / 216)
    grouped = kernels.tile_wave_utilisation(16, two, "a100_80gb_sxm", KERN, groups=16)
    assert grouped == pytest.approx(16 * 109 / (math.ceil(16 * 109 / 108) * 108)) and grouped > 0.9
    assert kernels.tile_wave_utilisation(16, one, "a100_80gb_sxm", KERN, groups=16) == pytest.approx(1.0)
    # the grouped GEMM's compute time at 512 and 514 tokens per expert (16 experts, Scout's w13 at TP 8) is continuous
    kern = kernels.load_kernels()
    def f(m, groups):
        return kernels.grouped_gemm_seconds(1e6, 2.0 * 16 * m * 2048 * 5120, m, 2048, 3.35e12, 989e12, "h100_sxm", 1,
                                            kern, groups=groups)["compute"]
    assert f(514, 16) / f(512, 16) < 1.2  # a ninth 64-token M tile, partly filled: tile quantization, no second wave
    assert f(514, 1) / f(512, 1) > 1.8  # the former pricing: each expert's tiles a wave of their own


def test_weight_only_int4_streams_fewer_bytes_but_loses_its_edge_as_M_grows():
    dev = get_datasheet("h100_sxm")
    bw, f, f32 = dev.bandwidth_Bps(), dev.peak_flops("bf16"), dev.peak_flops("fp32")
    N = K = 8192

    def t(M, kind, nbytes, ops):
        return kernels.gemm_seconds(M, N, K, nbytes, kind, ops, bw, f, f32, dev.key, 1, KERN)["seconds"]
    r1 = t(1, "int4", N * K / 2, 3) / t(1, "dense", N * K * 2, 0)
    r128 = t(128, "int4", N * K / 2, 3) / t(128, "dense", N * K * 2, 0)
    assert r1 < 0.5 and r128 > r1 * 1.5


def test_a_weight_only_quantized_gemm_pays_its_call_floor_and_a_dense_one_does_not():
    kern = dict(KERN, weight_only=dict(KERN["weight_only"], call_floor_us={"applies_to": ["int8"], "values": [1, 7, 9]}))
    args = (1, 4096, 4096, 4096 * 4096, None, 0, 3e12, 1e15, 2e13, "h100_sxm", 1, kern)
    g = lambda kind: kernels.gemm_seconds(*args[:4], kind, *args[5:])  # noqa: E731
    assert g("int8")["seconds"] == pytest.approx(7e-6 + max(g("int8")["memory"], g("int8")["compute"]))
    assert g("dense")["seconds"] == pytest.approx(max(g("dense")["memory"], g("dense")["compute"]))


def test_decode_attention_overlaps_kv_traffic_and_arithmetic():
    d = kernels.attention_seconds(1e9, 1e12, 8, 4096, 3e12, 1e15, 1, KERN)
    assert d["seconds"] == pytest.approx(max(d["memory"], d["compute"]))
    assert d["seconds"] < d["memory"] + d["compute"]


def test_bad_kernel_triple_names_the_field():
    with pytest.raises(ConfigError, match="kernels.gemm.peak_fraction"):
        kernels.pick({"values": [0.5, 0.6]}, 1, "kernels.gemm.peak_fraction")


def test_int4_experts_stream_at_their_own_grouped_kernel_curve():
    kern = dict(KERN, grouped_gemm=dict(KERN["grouped_gemm"], weight_only={"int4": {"table": [[1, [0.3, 0.2, 0.1]]]}}))
    args = (1e9, 1e6, 1.0, 4096, 3e12, 1e15, "h100_sxm", 1, kern)
    dense, int4 = kernels.grouped_gemm_seconds(*args)["memory"], kernels.grouped_gemm_seconds(*args, "int4")["memory"]
    assert int4 == pytest.approx(1e9 / (3e12 * 0.2)) and dense == pytest.approx(1e9 / (3e12 * 0.45))
    assert kernels.grouped_gemm_seconds(*args, "int8")["memory"] == pytest.approx(dense)  # no int8 curve: the dense one


def test_a_kernel_table_is_prepared_once_per_table_object_and_never_read_for_another():
    """table_value prepares a table (sorted log x, one scenario's y) once per table object: the same object gives
    the same answer from the prepared copy, another object (a copy with other values, a table built on the fly,
    a mapping or a {table: ...} entry) its own, whatever order its rows come in."""
    rows = [[1, [0.9, 0.8, 0.7]], [100, [0.5, 0.4, 0.3]]]
    mid = math.exp((math.log(1) + math.log(100)) / 2)  # halfway in log x
    assert kernels.table_value(rows, mid, 1, "t") == pytest.approx(0.6)
    assert kernels.table_value(rows, mid, 1, "t") == pytest.approx(0.6) and kernels.table_value(rows, 1, 0, "t") == 0.9
    for i in range(50):  # tables built and dropped: none is answered from another's preparation
        other = [[100, [0.1, 0.2 + i / 1000, 0.3]], [1, [0.9, 0.6, 0.7]]]
        assert kernels.table_value(other, 100, 1, "t") == pytest.approx(0.2 + i / 1000)
    assert kernels.table_value({1: [1, 1, 1], 10: [3, 3, 3]}, 10, 2, "t") == 3.0
    assert kernels.table_value({"table": rows}, 1000, 1, "t") == pytest.approx(0.4)  # clamped at the last row
    with pytest.raises(ConfigError, match="empty table"):
        kernels.table_value([], 1, 1, "t")


def test_the_fused_moe_kernel_pays_its_layer_floor_beside_streaming_its_touched_bytes():
    """vLLM's fused_moe (benchmark_moe.py: a line through its kernel times, ~31 us per layer on H100, ~58 on
    A100) pays its floor once per MoE layer beside the touched bytes at the floor-free streaming fraction: time
    grows linearly with the bytes from an intercept. An engine running another MoE kernel streams at the
    measured kernel's whole-kernel fraction with no floor; int4 experts (vLLM's Marlin MoE) the same with their own."""
    kern = kernels.load_kernels()
    def t(nbytes, dev="h100_sxm", fmt="dense", fused=True, scenario=1):
        return kernels.grouped_gemm_seconds(nbytes, 2.0 * 8 * 4.7e6, 1.0, 1536, 3.35e12, 989e12, dev, scenario, kern,
                                            fmt, fused)["memory"]
    g = kern["grouped_gemm"]
    floor = kernels.pick(g["floor_us"], 1) * 1e-6
    assert 25e-6 < floor < 40e-6 and t(0.0) == 0.0
    assert t(1e8) == pytest.approx(floor + 1e8 / (3.35e12 * kernels.table_value(g["bw_fraction_vs_tokens_per_expert"], 1.0, 1, "")))
    assert t(2e8) - t(1e8) == pytest.approx(t(1e8) - floor)  # linear in the bytes above the intercept
    ampere = kernels.pick(kern["arch_overrides"]["ampere"]["grouped_gemm_floor_us"], 1) * 1e-6
    assert ampere > 1.5 * floor and t(1e8, "a100_80gb_sxm") - t(1e8) == pytest.approx(ampere - floor)
    whole = kernels.table_value(g["whole_kernel_fraction_vs_tokens_per_expert"]["table"], 1.0, 1, "")
    assert t(1e8, fused=False) == pytest.approx(1e8 / (3.35e12 * whole))
    # vLLM's Marlin MoE (int4 experts): the same split, its own floor (FlagGems PR #3609's lines, ~40 us), on the
    # part it was measured on (an H20; another Hopper part scales it: test_a_dequantising_moe_kernel_measured_on_an_h20...)
    w4 = g["weight_only"]["int4"]
    f4 = kernels.pick(w4["floor_us"], 1) * 1e-6
    def h20(fused):
        return kernels.grouped_gemm_seconds(1e8, 2.0 * 8 * 4.7e6, 1.0, 1536, 4.0e12, 148e12, "h20", 1, kern, "int4",
                                            fused)["memory"]
    assert h20(True) == pytest.approx(f4 + 1e8 / (4.0e12 * kernels.table_value(w4["table"], 1.0, 1, "")))
    assert h20(False) == pytest.approx(1e8 / (4.0e12 * kernels.table_value(w4["whole_kernel_table"], 1.0, 1, "")))
    assert t(1e8, scenario=0) < t(1e8) < t(1e8, scenario=2)
    # which engines run it is profile data
    assert [engines.profile(e, 1).fused_moe for e in ("vllm", "vllm-v0", "sglang", "gpt-fast", "trtllm")] == [
        True, True, True, False, False]



def test_a_dequantising_moe_kernel_measured_on_an_h20_streams_with_the_sms_of_another_hopper_part():
    """The Marlin MoE tables (int4, and the fp4 / fp8 weight-only experts that borrow them) were measured on an H20:
    78 SMs for 4.0 TB/s, so the kernel is bound by its SMs there. On another Hopper part the fraction scales by
    (SMs / 78) x (4.0 TB/s / bandwidth), never below the H20's and never above the bf16 kernel of the same family at
    those tokens per expert; another architecture (Ampere) reads the table as measured."""
    kern = kernels.load_kernels()
    g, w4 = kern["grouped_gemm"], kern["grouped_gemm"]["weight_only"]["int4"]
    m = w4["measured_on"]
    assert (m["arch"], m["sm_count"], m["mem_bw_GBps"]) == ("hopper", 78, 4000)
    read = kernels.table_value(w4["table"], 2.0, 1, "")
    cap = kernels.table_value(g["bw_fraction_vs_tokens_per_expert"], 2.0, 1, "")

    def frac(dev, bw, fmt="int4", fused=True):
        floor = kernels.pick(w4["floor_us"], 1) * 1e-6 if fused else 0.0
        t = kernels.grouped_gemm_seconds(1e9, 1e6, 2.0, 4096, bw, 1e15, dev, 1, kern, fmt, fused)["memory"]
        return 1e9 / (bw * (t - floor))

    assert frac("h20", 4.0e12) == pytest.approx(read)
    assert frac("h200_sxm", 4.8e12) == pytest.approx(min(cap, read * 132 / 78 * 4.0 / 4.8))
    assert frac("h100_sxm", 3.35e12) == pytest.approx(min(cap, read * 132 / 78 * 4.0 / 3.35))
    assert frac("h100_sxm", 3.35e12) > frac("h200_sxm", 4.8e12) > read
    assert frac("a100_80gb_sxm", 2.039e12) == pytest.approx(read)  # Ampere: as measured
    assert frac("h100_sxm", 3.35e12, "fp4_weight_only") == pytest.approx(frac("h100_sxm", 3.35e12))  # like: int4
    whole = kernels.table_value(w4["whole_kernel_table"], 2.0, 1, "")
    whole_cap = kernels.table_value(g["whole_kernel_fraction_vs_tokens_per_expert"]["table"], 2.0, 1, "")
    assert frac("h100_sxm", 3.35e12, fused=False) == pytest.approx(min(whole_cap, whole * 132 / 78 * 4.0 / 3.35))
    # never below the measured fraction, never above the cap
    assert kernels.sm_bound_transfer(w4, 0.4, 100e12, "h100_sxm", kern, 0.9) == 0.4
    assert kernels.sm_bound_transfer(w4, 0.4, 1e12, "h100_sxm", kern, 0.9) == 0.9
    assert kernels.sm_bound_transfer({}, 0.4, 1e12, "h100_sxm", kern, 0.9) == 0.4

# ---- MoE: touched experts in every mode ------------------------------------------------------

def test_mi300x_all_reduces_run_on_its_xgmi_mesh_not_on_pcie():
    """An 8x MI300X (or MI325X) platform links every GPU to its seven peers by xGMI: a TP all-reduce is priced
    at RCCL's measured xGMI latency and bus bandwidth (priors.yaml xgmi_mi300: 7.6 us, 241 GB/s typical), not a
    PCIe 5 link's (20 us, 40 GB/s), which priced a 70B TP8 decode step's all-reduces 2.7x too long at batch 1
    and a 2048-token prefill chunk's 6x."""
    from roofline.parallel.whatif import collective_link, load_priors
    p = load_priors()
    for dev in ("mi300x", "mi325x"):
        assert collective_link("all_reduce", Layout(tp=8), get_datasheet(dev), S, p) == "xgmi_mi300"
    x = p["interconnects"]["xgmi_mi300"]
    assert kernels.pick(x["latency_us"], 1) < kernels.pick(p["interconnects"]["pcie5"]["latency_us"], 1)
    assert kernels.pick(x["busbw_GBps"], 1) > 5 * kernels.pick(p["interconnects"]["pcie5"]["busbw_GBps"], 1)
    cfg = get_preset("llama-3.1-70b")
    w = WhatIf(cfg, get_datasheet("mi300x"), "float16+weights=fp8", Layout(tp=8), Setting(engine="vllm"))
    comm = w.pass_detail(Pass(1, 1, 1024), 1, "vllm")["terms"]["comm"]
    assert comm == pytest.approx(2 * cfg.layers * (7.6e-6 + 2 * 8192 * 2 * 1.75 / 241e9), rel=0.05)


def test_cdna3_pays_its_own_per_layer_floor_under_graphs_only():
    """kernels.yaml arch_overrides.cdna3.launch_floor_us_per_layer_graph (derived from calibration rows of vLLM
    0.10 on MI300X at batch 1) replaces the graph floor per layer on a CDNA3 part; an NVIDIA part keeps
    priors.yaml's; eager mode (no graphs): the host issues 262 us a layer (priors.yaml eager_host_us_per_layer)
    beside the GPU's work, its own gaps included, and the step pays the longer of the two."""
    kern = kernels.load_kernels()
    assert kernels.pick(kernels.arch_override(kern, "mi300x")["launch_floor_us_per_layer_graph"], 1) == 44
    assert "launch_floor_us_per_layer_graph" not in kernels.arch_override(kern, "h100_sxm")
    cfg = get_preset("llama-3.1-8b")

    def per_layer(dev, graphs):
        w = WhatIf(cfg, get_datasheet(dev), "bfloat16", Layout(), Setting(engine="vllm", graphs=graphs))
        return w.pass_detail(Pass(1, 1, 1024), 1, "vllm")["terms"]["per_layer"] / cfg.layers
    assert per_layer("mi300x", True) == pytest.approx(44e-6)
    assert per_layer("h100_sxm", True) == pytest.approx(11e-6)
    for dev in ("mi300x", "h100_sxm"):
        t = WhatIf(cfg, get_datasheet(dev), "bfloat16", Layout(), Setting(engine="vllm", graphs=False)).pass_detail(
            Pass(1, 1, 1024), 1, "vllm")["terms"]
        gpu = sum(v for k, v in t.items() if k not in ("per_layer", "step_overhead", "experts", "lm_head"))
        floor = per_layer(dev, True) * cfg.layers  # the device's own gaps, paid eager or not
        assert t["per_layer"] == pytest.approx(max(cfg.layers * 262e-6 - gpu, floor)) and t["per_layer"] > floor


def test_an_architecture_with_its_own_kernels_replaces_the_nvidia_curves():
    """arch_overrides: the shipped CDNA3 entry (ROCm Triton MoE, MI300X GEMM share) prices the same
    experts and the same GEMM slower than the NVIDIA-measured curves at the same datasheet rates;
    a device without an override keeps the NVIDIA curves."""
    kern = kernels.load_kernels()
    args = (600e6, 2 * 200 * 8 * 4.7e6, 12.5, 1536, 5.3e12, 1307e12)
    amd = kernels.grouped_gemm_seconds(*args, "mi300x", 1, kern)["seconds"]
    nv = kernels.grouped_gemm_seconds(*args, "h100_sxm", 1, kern)["seconds"]
    assert amd > 1.5 * nv
    assert kernels.peak_fraction("fp8", 1, kern, "mi300x") == pytest.approx(0.45)
    assert kernels.peak_fraction("fp8", 1, kern, "h100_sxm") == kernels.peak_fraction("fp8", 1, kern)


def test_prefill_attention_on_cdna3_runs_at_the_aiter_kernels_share_not_the_gemm_share():
    """arch_overrides.cdna3.prefill_attention_fraction (AITER's causal flash-attention forward on MI300X) prices
    a prompt's attention; an NVIDIA part keeps its large-GEMM share. A chunk of 8192 prompt tokens at context
    8192: its attention time grows by the ratio of the shares, and nothing else moves."""
    kern = kernels.load_kernels()
    assert [kernels.prefill_attention_fraction(s, kern, "mi300x") for s in range(3)] == [0.43, 0.40, 0.32]
    assert [kernels.prefill_attention_fraction(s, kern, "h100_sxm") for s in range(3)] == \
        [kernels.peak_fraction("dense", s, kern, "h100_sxm") for s in range(3)]
    cfg = get_preset("llama-3.1-8b")
    w = WhatIf(cfg, get_datasheet("mi300x"), "bfloat16", Layout(), Setting(engine="vllm"))  # the shipped tables
    with_prompt = w.pass_detail(Pass(1, 1, 1024, prefill=8192, prefill_context=8192), 1, "vllm")["terms"]
    without = w.pass_detail(Pass(1, 1, 1024), 1, "vllm")["terms"]
    d = 128 + 128
    flops = 2 * d * cfg.heads * cfg.layers * 8192 * 8192
    rate = get_datasheet("mi300x").dense_tflops["bf16"] * 1e12
    cache_writes = with_prompt["attention"] - without["attention"] - flops / (rate * 0.40)
    assert 0 < cache_writes < 0.05 * flops / (rate * 0.40)  # the prompt's attention at 0.40 of peak, plus its KV writes


def test_qwen3_moe_what_if_prices_touched_experts_not_all_of_them():
    cfg = get_preset("qwen3-30b-a3b")
    w = WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(), S)
    t1, t2 = w.target(1, 1, 1024, 1), w.target(1, 2, 1024, 1)
    assert w.experts_touched(1) == pytest.approx(cfg.experts_per_token)
    assert t2 / t1 > 1.2  # a second token touches new experts (T(2)/T(1) was 1.00 when priced dense)
    # a dense-priced step reads all 128 experts per layer: > 40 GB; touched at B=1 is ~ the active bytes
    active_GB = 2 * 3.3e9 / 1e9
    assert t1 < 3 * active_GB / 3350 and t1 > active_GB / 3350


def test_graph_mode_fit_of_an_moe_is_a_transfer_priced_touched():
    from roofline.analysis.costmodel import cost_row
    from roofline.model.accounting import moe_impl_for_mode
    cfg = get_preset("qwen3-30b-a3b")
    assert moe_impl_for_mode("graph") == "dense" and moe_impl_for_mode("compiled") == "dense"
    ran = cost_row(cfg, "forward", "bfloat16", 1, 1, 128, "graph")
    priced = cost_row(cfg, "forward", "bfloat16", 1, 1, 128, "graph", "touched")
    assert ran["experts_touched"] == cfg.experts and priced["experts_touched"] == pytest.approx(cfg.experts_per_token)


# ---- engines, links, layouts ---------------------------------------------------------------

def test_unknown_engine_names_the_field_and_no_engine_spans_the_profiles():
    cfg = get_preset("llama-3.1-8b")
    with pytest.raises(ConfigError, match="engine='nope'"):
        WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine="nope", engines=S.engines,
                                                                          kernels=S.kernels)).itl(1, 128)
    span = WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engines=S.engines, kernels=S.kernels))
    one = {e: WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(),
                     Setting(engine=e, engines=S.engines, kernels=S.kernels)).itl(1, 128) for e in engines.names(S.engines)}
    s = span.itl(1, 128)
    assert s["optimistic"] == min(v["optimistic"] for v in one.values())
    assert s["pessimistic"] == max(v["pessimistic"] for v in one.values())
    assert one["hf-eager"]["typical"] > one["vllm"]["typical"]  # eager launches + a slower host loop


def test_an_eager_engine_pays_the_host_issue_the_gpu_does_not_hide():
    """host_issue: eager PyTorch enqueues each kernel and returns, so the host's issue of a step's launches (50 a layer
    at 10 us, matmuls and attention included) runs beside the GPU's work: the step is the later of the two, and only
    the host's excess is a term; the LM head, issued last, runs after it. A small model on an H100 is host-bound
    (the host's 50 x 10 us a layer exceed the GPU's work, which it hides); a 70B model's GEMMs outlast the issue,
    which costs nothing beyond the device's own launch gaps (the graph floor, which the GPU pays eager or not).
    Forced CUDA graphs replace the issue by the graph floor."""
    dev = get_datasheet("h100_sxm")

    def terms(model, **kw):
        w = WhatIf(get_preset(model), dev, "bfloat16", Layout(),
                   Setting(engine="eager-host", engines=S.engines, kernels=S.kernels, **kw))
        return w.pass_detail(Pass(1, 1, 128), 1, "eager-host")["terms"]
    small, cfg = terms("llama-3.1-8b"), get_preset("llama-3.1-8b")
    issue = cfg.layers * 50 * 10e-6
    gpu = sum(v for k, v in small.items() if k not in ("per_layer", "step_overhead", "experts", "lm_head"))
    assert 0 < gpu < issue and small["per_layer"] == pytest.approx(issue - gpu)
    # host-bound: the issue, the LM head after it, then the step's own host time
    assert sum(small.values()) == pytest.approx(issue + small["lm_head"] + small["step_overhead"])
    big, n70 = terms("llama-3.1-70b"), get_preset("llama-3.1-70b").layers
    # GPU-bound: the issue hidden, the device's own launch gaps left (the graph floor: 11 us a layer on an H100)
    assert big["per_layer"] == pytest.approx(n70 * 11e-6) and big["dense"] > n70 * 50 * 10e-6
    assert terms("llama-3.1-8b", graphs=True)["per_layer"] < small["per_layer"] / 10
    # any engine forced eager (no launch count of its own): priors.yaml eager_host_us_per_layer, the same queue
    forced = {m: WhatIf(get_preset(m), dev, "bfloat16", Layout(), Setting(engine="vllm", graphs=False)).pass_detail(
        Pass(1, 1, 128), 1, "vllm")["terms"] for m in ("llama-3.1-8b", "llama-3.1-70b")}
    assert forced["llama-3.1-8b"]["per_layer"] > cfg.layers * 11e-6
    assert forced["llama-3.1-70b"]["per_layer"] == pytest.approx(n70 * 11e-6)


def test_an_engine_accumulating_fp16_gemms_in_fp16_gets_the_geforce_double_rate():
    """llama.cpp's cuBLAS path accumulates fp16 GEMMs in fp16: on an RTX 4090 (2x the fp32-accumulate
    rate) a compute-bound prefill is faster than with fp32 accumulation; data-center parts have one rate."""
    import dataclasses
    from roofline.parallel import whatif
    kern = kernels.load_kernels()
    assert kernels.fp16_accumulate_speedup(kern, "rtx4090") == 2.0 and kernels.fp16_accumulate_speedup(kern, "h100_sxm") == 1.0
    eng = engines.profile("llama.cpp", 1)
    assert eng.fp16_accumulate and not engines.profile("vllm", 1).fp16_accumulate
    cfg, dev, p = get_preset("llama-3.1-8b"), get_datasheet("rtx4090"), Pass(1, 1, 0, 2048, 1024)
    fast = whatif.pass_seconds(cfg, Layout(), "float16", p, dev, eng, 1, kern, whatif.load_priors())["terms"]["dense"]
    slow = whatif.pass_seconds(cfg, Layout(), "float16", p, dev, dataclasses.replace(eng, fp16_accumulate=False), 1,
                               kern, whatif.load_priors())["terms"]["dense"]
    assert fast < 0.75 * slow
    bf = whatif.pass_seconds(cfg, Layout(), "bfloat16", p, dev, eng, 1, kern, whatif.load_priors())["terms"]["dense"]
    assert bf == pytest.approx(slow)  # bf16 has no fp16 accumulation


def _without_pair_io(monkeypatch):
    """The what-if with no routed-pair activation traffic (accounting.expert_pair_io_bytes): for tests of the
    expert weights' own streaming."""
    import roofline.parallel.whatif as whatif_mod
    monkeypatch.setattr(whatif_mod, "expert_pair_io_bytes", lambda *args: 0.0)


def test_an_engines_own_quantized_expert_kernel_streams_at_its_ratio_of_the_grouped_curve(monkeypatch):
    """gpt-fast's int8 experts (Inductor's dequantising reduction) stream at its int8 / bf16 bandwidth
    ratio (0.765 typical, from its README's calibration rows); its bf16 experts and other engines' keep the
    grouped curve."""
    _without_pair_io(monkeypatch)  # the ratio scales the weights' streaming; the pairs' traffic is not the kernel's
    import dataclasses
    from roofline.parallel import whatif
    kern, priors = kernels.load_kernels(), whatif.load_priors()
    eng = engines.profile("gpt-fast", 1)
    assert dict(eng.grouped_bw_ratio) == {"int8": pytest.approx(0.765)} and engines.profile("vllm", 1).grouped_bw_ratio == ()
    cfg, dev, p = get_preset("mixtral-8x7b"), get_datasheet("a100_80gb_sxm"), Pass(1, 1, 128)
    def experts(dtype, e):
        return whatif.pass_seconds(cfg, Layout(), dtype, p, dev, e, 1, kern, priors)["terms"]["experts"]
    plain = dataclasses.replace(eng, grouped_bw_ratio=())
    assert experts("bfloat16+weights=int8", eng) == pytest.approx(experts("bfloat16+weights=int8", plain) / 0.765)
    assert experts("bfloat16", eng) == pytest.approx(experts("bfloat16", plain))


def test_an_engines_scheduler_time_per_running_sequence_grows_the_step_with_the_batch():
    """vLLM V1's scheduler loops over the running requests every step (PR #46112: ~1.1 us per request at
    128-256): the host term grows linearly with B on top of the fixed per-step time; an engine with no
    such figure (sglang's overlap scheduler) keeps a flat host term."""
    v, s = engines.profile("vllm", 1), engines.profile("sglang", 1)
    assert v.step_overhead_per_seq_s == pytest.approx(1.1e-6) and s.step_overhead_per_seq_s == 0.0
    assert [engines.profile("vllm", i).step_overhead_per_seq_s for i in range(3)] == sorted(
        engines.profile("vllm", i).step_overhead_per_seq_s for i in range(3))
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    def host(B, eng):
        return WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine=eng)).pass_detail(
            Pass(B, 1, 512), 1, eng)["terms"]["step_overhead"]
    assert host(256, "vllm") - host(1, "vllm") == pytest.approx(255 * 1.1e-6)
    assert host(256, "sglang") == host(1, "sglang")


def test_vllms_v0_engine_is_its_own_profile_and_the_anchors_that_ran_it_use_it():
    """vLLM's V0 engine spends host time per running sequence between steps (the RFC for multi-step
    scheduling; a slope derived from the V0-era calibration rows, 170-350 us per sequence): its host term grows
    with B far faster than V1's; every anchor whose source states the V0 engine (or predates V1) is priced
    with it, and no other."""
    v0, v1 = engines.profile("vllm-v0", 1), engines.profile("vllm", 1)
    assert v0.step_overhead_per_seq_s == pytest.approx(220e-6) and v0.step_overhead_per_seq_s > 100 * v1.step_overhead_per_seq_s
    assert [engines.profile("vllm-v0", i).step_overhead_per_seq_s for i in range(3)] == pytest.approx([170e-6, 220e-6, 350e-6])
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    def step(B, eng):
        return WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine=eng)).target(1, B, 512, 1)
    assert step(64, "vllm-v0") - step(1, "vllm-v0") > step(64, "vllm") - step(1, "vllm") + 60 * 200e-6
    _, sources, rows = anchors.load()
    for a in rows:
        if a["engine"] in ("vllm", "vllm-v0"):
            stated = str(sources[a["source"]].get("engine_version", "")) + str(sources[a["source"]].get("date_or_version", ""))
            assert (a["engine"] == "vllm-v0") == ("V0" in stated or "2023" in stated or "2024" in stated), a["id"]


def test_vllm_on_rocm_with_an_fp8_kv_cache_before_v1_took_it_ran_the_v0_engine():
    """vLLM's V1 oracle of early 2025 (`_is_v1_supported_oracle`, 'No Fp8 KV cache so far') fell back to V0 for
    --kv-cache-dtype fp8 on ROCm until vLLM PR #17870 (2025-05-08): PR #17530's MI300X runs (2025-05-01, fp8 KV) are
    priced with the V0 profile, and their source says why."""
    _, sources, rows = anchors.load()
    src = sources["vllm_pr17530_mi300x"]
    assert src["engine"] == "vllm-v0" and "#17870" in src["engine_version"] and "--kv-cache-dtype fp8" in src["note"]
    mine = [a for a in rows if a["source"] == "vllm_pr17530_mi300x"]
    assert len(mine) == 3 and {a["engine"] for a in mine} == {"vllm-v0"} and {a["kv"] for a in mine} == {"fp8"}


def test_an_engines_own_attention_kernel_streams_the_kv_at_its_own_fraction():
    """TensorRT-LLM's decode attention (gpt_attention_plugin) streams KV at its own fraction (0.82 typical,
    derived from its calibration throughput rows; 0.78 = FlashAttention-2's kernel figure at the pessimistic
    end), in place of kernels.yaml's 0.65; the floor per call stays; engines without one keep kernels.yaml's."""
    kern = kernels.load_kernels()
    t, v = engines.profile("trtllm", 1), engines.profile("vllm", 1)
    assert t.attention_bw_fraction == pytest.approx(0.82) and v.attention_bw_fraction is None
    assert [engines.profile("trtllm", i).attention_bw_fraction for i in range(3)] == pytest.approx([0.88, 0.82, 0.78])
    args = (1e9, 0.0, 64, 1024, 3.35e12, 989e12, 1, kern, 32)
    floor = 32 * kernels.pick(kern["decode_attention"]["floor_us"], 1) * 1e-6
    own = kernels.attention_seconds(*args, bw_fraction=0.82)["seconds"]
    assert own == pytest.approx(floor + 1e9 / (3.35e12 * 0.82))
    assert kernels.attention_seconds(*args)["seconds"] > own
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    def attn(eng):
        return WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine=eng)).pass_detail(
            Pass(64, 1, 2048), 1, eng)["terms"]["attention"]
    assert attn("trtllm") < attn("vllm")


def test_tp_all_reduces_stay_on_nvlink_beyond_eight_devices():
    from roofline.parallel.whatif import collective_link, load_priors
    p = load_priors()
    lay = Layout(tp=8, pp=2)
    assert collective_link("all_reduce", lay, get_datasheet("h100_sxm"), S, p) == "nvlink4"
    assert collective_link("send_recv", lay, get_datasheet("h100_sxm"), S, p) == "infiniband_ndr"


def test_memory_check_counts_the_draft_model_and_a_plan_that_does_not_fit_says_so():
    cfg, dev = get_preset("llama-3.1-70b"), get_datasheet("h100_sxm")
    plain = memory_check(get_preset("llama-3.1-8b"), dev, "bfloat16", Layout(), 8, 2048)
    with_draft = memory_check(get_preset("llama-3.1-8b"), dev, "bfloat16", Layout(), 8, 2048,
                              draft=get_preset("llama-3.1-8b"))
    assert with_draft["weights_GB"] == pytest.approx(2 * plain["weights_GB"], rel=1e-9)
    rows = capacity(cfg, dev, "bfloat16", 1024, 256, 1000.0, 1000.0, setting=S, layouts=[Layout()])
    assert rows[0]["note"] == "does not fit the device at any batch"


# ---- one answer behind every command ---------------------------------------------------------

def test_capacity_with_and_without_layouts_give_one_answer(fixture_data):
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands.capacity import DEVICE_AS, plan_layouts, request_from_config
    c = composed("capacity", "model=llama-3.1-8b", "device=h100_sxm", "engine=vllm", "B=[16]", "itl_target_ms=1e4",
                 "out_dir=''", device_as=DEVICE_AS)
    c.pop("overrides"), c.pop("layouts")  # what the command's run() takes off before it plans
    one, _ = plan_whatif(request_from_config(dict(c)))
    rows, summary = plan_layouts(dict(c))
    tp1 = rows[rows["layout"] == "tp1"].iloc[0]
    assert int(tp1["batch"]) == 16  # layouts honour B
    assert float(one.iloc[0]["itl_ms"]) == pytest.approx(float(tp1["itl_ms"]), rel=1e-12)
    assert summary["engine"] == "vllm"


def test_capacity_plans_no_batch_above_the_engines_cap_on_running_sequences():
    """SGLang keeps at most 48 sequences running with speculative decoding (engines.yaml spec_max_running_seqs), so
    neither capacity plan gives a speculative replica more: the cap itself is planned as a batch (48, between the
    grid's 32 and 64), the larger ones are marked out of it; plain decode, which SGLang does not cap, still plans
    256. A deployment's own max_running_seqs= caps both plans (and a fit's plan), and a bad one is an error naming
    the key."""
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands.capacity import DEVICE_AS, plan_layouts, request_from_config
    c = composed("capacity", "model=deepseek-v3", "device=h200_sxm", "engine=sglang", "weights=native",
                 "itl_target_ms=1e4", "speculative=true", "drafter=mtp", "alpha=0.7", "k=1", "out_dir=''",
                 device_as=DEVICE_AS)
    c.pop("overrides"), c.pop("layouts")
    one, s = plan_whatif(request_from_config(dict(c, tp=8)))
    assert s["max_running_seqs"] == dict(plain=None, spec=48)
    assert s["spec"]["best_batch"] == 48 and s["plain"]["best_batch"] == 256
    spec = one[one["spec"]]
    assert 48 in set(spec["B"]) and (spec["within_cap"] == (spec["B"] <= 48)).all()
    assert one[~one["spec"]]["within_cap"].all()
    rows, _ = plan_layouts(dict(c))
    tp8 = rows[rows["layout"] == "tp8"].set_index("speculative")
    assert int(tp8.loc[True, "batch"]) == 48 == int(tp8.loc[True, "seq_cap"]) and int(tp8.loc[False, "batch"]) == 256
    own = dict(c, speculative=False, max_running_seqs=24)
    _, s = plan_whatif(request_from_config(dict(own, tp=8)))
    assert s["plain"]["best_batch"] == 24 == s["max_running_seqs"]["plain"]
    rows, _ = plan_layouts(dict(own))
    assert (rows["batch"].dropna() <= 24).all() and 24 in set(rows["batch"].dropna())
    for bad in (-1, "x"):
        with pytest.raises(ConfigError, match="max_running_seqs="):
            plan_whatif(request_from_config(dict(own, tp=8, max_running_seqs=bad)))
        with pytest.raises(ConfigError, match="max_running_seqs="):
            plan_layouts(dict(own, max_running_seqs=bad))


def test_capacity_prices_a_sustained_service_its_prompts_prefill_included():
    """A capacity plan's tokens/s and mean ITL are a sustained service's (whatif.sustained: every finished request's
    successor prefilled in the running steps), not a decode step's B / ITL: 2048-token prompts on a Llama-3.1-70B TP4
    replica at B = 64 take most of its time (it planned 2.5x the tokens/s), while 16-token prompts cost little. Both
    plans give that one answer; the ITL median is the decode step, the TPOT above it."""
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands.capacity import DEVICE_AS, plan_layouts, request_from_config
    cfg, dev = get_preset("llama-3.1-70b"), get_datasheet("h100_sxm")
    w = WhatIf(cfg, dev, "bfloat16", Layout(tp=4), Setting(engine="vllm"))
    share = {}
    for context, output in ((2048, 256), (16, 1024)):
        c = composed("capacity", "model=llama-3.1-70b", "device=h100_sxm", "engine=vllm", "B=[64]",
                     f"context={context}", f"output={output}", "itl_target_ms=1e4", "out_dir=''", device_as=DEVICE_AS)
        c.pop("overrides"), c.pop("layouts")
        one, s = plan_whatif(request_from_config(dict(c, tp=4)))
        rows, _ = plan_layouts(dict(c))
        tp4 = rows[rows["layout"] == "tp4"].iloc[0]
        row = one.iloc[0]
        run = whatif.sustained(w, 64, context, output)
        assert float(row["tok_s_per_device"]) == pytest.approx(run["tok_s_per_gpu"]["typical"], rel=1e-12)
        assert float(tp4["tok_s_per_replica"]) == pytest.approx(4 * float(row["tok_s_per_device"]), rel=1e-12)
        assert float(tp4["itl_ms"]) == pytest.approx(float(row["itl_ms"]), rel=1e-12)
        decode_only = 64 / w.itl(64, context + output // 2)["typical"] / 4
        assert float(row["itl_median_ms"]) == pytest.approx(1e3 * w.itl(64, context + output // 2)["typical"])
        assert float(row["itl_ms"]) >= float(row["itl_median_ms"]) and float(row["ttft_ms"]) > 0
        share[context] = float(row["tok_s_per_device"]) / decode_only
        assert "sustained service" in s["priced"]
    assert share[2048] < 0.5 and 0.9 < share[16] <= 1.0


def test_a_sustained_services_decode_step_carries_the_prompts_that_arrived_not_a_full_budget():
    """In a staggered run's steady state a request's prompt rides in the next decode step with those that arrived
    beside it (C·tau/O a step): at 8 requests of 2048 + 256 tokens that is one prompt, so its TTFT is about the
    single request's (it was a step of vLLM's whole 8192-token budget, 3.9x); where the arrivals fill the budget
    (prefill-bound) the step carries it whole. The steps carrying prompts are then more, each smaller: the TPOT keeps
    the prompts' tokens."""
    w = WhatIf(get_preset("llama-3.1-70b"), get_datasheet("h100_sxm"), "bfloat16", Layout(tp=4), Setting(engine="vllm"))
    one, eight = (whatif.sustained(w, B, 2048, 256) for B in (1, 8))
    assert eight["ttft_s"]["typical"] < 1.1 * one["ttft_s"]["typical"]
    assert eight["itl_mean_s"]["typical"] > eight["itl_s"]["typical"]  # the prompts' steps are in the TPOT
    busy = whatif.sustained(w, 256, 2048, 16)  # 256 x 2048 / 16 tokens arrive a step: full budgets
    budget = busy["prefill_chunk_tokens"]["typical"]
    full = w.forward(Pass(int(busy["running"]["typical"]), 1, 2048 + 8, budget - busy["running"]["typical"], 1024),
                     1, "vllm")
    assert busy["ttft_s"]["typical"] >= 0.9 * full


def test_capacity_honours_a_ttft_target_on_the_what_if_and_refuses_it_with_a_fit():
    from roofline.analysis import capacity as cap_mod
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands.capacity import DEVICE_AS, plan_layouts, request_from_config
    c = composed("capacity", "model=llama-3.1-70b", "device=h100_sxm", "engine=vllm", "B=[1,8,64]", "context=8192",
                 "output=256", "itl_target_ms=1e4", "out_dir=''", device_as=DEVICE_AS)
    c.pop("overrides"), c.pop("layouts")
    free, _ = plan_whatif(request_from_config(dict(c, tp=4)))
    ttft = dict(zip(free["B"], free["ttft_ms"]))
    target = (ttft[1] + ttft[64]) / 2  # between the smallest and largest batch's TTFT
    one, s = plan_whatif(request_from_config(dict(c, tp=4, ttft_target_ms=target)))
    assert s["plain"]["best_batch"] == max(B for B, t in ttft.items() if t <= target) < 64
    assert list(one["meets_ttft"]) == [t <= target for t in one["ttft_ms"]]
    rows, _ = plan_layouts(dict(c, ttft_target_ms=target))
    tp4 = rows[rows["layout"] == "tp4"].iloc[0]
    assert int(tp4["batch"]) == s["plain"]["best_batch"] and float(tp4["ttft_ms"]) <= target
    for bad in (-1, "x"):
        with pytest.raises(ConfigError, match="ttft_target_ms="):
            plan_whatif(request_from_config(dict(c, tp=4, ttft_target_ms=bad)))
    fit = dict(provenance=dict(what_if="test", device_name="x"), groups=[])
    with pytest.raises(ConfigError, match="ttft_target_ms=100.*a fit's plan prices decode steps alone"):
        cap_mod.plan(fit, get_preset("llama-3.1-8b"), "bfloat16", cap_mod.Workload(64, 64, 20.0, 1000.0, 100.0), 1e12,
                     (1,))


def test_a_fits_capacity_plan_honours_the_deployments_cap_on_running_sequences(monkeypatch):
    from roofline.analysis import capacity as cap_mod
    t = pd.DataFrame(dict(B=[1, 8, 64], spec=[False] * 3, alpha=[math.nan] * 3, k=[0] * 3, step_s=[0.01] * 3,
                          itl_ms=[10.0] * 3, tok_s_per_device=[100.0, 800.0, 6400.0], L_priced=[100] * 3))
    monkeypatch.setattr(cap_mod, "batch_table", lambda *a, **k: t.copy())
    fit = dict(provenance=dict(what_if="test", device_name="x"), groups=[])
    work = cap_mod.Workload(64, 64, 20.0, 1000.0)
    for cap, best in ((None, 64), (8, 8)):
        _, s = cap_mod.plan(fit, get_preset("llama-3.1-8b"), "bfloat16", work, 1e12, (1, 8, 64), max_running=cap)
        assert s["plain"]["best_batch"] == best and s["max_running_seqs"] == cap


LLAMA31_8B_CONFIG = {  # meta-llama/Llama-3.1-8B's config.json, the fields the preset's header lists
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
    "hidden_act": "silu", "torch_dtype": "bfloat16"}


def test_a_model_folder_prices_as_its_preset_in_card_capacity_and_predict(tmp_path, capsys, fixture_data):
    """`checkpoint=` (a Hugging Face folder's config.json, roofline.commands.CheckpointKeys) replaces the preset in
    card, capacity (one layout and layouts=true) and predict's what-if, with the same numbers as the preset of the
    same shapes; with model= on the command line too, or a folder without config.json, one error naming the key."""
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands import capacity as capacity_cmd, card as card_cmd
    from roofline.commands.predict import predict_command
    folder = tmp_path / "Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA31_8B_CONFIG))
    keys = ("device=h100_sxm", "engine=vllm", "B=[16]", "itl_target_ms=1e4", "out_dir=''")
    plans = {}
    for given in ("model=llama-3.1-8b", f"checkpoint={folder}"):
        c = composed("capacity", given, *keys, device_as=capacity_cmd.DEVICE_AS)
        model = capacity_cmd.target_model(c)
        c.pop("overrides"), c.pop("layouts")
        one, s = plan_whatif(capacity_cmd.request_from_config(dict(c), model))
        rows, _ = capacity_cmd.plan_layouts(dict(c), model)
        _, p = predict_command(composed("predict", given, "device=h100_sxm", "engine=vllm", "drafter=ngram",
                                        "k=[0,2]", "B=[4]", "L=[1024]", "alphas=[0.8]", device_as="datasheet"))
        card_cmd.run(composed("card", given, "device=h100_sxm", "engine=vllm", "batch=16", "context=1024",
                              device_as=card_cmd.DEVICE_AS))
        card = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        plans[given.split("=")[0]] = (s["model"], float(one.iloc[0]["itl_ms"]),
                                      float(rows[rows["layout"] == "tp1"].iloc[0]["itl_ms"]), p["rows"],
                                      card["params_total"], card["whatif_itl_ms"])
    assert plans["checkpoint"][0] == "Llama-3.1-8B" and plans["model"][0] == "llama-3.1-8b"
    assert plans["checkpoint"][1:] == pytest.approx(plans["model"][1:], rel=1e-12)
    assert plans["checkpoint"][4] == 8_030_261_248
    both = ("model=llama-3.1-8b", f"checkpoint={folder}", *keys)
    both = dict(composed("capacity", *both, device_as=capacity_cmd.DEVICE_AS), overrides=list(both))  # as the entry's
    with pytest.raises(ConfigError, match="model= and checkpoint= are both given"):
        capacity_cmd.run(both)
    with pytest.raises(ConfigError, match="no config.json"):
        predict_command(composed("predict", f"checkpoint={tmp_path}", "device=h100_sxm", device_as="datasheet"))


def test_a_one_layout_capacity_plan_counts_whole_replicas(fixture_data):
    """A tp8 layout is deployed 8 devices at a time: the plan's device count for the target is whole replicas
    (it was target / tok/s per device rounded up, 6 devices of a tp8 layout), as the layouts plan counts them."""
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands.capacity import DEVICE_AS, plan_layouts, request_from_config
    c = composed("capacity", "model=llama-3.1-70b", "device=h100_sxm", "engine=vllm", "weights=fp8", "tp=8",
                 "B=[64]", "itl_target_ms=1e4", "target_tok_s=10000", "out_dir=''", device_as=DEVICE_AS)
    c.pop("overrides"), c.pop("layouts")
    _, s = plan_whatif(request_from_config(dict(c)))
    p = s["plain"]
    assert p["devices_per_replica"] == 8 and p["devices_for_target"] % 8 == 0
    assert p["replicas_for_target"] == math.ceil(10000 / (p["tok_s_per_device"] * 8))
    assert p["devices_for_target"] == 8 * p["replicas_for_target"]
    c.pop("tp")
    rows, _ = plan_layouts(dict(c))
    tp8 = rows[rows["layout"] == "tp8"].iloc[0]
    assert int(tp8["devices"]) == p["devices_for_target"]


def test_capacity_with_and_without_layouts_read_one_memory_and_honour_memory_gb(fixture_data):
    """One device memory behind both plans: the driver-reported size by default (an H100's "80GB" is
    80 GiB), a user's memory_gb where given, which the layouts' memory check used to ignore (a 70B in
    bf16 fitted tp2 at B = 16 with memory_gb=40)."""
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands.capacity import DEVICE_AS, plan_layouts, request_from_config
    for mem in ("null", "40"):
        c = composed("capacity", "model=llama-3.1-70b", "device=h100_sxm", "engine=vllm", "tp=2", "B=[16]",
                     f"memory_gb={mem}", "out_dir=''", device_as=DEVICE_AS)
        c.pop("overrides"), c.pop("layouts")
        one, s_one = plan_whatif(request_from_config(dict(c)))
        with pytest.raises(ConfigError, match="tp=2: layouts=true plans every layout"):
            plan_layouts(dict(c))  # the layouts plan would ignore tp=: refused by name
        rows, s_lay = plan_layouts(dict(c, tp=1))
        assert s_one["memory_GB"] == s_lay["memory_GB"] == (40.0 if mem == "40" else
                                                             get_datasheet("h100_sxm").usable_mem_bytes() / 1e9)
        tp2 = rows[rows["layout"] == "tp2"].iloc[0]
        assert bool(one.iloc[0]["fits_memory"]) == (mem == "null") == (tp2["batch"] == 16)
    assert "layouts=true" in s_one["note"]  # a plan that does not fit says how to get one that does


def test_fixed_lengths_ramp_every_wave_and_staggered_ones_interleave_the_prompts():
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), S)
    fixed, stag = serve(w, 2048, 512, 16, 160), serve(w, 2048, 512, 16, 160, staggered=True)
    one = serve(w, 2048, 512, 16, 16)
    # fixed lengths: the 10 waves each wait for their 16 prompts (8 of 16 chunks for the median request)
    assert fixed["ttft_s"]["typical"] == pytest.approx(one["ttft_s"]["typical"])
    assert fixed["ttft_s"]["typical"] > 4 * stag["ttft_s"]["typical"]  # staggered: one chunk step
    assert stag["itl_mean_s"]["typical"] > fixed["itl_s"]["typical"]  # its decode steps carry prompt chunks


def test_a_staggered_run_of_requests_past_a_multiple_of_its_slots_is_not_a_wave_longer():
    """Staggered requests are replaced one by one, so N requests C at a time take N / C of a slot's requests each; the
    run was priced ceil(N / C) waves long: Llama-3.1-70B fp8 TP 4 on H100s with vLLM, 2048 requests of 1024 / 1024
    in the 341 its KV pool keeps running, 7 waves for 6.006 (4797 output tok/s against 5550 with 1024 requests at
    256), as if a run gained throughput by sending fewer requests."""
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine="vllm"))
    even, past = serve(w, 1024, 1024, 64, 6 * 64, staggered=True), serve(w, 1024, 1024, 64, 6 * 64 + 1, staggered=True)
    assert past["output_tok_s"]["typical"] == pytest.approx(even["output_tok_s"]["typical"], rel=0.01)
    w70 = WhatIf(get_preset("llama-3.1-70b"), get_datasheet("h100_sxm"), "bfloat16+weights=fp8", Layout(tp=4),
                 Setting(engine="vllm"))
    runs = [serve(w70, 1024, 1024, C, 4 * C, staggered=True) for C in (256, 384, 512)]
    assert runs[-1]["running"]["typical"] < 512  # the KV pool's cap: 2048 requests in fewer slots
    assert all(b["output_tok_s"]["typical"] >= 0.99 * a["output_tok_s"]["typical"] for a, b in zip(runs, runs[1:]))


def test_a_prefill_bound_staggered_run_steps_with_the_decodes_it_has_not_all_its_slots():
    """Prefill-bound (its prompts need more steps than its decodes), a staggered run's steps each carry a chunk beside
    the sequences decoding at the time, C x its decode steps / its prompt steps, not all C: priced beside all C, the
    prompt-bound throughput fell as C grew (Qwen2.5-7B on an A100, vLLM V0, 8192 / 256: 316 -> 279 tok/s from 64
    to 128 requests, where the prompts bound it alike)."""
    w = WhatIf(get_preset("qwen2.5-7b"), get_datasheet("a100_80gb_sxm"), "bfloat16", Layout(),
               Setting(engine="vllm-v0"))
    tput = [serve(w, 8192, 256, C, 4 * C, staggered=True)["output_tok_s"]["typical"] for C in (64, 96, 128)]
    assert min(tput) >= 0.97 * max(tput)


def test_a_prefill_bound_run_lasts_its_prompts_steps_and_its_requests_queue_for_them():
    """No run outpaces its own prefill: N prompts of I tokens need N·I/chunk steps that each carry a chunk, so the
    output rate is at most N·O over that time. Staggered lengths priced the decode steps alone (8192 in / 16 out at
    C = 64: 181 tok/s where the prompts alone bound it at 79); now the run lasts max(decode steps, prompt steps) and a
    new request waits for the C·I/chunk - O chunks queued ahead of it. A decode-bound run is unchanged. (A run
    batched `beside`, given to the run: its chunk priced whole beside the decodes.)"""
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine="vllm-v0"))
    for staggered in (False, True):
        r = serve(w, 8192, 16, 64, 640, staggered=staggered, chunk_tokens=8192, step_batching="beside")
        chunk = int(r["prefill_chunk_tokens"]["typical"])
        prompt_steps = 640 * 8192 / chunk * w.forward(Pass(1, 1, 0, chunk, 8192 / 2), 1, "vllm-v0")
        assert r["output_tok_s"]["typical"] < 640 * 16 / prompt_steps
    bound = serve(w, 8192, 16, 32, 320, staggered=True, chunk_tokens=8192, step_batching="beside")
    free = serve(w, 8192, 32, 32, 320, staggered=True, chunk_tokens=8192, step_batching="beside")
    assert bound["running"]["typical"] == free["running"]["typical"] == 32  # the KV pool holds them all
    # each step a chunk beside the 18 sequences decoding at a time: 32 x 160 decode steps / 288 prompt steps
    mixed = w.forward(Pass(18, 1, 8192 + 8, 8192, 8192 / 2), 1, "vllm-v0")
    assert bound["ttft_s"]["typical"] == pytest.approx((32 - 16) * mixed)  # 32 chunks queued, 16 decode steps
    assert free["ttft_s"]["typical"] < bound["ttft_s"]["typical"] / 10  # 32 - 32 <= 1: its own chunk only


def test_a_steps_token_budget_holds_its_decodes_where_the_engine_shares_it():
    """vLLM V1 schedules its running requests first out of max_num_batched_tokens (a decode's one token, 1 + k with
    k drafts) and the waiting prompts out of what is left; TensorRT-LLM's max_num_tokens counts the generation
    tokens too (engines.yaml step_batching: shared). A chunk beside C decodes is the budget less C: it was the whole
    budget beside them, as a run batched `beside` still prices it."""
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    assert engines.profile("vllm", 1).step_batching == engines.profile("trtllm", 1).step_batching == "shared"
    w = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="vllm"))
    bound = serve(w, 8192, 16, 32, 320, staggered=True, chunk_tokens=8192)  # prefill-bound: every step a chunk
    # beside the 18 sequences decoding at a time (32 x 160 decode steps / 289 prompt steps), a chunk of the budget
    # less the 32 slots' decodes
    mixed = w.forward(Pass(18, 1, 8192 + 8, 8192 - 32, 8192 / 2), 1, "vllm")
    assert bound["ttft_s"]["typical"] == pytest.approx((32 * 8192 / (8192 - 32) - 16) * mixed)
    assert bound["prefill_chunk_tokens"]["typical"] == 8192  # the budget as the engine states it
    # a fixed-length ramp of 256 prompts of 128 tokens: 4 whole chunks beside, 5 steps once the decodes of the
    # prompts already prefilled take their tokens (96 on average), so the 128th prompt completes at step 3, not 2
    shared = serve(w, 128, 128, 256, 256, chunk_tokens=8192)
    beside = serve(WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="vllm-v0")), 128, 128, 256, 256,
                   chunk_tokens=8192, step_batching="beside")
    # its three steps carry 0, 63.25 and 126.5 decoding sequences (8096 / 128 prompts a step): 63 on average
    assert shared["ttft_s"]["typical"] == pytest.approx(3 * w.forward(Pass(63, 1, 128, 8096, 64), 1, "vllm"))
    assert shared["ttft_s"]["typical"] > 1.3 * beside["ttft_s"]["typical"]  # beside: the 128th at step 2


def test_vllm_v0_batches_its_prompts_as_its_default_chunked_prefill_rule_says(tmp_path):
    """vLLM V0 without chunked prefill runs waiting prompts in steps of their own ('Don't schedule decodes if prefills
    are scheduled'), whole prompts up to max_num_batched_tokens = max(max_model_len, 2048); its default turns chunked
    prefill on only for a model of more than 32K tokens on CUDA without MLA or sliding windows (then V1-like `shared`
    steps of 2048 tokens). A run's own step_batching / prefill_chunk_tokens replace the rule's, checked by name, and
    V1, which always chunks, is untouched."""
    from roofline.parallel.whatif import v0_chunked_prefill
    e = engines.profile("vllm-v0", 1)
    assert e.chunked_prefill_v0 and engines.profile("vllm-v0-rocm", 1).chunked_prefill_v0
    assert not engines.profile("vllm", 1).chunked_prefill_v0
    h100, mi300 = get_datasheet("h100_sxm"), get_datasheet("mi300x")
    long, short, mla = get_preset("llama-3.1-8b"), get_preset("llama-2-7b"), get_preset("deepseek-v3")
    assert long.max_context > 32768 >= short.max_context and mla.is_mla and mla.max_context > 32768
    assert v0_chunked_prefill(long, h100) and not v0_chunked_prefill(long, mi300)
    assert not v0_chunked_prefill(short, h100) and not v0_chunked_prefill(mla, h100)

    def run(cfg, dev, **kw):
        w = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="vllm-v0"))
        return w, serve(w, 1024, 64, 16, 16, **kw)
    _, r = run(long, h100)
    assert r["prefill_chunk_tokens"]["typical"] == 2048  # chunked: V0's default budget
    w, r = run(short, h100)
    assert r["prefill_chunk_tokens"]["typical"] == 4096  # whole prompts up to the model's context (4 a step)
    alone = w.forward(Pass(1, 1, 0, 4096, 512), 1, "vllm-v0")  # 16 prompts of 1024: 4 prompt steps, the 8th in the 2nd
    assert r["ttft_s"]["typical"] == pytest.approx(2 * alone)
    _, own = run(short, h100, step_batching="shared", chunk_tokens=2048)
    assert own["prefill_chunk_tokens"]["typical"] == 2048 and own["ttft_s"]["typical"] != r["ttft_s"]["typical"]
    with pytest.raises(ConfigError, match="step_batching='mixed'"):
        engines.run_scheduling({"step_batching": "mixed"}, "")
    with pytest.raises(ConfigError, match="prefill_chunk_tokens=-1"):
        engines.run_scheduling({"prefill_chunk_tokens": -1}, "")
    from roofline.analysis import calibrate
    pts = tmp_path / "pts.yaml"  # a calibration point's run: the same keys, checked where the points are read
    pts.write_text("points: [{concurrency: 16, input_len: 512, output_len: 128, tpot_ms: 30, step_batching: nope}]\n")
    with pytest.raises(ConfigError, match=r"points\[0\]\.step_batching='nope'"):
        calibrate.load_points(pts)
    a = next(a for a in anchors.load()[2] if a["id"] == "vllm-mi300x-qwen3-30b-a3b-fp8-10000-500")
    assert a["workload"]["prefill_chunk_tokens"] == 32768  # its --max-model-len 32768: max(32768, 2048)


def test_sglang_runs_its_prompts_in_steps_of_their_own_before_the_decodes():
    """SGLang's scheduler runs a prefill batch whenever one can be formed ('Run prefill first if possible') and
    mixes the decodes into it only with --enable-mixed-chunk (default off): a fixed-length wave's ramp is prompts
    alone, its first prompts wait for the last before they decode, and a staggered run's prompt chunk is a step of
    its own beside the decode step (engines.yaml step_batching: prefill_first). A static batch (gptSessionBenchmark)
    prefills its whole batch before it decodes too."""
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    assert engines.profile("sglang", 1).step_batching == "prefill_first"
    w = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="sglang"))
    r = serve(w, 4096, 64, 16, 16, chunk_tokens=8192)  # R = 8 ramp steps of two prompts, the 8th prompt at step 4
    alone = w.forward(Pass(1, 1, 0, 8192, 4096 / 2), 1, "sglang")
    plain = w.forward(Pass(16, 1, 4096 + 32, 0, 4096 / 2), 1, "sglang")
    assert r["ttft_s"]["typical"] == pytest.approx(4 * alone)
    assert r["e2e_s"]["typical"] == pytest.approx(8 * alone + 63 * plain)  # waits steps 5..8, then 63 decode steps
    assert r["itl_mean_s"]["typical"] == pytest.approx((4 * alone + 63 * plain) / 63)
    assert r["output_tok_s"]["typical"] == pytest.approx(16 * 64 / (8 * alone + 63 * plain))
    # staggered: a step carrying a chunk is the prompts' step, then the decodes'
    st = serve(w, 4096, 64, 16, 160, staggered=True, chunk_tokens=8192)
    assert st["itl_p90_s"]["typical"] == pytest.approx(
        w.forward(Pass(1, 1, 0, 8192, 2048), 1, "sglang") + w.forward(Pass(16, 1, 4096 + 32, 0, 2048), 1, "sglang"))
    v = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="vllm-v0"))
    static, mixed = serve(v, 4096, 64, 16, 16, chunk_tokens=8192, static_batch=True), serve(v, 4096, 64, 16, 16,
                                                                                            chunk_tokens=8192)
    assert static["ttft_s"]["typical"] == pytest.approx(4 * v.forward(Pass(1, 1, 0, 8192, 2048), 1, "vllm-v0"))
    assert static["ttft_s"]["typical"] < mixed["ttft_s"]["typical"]  # no decodes beside its ramp's prompts


def _refused_engine_entry(tmp_path, engine: str, key: str, value: str) -> None:
    """The shipped engines.yaml with engines.<engine>.<key> set to {value, source}: loading the profile is one error
    naming the field and the value."""
    bad = yaml.safe_load((ROOT / "roofline" / "data" / "engines.yaml").read_text())
    bad["engines"][engine][key] = {"value": value, "source": "x"}
    path = tmp_path / "bad_engines.yaml"
    path.write_text(yaml.safe_dump(bad))
    engines.load_engines.cache_clear()
    try:
        with pytest.raises(ConfigError, match=rf"engines.{engine}.{key}: '{value}': allowed"):
            engines.profile(engine, 1, str(path))
    finally:
        engines.load_engines.cache_clear()


def test_cuda_graph_sizes_read_as_sizes_and_ranges_and_a_batch_pads_to_the_next_one():
    """engines.yaml graph_padding sizes: single sizes and inclusive [first, last, step] ranges; a batch pads to the
    smallest size at least its own, and stays itself above the largest (no graph) or without sizes."""
    assert engines.graph_sizes([1, 2, 4, [8, 32, 8]], "x") == (1, 2, 4, 8, 16, 24, 32)
    assert engines.graph_sizes(None, "x") == () and engines.graph_sizes([], "x") == ()
    for bad in ([0], [[8, 4, 1]], [[1, 2]], "1, 2", [True]):
        with pytest.raises(ConfigError, match=r"^where: "):
            engines.graph_sizes(bad, "where")
    sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024)
    assert [engines.padded_batch(b, sizes) for b in (1, 3, 130, 300, 850, 1024, 1500)] == [1, 4, 256, 384, 1024, 1024,
                                                                                         1500]
    assert engines.padded_batch(7, ()) == 7
    assert engines.profile("vllm", 1).graph_sizes[:5] == (1, 2, 4, 8, 16) and engines.profile("vllm", 1).graph_sizes[-1] == 512
    assert engines.profile("trtllm", 1).graph_sizes == ()  # CudaGraphConfig.enable_padding defaults to false


def test_a_decode_only_step_under_padded_cuda_graphs_runs_its_gemms_at_the_captured_batch():
    """An engine that captures decode batches as CUDA graphs with padding (vLLM: multiples of 8; TensorRT-LLM when a
    run sets enable_padding with its batch_sizes, as its perf-overview pages do) runs a decode-only step of b
    sequences at the next captured size: its GEMMs, the activations between them and the LM head at that batch,
    attention at the b real sequences. A step with a prompt chunk is not padded, nor a batch whose padded size
    exceeds the engine's cap on running sequences (TensorRT-LLM: 'It would create too many concurrent requests')."""
    cfg, dev = get_preset("llama-3.1-70b"), get_datasheet("h200_sxm")
    sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)
    pad = WhatIf(cfg, dev, "bfloat16+weights=fp8+kv=fp8", Layout(), Setting(engine="trtllm", bands=(),
                                                                              graph_batch_sizes=sizes))
    raw = WhatIf(cfg, dev, "bfloat16+weights=fp8+kv=fp8", Layout(), Setting(engine="trtllm", bands=()))
    t = {name: w.pass_detail(Pass(b, 1, 1152), 1, "trtllm")["terms"] for name, w, b in
         (("padded", pad, 172), ("raw", raw, 172), ("raw256", raw, 256))}
    for term in ("dense", "elementwise", "lm_head"):
        assert t["padded"][term] == pytest.approx(t["raw256"][term]) and t["padded"][term] > t["raw"][term]
    assert t["padded"]["attention"] == pytest.approx(t["raw"]["attention"])
    assert t["padded"]["dense"] > 1.15 * t["raw"]["dense"]  # compute-bound (172 rows already run as 3 tiles of 64)
    chunk = Pass(172, 1, 1152, 512, 256)  # a step with a prompt chunk runs unpadded
    assert pad.pass_detail(chunk, 1, "trtllm")["seconds"] == pytest.approx(raw.pass_detail(chunk, 1, "trtllm")["seconds"])
    over = Pass(1500, 1, 256)  # 1500 pads to 2048, within TensorRT-LLM's 2048; 2100 would pad to 4096 > 2048
    assert pad.pass_detail(over, 1, "trtllm")["terms"]["dense"] == pytest.approx(
        raw.pass_detail(Pass(2048, 1, 256), 1, "trtllm")["terms"]["dense"])
    beyond = Pass(2100, 1, 256)
    assert pad.pass_detail(beyond, 1, "trtllm")["seconds"] == pytest.approx(raw.pass_detail(beyond, 1, "trtllm")["seconds"])
    eager = WhatIf(cfg, dev, "bfloat16+weights=fp8+kv=fp8", Layout(), Setting(engine="trtllm", bands=(), graphs=False,
                                                                                graph_batch_sizes=sizes))
    assert eager.pass_detail(Pass(172, 1, 1152), 1, "trtllm")["terms"]["dense"] == pytest.approx(t["raw"]["dense"])
    vllm = WhatIf(cfg, dev, "bfloat16+weights=fp8+kv=fp8", Layout(), Setting(engine="vllm", bands=()))
    assert vllm.pass_detail(Pass(300, 1, 1152), 1, "vllm")["terms"]["dense"] == pytest.approx(
        vllm.pass_detail(Pass(304, 1, 1152), 1, "vllm")["terms"]["dense"])  # vLLM: the multiples of 8


def test_an_sglang_prompt_step_of_an_mla_model_takes_the_longer_of_its_gpu_and_its_eager_host_time(tmp_path):
    """SGLang runs a step carrying a prompt chunk without CUDA graphs: its DeepSeek-V3 forward of one new token took
    82.6 ms eager and 23.1 ms as a graph (sglang PR #12160; 'prefill latency is similar when new_tokens < 100'), host
    time of 1355 us a layer. Such a step costs the longer of its GPU time and 61 x that (the `prefill_host` term);
    a decode step (under its graph), a prompt step whose GPU time is longer, another engine and a layer kind without
    a measurement (GQA) pay nothing more. Before, a 1024-token prompt of DeepSeek-R1 FP4 on 8x B300 was priced at
    22 ms against a measured TTFT of 76 ms (InferenceX, calibration, no prior cites it)."""
    ds, dev = get_preset("deepseek-v3"), get_datasheet("h200_sxm")
    assert dict(engines.profile("sglang", 1).prefill_host_s_per_layer) == {"mla": pytest.approx(1355e-6)}
    assert engines.profile("vllm", 1).prefill_host_s_per_layer == ()
    w = WhatIf(ds, dev, "bfloat16+weights=fp8_b128", Layout(tp=8), Setting(bands=()))
    small = w.pass_detail(Pass(0, 1, 0, 16, 8), 1, "sglang")
    assert small["seconds"] == pytest.approx(61 * 1355e-6) and small["terms"]["prefill_host"] > 0
    big = w.pass_detail(Pass(0, 1, 0, 16384, 8192), 1, "sglang")
    assert big["terms"]["prefill_host"] == 0.0 and big["seconds"] > 61 * 1355e-6
    decode = w.pass_detail(Pass(4, 1, 1024), 1, "sglang")
    assert "prefill_host" not in decode["terms"] and decode["seconds"] < 61 * 1355e-6
    assert "prefill_host" not in w.pass_detail(Pass(0, 1, 0, 16, 8), 1, "vllm")["terms"]
    llama = WhatIf(get_preset("llama-3.1-8b"), dev, "bfloat16", Layout(), Setting(bands=()))
    assert "prefill_host" not in llama.pass_detail(Pass(0, 1, 0, 16, 8), 1, "sglang")["terms"]
    bad = yaml.safe_load((ROOT / "roofline" / "data" / "engines.yaml").read_text())
    bad["engines"]["sglang"]["eager_prefill_host_us_per_layer"] = {"gqa": {"values": [1, 2, 3], "source": "x"}}
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"engines.sglang.eager_prefill_host_us_per_layer: \['gqa'\]: allowed kinds"):
        engines.profile("sglang", 1, str(tmp_path / "e.yaml"))


def test_vllm_pads_a_decode_steps_tokens_and_the_others_its_requests(tmp_path):
    """vLLM V1 pads a step's tokens (num_scheduled_tokens, drafts included) to its capture sizes and computes the
    logits on the real rows; TensorRT-LLM and SGLang pad the step's requests, each with its q tokens
    (engines.yaml graph_padding.unit). Nine sequences with three drafts each (q = 4): vLLM runs 36 tokens as 40,
    SGLang 9 requests as 12, i.e. 48 tokens. Before, every engine padded requests."""
    cfg, dev = get_preset("llama-3.1-70b"), get_datasheet("h200_sxm")
    assert engines.profile("vllm", 1).graph_pad_unit == "tokens"
    assert {engines.profile(e, 1).graph_pad_unit for e in ("sglang", "trtllm", "vllm-v0")} == {"sequences"}
    w = WhatIf(cfg, dev, "bfloat16", Layout(tp=8), Setting(bands=()))
    dense = {(e, B, q): w.pass_detail(Pass(B, q, 1024), 1, e)["terms"]["dense"]
             for e, B, q in (("vllm", 9, 4), ("vllm", 10, 4), ("sglang", 9, 4), ("sglang", 12, 4))}
    assert dense[("vllm", 9, 4)] == pytest.approx(dense[("vllm", 10, 4)])  # 36 tokens -> 40 = 10 x 4
    assert dense[("sglang", 9, 4)] == pytest.approx(dense[("sglang", 12, 4)])  # 9 requests -> 12
    head = {e: w.pass_detail(Pass(9, 4, 1024), 1, e)["terms"]["lm_head"] for e in ("vllm", "sglang")}
    raw = WhatIf(cfg, dev, "bfloat16", Layout(tp=8), Setting(bands=(), graph_batch_sizes=()))
    assert head["vllm"] == pytest.approx(raw.pass_detail(Pass(9, 4, 1024), 1, "vllm")["terms"]["lm_head"])
    assert head["sglang"] > head["vllm"]  # 48 rows of logits against 36
    bad = yaml.safe_load((ROOT / "roofline" / "data" / "engines.yaml").read_text())
    bad["engines"]["vllm"]["graph_padding"]["unit"] = "batches"
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"engines.vllm.graph_padding.unit: 'batches': allowed"):
        engines.profile("vllm", 1, str(tmp_path / "e.yaml"))


def test_an_anchors_graph_batch_sizes_are_the_runs_own(tmp_path):
    """An anchor whose source prints its engine's CUDA-graph sizes (workload.graph_batch_sizes) is priced with them in
    place of the engine's default: TensorRT-LLM's perf-overview runs pad to [1, 2, 4, ..., 384, 512, 1024, ...]."""
    models, _, rows = anchors.load()
    a = next(r for r in rows if r["id"] == "trt10-h200-llama33-70b-fp8-tp1-128-2048")
    assert 384 in a["workload"]["graph_batch_sizes"]
    bare = dict(a, workload={k: v for k, v in a["workload"].items() if k != "graph_batch_sizes"})
    padded, plain = (anchors.what_if(x, models[a["model"]], Setting(engine="trtllm", bands=()), models)
                     for x in (a, bare))
    assert padded["typical"] < plain["typical"]  # 172 running (its KV pool) pad to 256: fewer tokens a second


def test_an_unknown_step_batching_is_one_error_naming_the_field(tmp_path):
    _refused_engine_entry(tmp_path, "sglang", "step_batching", "mixed")


def test_the_engines_kv_pool_caps_the_running_sequences_and_a_capped_run_goes_in_waves(tmp_path):
    from roofline.parallel.cost import memory_per_rank
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("a100_40gb_sxm")
    mem = dev.usable_mem_bytes()
    w_s = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="sglang"))
    weights, kv1 = memory_per_rank(cfg, Layout(), "bfloat16", 1, 6000)
    frac = engines.profile("sglang", 1).kv_pool_fraction  # of the total: weights + KV
    assert w_s.max_running("sglang", 6000) == int((frac * mem - weights) // kv1) < 50
    w_t = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="trtllm"))
    f_t = engines.profile("trtllm", 1).kv_pool_fraction  # of what the weights leave free
    assert w_t.max_running("trtllm", 6000) == int(f_t * (mem - weights) // kv1)
    w_l = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="llama.cpp"))
    # no pool stated: the memory itself (HEADROOM of it) bounds the sequences at their mean size; it once had no cap,
    # and the card priced 100000 sequences of 2000 tokens running at once on one H100 (26 TB of KV)
    # (llama.cpp keeps the embedding table in host memory: engines.yaml input_embedding)
    w_lcpp, kv_mean = memory_per_rank(cfg, Layout(), "bfloat16", 1, 5500, embedding_held=False)
    assert w_lcpp == weights - cfg.vocab * cfg.d * 2
    assert w_l.max_running("llama.cpp", 6000, 5500) == int((HEADROOM * mem - w_lcpp) // kv_mean) < 50
    assert w_l.max_running("llama.cpp", 6000) == int((HEADROOM * mem - w_lcpp) // kv1)
    # llama-server's own cap (its 4 slots, engines.yaml max_running_seqs) binds before its memory does
    assert serve(w_l, 5000, 1000, 1000, 1000)["running"]["typical"] == min(
        whatif.sequence_cap(w_l, "llama.cpp"), w_l.max_running("llama.cpp", 6000, 5500)) == 4
    cap = w_s.max_running("sglang", 6000)
    capped, fits = serve(w_s, 5000, 1000, 4 * cap, 4 * cap), serve(w_s, 5000, 1000, cap, cap)
    assert capped["running"]["typical"] == cap and fits["running"]["typical"] == cap
    # 4 x cap requests in four waves of `cap`: a wave's throughput, and the median request waits a whole wave
    assert capped["output_tok_s"]["typical"] == pytest.approx(fits["output_tok_s"]["typical"])
    assert capped["ttft_s"]["typical"] > fits["e2e_s"]["typical"]
    static = serve(w_s, 5000, 1000, 4 * cap, 4 * cap, static_batch=True)  # the benchmark allocated the batch itself
    assert static["running"]["typical"] == 4 * cap and static["ttft_s"]["typical"] < capped["ttft_s"]["typical"]
    with pytest.raises(ConfigError, match="kv_pool"):
        bad = yaml.safe_load((ROOT / "roofline" / "data" / "engines.yaml").read_text())
        bad["engines"]["sglang"]["kv_pool"] = {"fraction": 1.5, "of": "total"}
        engines.load_engines.cache_clear()
        try:
            path = tmp_path / "bad_engines.yaml"
            path.write_text(yaml.safe_dump(bad))
            engines.profile("sglang", 1, str(path))
        finally:
            engines.load_engines.cache_clear()


def test_the_cards_finite_run_refuses_a_request_longer_than_the_models_context():
    """input_len + output_len beyond max_context was priced (a 200k-token prompt on a 128k model), while
    context= and capacity's context + output were refused."""
    from roofline.commands.card import CardRequest
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    with pytest.raises(ConfigError, match="a request of 200010 tokens exceeds the model's max_context 131072"):
        CardRequest(model=cfg, device=dev, input_len=200000, output_len=10, concurrency=1)
    CardRequest(model=cfg, device=dev, input_len=131000, output_len=72, concurrency=1)  # exactly the window: priced


def test_the_card_prices_a_finite_run_as_the_what_if_serves_it():
    from roofline.commands.card import CardRequest, card_record, render_card
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("a100_40gb_sxm")
    req = CardRequest(model=cfg, device=dev, engine="sglang", input_len=5000, output_len=1000, concurrency=50,
                      num_prompts=50)
    rec = card_record(req)
    s = serve(WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="sglang")), 5000, 1000, 50, 50)
    assert rec["run_output_tok_s"] == pytest.approx(s["output_tok_s"]["typical"])
    assert rec["run_ttft_ms"] == pytest.approx(1e3 * s["ttft_s"]["typical"])
    assert rec["run_running_seqs"] < 50 and "running (the engine's KV pool and sequence cap)" in render_card(rec)
    assert rec["run_output_tok_s_optimistic"] >= rec["run_output_tok_s"] >= rec["run_output_tok_s_pessimistic"]
    with pytest.raises(ConfigError, match="output_len"):
        CardRequest(model=cfg, device=dev, input_len=5000)
    assert "run_ttft_ms" not in card_record(CardRequest(model=cfg, device=dev, engine="sglang"))
    big = card_record(CardRequest(model=get_preset("llama-3.1-70b"), device=dev, engine="vllm", input_len=128,
                                  output_len=128, concurrency=8))  # 141 GB of bf16 weights on one 40 GB GPU
    assert big["run_running_seqs"] == 1 and "does not fit" in big["run_note"]


def test_the_cards_finite_run_prices_speculative_decoding_as_the_what_if_serves_it():
    """k=, acceptance= (one rate or one per position), drafter= and draft_model= reach whatif.serve's spec: the card's
    run is serve's with that SpecDecode, beside the same run without it and the ratio of their output rates."""
    from roofline.commands.card import CardRequest, card_record, render_card
    dev = get_datasheet("h200_sxm")
    cfg = get_preset("deepseek-v3")
    req = CardRequest(model=cfg, device=dev, engine="sglang", tp=8, input_len=1000, output_len=1000, concurrency=8,
                      k=3, acceptance=(0.8, 0.6, 0.45))
    rec = card_record(req)
    w = WhatIf(cfg, dev, "bfloat16", Layout(tp=8), Setting(engine="sglang"))
    spec = serve(w, 1000, 1000, 8, 8, spec=SpecDecode(3, (0.8, 0.6, 0.45), "mtp"))
    plain = serve(w, 1000, 1000, 8, 8)
    assert rec["run_output_tok_s"] == pytest.approx(spec["output_tok_s"]["typical"])
    assert rec["run_tpot_ms"] == pytest.approx(1e3 * spec["itl_mean_s"]["typical"])
    assert rec["run_itl_median_ms"] == pytest.approx(1e3 * spec["itl_s"]["typical"])  # the gap between rounds
    assert rec["run_plain_output_tok_s"] == pytest.approx(plain["output_tok_s"]["typical"])
    assert rec["run_spec_speedup"] == pytest.approx(spec["output_tok_s"]["typical"] / plain["output_tok_s"]["typical"])
    assert rec["run_spec_tokens_per_round"] == pytest.approx(1 + 0.8 + 0.8 * 0.6 + 0.8 * 0.6 * 0.45)
    assert rec["run_spec_speedup"] > 1.2 and "without speculation" in render_card(rec)
    # one rate: the same at every position; n-gram and a draft model on a model without MTP modules
    small = get_preset("llama-3.1-8b")
    ng = card_record(CardRequest(model=small, device=dev, engine="vllm", input_len=1000, output_len=500,
                                 concurrency=16, k=3, acceptance=0.5, drafter="ngram"))
    s_ng = serve(WhatIf(small, dev, "bfloat16", Layout(), Setting(engine="vllm")), 1000, 500, 16, 16,
                 spec=SpecDecode(3, (0.5,), "ngram"))
    assert ng["run_output_tok_s"] == pytest.approx(s_ng["output_tok_s"]["typical"])
    big = get_preset("llama-3.1-70b")
    dm = card_record(CardRequest(model=big, device=dev, engine="vllm", tp=4, input_len=1000, output_len=500,
                                 concurrency=16, k=4, acceptance=0.7, drafter="draft_model", draft_model=small))
    w70 = WhatIf(big, dev, "bfloat16", Layout(tp=4), Setting(engine="vllm"))
    draft = WhatIf(small, dev, "bfloat16", Layout(), Setting(engine="vllm"))
    s_dm = serve(w70, 1000, 500, 16, 16, spec=SpecDecode(4, (0.7,), "draft_model", draft))
    assert dm["run_output_tok_s"] == pytest.approx(s_dm["output_tok_s"]["typical"])
    assert dm["run_spec_draft_model"] == "llama-3.1-8b"
    assert "run_spec_k" not in card_record(CardRequest(model=small, device=dev, engine="vllm", input_len=100,
                                                       output_len=10))  # k = 0: plain decoding only


def test_the_card_prices_a_random_datasets_range_of_lengths_as_an_anchor_does():
    """range_ratio= (vllm bench serve --random-range-ratio) reaches the card's finite run by the anchors' one rule
    (whatif.random_dataset_lengths): the mean lengths, staggered; 1 keeps the stated lengths fixed."""
    from roofline.commands.card import CardRequest, card_record
    from roofline.parallel.anchors import random_lengths
    from roofline.parallel.whatif import random_dataset_lengths
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    rec = card_record(CardRequest(model=cfg, device=dev, engine="vllm", input_len=1024, output_len=1024,
                                  concurrency=64, num_prompts=640, range_ratio=0.8))
    assert random_dataset_lengths(1024, 1024, 0.8) == random_lengths(
        dict(input_len=1024, output_len=1024, range_ratio=0.8)) == (922, 922, True)
    s = serve(WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="vllm")), 922, 922, 64, 640, staggered=True)
    assert rec["run_output_tok_s"] == pytest.approx(s["output_tok_s"]["typical"]) and rec["run_staggered"]
    assert random_dataset_lengths(1024, 512) == (1024, 512, False)
    for bad in (0, 1.5, True, "x"):
        with pytest.raises(ConfigError, match=re.escape(f"range_ratio={bad!r}: allowed a number in (0, 1]")):
            CardRequest(model=cfg, device=dev, input_len=10, output_len=10, range_ratio=bad)


def test_a_speculative_runs_kv_pool_holds_its_drafter_as_the_memory_check_does():
    """The MTP module's weights and KV, or a draft model's (replicated on every rank), come out of the engine's KV
    pool in a finite run, as memory_check counts them: fewer sequences run; a drafter that leaves no room is said."""
    from roofline.commands.card import CardRequest, card_record
    dev = get_datasheet("h200_sxm")
    w = WhatIf(get_preset("deepseek-v3"), dev, "bfloat16+weights=fp8_e4m3_b128", Layout(tp=8), Setting(engine="vllm"))
    mtp = SpecDecode(2, (0.8,), "mtp")
    assert w.max_running("vllm", 9000, 5000, mtp) < w.max_running("vllm", 9000, 5000)
    plain_run, spec_run = (serve(w, 8000, 1000, 4096, spec=s)["running"]["typical"] for s in (None, mtp))
    assert spec_run < plain_run
    big, small, h100 = get_preset("llama-3.1-70b"), get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    w70 = WhatIf(big, h100, "bfloat16+weights=fp8_e4m3", Layout(), Setting(engine="vllm"))
    draft = WhatIf(small, h100, "bfloat16+weights=fp8_e4m3", Layout(), Setting(engine="vllm"))
    assert w70.max_running("vllm", 2000, 1500) > 0  # 70 GB of fp8 weights leave the pool a few GB
    assert w70.max_running("vllm", 2000, 1500, SpecDecode(3, (0.7,), "draft_model", draft)) == 0  # 8 GB more do not
    rec = card_record(CardRequest(model=big, dtype="bfloat16+weights=fp8_e4m3", device=h100, engine="vllm",
                                  input_len=1000, output_len=1000, concurrency=4, k=3, acceptance=0.7,
                                  drafter="draft_model", draft_model=small))
    assert "no room beside the drafter" in rec["run_note"]


@pytest.mark.parametrize("keys, field", [
    (dict(k=3, acceptance=0.5), "k=3: speculative decoding is priced in a finite run"),
    (dict(input_len=10, output_len=10, k=3, drafter="ngram"), "k=3: acceptance= is needed"),
    (dict(acceptance=0.5), "acceptance=0.5 is given with k=0"),
    (dict(input_len=10, output_len=10, k=3, acceptance=0.5), "drafter=mtp: model 'llama-3.1-8b' has no MTP"),
    (dict(input_len=10, output_len=10, k=3, acceptance=(0.5, 0.2), drafter="ngram"), "acceptance=(0.5, 0.2)"),
    (dict(input_len=10, output_len=10, k=3, acceptance=1.5, drafter="ngram"), "acceptance=1.5"),
    (dict(input_len=10, output_len=10, k=3, acceptance=0.5, drafter="medusa"), "drafter='medusa'"),
    (dict(input_len=10, output_len=10, k=3, acceptance=0.5, drafter="eagle3", draft_vocab=0), "draft_vocab=0"),
    (dict(input_len=10, output_len=10, k=3, acceptance=0.5, drafter="eagle", draft_vocab=64000),
     "draft_vocab=64000 is given with drafter='eagle'"),
    (dict(input_len=10, output_len=10, k=3, acceptance=0.5, drafter="draft_model"), "needs draft_model="),
    (dict(input_len=10, output_len=10, draft_topk=4), "draft_topk=4, draft_tokens=None are given with k=0"),
    (dict(input_len=10, output_len=10, k=-1), "k=-1"),
])
def test_the_cards_speculative_keys_name_what_is_wrong(keys, field):
    from roofline.commands.card import CardRequest
    with pytest.raises(ConfigError, match=re.escape(field)):
        CardRequest(model=get_preset("llama-3.1-8b"), device=get_datasheet("h100_sxm"), engine="vllm", **keys)


def test_the_card_says_where_the_typical_steps_time_goes_term_by_term():
    """With an engine named the card breaks the typical decode step into pass_seconds' terms, which sum to its
    what-if ITL: routed experts for an MoE model, none for a dense one, collectives only across devices; with no
    engine (the span of the profiles) there is no one breakdown."""
    from roofline.commands.card import CardRequest, card_record, render_card
    dev = get_datasheet("h100_sxm")
    moe = card_record(CardRequest(model=get_preset("qwen3-30b-a3b"), device=dev, engine="vllm", batch=64, context=2048))
    terms = moe["whatif_terms_ms"]
    assert sum(terms.values()) == pytest.approx(moe["whatif_itl_ms"], rel=1e-9)
    assert terms["experts"] > terms["dense"] > 0 and terms["attention"] > 0 and terms["comm"] == 0
    line = next(x for x in render_card(moe).splitlines() if x.strip().startswith("by term"))
    assert line.index("routed experts") < line.index("attention") and "collectives" not in line
    dense = card_record(CardRequest(model=get_preset("llama-3.1-70b"), device=dev, engine="trtllm", tp=4, batch=8,
                                    context=4096))["whatif_terms_ms"]
    assert dense["experts"] == 0 and dense["comm"] > 0 and dense["dense"] > dense["attention"]
    span = card_record(CardRequest(model=get_preset("llama-3.1-8b"), device=dev, batch=8, context=4096))
    assert "whatif_terms_ms" not in span and "by term" not in render_card(span)
    from roofline.commands.card import TERM_NAMES  # every term has a name on the card (hf-eager's copies included)
    eager = card_record(CardRequest(model=get_preset("llama-3.1-8b"), device=dev, engine="hf-eager", batch=8,
                                    context=4096))
    assert set(eager["whatif_terms_ms"]) <= set(TERM_NAMES) and eager["whatif_terms_ms"]["kv_copy"] > 0
    assert "KV cache copies" in next(x for x in render_card(eager).splitlines() if x.strip().startswith("by term"))


def test_the_cards_launch_term_says_what_it_holds_for_the_engine_named():
    """The launch term is the GPU's gaps under CUDA graphs (and an MoE layer's routing kernels), the host issue the
    GPU does not hide for an engine that issues its kernels eagerly (hf-eager), and an eager engine's own per-layer
    floor (lmdeploy): the card names which, never an eager label for a graph engine."""
    from roofline.commands.card import LAUNCH_NAMES, CardRequest, card_record, launch_kind, render_card
    from roofline.parallel.engines import profile
    dev = get_datasheet("h100_sxm")
    by_term = lambda rec: next(x for x in render_card(rec).splitlines() if x.strip().startswith("by term"))  # noqa
    seen = {}
    for model, engine in (("llama-3.1-8b", "vllm"), ("qwen3-30b-a3b", "sglang"), ("llama-3.1-8b", "hf-eager"),
                          ("llama-3.1-8b", "lmdeploy")):
        rec = card_record(CardRequest(model=get_preset(model), device=dev, engine=engine, batch=4, context=1024))
        seen[engine] = rec["whatif_launch"]
        assert LAUNCH_NAMES[rec["whatif_launch"]] in by_term(rec)
    assert seen == dict(vllm="graph", sglang="graph_moe", **{"hf-eager": "host_issue", "lmdeploy": "engine_floor"})
    assert launch_kind(profile("vllm", 1), Setting(graphs=False)) == "host_issue"  # graphs forced off
    assert "eager" not in LAUNCH_NAMES["graph"] + LAUNCH_NAMES["graph_moe"]


def test_a_finite_run_prefills_in_the_engines_own_default_chunks_and_caps_its_running_sequences():
    """engines.yaml prefill_chunk_tokens / max_running_seqs: vLLM V1 schedules 8192 tokens per step behind its HTTP
    server and 16384 offline on a >= 70 GiB part that is not an A100 (2048 / 8192 otherwise) and runs at most 1024
    (256) sequences; SGLang's chunk follows the GPU's memory (2048 / 8192 / 16384 below 35 / 160 GiB / above);
    TensorRT-LLM's BuildConfig takes 8192 tokens per step. An engine with no default keeps priors.yaml's 2048.
    One long prompt in fewer, larger chunks reaches its first token sooner; a cap below the concurrency runs the
    requests in waves; a client name that is neither is one error."""
    cfg = get_preset("llama-3.1-8b")

    def run(dev, engine, client="server", C=64, I=4096, O=256):
        w = WhatIf(cfg, get_datasheet(dev), "bfloat16", Layout(), Setting(engine=engine))
        return serve(w, I, O, C, C, client=client)
    chunk = lambda r: r["prefill_chunk_tokens"]["typical"]  # noqa: E731
    assert chunk(run("h100_sxm", "vllm")) == 8192 and chunk(run("h100_sxm", "vllm", "offline")) == 16384
    assert chunk(run("a100_80gb_sxm", "vllm")) == 2048 and chunk(run("a100_80gb_sxm", "vllm", "offline")) == 8192
    assert [chunk(run(d, "sglang")) for d in ("rtx4090", "h100_sxm", "mi300x")] == [2048, 8192, 16384]
    assert chunk(run("h100_sxm", "vllm-v0")) == 2048 and chunk(run("h100_sxm", "trtllm")) == 8192
    one = dict(C=1, I=16384, O=16)  # one long prompt: two server chunks, one offline
    ttft = lambda client: run("h100_sxm", "vllm", client, **one)["ttft_s"]["typical"]  # noqa: E731
    assert ttft("offline") < ttft("server")
    small = run("l40s", "vllm", C=400, I=64, O=64)  # 256 sequences at most on a 48 GB part
    assert small["running"]["typical"] == 256
    assert run("h100_sxm", "vllm", C=400, I=64, O=64)["running"]["typical"] == 400
    with pytest.raises(ConfigError, match="client"):
        run("h100_sxm", "vllm", "batch")


def test_sglang_runs_at_most_48_sequences_with_speculative_decoding_unless_its_release_sets_no_cap(tmp_path):
    """engines.yaml spec_max_running_seqs: SGLang resets max_running_requests to 48 for EAGLE, EAGLE3, STANDALONE and
    NGRAM where the user sets none, so a speculative run of 128 requests runs 48 at a time; the same run without
    speculation, or under vLLM (no such cap), runs all 128; the 0.4 releases' profile states none (`tiers: null`
    with its source); `tiers: null` without a source is a one-line error naming the field."""
    cfg = get_preset("llama-3.1-8b")
    spec = SpecDecode(3, (0.6,), "eagle3")

    def running(engine, s=spec):
        w = WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine=engine))
        return serve(w, 512, 128, 128, 128, spec=s)["running"]["typical"]
    assert running("sglang") == 48 and running("sglang", SpecDecode(3, (0.6,), "ngram")) == 48
    assert running("sglang", None) == 128 and running("vllm") == 128 and running("sglang-0.4") == 128
    assert engines.profile("sglang-0.4", 1).spec_max_running_tiers == ()
    from roofline.commands.card import CardRequest, card_record, render_card
    kw = dict(model=cfg, device=get_datasheet("h100_sxm"), input_len=512, output_len=128, concurrency=128, k=3,
              acceptance=0.6, drafter="eagle3")
    rec = card_record(CardRequest(engine="sglang", **kw))
    assert rec["run_running_seqs"] == 48 and rec["run_plain_running_seqs"] == 128
    assert "with speculation 48 run at a time, without it 128" in render_card(rec)
    assert "run at a time" not in render_card(card_record(CardRequest(engine="vllm", **kw)))
    own = card_record(CardRequest(engine="sglang", max_running_seqs=100, **kw))  # --max-running-requests 100
    assert own["run_running_seqs"] == own["run_plain_running_seqs"] == 100
    assert "100 running (the run's cap of 100 and the engine's KV pool)" in render_card(own)
    doc = yaml.safe_load(engines.ENGINES_PATH.read_text())
    doc["engines"]["sglang"]["spec_max_running_seqs"] = {"tiers": None}
    path = tmp_path / "engines.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"^engines\.sglang\.spec_max_running_seqs: needs tiers"):
        engines.profile("sglang", 1, str(path))


def test_a_runs_own_cap_on_running_sequences_replaces_the_engines_defaults_and_is_read_per_rank_where_it_schedules():
    """serve(max_running=): a run's own --max-num-seqs / --max-running-requests / max_batch_size replaces the engine's
    default caps (max_running_seqs, and spec_max_running_seqs when it speculates), the KV pool still binding; under
    attention DP an engine whose ranks schedule their own batch (vLLM: per_rank) runs it on every rank, one that divides
    it (SGLang: whole) once. The same key in an anchor's workload, a calibration point or the card; a bad value is one
    line naming it."""
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    spec = SpecDecode(3, (0.6,), "eagle3")

    def running(engine, layout=Layout(), model=cfg, **kw):
        w = WhatIf(model, dev, "bfloat16", layout, Setting(engine=engine))
        return serve(w, 512, 128, 256, 256, **kw)["running"]["typical"]
    assert running("vllm", max_running=32) == 32 and running("sglang", spec=spec, max_running=100) == 100
    assert running("sglang", spec=spec) == 48 and running("vllm") == 256
    dp, moe = Layout(tp=2, ep=2, dp_attention=True), get_preset("qwen3-30b-a3b")
    assert running("vllm", dp, moe, max_running=32) == 64 and running("sglang", dp, moe, max_running=32) == 32
    huge = WhatIf(get_preset("llama-3.1-70b"), dev, "bfloat16", Layout(tp=2), Setting(engine="vllm"))
    pool = huge.max_running("vllm", 8192 + 8192)
    assert serve(huge, 8192, 8192, 1024, 1024, max_running=4096)["running"]["typical"] == pool < 1024
    assert engines.run_scheduling({"max_running_seqs": 64}, "") == {"max_running": 64}
    with pytest.raises(ConfigError, match=r"^workload\.max_running_seqs=-3: must be an integer >= 1"):
        engines.run_scheduling({"max_running_seqs": -3}, "workload.")


def test_a_fixed_length_runs_last_partial_wave_runs_at_its_own_batch():
    """A fixed-length run of N = C + r requests, r < C, goes in a wave of C and a last wave of the r left, priced at
    r sequences (its own ramp and steps): the run lasts the two waves as if run apart. It was priced as two full
    waves of C, so a few requests past a multiple of the cap halved the throughput (TensorRT-LLM's gpt-oss-120b at
    1024 in / 1024 out on four H100s: 2960 of 3000 requests running, the 40 left priced as a second wave of 2960)."""
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    w = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="vllm"))
    I, O, C, r = 1024, 256, 64, 8
    both, full, last = serve(w, I, O, C, C + r), serve(w, I, O, C, C), serve(w, I, O, r, r)
    seconds = lambda s, n: n * O / s["output_tok_s"]["typical"]  # noqa: E731  (the run's duration)
    assert seconds(both, C + r) == pytest.approx(seconds(full, C) + seconds(last, r))
    assert seconds(last, r) < 0.5 * seconds(full, C) and seconds(both, C + r) < 2 * seconds(full, C)
    whole = serve(w, I, O, C, 2 * C)  # two full waves: no partial one
    assert seconds(whole, 2 * C) == pytest.approx(2 * seconds(full, C))


def test_attention_dp_ranks_each_run_the_engines_caps_where_the_engine_schedules_per_rank(tmp_path):
    """engines.yaml dp_attention_limits: under attention DP TensorRT-LLM's max_batch_size / max_num_tokens and vLLM's
    max_num_seqs / max_num_batched_tokens bound each rank (every rank schedules its own batch: the deployment runs
    tp times them), SGLang divides its chunked_prefill_size and max_running_requests among the ranks (once for the
    deployment). Both were read as the deployment's: TensorRT-LLM's DEP4 runs capped at 2048 sequences and 8192 prompt
    tokens a step for all four ranks. An unknown value is one error naming the field."""
    cfg, dev = get_preset("qwen3-30b-a3b"), get_datasheet("h100_sxm")

    def run(engine, dp, C=5000):
        lay = Layout(tp=4, ep=4, dp_attention=dp)
        return serve(WhatIf(cfg, dev, "bfloat16", lay, Setting(engine=engine)), 64, 64, C, C, client="offline")
    val = lambda r, k: r[k]["typical"]  # noqa: E731
    assert val(run("trtllm", False), "running") == 2048 and val(run("trtllm", True), "running") == 5000
    assert val(run("trtllm", False), "prefill_chunk_tokens") == 8192
    assert val(run("trtllm", True), "prefill_chunk_tokens") == 4 * 8192
    assert val(run("vllm", True), "prefill_chunk_tokens") == 4 * val(run("vllm", False), "prefill_chunk_tokens")
    assert val(run("vllm", True, 5000), "running") == 4096 and val(run("vllm", False), "running") == 1024
    assert val(run("sglang", True), "prefill_chunk_tokens") == val(run("sglang", False), "prefill_chunk_tokens")
    _refused_engine_entry(tmp_path, "sglang", "dp_attention_limits", "each")


def test_mxfp4_weights_multiply_at_the_engines_activation_rate_on_fp4_tensor_cores(tmp_path):
    """mxfp4 (gpt-oss's experts) carries no activation format: on Blackwell's fp4 tensor cores TensorRT-LLM
    (W4A8_MXFP4_MXFP8 on SM >= 100) and SGLang (mxfp8_quantize at its default precision) multiply them with mxfp8
    activations at the fp8 rate, vLLM's default FlashInfer path with bf16 ones at the bf16 rate; only nvfp4 (W4A4)
    runs at the fp4 rate. They were all priced at the fp4 rate: TensorRT-LLM's compute-bound gpt-oss steps on a
    B200 twice too fast. Without fp4 tensor cores (Hopper) mxfp4 stays weight-only, at the activations' rate."""
    from roofline.model.formats import parse_precision
    from roofline.parallel.whatif import _ceilings, matmul_dtype
    b200, h100 = get_datasheet("b200"), get_datasheet("h100_sxm")
    mx, nv = parse_precision("bfloat16+experts=mxfp4"), parse_precision("bfloat16+experts=nvfp4")
    act = {e: engines.profile(e, 1).mxfp4_activations for e in ("trtllm", "sglang", "vllm", "gpt-fast")}
    assert act == {"trtllm": "fp8", "sglang": "fp8", "vllm": "bf16", "gpt-fast": "bf16"}  # absent: bf16
    assert matmul_dtype(b200, mx, "experts", "fp8") == "float8_e4m3fn"
    assert matmul_dtype(b200, mx, "experts", "bf16") == "bfloat16"
    assert matmul_dtype(b200, nv, "experts", "bf16") == matmul_dtype(b200, nv, "experts", "fp8") == "float4_e2m1"
    assert matmul_dtype(h100, mx, "experts", "fp8") == matmul_dtype(h100, nv, "experts", "fp8") == "bfloat16"
    assert _ceilings(b200, mx, "experts", "fp8")[1] == b200.peak_flops("float8_e4m3fn") < b200.peak_flops("float4_e2m1")
    assert matmul_dtype(b200, mx, "weights", "fp8") == "bfloat16"  # its bf16 attention and dense layers
    _refused_engine_entry(tmp_path, "trtllm", "mxfp4_activations", "fp4")


def test_a_single_requests_first_token_waits_for_every_chunk_of_its_prompt():
    """The median request's TTFT is the ramp steps that complete ITS prompt (the ceil(C/2)-th): all R chunks for one
    request (it was R/2, half the prompt, which priced one 4096-token prompt in 2048-token chunks as one chunk), about
    R/2 for many. Those ramp steps carry the decodes of the prompts completed before them and not yet done (step j:
    (j - 1) / 2 sequences for 4096-token prompts in 2048-token chunks, less those past their 15 decode steps),
    priced at their mean over the steps: before, every ramp step was priced as one chunk and one decode at
    context 0, whatever ran beside it. (A run batched `beside`, given to the run: each chunk whole beside the
    decodes.)"""
    cfg = get_preset("llama-3.1-8b")
    e = "vllm-v0"
    w = WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine=e))
    first = w.forward(Pass(1, 1, 0, 2048, 4096 / 2), 1, e)
    assert serve(w, 4096, 16, 1, 1, chunk_tokens=2048, step_batching="beside")["ttft_s"]["typical"] == pytest.approx(
        2 * first)
    many = serve(w, 4096, 16, 64, 64, chunk_tokens=2048, step_batching="beside")  # R = 128 ramp steps; the 32nd prompt
    # completes at step 64
    # steps 1..16 carry 0..7.5 decoding sequences, then 7.5 (as many finish as start): 6.56 on average over 1..64,
    # priced as 7 at 4096 cached tokens
    carried = w.forward(Pass(7, 1, 4096, 2048, 4096 / 2), 1, e)
    assert carried > first and many["ttft_s"]["typical"] == pytest.approx(64 * carried)
    # its 15 tokens after the first ride ramp steps 65..79, beside 7.5 decoding sequences (priced as 8)
    late = w.forward(Pass(8, 1, 4096, 2048, 4096 / 2), 1, e)
    assert many["e2e_s"]["typical"] == pytest.approx(64 * carried + 15 * late)
    # a long output keeps them all decoding: steps 1..64 carry 15.75 on average
    longer = serve(w, 4096, 256, 64, 64, chunk_tokens=2048, step_batching="beside")
    assert longer["ttft_s"]["typical"] == pytest.approx(64 * w.forward(Pass(16, 1, 4096, 2048, 4096 / 2), 1, e))


def test_anchors_name_the_offline_client_where_the_benchmark_ran_the_engine_offline():
    """A source whose benchmark drove vLLM through benchmark_throughput.py / benchmark_latency.py says
    `client: offline` (its rows take the offline batch defaults), and so do the TensorRT-LLM tables of
    trtllm-bench (whose engine defaults are one for both clients); the rest run behind the server."""
    _, sources, _ = anchors.load()
    offline = sorted(k for k, v in sources.items() if v.get("client") == "offline")
    assert [k for k in offline if sources[k]["engine"] != "trtllm"] == [
        "rocm_vllm_devdocker_readme_v0_10_0", "vllm_pr17530_mi300x", "vllm_pr23197_rtn"]
    for k in offline:
        text = sources[k].get("note", "") + sources[k].get("title", "") + sources[k].get("engine_version", "")
        assert any(w in text for w in ("benchmark_throughput", "benchmark_latency", "trtllm-bench")), k


def test_an_offline_run_queues_every_request_where_its_concurrency_is_assumed():
    """trtllm-bench throughput (and vLLM's benchmark_throughput.py) feeds every request of its dataset at once:
    its sources say `client: offline`, and a row whose concurrency the source does not state queues all its
    requests (concurrency = num_prompts), the engine's cap and KV pool bounding what runs. TensorRT-LLM 1.0's
    Llama 3.1 / 3.3 rows carried an unsourced 256 beside the same page's Scout rows at num_prompts."""
    _, sources, rows = anchors.load()
    bench = [k for k, v in sources.items() if "trtllm-bench throughput" in v.get("engine_version", "")]
    assert {"trtllm_perf_v10", "trtllm_perf_v10_llama4_scout"} <= set(bench)
    assert [k for k in bench if sources[k].get("client") != "offline"] == []
    queued = [a for a in rows if sources[a["source"]].get("client", a.get("client")) == "offline"
              and "concurrency" in (a["workload"].get("assumed") or [])]
    assert len(queued) >= 50
    assert [a["id"] for a in queued if a["workload"]["concurrency"] != a["workload"].get("num_prompts")] == []


def test_one_memory_rule_the_engines_kv_pool_for_capacity_the_card_and_a_finite_run():
    """memory_check (capacity, `capacity layouts=true`, the card's layout) fits a plan by the rule that caps a
    finite run (`WhatIf.max_running`): the named engine's KV pool; no engine named, every profile's pool."""
    from roofline.commands.card import CardRequest, card_record, render_card
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("a100_40gb_sxm")
    for eng in ("sglang", "trtllm", "vllm"):
        cap = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine=eng)).max_running(eng, 6000)
        at = [memory_check(cfg, dev, "bfloat16", Layout(), b, 6000, setting=Setting(engine=eng))["fits"]
              for b in (cap, cap + 1)]
        assert at == [True, False], eng
    caps = {e: WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine=e)).max_running(e, 6000)
            for e in ("sglang", "trtllm", "vllm")}
    strict = min(caps.values())
    assert len(set(caps.values())) > 1  # the pools differ: which one rules matters
    anyone = [memory_check(cfg, dev, "bfloat16", Layout(), b, 6000, setting=Setting())["fits"]
              for b in (strict, strict + 1)]
    assert anyone == [True, False]  # no engine named: the strictest pool
    # without a setting, the old rule (0.9 of the memory) still answers, on the driver-reported memory
    loose = memory_check(cfg, dev, "bfloat16", Layout(), strict + 1, 6000)
    assert loose["device_mem_GB"] == pytest.approx(dev.usable_mem_bytes() / 1e9)
    # the card: a layout asked for (tp=) that its engine's pool cannot hold is priced and said not to fit
    r1 = card_record(CardRequest(model=get_preset("deepseek-r1"), device=get_datasheet("h200_sxm"), engine="vllm",
                                 tp=8, batch=4, context=2048))  # 1.34 TB of bf16 weights over 8 x 141 GB
    assert "tp8 does not fit" in r1["whatif_note"] and r1["smallest_layout"] == "tp8-pp2"
    assert "vllm's KV pool" in render_card(r1)
    r2 = card_record(CardRequest(model=get_preset("deepseek-r1"), device=get_datasheet("h200_sxm"), engine="vllm",
                                 tp=8, batch=4, context=2048, dtype="bfloat16+weights=fp8_b128"))  # its released fp8
    assert "whatif_note" not in r2 and r2["smallest_layout"].startswith("tp8")
    # its floor line: the step's bytes over one device (59 ms at batch 16, a device it does not fit) and, over the
    # 8 devices of its layout, at least an eighth of that, which no engine's what-if on tp8 beats
    r3 = card_record(CardRequest(model=get_preset("deepseek-r1"), device=get_datasheet("h200_sxm"), engine="sglang",
                                 tp=8, batch=16, context=4000, dtype="bfloat16+weights=fp8_b128"))
    spread = r3["decode_floor_s"] / r3["layout_devices"]
    assert r3["layout_devices"] == 8 and f"over the 8 of tp8 at least {1e3 * spread:.3f} ms/step" in render_card(r3)
    assert spread <= r3["whatif_itl_ms_optimistic"] * 1e-3 < r3["decode_floor_s"]
    assert "at least" not in render_card(card_record(CardRequest(model=get_preset("llama-3.1-8b"),
                                                                 device=get_datasheet("h200_sxm"), batch=16)))


def test_vllm_v0_runs_block_fp8_experts_at_its_triton_kernels_measured_share_on_nvidia_parts_only(monkeypatch):
    """vLLM PR #13932's H100 table (DeepSeek-V3, E = 256, TP 1-8): the Triton fused_moe of early 2025 streamed block-fp8
    experts at 0.22-0.27 of the bandwidth, 0.29 of the grouped curve's typical fraction (engines.yaml vllm-v0
    grouped_weight_only.fp8_block). The ratio is to the NVIDIA-measured curve: an architecture with its own grouped
    curve (CDNA3's ROCm Triton MoE) keeps it, and so does an engine without the entry (vLLM V1, SGLang)."""
    _without_pair_io(monkeypatch)  # the ratio scales the weights' streaming; the pairs' traffic is not the kernel's
    ds = get_preset("deepseek-v3")
    prec = "bfloat16+weights=fp8_b128"

    def experts(device, engine, scenario=1):
        w = WhatIf(ds, get_datasheet(device), prec, Layout(tp=8), Setting(engine=engine, bands=()))
        return w.pass_detail(Pass(128, 1, 1024), scenario, engine)["terms"]["experts"]
    ratio = dict(engines.profile("vllm-v0", 1).grouped_bw_ratio)["fp8_block"]
    assert ratio == pytest.approx(0.29)
    floor = 58 * kernels.load_kernels()["grouped_gemm"]["floor_us"]["values"][1] * 1e-6
    v0, v1 = experts("h100_sxm", "vllm-v0"), experts("h100_sxm", "vllm")
    assert (v0 - floor) == pytest.approx((v1 - floor) / ratio, rel=1e-6)  # its bytes at 0.29 x the curve's bandwidth
    assert experts("h100_sxm", "sglang") == pytest.approx(v1)
    assert experts("mi300x", "vllm-v0") == pytest.approx(experts("mi300x", "vllm"))  # ROCm's own curve, no ratio


def test_sglang_0_4_is_sglang_with_the_triton_block_fp8_experts_of_early_2025(monkeypatch):
    """SGLang 0.4.x before DeepGEMM became its default (PR #5628, 2025-04) ran DeepSeek's block-fp8 experts through
    its Triton fused_moe (vLLM's kernel, the N tile locked to the quant block): the sglang-0.4 profile is `sglang`
    with vllm-v0's measured ratio on those experts, on NVIDIA parts only, its release's CUDA-graph batches (1, 2,
    4 and the multiples of 8 to 160) and no running cap of its own under speculative decoding (the early-2025
    server_args read sets none; later releases, 48), nothing else different. dstack's SGLang 0.4.2 / 0.4.3 rows
    (calibration) are priced with it; no other anchor states a 0.4 release."""
    _without_pair_io(monkeypatch)  # the ratio scales the weights' streaming; the pairs' traffic is not the kernel's
    import dataclasses
    old, new = engines.profile("sglang-0.4", 1), engines.profile("sglang", 1)
    diff = {f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)}
    assert diff == {"name", "grouped_bw_ratio", "graph_sizes", "spec_max_running_tiers"}
    assert old.spec_max_running_tiers == () and new.spec_max_running_tiers == ((0.0, (), 48, 48),)
    assert old.graph_sizes == (1, 2, 4, *range(8, 161, 8))
    assert dict(old.grouped_bw_ratio) == dict(engines.profile("vllm-v0", 1).grouped_bw_ratio) == {"fp8_block": 0.29}
    ds, prec = get_preset("deepseek-r1"), "bfloat16+weights=fp8_b128"

    def experts(device, engine):
        w = WhatIf(ds, get_datasheet(device), prec, Layout(tp=8), Setting(engine=engine, bands=()))
        return w.pass_detail(Pass(16, 1, 4000), 1, engine)["terms"]["experts"]
    floor = 58 * kernels.load_kernels()["grouped_gemm"]["floor_us"]["values"][1] * 1e-6
    assert experts("h200_sxm", "sglang-0.4") - floor == pytest.approx((experts("h200_sxm", "sglang") - floor) / 0.29)
    assert experts("mi300x", "sglang-0.4") == pytest.approx(experts("mi300x", "sglang"))  # CDNA3's own curve
    dense = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(bands=()))
    assert dense.target(1, 8, 1024, 1, "sglang-0.4") == dense.target(1, 8, 1024, 1, "sglang")
    _, sources, rows = anchors.load()
    for a in rows:
        if a["engine"] in ("sglang", "sglang-0.4"):
            stated = str(sources[a["source"]].get("engine_version", "")) + str(sources[a["source"]].get("date_or_version", ""))
            assert (a["engine"] == "sglang-0.4") == bool(re.search(r"(?i)sglang 0\.4\.[0-5]", stated)), a["id"]


def test_trtllm_0_6_reads_a_gqa_layers_kv_once_per_query_head():
    """TensorRT-LLM v0.5 - v0.6.1 decoded with its masked multi-head attention kernel, one thread block per query head
    (gpt-attention.md), so a GQA layer's K and V are read once per query head; XQA (v0.7a on) reads them once. The
    trtllm-0.6 profile is `trtllm` with 0.5 / 0.75 / 1.0 of those repeats from DRAM and nothing else different: an
    MHA or MLA model prices the same, Llama-2-70B's attention at 1 + 7 x 0.75 its reads. The anchors of a source
    stating v0.5 / v0.6.1, or an engine built without XQA, take it, and only those."""
    import dataclasses
    old, new = engines.profile("trtllm-0.6", 1), engines.profile("trtllm", 1)
    diff = {f.name for f in dataclasses.fields(old) if getattr(old, f.name) != getattr(new, f.name)}
    assert diff == {"name", "kv_repeat_share"}
    assert [engines.profile("trtllm-0.6", j).kv_repeat_share for j in range(3)] == [0.5, 0.75, 1.0]
    assert new.kv_repeat_share == 0.0 and engines.profile("vllm", 1).kv_repeat_share == 0.0
    dev, prec = get_datasheet("h100_sxm"), "float16+weights=fp8_e4m3+kv=fp8_e4m3"

    def attention(model, layout, engine, B=64, L=3000):
        w = WhatIf(get_preset(model), dev, prec, layout, Setting(bands=()))
        return w.pass_detail(Pass(B, 1, L), 1, engine)["terms"]["attention"]
    for model, lay in (("llama-2-7b", Layout()), ("deepseek-v3", Layout(tp=8))):  # MHA; MLA's latent is one head
        assert attention(model, lay, "trtllm-0.6") == pytest.approx(attention(model, lay, "trtllm"))
    ratio = attention("llama-2-70b", Layout(tp=2), "trtllm-0.6") / attention("llama-2-70b", Layout(tp=2), "trtllm")
    assert 4.5 < ratio <= 1 + 7 * 0.75 + 1e-9  # the reads x 6.25; the cache writes and the per-call floor once
    bad = {"gqa_decode_kv_reads": {"value": "per_query_head", "dram_share": {"values": [0.5, 0.75, 1.5]}}}
    with pytest.raises(ConfigError, match="gqa_decode_kv_reads.dram_share"):
        engines.kv_repeat_share(bad, 2, "engines.x")
    with pytest.raises(ConfigError, match="gqa_decode_kv_reads"):
        engines.kv_repeat_share({"gqa_decode_kv_reads": {"value": "twice"}}, 1, "engines.x")
    _, sources, rows = anchors.load()
    for a in rows:
        if a["engine"].startswith("trtllm"):
            src = sources[a["source"]]
            pre_xqa = bool(re.search(r"^v0\.[56]\.|without XQA", str(src.get("engine_version", ""))))
            assert (a["engine"] == "trtllm-0.6") == pre_xqa, a["id"]


def test_hf_eager_rewrites_its_cache_each_step_and_copies_a_gqa_layers_kv_per_query_head():
    """transformers' generate (hf-eager) appends K and V with torch.cat (DynamicCache): each decode step reads the
    whole cache and writes it again, one token longer, beside attention (kv_copy: 2 x the cache). Before SDPA,
    repeat_kv copies a GQA layer's KV heads once per query head (read once, write r copies) and SDPA reads the r
    copies (attention x r); since transformers PR #39412 an unmasked step on torch >= 2.5 skips the copy (the
    optimistic end). An MHA model has no repeats; an engine writing in place (vLLM) has no kv_copy term. gpt-fast
    writes in place and repeats a GQA layer's K and V every step (repeat_interleave before SDPA)."""
    hf = [engines.profile("hf-eager", j) for j in range(3)]
    assert all(e.kv_concat and e.kv_repeat_copies for e in hf) and [e.kv_repeat_share for e in hf] == [0.0, 1.0, 1.0]
    dev = get_datasheet("a100_80gb_sxm")

    def terms(model, engine, scenario=1, B=16, L=2048):
        cfg = get_preset(model)
        cache = B * cfg.layers * 2 * cfg.kv_heads * cfg.head_dim * 2 * (L + 1)  # bf16 K and V the step attends to
        w = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(bands=()))
        return w.pass_detail(Pass(B, 1, L), scenario, engine)["terms"], cache
    (mha, c_mha), (gqa, c_gqa) = terms("llama-2-7b", "hf-eager"), terms("llama-3.1-8b", "hf-eager")
    r = get_preset("llama-3.1-8b").heads / get_preset("llama-3.1-8b").kv_heads
    assert r == 4
    per_byte = mha["kv_copy"] / (2 * c_mha)  # seconds per byte copied (the streaming rate)
    assert gqa["kv_copy"] == pytest.approx(per_byte * (2 + 1 + r) * c_gqa)  # cat + repeat_kv's read and 4 writes
    assert gqa["kv_copy"] / terms("llama-3.1-8b", "hf-eager", B=16, L=1023)[0]["kv_copy"] == pytest.approx(2049 / 1024)
    opt, _ = terms("llama-3.1-8b", "hf-eager", scenario=0)
    assert opt["kv_copy"] == pytest.approx(terms("llama-2-7b", "hf-eager", scenario=0)[0]["kv_copy"] * c_gqa / c_mha)
    vllm = terms("llama-3.1-8b", "vllm")[0]
    assert vllm["kv_copy"] == 0.0
    assert 3.0 < gqa["attention"] / vllm["attention"] <= r  # SDPA reads the 4 copies (the cache write and floor once)
    assert mha["attention"] == pytest.approx(terms("llama-2-7b", "vllm")[0]["attention"])
    with pytest.raises(ConfigError, match="kv_cache_update"):
        engines.choice({"kv_cache_update": {"value": "append"}}, "kv_cache_update", engines.KV_UPDATES, "in_place",
                       "engines.x")
    # gpt-fast writes its static cache in place but repeat_interleaves a GQA layer's K and V before SDPA, every step
    fast = [engines.profile("gpt-fast", j) for j in range(3)]
    assert not any(e.kv_concat for e in fast) and all(e.kv_repeat_copies and e.kv_repeat_share == 1.0 for e in fast)
    assert terms("llama-3.1-8b", "gpt-fast")[0]["kv_copy"] == pytest.approx(per_byte * (1 + r) * c_gqa)
    assert terms("llama-2-7b", "gpt-fast")[0]["kv_copy"] == 0.0
    # and its decode attends over the whole static cache the run allocated (prompt + output, a multiple of 8): a run's
    # decode step is priced at that length whatever the tokens so far; an engine reading what is filled is not
    assert engines.profile("gpt-fast", 1).kv_reads_allocated and not engines.profile("vllm", 1).kv_reads_allocated
    w = WhatIf(get_preset("llama-2-7b"), dev, "bfloat16", Layout(), Setting(engine="gpt-fast"))
    run = serve(w, 1000, 1001, 1, 1)
    assert run["itl_s"]["typical"] == pytest.approx(w.forward(Pass(1, 1, 2008, 0, 500), 1, "gpt-fast"))
    v = WhatIf(get_preset("llama-2-7b"), dev, "bfloat16", Layout(), Setting(engine="vllm"))
    assert serve(v, 1000, 1001, 1, 1)["itl_s"]["typical"] == pytest.approx(v.forward(Pass(1, 1, 1500, 0, 500), 1, "vllm"))


def test_hf_eager_issues_each_touched_experts_kernels_from_its_python_loop():
    """transformers' eager MoE blocks loop over the experts their tokens hit, about 10 launches each (a nonzero, the
    gather, w1 / act / w3 / product / w2, the routing weights, index_add_): hf-eager's host pays them per touched
    expert of every MoE layer, so a step grows with the experts its batch touches; a dense model and an engine under
    CUDA graphs pay none of it."""
    import dataclasses
    kern, priors = kernels.load_kernels(), whatif.load_priors()
    cfg, dev = get_preset("qwen3-30b-a3b"), get_datasheet("h100_sxm")
    eng = engines.profile("hf-eager", 1)
    assert [engines.profile("hf-eager", j).launches_per_expert for j in range(3)] == [9, 10, 12]
    assert engines.profile("vllm", 1).launches_per_expert == 0.0
    no_loop = dataclasses.replace(eng, launches_per_expert=0.0)

    def detail(e, B):
        return whatif.pass_seconds(cfg, Layout(), "bfloat16", Pass(B, 1, 512), dev, e, 1, kern, priors)
    for B in (1, 32):
        d = detail(eng, B)
        extra = d["terms"]["per_layer"] - detail(no_loop, B)["terms"]["per_layer"]
        assert extra == pytest.approx(cfg.layers * d["experts_touched"] * 10 * eng.host_s_per_launch)
    assert detail(eng, 32)["experts_touched"] > 10 * detail(eng, 1)["experts_touched"]  # 8 at B = 1, ~112 at 32
    dense = get_preset("llama-3.1-8b")
    d = whatif.pass_seconds(dense, Layout(), "bfloat16", Pass(1, 1, 512), dev, eng, 1, kern, priors)
    assert d["terms"]["per_layer"] == pytest.approx(
        whatif.pass_seconds(dense, Layout(), "bfloat16", Pass(1, 1, 512), dev, no_loop, 1, kern, priors)["terms"]["per_layer"])
    graphs = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="hf-eager", graphs=True))
    assert graphs.pass_detail(Pass(32, 1, 512), 1, "hf-eager")["terms"]["per_layer"] < extra / 10


def test_vllm_v0_rocm_is_vllm_v0_with_the_host_time_of_the_rocm_build():
    """AMD's rocm/vllm-dev containers (vLLM V0, 'Cython to reduce host overhead') pay a fixed host time per step
    (1.17 ms), fitted to the one V0 batch sweep of the calibration split, and no host time per sequence: the sweep's
    slope (54 us a sequence) is the CDNA3 device's, paid by every engine on it (kernels.yaml arch_overrides.cdna3
    step_us_per_seq); upstream V0 (vllm-v0) pays 220 us a sequence of host time. Nothing else differs. The anchors
    whose source states a rocm/vllm-dev image (on an AMD device) take the profile, and only those."""
    import dataclasses
    rocm, up = engines.profile("vllm-v0-rocm", 1), engines.profile("vllm-v0", 1)
    diff = {f.name for f in dataclasses.fields(rocm) if getattr(rocm, f.name) != getattr(up, f.name)}
    assert diff == {"name", "step_overhead_s", "step_overhead_per_seq_s"}
    assert (rocm.step_overhead_s, rocm.step_overhead_per_seq_s) == pytest.approx((1.17e-3, 0.0))
    w = WhatIf(get_preset("llama-3.1-70b"), get_datasheet("mi300x"), "float16+weights=fp8_e4m3", Layout(tp=8),
               Setting(bands=()))
    terms = {e: w.pass_detail(Pass(128, 1, 1100), 1, e)["terms"] for e in ("vllm-v0-rocm", "vllm-v0")}
    assert terms["vllm-v0-rocm"]["step_overhead"] == pytest.approx(1.17e-3)
    assert terms["vllm-v0-rocm"]["per_seq"] == terms["vllm-v0"]["per_seq"] == pytest.approx(128 * 54e-6)
    assert terms["vllm-v0"]["step_overhead"] > 20 * terms["vllm-v0-rocm"]["step_overhead"]
    _, sources, rows = anchors.load()
    for a in rows:
        if a["engine"] in ("vllm-v0", "vllm-v0-rocm"):
            src = sources[a["source"]]
            stated = " ".join(str(src.get(k, "")) for k in ("engine_version", "date_or_version", "note"))
            amd_image = a["device"].startswith("mi3") and "rocm/vllm-dev" in stated
            assert (a["engine"] == "vllm-v0-rocm") == amd_image, a["id"]


def test_cdna3s_cost_per_sequence_and_the_rocm_builds_host_time_are_what_their_derivation_gives_now(tmp_path):
    """Both priors come from one calibration sweep (the ROCm blog's vLLM V0 on 8x MI300X, Llama-3.1-70B fp8, static
    batches 1-128 at 128 / 2048 in, 2048 out) priced without them: the time missed per decode step is a line in the
    batch, its slopes CDNA3's cost per sequence (kernels.yaml step_us_per_seq: ends and joint line) and its
    intercepts the build's host time (engines.yaml vllm-v0-rocm step_overhead_us). Whatever else the what-if comes to
    price on those rows (the elementwise kernels took ~6 us a sequence of the slope) must be taken out of them: this
    re-runs the derivation and fails when the stored triples no longer match it."""
    import numpy as np
    eng = yaml.safe_load((ROOT / "roofline" / "data" / "engines.yaml").read_text())
    kern = yaml.safe_load((ROOT / "roofline" / "data" / "kernels.yaml").read_text())
    stored_slope = kern["arch_overrides"]["cdna3"]["step_us_per_seq"]["values"]
    stored_fixed = eng["engines"]["vllm-v0-rocm"]["step_overhead_us"]["values"]
    eng["engines"]["vllm-v0-rocm"]["step_overhead_us"]["values"] = [0, 0, 0]
    kern["arch_overrides"]["cdna3"]["step_us_per_seq"]["values"] = [0, 0, 0]
    (tmp_path / "e.yaml").write_text(yaml.safe_dump(eng))
    (tmp_path / "k.yaml").write_text(yaml.safe_dump(kern))
    models, _, rows = anchors.load()
    st = Setting(engine="vllm-v0-rocm", bands=(), engines=str(tmp_path / "e.yaml"), kernels=str(tmp_path / "k.yaml"))
    pts = {}
    for a in (r for r in rows if r["source"] == "rocm_blog_mi300x_2025_01_mi300x_vllm"):
        wl = a["workload"]
        miss = (a["value"] - anchors.what_if(a, models[a["model"]], st, models)["typical"]) / wl["output_len"]
        pts.setdefault(wl["input_len"], []).append((wl["concurrency"], miss))
    fits = [np.polyfit(*zip(*v), 1) for v in pts.values()]
    joint = np.polyfit(*zip(*[p for v in pts.values() for p in v]), 1)
    slopes = sorted(f[0] * 1e6 for f in fits)
    assert len(pts) == 2 and sum(len(v) for v in pts.values()) == 16
    assert stored_slope == pytest.approx([slopes[0], joint[0] * 1e6, slopes[1]], abs=0.6)
    fixed = sorted(f[1] * 1e6 for f in fits)
    assert stored_fixed == pytest.approx([fixed[0], joint[1] * 1e6, fixed[1]], abs=6)


def test_cdna3_prices_a_cost_per_running_sequence_for_every_engine_and_nvidia_none():
    """A decode step on CDNA3 (MI300X, MI325X; MI355X by transfer) costs 54 us (53-56) per sequence of the rank
    beyond its bytes, FLOPs, launches and host time, under any engine (the slope vLLM V0 and V1 sweeps on MI300X
    share); an NVIDIA part pays none. It is its own term, outside the engine's host time, absent from an MTP
    module's pass, and counts the rank's sequences under DP attention."""
    from roofline.parallel import kernels as K
    kern = K.load_kernels()
    assert [K.step_seconds_per_seq(s, kern, "mi300x") for s in range(3)] == pytest.approx([53e-6, 54e-6, 56e-6])
    assert K.step_seconds_per_seq(1, kern, "mi325x") == K.step_seconds_per_seq(1, kern, "mi355x") == pytest.approx(54e-6)
    assert K.step_seconds_per_seq(1, kern, "h100_sxm") == 0.0
    cfg = get_preset("llama-3.1-8b")
    for eng in ("vllm", "sglang", "vllm-v0"):
        amd = WhatIf(cfg, get_datasheet("mi300x"), "bfloat16", Layout(), Setting(bands=()))
        nv = WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(bands=()))
        one, many = (amd.pass_detail(Pass(B, 1, 1024), 1, eng)["terms"]["per_seq"] for B in (1, 64))
        assert (one, many) == pytest.approx((54e-6, 64 * 54e-6))
        assert nv.pass_detail(Pass(64, 1, 1024), 1, eng)["terms"]["per_seq"] == 0.0
        chunk = amd.pass_detail(Pass(8, 1, 1024, 512, 256), 1, eng)["terms"]["per_seq"]
        assert chunk == pytest.approx(9 * 54e-6)  # 8 decodes and the prompt whose chunk rides along
    dsv3 = WhatIf(get_preset("deepseek-v3"), get_datasheet("mi300x"), "bfloat16+weights=fp8_b128",
                  Layout(tp=8, ep=8, dp_attention=True), Setting(bands=()))
    d = dsv3.pass_detail(Pass(64, 1, 1024), 1, "sglang")
    assert d["terms"]["per_seq"] == pytest.approx(8 * 54e-6)  # 64 sequences over 8 attention ranks
    assert dsv3.pass_detail(Pass(64, 1, 1024), 1, "sglang", head="mtp")["terms"]["per_seq"] == 0.0
    assert d["seconds"] == pytest.approx(sum(d["terms"].values()))


def test_an_unnamed_engine_spans_each_engine_once_and_a_release_variant_only_when_named(tmp_path):
    """A profile marked `release_of: <profile>` (sglang-0.4 of sglang) is priced when named; the span of an
    unnamed engine leaves it out, so that its median is not pulled toward an engine listed twice. A release_of
    naming no profile (or another variant) is one error naming the field."""
    assert "sglang-0.4" in engines.names() and "sglang-0.4" not in engines.spanned()
    assert set(engines.names()) - set(engines.spanned()) == {"sglang-0.4", "vllm-v0-rocm", "trtllm-0.6",
                                                             "hf-eager-qwen1"}
    assert Setting().engine_names() == engines.spanned()
    assert Setting(engine="sglang-0.4").engine_names() == ["sglang-0.4"]
    doc = yaml.safe_load(engines.ENGINES_PATH.read_text())
    doc["engines"]["sglang-0.4"]["release_of"] = "sglang-0.3"
    bad = tmp_path / "engines.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"engines\.sglang-0\.4\.release_of='sglang-0\.3'"):
        engines.spanned(str(bad))


def test_a_routed_pair_moves_its_activations_beside_the_experts_weights(monkeypatch):
    """vLLM's fused_experts reads each (token, expert) pair's row, writes and reads back its gate/up outputs, the
    down GEMM's inputs and its outputs (summed over the top-k after): d (a_in + 2a) + F (4a + 2 a_in) bytes a pair,
    F the rank's shard. DeepSeek-V3 at TP 8 (d 7168, F 256, fp8 w8a8: a_in 1): 38,400 B a pair. At a decode step
    of 64 sequences that is a few percent of the touched experts' bytes; at an 8192-token prefill chunk it is
    more than the experts' weights, and the layer's memory term carries it."""
    from roofline.model.accounting import expert_pair_io_bytes
    assert expert_pair_io_bytes(7168, 256, 1, 2) == 7168 * 5 + 256 * 10 == 38400
    assert expert_pair_io_bytes(4096, 14336 // 2, 2, 2) == 4096 * 6 + 7168 * 12
    ds = get_preset("deepseek-v3")
    w = WhatIf(ds, get_datasheet("h200_sxm"), "bfloat16+weights=fp8_b128", Layout(tp=8), Setting(bands=()))
    kern, bw = kernels.load_kernels(), get_datasheet("h200_sxm").bandwidth_Bps()
    stream = bw * kernels.weight_bw_fraction("dense", 1, 1, kern)
    decode, chunk = Pass(64, 1, 2000), Pass(0, 1, 0, 8192, 4096)
    n_moe = sum(ds.layer_is_moe(i) for i in range(ds.layers))
    t = {p: w.pass_detail(p, 1, "sglang")["terms"]["experts"] for p in (decode, chunk)}
    io = {p: n_moe * p_pairs * 38400 / stream for p, p_pairs in ((decode, 64 * 8), (chunk, 8192 * 8))}
    assert io[decode] / t[decode] < 0.05
    assert io[chunk] / t[chunk] > 0.5
    _without_pair_io(monkeypatch)
    w0 = WhatIf(ds, get_datasheet("h200_sxm"), "bfloat16+weights=fp8_b128", Layout(tp=8), Setting(bands=()))
    t0 = {p: w0.pass_detail(p, 1, "sglang")["terms"]["experts"] for p in (decode, chunk)}
    for p in (decode, chunk):  # in the memory term (the chunk is memory-bound with it, compute-bound without)
        assert t0[p] < t[p] <= t0[p] + io[p] * (1 + 1e-9)
    assert t[decode] == pytest.approx(t0[decode] + io[decode])
    assert 8192 * 8 * 38400 > 256 * 3 * ds.d * ds.moe_ffn / 8  # the chunk's pairs move more than a layer's experts


def test_a_blocks_norms_rotary_and_gated_activation_move_their_activations_at_every_batch():
    """The kernels of a block that are neither GEMM nor attention move each token's activations: vLLM's
    fused_add_rms_norm twice (reads and writes back the hidden state and the residual: 4 d), silu_and_mul (reads
    the gate/up output 2F, writes F) and rotary_embedding in place on q and k ((heads + kv_heads) x head_dim each
    way). Llama 3.1 8B: 8 x 4096 + 3 x 14336 + 2 x 40 x 128 = 86,016 elements a token and layer; at TP 8 the FFN's and
    the heads' shares shrink by 8, the norms' do not. Priced as streaming (the `elementwise` term), they are
    nothing at batch 1 and a tenth of a 2048-token chunk's GEMMs at TP 8. Before, none of it was priced."""
    from roofline.model.accounting import block_elementwise_elements
    from roofline.parallel.cost import _rank_cfgs
    cfg = get_preset("llama-3.1-8b")
    assert block_elementwise_elements(cfg, False) == 8 * 4096 + 3 * 14336 + 2 * 40 * 128 == 86016
    tp8 = _rank_cfgs(cfg, Layout(tp=8))[0]
    assert block_elementwise_elements(tp8, False) == 8 * 4096 + 3 * 14336 // 8 + 2 * 5 * 128
    ds = get_preset("deepseek-v3")  # MLA: the rope part of the 128 query heads and the one rope key, the two latents
    assert block_elementwise_elements(ds, True) == 8 * 7168 + 3 * 2048 + 2 * (128 * 64 + 64) + 2 * (1536 + 512)
    dev = get_datasheet("h100_sxm")
    kern, bw = kernels.load_kernels(), dev.bandwidth_Bps()
    stream = bw * kernels.weight_bw_fraction("dense", 1, 1, kern)
    w = WhatIf(cfg, dev, "bfloat16", Layout(tp=8), Setting(bands=()))
    for p, tokens in ((Pass(1, 1, 1000), 1), (Pass(0, 1, 0, 2048, 1024), 2048)):
        d = w.pass_detail(p, 1, "vllm")["terms"]
        assert d["elementwise"] == pytest.approx(cfg.layers * tokens * 2 * block_elementwise_elements(tp8, False) / stream)
    one, chunk = (w.pass_detail(p, 1, "vllm")["terms"] for p in (Pass(1, 1, 1000), Pass(0, 1, 0, 2048, 1024)))
    assert one["elementwise"] < 0.01 * one["dense"] and 0.05 < chunk["elementwise"] / chunk["dense"] < 0.5


def test_a_gemm_moves_its_input_and_output_rows_beside_its_weights():
    """A GEMM's memory term is its weights plus its M input rows (K elements in the GEMM's input dtype) and M
    output rows (N in the activations'): at 256 rows they are a tenth of a TP-8 shard's fp8 weights. They stream
    at the plain (M = 1) fraction, not at the weights' fraction at M, which past M = 64 is a measured GEMM's whole
    time. Before, only the weights were counted."""
    kern, dev = kernels.load_kernels(), get_datasheet("h100_sxm")
    bw, f, f32 = dev.bandwidth_Bps(), dev.peak_flops("float8_e4m3fn"), dev.peak_flops("float32")
    M, N, K = 256, 7168, 8192
    bare = kernels.gemm_seconds(M, N, K, N * K, "fp8", 0, bw, f, f32, dev.key, 1, kern)
    io = M * (K * 1 + N * 2)
    full = kernels.gemm_seconds(M, N, K, N * K, "fp8", 0, bw, f, f32, dev.key, 1, kern, io)
    stream = dev.bandwidth_Bps() * kernels.weight_bw_fraction("dense", 1, 1, kern)
    assert full["memory"] == pytest.approx(bare["memory"] + io / stream)
    assert full["compute"] == bare["compute"] and 0.05 < io / (N * K) < 0.5


def test_an_mla_prompt_is_priced_as_the_multi_head_attention_the_engines_run_for_prefill():
    """vLLM's MLA (attention/backends/mla/common.py) runs a prefill the "compute friendly" way: the cached latents
    up-projected to per-head keys and values, then attention at the heads' own widths (DeepSeek-V3: 192 + 128),
    while decode runs the absorbed form over the latent (576 + 512: 3.4x the arithmetic per attended pair).
    A prompt chunk's attention is priced the first way, its up-projection included; decode keeps the second."""
    from roofline.parallel.whatif import mla_prefill_flops
    ds = get_preset("deepseek-v3")
    heads = ds.heads // 8
    pairs = 2 * (192 + 128) * heads * 8192 * 4096
    up = 2 * (4096 + 4096) * 512 * heads * (128 + 128)
    assert mla_prefill_flops(ds, heads, 1, 8192, 4096) == pytest.approx(pairs + up)
    absorbed = 2 * (512 + 64 + 512) * heads * 8192 * 4096
    assert absorbed / pairs == pytest.approx(3.4)
    dev = get_datasheet("h200_sxm")
    w = WhatIf(ds, dev, "bfloat16+weights=fp8_b128", Layout(tp=8), Setting(bands=()))
    t = w.pass_detail(Pass(0, 1, 0, 8192, 4096), 1, "sglang")["terms"]["attention"]
    fa = dev.peak_flops("bfloat16") * kernels.prefill_attention_fraction(1, kernels.load_kernels(), dev.key)
    flops = mla_prefill_flops(ds, heads, ds.layers, 8192, 4096)
    assert flops / fa < t < 1.2 * flops / fa  # the arithmetic, and the cache writes beside it
    assert t < 0.5 * ds.layers * absorbed / fa


def test_every_moe_layer_pays_its_router_gemm_and_gating_kernels_under_graphs():
    """priors.yaml moe_routing_us_per_layer: per MoE layer beside the graph floor (CUDA graphs); a dense model
    pays nothing more; an engine without graphs prices those launches at its host issue time instead."""
    from roofline.parallel.whatif import load_priors
    routing = load_priors()["moe_routing_us_per_layer"]["values"]
    ds, dev = get_preset("deepseek-v3"), get_datasheet("h200_sxm")
    graph = Setting(engine="sglang", bands=())
    w = WhatIf(ds, dev, "bfloat16+weights=fp8_b128", Layout(tp=8), graph)
    floor = load_priors()["launch_floor_us_per_layer"]["graph"]["values"]
    for s_ in range(3):
        got = w.pass_detail(Pass(4, 1, 1024), s_, "sglang")["terms"]["per_layer"]
        assert got == pytest.approx((61 * floor[s_] + 58 * routing[s_]) * 1e-6)
    dense = WhatIf(get_preset("llama-3.1-8b"), dev, "bfloat16", Layout(), graph)
    assert dense.pass_detail(Pass(4, 1, 1024), 1, "sglang")["terms"]["per_layer"] == pytest.approx(32 * floor[1] * 1e-6)
    eager = WhatIf(get_preset("mixtral-8x7b"), get_datasheet("a100_80gb_sxm"), "bfloat16", Layout(tp=2),
                   Setting(engine="hf-eager", bands=()))
    one = eager.pass_detail(Pass(1, 1, 128), 1, "hf-eager")["terms"]["per_layer"]
    with_graphs = WhatIf(eager.cfg, eager.device, "bfloat16", Layout(tp=2),
                         Setting(engine="hf-eager", bands=(), graphs=True)).pass_detail(Pass(1, 1, 128), 1, "hf-eager")
    assert with_graphs["terms"]["per_layer"] == pytest.approx(32 * (floor[1] + routing[1]) * 1e-6)
    assert one != pytest.approx(with_graphs["terms"]["per_layer"])


def test_an_engine_sizes_its_pool_from_the_memory_the_driver_reports():
    h100, l4090 = get_datasheet("h100_sxm"), get_datasheet("rtx4090")
    assert h100.mem_bytes == 80e9 and h100.usable_mem_bytes() == pytest.approx(81559 * 2**20, rel=1e-3)
    assert l4090.usable_mem_bytes() == l4090.mem_bytes  # no printout read: the printed capacity


def test_a_block_scaled_fp8_gemm_pays_its_own_call_floor_and_streams_like_fp8():
    from roofline.model.formats import parse_precision
    from roofline.parallel.whatif import _fmt_kind
    assert _fmt_kind(parse_precision("bfloat16+weights=fp8_b128").weights, get_datasheet("h100_sxm")) == "fp8_block"
    assert _fmt_kind(parse_precision("bfloat16+weights=fp8").weights, get_datasheet("h100_sxm")) == "fp8"
    kern = kernels.load_kernels()
    args = (8, 3072, 1536, 3072 * 1536 * 1.0, None, 0, 4.8e12, 1.979e15, 6.7e13, "h200_sxm", 1, kern)
    g = lambda kind: kernels.gemm_seconds(*args[:4], kind, *args[5:])  # noqa: E731
    floor = kernels.pick(kern["weight_only"]["fp8_block"]["call_floor_us"], 1) * 1e-6
    assert g("fp8_block")["memory"] == pytest.approx(g("fp8")["memory"])
    assert g("fp8_block")["seconds"] == pytest.approx(g("fp8")["seconds"] + floor)
    assert kernels.peak_fraction("fp8_block", 1, kern) == kernels.peak_fraction("fp8", 1, kern)


def test_the_band_quantile_weighs_each_source_once():
    s = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    one_each = anchors.weighted_quantile(s, np.array(list("abcde")), 0.8)
    assert one_each == 0.5  # ceil(6 x 0.8) = 5th of 5
    # a sixth source of 45 rows all at 0.9 counts once: ceil(7 x 0.8) = 6th of 6 sources
    many = anchors.weighted_quantile(np.r_[s, np.full(45, 0.9)], np.array(list("abcde") + ["f"] * 45), 0.8)
    assert many == 0.9
    low = anchors.weighted_quantile(np.r_[s, np.full(45, 0.01)], np.array(list("abcde") + ["f"] * 45), 0.8)
    assert low == 0.5  # 45 rows below all count as one source: unweighted they would pull it to 0.01
    assert math.isinf(anchors.weighted_quantile(s[:3], np.array(list("abc")), 0.8))  # S < 4 at 80%


def test_a_run_over_a_variable_length_dataset_is_not_priced_and_says_why(tmp_path):
    doc = yaml.safe_load((ROOT / "roofline" / "data" / "deployments.yaml").read_text())
    a = next(a for a in doc["anchors"] if a["source"] == "vllm_pr23151_qwen3")
    doc["anchors"] = [dict(a, id="x-fixed"), dict(a, id="x-sharegpt", dataset="sharegpt")]
    p = tmp_path / "d.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    t = anchors.table(p, bands=()).set_index("id")
    assert np.isfinite(t.loc["x-fixed", "predicted"]) and np.isnan(t.loc["x-sharegpt", "predicted"])
    assert "dataset='sharegpt'" in t.loc["x-sharegpt", "note"]


def test_a_deployment_calibrated_to_its_other_published_points_prices_the_one_left_out(tmp_path):
    """anchors_leave_one_out: each anchor priced calibrated to the other anchors of its deployment (never to
    itself). Three finite runs published 1.2x slower than priced: each is priced 1.2x slower from the other two; a
    TTFT is priced from them but is no point itself; another deployment (other device) shares no points."""
    from roofline.analysis.calibrate import anchors_leave_one_out, leave_one_out_summary
    doc = yaml.safe_load((ROOT / "roofline" / "data" / "deployments.yaml").read_text())
    a = next(a for a in doc["anchors"] if a["source"] == "vllm_pr23151_qwen3")
    cfg = get_preset(a["model"])
    rows = [dict(a, id=f"x-c{c}", metric="tpot_ms", workload=dict(a["workload"], concurrency=c, num_prompts=10 * c))
            for c in (1, 8, 32)]
    rows.append(dict(rows[1], id="x-ttft", metric="ttft_ms"))
    rows.append(dict(rows[0], id="x-alone", device="h200_sxm"))  # a deployment of one point: left out
    for r in rows:
        r["value"] = float(anchors.what_if(r, cfg)["typical"]) * 1.2
    doc["anchors"] = rows
    p = tmp_path / "d.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    t = anchors_leave_one_out(p).set_index("id")
    assert sorted(t.index) == ["x-c1", "x-c32", "x-c8", "x-ttft"] and (t.loc[["x-c1", "x-c8", "x-c32"], "points"] == 2).all()
    assert np.allclose(t.loc[["x-c1", "x-c8", "x-c32"], "error_pct"], 100 * (1 / 1.2 - 1))
    assert np.allclose(t.loc[["x-c1", "x-c8", "x-c32"], "calibrated_error_pct"], 0.0, atol=2.0)
    assert t.loc["x-ttft", "points"] == 3 and abs(t.loc["x-ttft", "calibrated_error_pct"]) < 5.0
    one = anchors_leave_one_out(p, nearest=True).set_index("id")
    assert (one["points"] == 1).all() and "x-ttft" not in one.index  # a TTFT has no batch or context to be near
    summary = leave_one_out_summary(t.reset_index())["calibration"]
    assert summary["n"] == 4 and summary["improved"] == 1.0 and summary["calibrated_median_abs_error_pct"] < 2.0
    span = anchors_leave_one_out(p, engine_known=False).set_index("id")  # a user who names no engine
    assert span.loc["x-c8", "predicted"] == pytest.approx(anchors.what_if(rows[1], cfg, Setting(engine=None))["typical"])
    assert span.loc["x-c8", "predicted"] != pytest.approx(t.loc["x-c8", "predicted"])


def test_an_anchor_becomes_the_calibrate_point_its_metric_states():
    """tok/s of one user -> the run's end-to-end latency of its mean request; tok/s per GPU -> the run's tok/s; a
    TTFT, a speedup, a speculative or static-batch run and a dataset of varying lengths are no points."""
    run = dict(tp=4, workload=dict(concurrency=8, input_len=1000, output_len=500, range_ratio=0.5), value=50.0)
    assert anchors.calibration_point(dict(run, metric="tok_s_per_user")) == dict(
        concurrency=8, input_len=1000, output_len=500, range_ratio=0.5, client="server", e2e_latency_s=375 / 50.0)
    assert anchors.calibration_point(dict(run, metric="output_tok_s_per_gpu"))["output_tok_s"] == 200.0
    assert anchors.calibration_point(dict(run, metric="output_tok_s_per_gpu", n_devices=8))["output_tok_s"] == 400.0
    assert anchors.calibration_point(dict(tp=1, workload=dict(B=4, L=100), metric="itl_ms", value=9.0)) == dict(
        B=4, L=100, itl_ms=9.0)
    for other in (dict(metric="ttft_ms"), dict(metric="tpot_ms", spec=dict(k=2)), dict(metric="tpot_ms", batching="static"),
                  dict(metric="tpot_ms", dataset="sharegpt"), dict(metric="spec_speedup")):
        assert anchors.calibration_point(dict(run, **other)) is None


def test_capacity_and_layouts_honour_calibrate_with_one_answer(fixture_data, tmp_path):
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands.capacity import DEVICE_AS, plan_layouts, request_from_config
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine="vllm"))
    L = 1024 + 256 // 2
    (tmp_path / "cal.yaml").write_text(yaml.safe_dump(dict(points=[dict(B=16, L=L, itl_ms=1.5e3 * w.itl(16, L)["typical"])])))
    c = composed("capacity", "model=llama-3.1-8b", "device=h100_sxm", "engine=vllm", "B=[16]", "itl_target_ms=1e4",
                 "out_dir=''", f"calibrate={tmp_path / 'cal.yaml'}", device_as=DEVICE_AS)
    c.pop("overrides"), c.pop("layouts")
    one, summary = plan_whatif(request_from_config(dict(c)))
    rows, _ = plan_layouts(dict(c))
    tp1 = rows[rows["layout"] == "tp1"].iloc[0]
    # the sustained service's decode steps (its ITL median) are the calibrated step; its TPOT and interval are the
    # calibrated what-if's sustained run, prompts' steps included, in both plans
    assert float(one.iloc[0]["itl_median_ms"]) == pytest.approx(1.5e3 * w.itl(16, L)["typical"], rel=1e-9)
    from roofline.analysis.calibrate import calibrated
    run = whatif.sustained(calibrated(w, str(tmp_path / "cal.yaml")), 16, 1024, 256)["itl_mean_s"]
    for k in ("typical", "optimistic", "pessimistic"):
        col = "itl_ms" + ("" if k == "typical" else f"_{k}")
        assert float(one.iloc[0][col]) == pytest.approx(1e3 * run[k], rel=1e-12)
        assert float(tp1[col]) == pytest.approx(float(one.iloc[0][col]), rel=1e-12)
    assert float(one.iloc[0]["itl_ms"]) > float(one.iloc[0]["itl_median_ms"])  # the prompts' steps count in the TPOT
    assert summary["calibration_scale"] == pytest.approx(1.5)


def test_card_capacity_and_predict_honour_graph_batch_sizes():
    """`graph_batch_sizes=` (roofline.commands.GraphKeys) reaches the what-if of card, capacity (one layout and
    layouts=true) and predict: a TensorRT-LLM decode step of 172 sequences priced as the 256 it pads to; a bad size
    is one error naming the key."""
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands.capacity import DEVICE_AS, plan_layouts, request_from_config
    from roofline.commands.card import CardRequest, card_record
    from roofline.commands.predict import predict_command
    cfg, dev = get_preset("llama-3.1-70b"), get_datasheet("h200_sxm")
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    # outputs twice the prompts: a sixth of the sustained run's steps carry a prompt, its ITL median is the decode
    # step at context 576 + 1152 / 2 = 1152 (all 172 sequences in the KV pool)
    keys = ("model=llama-3.1-70b", "device=h200_sxm", "engine=trtllm", "weights=fp8", "kv=fp8", "B=[172]",
            "context=576", "output=1152", "itl_target_ms=1e4", "out_dir=''")

    def itl(graph_batch_sizes):
        w = WhatIf(cfg, dev, "bfloat16+weights=fp8+kv=fp8", Layout(),
                   Setting(engine="trtllm", graph_batch_sizes=graph_batch_sizes))
        return w.itl(172, 1024 + 128)["typical"]
    assert itl(tuple(sizes)) > 1.1 * itl(None)
    for extra, want in (((), itl(None)), ((f"graph_batch_sizes={sizes}".replace(" ", ""),), itl(tuple(sizes)))):
        c = composed("capacity", *keys, *extra, device_as=DEVICE_AS)
        c.pop("overrides"), c.pop("layouts")
        one, _ = plan_whatif(request_from_config(dict(c)))
        rows, _ = plan_layouts(dict(c))
        assert float(one.iloc[0]["itl_median_ms"]) == pytest.approx(1e3 * want)  # a sustained run's decode steps
        assert float(rows[rows["layout"] == "tp1"].iloc[0]["itl_median_ms"]) == pytest.approx(1e3 * want)
    rec = card_record(CardRequest(model=cfg, dtype="bfloat16+weights=fp8+kv=fp8", device=dev, batch=172, context=1152,
                                  engine="trtllm", graph_batch_sizes=tuple(sizes)))
    assert rec["whatif_itl_ms"] == pytest.approx(1e3 * itl(tuple(sizes)))
    base = dict(fit=None, device="h200_sxm", tp=1, ep=1, dp_attention=False, engine="trtllm", calibrate=None,
                model=dataclasses.asdict(cfg), dtype="bfloat16", weights="fp8", kv="fp8", lm_head=None, alphas=[0.8],
                k=[0], B=[172], L=[1152], overrides=[])
    plain, padded = (predict_command(dict(base, graph_batch_sizes=g))[0] for g in (None, sizes))
    assert f"{1e3 * itl(tuple(sizes)):.3f}"[:5] in padded and plain != padded
    with pytest.raises(ConfigError, match=r"^graph_batch_sizes: 0: allowed a size >= 1"):
        predict_command(dict(base, graph_batch_sizes=[0]))
    with pytest.raises(ConfigError, match=r"graph_batch_sizes: 'x': allowed a size >= 1"):
        composed_card = composed("card", "model=llama-3.1-70b", "device=h200_sxm", "graph_batch_sizes=[x]")
        engines.graph_batch_sizes(composed_card)


def test_predict_what_if_honours_formats_and_prices_plain_decode_without_mtp(fixture_data):
    from dataclasses import asdict

    from roofline.commands.predict import predict_command
    base = dict(fit=None, device="h100_sxm", tp=1, ep=1, dp_attention=False, engine=None, calibrate=None,
                model=asdict(get_preset("llama-3.1-8b")), dtype="bfloat16", weights=None, kv=None, lm_head=None,
                alphas=[0.8], k=[0, 1, 2], B=[1], L=[1024], overrides=[])
    text, summary = predict_command(dict(base))
    assert "no MTP module" in summary["note"] and summary["rows"] == 1
    _, s8 = predict_command(dict(base, weights="int8"))
    assert s8["dtype"] == "bfloat16+weights=int8"
    t_bf = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), S).itl(1, 1024)
    t_i8 = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16+weights=int8", Layout(), S).itl(1, 1024)
    assert t_i8["typical"] < 0.8 * t_bf["typical"]


def test_predict_what_if_says_when_its_layout_does_not_fit_as_the_card_does(fixture_data):
    """The what-if still prices a layout that does not fit (the step's time does not depend on it), and says so,
    by the engine KV pool rule of card and capacity: DeepSeek-V3's 686 GB of fp8 weights on one H200 do not fit,
    on eight they do."""
    from dataclasses import asdict

    from roofline.commands.predict import predict_command
    base = dict(fit=None, device="h200_sxm", tp=1, ep=1, dp_attention=False, engine=None, calibrate=None,
                model=asdict(get_preset("deepseek-v3")), dtype="bfloat16", weights=None, kv=None, lm_head=None,
                alphas=[0.8], k=[0, 2], B=[1], L=[1024], overrides=[])
    text, summary = predict_command(dict(base))
    assert summary["rows"] == 2 and "tp1 does not fit even at B = 1, L = 1024" in summary["note"]
    assert text.splitlines()[-1].startswith("warning: tp1 does not fit") and "of 141.0 GB" in text
    text8, s8 = predict_command(dict(base, tp=8))
    assert s8["note"] is None and "warning" not in text8


# ---- workload pricing and calibration ---------------------------------------------------------

def test_finite_run_prices_ttft_itl_and_throughput_consistently():
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), S)
    r = serve(w, 1024, 256, 32, 256)
    t = {k: v["typical"] for k, v in r.items()}
    assert t["itl_p90_s"] >= t["itl_s"] and t["ttft_s"] > 0
    assert t["e2e_s"] == pytest.approx(t["ttft_s"] + 255 * t["itl_mean_s"])
    assert t["output_tok_s"] < 32 / t["itl_s"]  # prefill chunks and the ramp cost throughput
    with pytest.raises(ConfigError, match="concurrency=0"):
        serve(w, 1024, 256, 0)


def test_a_finite_run_with_speculation_honours_k_the_drafter_and_the_acceptance_per_position():
    cfg = get_preset("llama-3.1-8b")
    w = WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(), S)
    plain = serve(w, 128, 1024, 8)
    none = serve(w, 128, 1024, 8, spec=SpecDecode(3, (0.0,), "ngram"))  # nothing accepted: tau = 1
    good = serve(w, 128, 1024, 8, spec=SpecDecode(3, (0.9, 0.8, 0.7), "ngram"))
    iid = serve(w, 128, 1024, 8, spec=SpecDecode(3, (0.8,), "ngram"))
    t = lambda r, k="output_tok_s": r[k]["typical"]  # noqa: E731
    assert t(none) < t(plain) < t(iid) < t(good)  # tau 1 < 2.952 (0.8 iid) < 3.124 (0.9, 0.72, 0.504)
    assert SpecDecode(3, (0.9, 0.8, 0.7), "ngram").tau() == pytest.approx(1 + 0.9 + 0.72 + 0.504)
    assert t(good, "itl_mean_s") == pytest.approx(t(good, "itl_s") / 3.124, rel=0.02)  # tau tokens per round
    assert t(good, "e2e_s") == pytest.approx(t(good, "ttft_s") + 1023 * t(good, "itl_mean_s"))
    draft = WhatIf(get_preset("tiny"), get_datasheet("h100_sxm"), "bfloat16", Layout(), S)
    drafted = serve(w, 128, 1024, 8, spec=SpecDecode(3, (0.8,), "draft_model", draft))
    assert t(drafted, "itl_s") > t(iid, "itl_s")  # the draft model's three passes cost time; n-gram lookup none
    for bad, field in (((0, (0.5,)), "spec.k=0"), ((2, (0.5, 0.5, 0.5)), "spec.acceptance"),
                       ((2, (1.5,)), "spec.acceptance"), ((2, (0.5,), "medusa"), "spec.drafter"),
                       ((2, (0.5,), "draft_model"), "spec.draft_model")):
        with pytest.raises(ConfigError, match=field):
            SpecDecode(*bad)


def test_a_speedups_interval_takes_the_shared_priors_end_that_moves_the_ratio_not_the_diagonal():
    """tau·T(1)/R shares its kernel priors between numerator and denominator: the interval takes the round's
    own priors (acceptance, round overhead) at their end and the shared ones at the scenario of three that
    moves the ratio furthest, so it holds the all-optimistic / all-pessimistic diagonal and is not narrower."""
    from roofline.model.speculation import tau_iid
    cfg, dev = get_preset("deepseek-v3"), get_datasheet("h200_sxm")
    w = WhatIf(cfg, dev, "bfloat16+weights=fp8_b128", Layout(tp=8), Setting(engine="sglang"))
    alphas = (0.9, 0.875, 0.85)
    s = w.spec_speedup(alphas, 1, 32, 1024)
    diag = [tau_iid(alphas[i], 1) * w.target(1, 32, 1024, i) / w.round_seconds(1, 32, 1024, i) for i in range(3)]
    assert s["typical"] == pytest.approx(diag[1])
    assert s["optimistic"] >= max(diag[0], diag[1]) and s["pessimistic"] <= min(diag[2], diag[1])
    assert s["pessimistic"] < s["typical"] < s["optimistic"]
    assert w.spec_speedup(alphas, 0, 32, 1024) == dict.fromkeys(("optimistic", "typical", "pessimistic"), 1.0)


def test_a_finite_speculative_anchor_is_priced_when_k_and_the_acceptance_are_stated():
    models, _, rows = anchors.load()
    a = next(r for r in rows if r["id"] == "gptfast-llama2-70b-int4-spec-7b-int4")
    with pytest.raises(NotImplementedError, match="acceptance"):
        anchors.what_if(a, models[a["model"]], None, models)  # the source states no acceptance
    plain = anchors.what_if(dict(a, spec=None), models[a["model"]], None, models)
    spec = anchors.what_if(dict(a, spec=dict(a["spec"], acceptance=0.8)), models[a["model"]], None, models)
    assert spec["typical"] > 1.5 * plain["typical"]  # tau = 3.69 at k = 5, a 7B int4 draft's five passes


def test_calibration_rescales_by_batch_and_keeps_the_points_leave_one_out_spread(tmp_path):
    from roofline.analysis.calibrate import calibrated
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), S)
    t1, t8, t8s = w.itl(1, 1024)["typical"], w.itl(8, 1024)["typical"], w.itl(8, 512)["typical"]
    pts = [dict(B=1, L=1024, itl_ms=1.2e3 * t1), dict(B=8, L=1024, itl_ms=1.3e3 * t8),
           dict(B=8, L=512, tok_s_per_user=1 / (1.25 * t8s))]
    (tmp_path / "cal.yaml").write_text(yaml.safe_dump(dict(points=pts)))
    c = calibrated(w, tmp_path / "cal.yaml")
    assert c.scale == pytest.approx(1.25)
    assert c.itl(1, 1024)["typical"] == pytest.approx(1.2 * t1)  # B = 1 measured at 1.2x
    assert c.itl(8, 1024)["typical"] == pytest.approx(1.275 * t8)  # B = 8: the median of its two points
    i1 = c.itl(1, 1024)
    # leave-one-out: B=1 from the B=8 points (1.275) -> 1.2/1.275; B=8 L=1024 from (1.2, 1.25) -> 1.3/1.25
    assert i1["optimistic"] / i1["typical"] == pytest.approx(1.2 / 1.275)
    assert i1["pessimistic"] / i1["typical"] == pytest.approx(1.3 / 1.25)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(dict(points=[dict(B=0, L=1, itl_ms=3)])))
    with pytest.raises(ConfigError, match=r"points\[0\].B=0"):
        calibrated(w, tmp_path / "bad.yaml")


@pytest.mark.parametrize("text, match", [
    ("points: [{B: 1, L: 1024, itl_ms: .nan}]", r"points\[0\].itl_ms=nan: allowed numbers in \(0.0, inf\)"),
    ("points: [{B: 1, L: 1024, tok_s_per_user: .inf}]", r"points\[0\].tok_s_per_user=inf: allowed numbers in \(0.0, inf\)"),
    ("points: [{B: 1, L: 1024, itl_ms: -3}]", r"points\[0\].itl_ms=-3: allowed numbers in \(0.0, inf\)"),
    ("points: [{B: 1, L: 1024, itl_ms: 7, tok_s_per_user: 140}]", r"points\[0\]: give exactly one of"),
    ("points: []", r"'points' is an empty list"),
])
def test_a_points_file_with_a_non_finite_or_empty_measurement_is_one_line_naming_it(tmp_path, text, match):
    """A NaN or infinite measurement once reached the plots' log axis and ended in 'Data cannot be
    log-scaled' (exit 2, naming no field); an empty list was called a missing key."""
    from roofline.analysis.calibrate import load_points
    (tmp_path / "p.yaml").write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_points(tmp_path / "p.yaml")


def test_calibrate_takes_a_benchmark_runs_result_priced_as_the_run(tmp_path):
    """A point may be a finite run as `vllm bench serve` reports it ({concurrency, input_len, output_len} and its
    TPOT, median ITL, end-to-end latency or output tokens/s): priced by whatif.serve, placed at the sequences it keeps running and their
    mean context; a run measured 1.2x slower than priced is priced 1.2x slower after, whichever metric states it."""
    from roofline.analysis.calibrate import calibrated
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine="vllm"))
    s = serve(w, 1024, 1024, 64, 640)
    for metric, value in (("tpot_ms", 1.2e3 * s["itl_mean_s"]["typical"]), ("itl_ms", 1.2e3 * s["itl_s"]["typical"]),
                          ("e2e_latency_s", 1.2 * s["e2e_s"]["typical"]),
                          ("output_tok_s", s["output_tok_s"]["typical"] / 1.2)):
        (tmp_path / "run.yaml").write_text(yaml.safe_dump(dict(points=[
            {"concurrency": 64, "input_len": 1024, "output_len": 1024, "num_prompts": 640, metric: value}])))
        c = calibrated(w, tmp_path / "run.yaml")
        assert c.scale == pytest.approx(1.2)
        assert c.calibration.B_range == (64, 64) and c.calibration.L_range == (1536, 1536)
        after = serve(c, 1024, 1024, 64, 640)
        assert after["itl_mean_s"]["typical"] == pytest.approx(1.2 * s["itl_mean_s"]["typical"], rel=0.02)
    # a random dataset's range of lengths: priced at its mean lengths, placed at their mean context
    (tmp_path / "rr.yaml").write_text(yaml.safe_dump(dict(points=[dict(concurrency=8, input_len=1000, output_len=1000,
                                                                       range_ratio=0.5, output_tok_s=500.0)])))
    assert calibrated(w, tmp_path / "rr.yaml").calibration.L_range == (1125, 1125)
    for text, match in (("points: [{concurrency: 8, input_len: 10, tpot_ms: 3}]", r"points\[0\].output_len=None"),
                        ("points: [{concurrency: 8, input_len: 10, output_len: 10, tok_s_per_user: 3}]",
                         r"points\[0\]: give exactly one of itl_ms, tpot_ms, e2e_latency_s, output_tok_s"),
                        ("points: [{concurrency: 8, input_len: 10, output_len: 10, tpot_ms: 3, range_ratio: 2}]",
                         r"points\[0\].range_ratio=2: allowed a number in \(0, 1\]"),
                        ("points: [{concurrency: 8, input_len: 10, output_len: 10, tpot_ms: 3, client: cli}]",
                         "client='cli'")):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(ConfigError, match=match):
            calibrated(w, tmp_path / "bad.yaml")


def test_a_calibrated_interval_widens_back_to_the_priors_away_from_the_points(tmp_path):
    from roofline.analysis.calibrate import calibrated
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), S)
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(dict(points=[dict(B=4, L=1024, itl_ms=1.1e3 * w.itl(4, 1024)["typical"])])))
    c = calibrated(w, tmp_path / "one.yaml")
    rel = lambda d: (d["optimistic"] / d["typical"], d["pessimistic"] / d["typical"])  # noqa: E731
    assert rel(c.itl(4, 1024)) == pytest.approx((0.95, 1.05))  # one point: +-5% at the point
    near, far, prior = rel(c.itl(8, 1024)), rel(c.itl(64, 1024)), rel(w.itl(64, 1024))
    assert 0.95 > near[0] > prior[0] and 1.05 < near[1] < prior[1]  # 0.3 decade out: part of the way back
    assert far == pytest.approx(prior)  # 1.2 decades out: the priors' own interval
    assert c.itl(64, 1024)["typical"] == pytest.approx(1.1 * w.itl(64, 1024)["typical"])


def test_a_calibrated_finite_run_narrows_its_decode_steps_not_its_prefill(tmp_path):
    """serve (and the card's finite run, `calibrate=`): the decode steps of the C running sequences take the
    points' interval where the points are (B = C, the run's mean context); the prompt chunks keep the priors'
    banded interval, which the points do not determine. Uncalibrated, nothing changes. (Bands of 0.15 in log, the
    shipped overall band at the time of writing, so that the test does not move with bands.yaml.)"""
    from roofline.analysis.calibrate import calibrated
    from roofline.commands.card import CardRequest, card_record, render_card
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    w = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="vllm", bands=(("all", 0.15),)))
    L = 1024 + 2048 // 2
    (tmp_path / "pts.yaml").write_text(yaml.safe_dump(dict(points=[
        dict(B=32, L=L, itl_ms=1.1e3 * w.itl(32, L)["typical"])])))
    c = calibrated(w, tmp_path / "pts.yaml")
    rel = lambda d: max(d["pessimistic"], d["optimistic"]) / min(d["pessimistic"], d["optimistic"])  # noqa: E731
    raw, cal = serve(w, 1024, 2048, 32, 64), serve(c, 1024, 2048, 32, 64)
    assert cal["itl_s"]["typical"] == pytest.approx(1.1 * raw["itl_s"]["typical"], rel=1e-6)
    assert rel(cal["itl_s"]) == pytest.approx(1.05 / 0.95)  # one point: +-5% at it
    assert rel(cal["itl_s"]) < rel(raw["itl_s"]) / 1.5
    assert rel(cal["output_tok_s"]) < rel(raw["output_tok_s"]) / 1.4  # a decode-heavy run: most of its time
    assert rel(cal["ttft_s"]) == pytest.approx(rel(raw["ttft_s"]))  # prompt chunks: the priors' own
    rec = card_record(CardRequest(model=cfg, device=dev, engine="vllm", batch=32, context=L, input_len=1024,
                                  output_len=2048, concurrency=32, num_prompts=64,
                                  calibrate=str(tmp_path / "pts.yaml")))
    assert rec["run_itl_median_ms"] == pytest.approx(1e3 * cal["itl_s"]["typical"])
    assert rec["whatif_itl_ms"] == pytest.approx(1.1e3 * w.itl(32, L)["typical"])
    assert rec["whatif_calibration"]["scale"] == pytest.approx(1.1) and "calibrated: x1.1" in render_card(rec)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(dict(points=[dict(B=2, L=1)])))
    with pytest.raises(ConfigError, match="tok_s_per_user|itl_ms"):
        card_record(CardRequest(model=cfg, device=dev, engine="vllm", calibrate=str(tmp_path / "bad.yaml")))


def test_calibrate_reads_a_sweeps_fit_json_of_the_same_model_only(tmp_path):
    from roofline.analysis.calibrate import calibrated, load_points
    fit = ROOT / "results" / "cpu-demo" / "fit.json"
    pts = load_points(fit, "cpu-demo", "bfloat16")
    assert pts and all(p["kernels_only"] and p["itl_ms"] > 0 for p in pts)
    w = WhatIf(get_preset("cpu-demo"), get_datasheet("h100_sxm"), "bfloat16", Layout(), S)
    c = calibrated(w, fit)
    B, L = pts[0]["B"], pts[0]["L"]
    assert c.calibration.B_range == (min(p["B"] for p in pts), max(p["B"] for p in pts))
    assert c.itl(B, L)["typical"] > 10 * w.itl(B, L)["typical"]  # a CPU sweep: far slower than an H100 datasheet
    with pytest.raises(ConfigError, match="the fit measured model 'cpu-demo'"):
        calibrated(WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), S), fit)
    with pytest.raises(ConfigError, match="no forward group in dtype 'float32'"):
        load_points(fit, "cpu-demo", "float32")


# ---- anchors -----------------------------------------------------------------------------------

def test_user_anchors_file_with_a_missing_key_is_one_line_exit_2(tmp_path):
    doc = yaml.safe_load((ROOT / "roofline" / "data" / "deployments.yaml").read_text())
    del doc["anchors"][0]["metric"]
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="missing key 'metric'"):
        anchors.load(tmp_path / "a.yaml")
    r = subprocess.run([sys.executable, "-m", "roofline.cli.anchors", f"anchors={tmp_path / 'a.yaml'}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "missing key 'metric'" in r.stderr and "Traceback" not in r.stderr


def _one_anchor(**over):
    a = dict(id="a1", source="s1", engine="vllm", device="h100_sxm", model="llama-3.1-8b", tp=1,
             workload=dict(B=1, L=1024), metric="itl_ms", value=7.5)
    a.update(over)
    return dict(sources=dict(s1=dict(title="t", url="u", split="calibration")), anchors=[a])


@pytest.mark.parametrize("doc, match", [
    (_one_anchor(workload=dict(B=1, context=1024)), r"anchors\[0\] \(a1\): workload: missing key 'L'"),
    (_one_anchor(workload=[1]), r"\(a1\): workload=\[1\]: expected a mapping"),
    (_one_anchor(metric="spec_speedup", spec=dict(drafter="eagle3", k=3, accepted_length=0.5)),
     r"\(a1\): spec.accepted_length=0.5: allowed numbers in \[1.0, inf\)"),
    (_one_anchor(metric="spec_speedup", spec=dict(drafter="eagle3", k=3, accepted_length=2.0, draft_vocab="x")),
     r"\(a1\): spec.draft_vocab='x'"),
    (_one_anchor(workload=dict(B="x", L=1)), r"\(a1\): workload.B='x': allowed integers >= 1"),
    (_one_anchor(workload=dict(concurrency=4, input_len=100), metric="output_tok_s"),
     r"\(a1\): workload .*missing key 'output_len'"),
    (_one_anchor(workload=dict(concurrency=4, input_len=9, output_len=9, num_prompts="x"), metric="output_tok_s"),
     r"\(a1\): workload.num_prompts='x'"),
    (_one_anchor(metric="output_tok_s"), r"\(a1\): metric='output_tok_s' needs a workload \{concurrency"),
    (_one_anchor(workload=dict(B=1, L=1, graph_batch_sizes=[1, "x"])),
     r"\(a1\): workload.graph_batch_sizes: 'x': allowed a size >= 1 or a range"),
    (_one_anchor(value=float("nan")), r"\(a1\): value=nan: allowed numbers in \(0.0, inf\)"),
    (_one_anchor(value=-1), r"\(a1\): value=-1: allowed numbers in \(0.0, inf\)"),
    (_one_anchor(tp="x"), r"\(a1\): tp='x': allowed integers >= 1"),
    (_one_anchor(dp_attention="yes"), r"\(a1\): dp_attention='yes': allowed true or false"),
    (_one_anchor(spec=[1]), r"\(a1\): spec=\[1\]: expected a mapping"),
    (dict(_one_anchor(), models=dict(m=dict(preset="llama-3.1-8b", overrides=dict(foo=1)))),
     r"models.m.overrides: .*'foo'"),
    (dict(_one_anchor(), sources=[1]), r"sources: expected a mapping"),
    (dict(_one_anchor(), sources=dict(s1=dict(split="train"))), r"sources.s1: split='train'"),
    (dict(_one_anchor(), anchors=[]), r"anchors: expected a non-empty list"),
    ([1, 2], r"expected a mapping with sources: and anchors:"),
])
def test_user_anchors_file_with_a_bad_field_is_one_line_naming_it(tmp_path, doc, match):
    """Each of these ended in a traceback (KeyError, AttributeError, TypeError: exit 1) or passed silently
    (a NaN or negative published value)."""
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=match):
        anchors.table(tmp_path / "a.yaml")


def test_a_user_anchors_file_names_the_anchor_of_a_bad_device_or_layout_and_prices_unpriced_ones(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_one_anchor(ep=2)))
    with pytest.raises(ConfigError, match=r"anchors\[0\] \(a1\): layout.ep=2"):
        anchors.table(tmp_path / "a.yaml")
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_one_anchor(device="h999")))
    with pytest.raises(ConfigError, match=r"anchors\[0\] \(a1\): device='h999'"):
        anchors.table(tmp_path / "a.yaml")
    # every anchor not priced (a speedup without k): a table of notes, not a KeyError
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(_one_anchor(metric="spec_speedup", value=1.5,
                                                                spec=dict(drafter="ngram", k="x", acceptance=0.7))))
    t = anchors.table(tmp_path / "a.yaml")
    assert t["predicted"].isna().all() and t["note"].iloc[0].startswith("not priced: k='x'")


def test_an_anchors_client_that_is_neither_server_nor_offline_names_the_anchor_or_source(tmp_path):
    doc = yaml.safe_load((ROOT / "roofline" / "data" / "deployments.yaml").read_text())
    doc["anchors"][0]["client"] = "batch"
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=rf"anchors\[0\] \({doc['anchors'][0]['id']}\): client='batch'"):
        anchors.load(tmp_path / "a.yaml")
    del doc["anchors"][0]["client"]
    doc["sources"][doc["anchors"][0]["source"]]["client"] = "http"
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=rf"sources\.{doc['anchors'][0]['source']}: client='http'"):
        anchors.load(tmp_path / "a.yaml")


def test_no_test_anchor_source_is_cited_by_a_prior():
    data = ROOT / "roofline" / "data"
    paths = [data / "priors.yaml", data / "kernels.yaml", data / "engines.yaml"]
    assert anchors.test_sources_cited_by_priors(prior_paths=paths) == []
    # the check can fail: a prior citing a test source's url is caught
    _, sources, _ = anchors.load()
    test_src = next(s for s in sources.values() if s.get("split") == "test")
    assert test_src["url"] in anchors.prior_sources([data / "deployments.yaml"])


def test_deployments_have_both_splits_and_enough_sources():
    _, sources, rows = anchors.load()
    splits = {s.get("split") for s in sources.values()}
    assert splits == {"calibration", "test"} and len(rows) >= 40


@functools.lru_cache(maxsize=1)
def _shipped_table():
    """deployments.yaml priced once for the slow tests that read it (~15 s)."""
    return anchors.table()


@pytest.mark.slow
def test_the_committed_anchor_results_and_the_docs_are_what_the_code_prices_now():
    """results/parallel/anchors.csv, anchors.json, anchors.md and the DeepSeek-V3 MTP trend are what
    `python -m roofline.cli.anchors 'trend=[sglang-dsv3-mtp-b1]' out_dir=results/parallel` writes from this commit's code and data (regenerate them with a change that
    moves a prediction), and docs/planning.md quotes the summary rows of anchors.md as they are."""
    fresh, out = _shipped_table(), ROOT / "results" / "parallel"
    shipped = pd.read_csv(out / "anchors.csv").fillna({"category": "", "note": "", "band_categories": ""})
    assert list(shipped["id"]) == list(fresh["id"])
    for col in ("predicted", "low", "high", "error_pct", "half_width_pct"):
        assert np.allclose(shipped[col], fresh[col].astype(float), rtol=1e-9, equal_nan=True), col
    assert list(shipped["inside"]) == list(fresh["inside"])
    assert (out / "anchors.md").read_text() == anchors.markdown(shipped) == anchors.markdown(fresh)
    trend = pd.read_csv(out / "trend-sglang-dsv3-mtp-b1.csv")
    assert np.allclose(trend.to_numpy(), anchors.trend("sglang-dsv3-mtp-b1").to_numpy(), rtol=1e-9)
    summary = json.loads((out / "anchors.json").read_text())
    assert summary["test"]["all"]["n"] == anchors.summary(fresh)["test"]["all"]["n"]
    from roofline.analysis.calibrate import anchors_leave_one_out, leave_one_out_markdown, leave_one_out_summary
    loo = {m: leave_one_out_summary(anchors_leave_one_out(nearest=n))
           for m, n in (("all other points", False), ("the nearest point", True))}
    assert (out / "calibrated.md").read_text().endswith(leave_one_out_markdown(loo))
    assert summary["calibrated_leave_one_out"] == json.loads(json.dumps(loo))
    planning = (ROOT / "docs" / "planning.md").read_text()
    for line in anchors.markdown(fresh).splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 7 or cells[1] != "all":
            continue  # the test and calibration summaries overall are the ones planning.md quotes
        split, _, n, med, signed, inside, width = cells
        assert f"| {split} | {n} | {med} | {signed} | {inside} | {width} |" in planning, line


@pytest.mark.slow
def test_test_set_error_and_bias_are_bounded_at_the_measured_level():
    """The held-out (test-split) anchors, priced with the engine each ran, their intervals widened by the
    conformal bands of the calibration anchors no prior cites (each source weighing one): bounds at the level
    measured when this test was last set plus a small margin, so a regression fails. All 109 test rows: median
    |error| 23.0%, signed median +16.1%, 83% inside, half-width 38.2%; quantized 23.3% / +15.9%, TP and MoE 28.1% /
    +24.9% (stop 71: a new test source, the first multi-node deployment, DeepSeek-R1-0528 with TP16 over two 8-GPU H100
    nodes joined by InfiniBand, SGLang and vLLM, tenstorrent/tt-inference-server issue #356: its 6 TPOT rows are
    priced 26-52% too fast, all inside their wide intervals; no earlier prediction moved, and the 103 rows before it are
    held at their own bounds below). All 103 test rows before it: median
    |error| 21.3%, signed median +15.0%, 83% inside, half-width 37.4% (stop 70: the Marlin MoE kernel's compute share
    has the H20's FLOP/s per SM as its pessimistic end on another Hopper part, which put seven of TensorRT-LLM's Hopper
    gpt-oss rows inside their intervals, 76% -> 83%, half-width 36.9 -> 37.4%, no prediction moved; a weight-only MoE kernel's
    compute-bound end at its own measured share, vLLM's Marlin MoE on an H20, moved TensorRT-LLM's Hopper gpt-oss rows
    0-19 points closer and the median row, DeepSeek-V3 AWQ at 32 requests of 4K on 4 H200s, -21.2 -> -23.2%, its
    prompts' experts slower: the median 21.2 -> 21.3%, quantized 21.2 -> 22.1%, its bound 21.7 -> 22.5; the held-out
    Marlin MoE kernel check 26.7 -> 7.5%. 21.2% / +15.0% / 76% before it; 21.3% / +15.4% / 73% before SGLang's EAGLE
    and MTP rounds paid the host time its overlap scheduler, off for them, hides: 1.1-2.0 ms a round, measured with
    the overlap on and off in SGLang PRs #11398 and #12128; SpecForge's rows +29..+87% -> +14..+54%, PR #4716's +58 ->
    +42%, the DeepSeek-V3 MTP README's -4.7 / +0.7% -> -16.2 / -4.4%; speculative 51.1% -> 26.8%, MoE 29.9% / +25.1%
    -> 26.8% / +22.9%, TP 29.9% / +24.4% -> 25.9% / +20.3%; +15.7% before an eager engine's host issue ran
    beside its GPU work at the Qwen 1 runs' measured host time a layer: the AutoAWQ rows -7 / +4 -> -23 / -7%, the
    eager gpt-fast baseline +43 -> -15%; quantized 21.0 -> 21.2%); MoE 26.8% / +22.9%, TP 25.9% / +20.3%,
    speculative 11 rows 26.8% / +26.8% (94 rows: 20.0% / +12.5% / 78% / 37.1%, MoE 25.9% / +18.2%, TP 23.7% / +14.0%,
    speculative 2 rows 2.7%, before SGLang's EAGLE-3 rows: SpecForge issue #339's 8 on Qwen3-30B-A3B, whose rounds ran
    0.72-0.93x of the plain step's speed where 1.08-1.43x are priced, and SGLang PR #4716's Llama-3.3-70B tree,
    2.65x where 4.18x is priced: new test sources, no earlier prediction moved; SGLang's own round time is not
    measured in any calibration source, so its rounds kept priors.yaml's 10-60 us; 19.0% / +12.6%, MoE +16.5%, before
    vLLM V0 ran its prompts as its scheduler does, in steps of their own up to the model's context unless its
    default rule turns chunked prefill on: six of its seven test rows closer, the MI300X 10000 / 500 row +15 -> +77%,
    one row across the median; 84% / 42.6% before the trtllm-0.6 profile priced
    TensorRT-LLM v0.5 - v0.6.1's GQA decode reads, which brought the H200 launch blog's calibration rows closer and so
    narrowed the TP and batch bands: no test prediction moved; 20.3% / +15.2% / 83% before vLLM PR #17530's
    MI300X rows took the V0 engine they ran, 20.0% before TensorRT-LLM 1.0's rows queued every request; 20.3% / +12.5% before a bf16 GEMM streamed
    at one fraction while memory-bound, 22.4% / +13.5% before the Triton fused_moe kernel's own compute share; 85% / 51.5% before SGLang's eager prompt
    steps of MLA models narrowed the TP and quantized bands; 21.6% / +14.8% before TensorRT-LLM's
    perf-overview runs padded their decode batches to the CUDA-graph sizes their pages print, engine behaviour that
    slowed its 70B rows of the 35 held out before, already too slow, and its too-fast gpt-oss and Scout rows; 20.7% /
    +16.8% / 86% / 52.8% before a block's
    norms, rotary and gated activation and a GEMM's input and output rows moved their activations, physics that
    slowed the too-fast rows and moved rows near the median across it; 84% / 52.6% before mxfp4 multiplied at the
    engine's activation rate on Blackwell; 25.0% / +16.5% / 86% / 52.8% before
    TensorRT-LLM's caps bounded each attention-DP rank, engine behaviour that made its DEP runs faster; 21.5% /
    +10.2% / 87% / 52.2% before a run's
    last partial wave was priced at its own batch, a bug fix that made the capped runs faster; 18.5% before the H20-measured Marlin MoE tables were carried to other Hopper parts by their SMs,
    which made TensorRT-LLM's Hopper gpt-oss rows faster still; 20.6% before CDNA3's cost per running sequence moved
    one MI300X row across the median; 23.0% before an MLA prompt was priced as multi-head attention: one row crossed
    a gap in the sorted errors), signed median +10.2% (too fast), 87% inside, median half-width 52.2% (45.1% before
    the ROCm blog's page became a prior's source, vllm-v0-rocm, and its 32 rows left the bands); now: quantized
    21.0% / +13.7%, TP 23.7% / +14.0%, MoE 25.9% / +18.2% (20.5% / +13.7%, 25.1% / +15.5% and 25.9% / +16.5% before
    V0's prompt steps; 21.3% / +15.6% and 28.1% / +20.3% before the MI300X rows'
    engine; 24.2%, 29.0% and 29.2% before the fused_moe compute share;
    their history: docs/planning.md). The 35 rows held out
    before 2026-12-06 (sources of dense, int4 / int8, fp8 and MoE deployments of 2023-2025): 11.2% / -5.4% (11.1% /
    -4.9% before SGLang's round host time, which slowed the DeepSeek-V3 MTP README's two rows among them; 10.4% /
    -2.9% before the eager host queue; -4.7%
    before V0's prompt steps; 10.4% / +0.7% before
    the MI300X rows' engine, 10.7% before TensorRT-LLM 1.0's rows queued every request, -2.5% before the flat bf16
    streaming, 9.3% before the padding), held apart so that the 59 rows added with the fp4 formats, gpt-oss and Llama 4 (29.9% / +24.4%:
    docs/planning.md, "Validation") cannot hide a regression on them. Of the issue's targets (10%, +-5%, 80% inside, half-width <= 25%) only the share
    inside was met on all 94 rows (84%) before stop 59's narrower bands, none is now; on the 35, the signed median was
    met until SGLang's round host time (and the median was, to 9.3%). The calibration split
    is held too (311 rows: 10.7%, +0.0%, 92% inside, half-width 43.3%; 308 rows, 10.8% / -0.1%, before the Qwen 1
    eager runs; 287 rows: 11.0%, -0.3%, 91% inside, half-width 43.4%; 11.1% before gpt-fast's decode read its whole
    static cache; 10.9% / 92% / 43.6% before V0's prompt steps; 275 rows before GPT-J and Falcon-180B: 11.2%, +0.9%, 94%, 51.1%; 11.5% before the fused_moe compute share; 11.9% / 96% / 60.5% before SGLang's eager prompt
    steps; 12.0% / +1.7% before the elementwise traffic;
    14.3% before the Marlin MoE tables' SM
    transfer, 15.3% before CDNA3's cost per running sequence; 15.5% before an MLA prompt was priced as
    multi-head attention, 15.2% before a routed pair's activations were
    priced, 15.5% before the ROCm build of vLLM V0 had its own host time; 16.4% before dstack's SGLang 0.4 rows took the
    sglang-0.4 profile; 14.9% before the fp4 GEMMs' call floor, which moved its one fp4 source, DeepSeek-R1 FP4 on
    B300, from -4.7% to -18.6%)."""
    t_all = _shipped_table()
    s = anchors.summary(t_all)
    t, q, m, c = s["test"]["all"], s["test"]["quantized"], s["test"]["moe"], s["calibration"]["all"]
    tp, sp = s["test"]["tp"], s["test"]["speculative"]
    assert t["n"] >= 109
    assert t["median_abs_error_pct"] <= 23.5
    assert abs(t["signed_median_fast_pct"]) <= 16.5
    assert t["inside_interval"] >= 0.80
    assert t["median_half_width_pct"] <= 38.5
    assert q["median_abs_error_pct"] <= 23.5 and abs(q["signed_median_fast_pct"]) <= 16.5
    assert tp["median_abs_error_pct"] <= 28.5 and abs(tp["signed_median_fast_pct"]) <= 25.5
    assert m["median_abs_error_pct"] <= 28.5 and abs(m["signed_median_fast_pct"]) <= 25.5
    multinode = ("tt_inference_server_issue356_dsr1",)  # 2026-12-08: TP16 across two nodes
    prior = anchors.summary(t_all[~t_all["source"].isin(multinode)])["test"]
    assert prior["all"]["n"] == 103 and prior["all"]["median_abs_error_pct"] <= 22.0
    assert abs(prior["all"]["signed_median_fast_pct"]) <= 15.5 and prior["all"]["inside_interval"] >= 0.80
    assert prior["all"]["median_half_width_pct"] <= 38.0
    pq = prior["quantized"]
    assert pq["median_abs_error_pct"] <= 22.5 and abs(pq["signed_median_fast_pct"]) <= 14.5
    assert prior["tp"]["median_abs_error_pct"] <= 27.0 and abs(prior["tp"]["signed_median_fast_pct"]) <= 21.5
    assert prior["moe"]["median_abs_error_pct"] <= 28.0 and abs(prior["moe"]["signed_median_fast_pct"]) <= 24.0
    assert sp["n"] == 11 and sp["median_half_width_pct"] >= 10.0 and sp["median_abs_error_pct"] <= 28.5
    assert c["n"] >= 270 and c["median_abs_error_pct"] <= 12.0 and abs(c["signed_median_fast_pct"]) <= 5.0
    assert c["inside_interval"] >= 0.88
    assert c["median_half_width_pct"] <= 44.5
    added = ("trtllm_perf_overview_gptoss", "trtllm_perf_fp4_03e27c7", "lmsys_blog_sglang_gptoss_2025_08",
             "vllm_blog_llama4_2025_04", "trtllm_perf_overview_llama4_maverick", "trtllm_perf_v10_llama4_scout")
    later = ("specforge_issue339_qwen3_eagle3", "sglang_pr4716_eagle3_70b")  # 2026-12-07, with the EAGLE heads
    before = anchors.summary(t_all[~t_all["source"].isin(added + later + multinode)])["test"]["all"]
    assert before["n"] == 35
    assert before["median_abs_error_pct"] <= 11.5 and abs(before["signed_median_fast_pct"]) <= 5.5


def test_a_speedups_interval_widens_with_its_acceptance_range_and_carries_the_drafts_priors():
    """A speculative speedup's interval carries every input's range: the acceptance at both ends of what
    the source states, the round overhead and the drafts' passes at their own ends (priced apart from T(1)
    and the verification, which share theirs)."""
    models, _, rows = anchors.load()
    a = next(r for r in rows if r["id"] == "sglang-dsv3-mtp-b1")
    raw = Setting(engine="sglang", bands=())

    def width(acc):
        p = anchors.what_if(dict(a, spec=dict(a["spec"], acceptance=acc)), models[a["model"]], raw, models)
        return p["optimistic"] - p["pessimistic"]
    assert 0 < width([0.875]) < width([0.9, 0.85]) < width([0.95, 0.75])
    # one acceptance: SGLang's round time (1.1-2.0 ms) and the MTP pass's own kernel priors still span the interval
    w = WhatIf(models[a["model"]], get_datasheet("h200_sxm"), anchors.served_precision(a, models[a["model"]]),
               Layout(tp=8), raw)
    s = w.spec_speedup((0.875,) * 3, 1, 1, 1024)
    tied = [max(w.target(1, 1, 1024, j) * 1.875 / w.round_seconds(1, 1, 1024, j, own_scenario=0) for j in range(3)),
            min(w.target(1, 1, 1024, j) * 1.875 / w.round_seconds(1, 1, 1024, j, own_scenario=2) for j in range(3))]
    assert s["optimistic"] == pytest.approx(tied[0]) and s["pessimistic"] == pytest.approx(tied[1])
    assert (s["optimistic"] - s["pessimistic"]) / s["typical"] > 0.02


def _subset(tmp_path, name, scale_split=None, factor=1.0):
    """deployments.yaml with 12 calibration anchors of sources no prior cites (round-robin over their
    sources, so at least four sources: the bands weigh each source once), 4 of sources a prior cites and 4
    test anchors (decode-step and finite-run ones); the published values of one split ("calibration",
    "in_sample": the prior-cited calibration ones, or "test") multiplied by factor."""
    doc = yaml.safe_load((ROOT / "roofline" / "data" / "deployments.yaml").read_text())
    text = anchors.prior_sources(anchors.PRIOR_PATHS)
    split = {sid: s.get("split", "calibration") for sid, s in doc["sources"].items()}
    split = {sid: "in_sample" if sp == "calibration" and anchors.cited_by(sid, doc["sources"][sid], text) else sp
             for sid, sp in split.items()}
    priced = [a for a in doc["anchors"] if "spec" not in a and not doc["sources"][a["source"]].get("dataset")]
    by_source = {}
    for a in priced:
        if split[a["source"]] == "calibration":
            by_source.setdefault(a["source"], []).append(a)
    rr = [rows[i] for i in range(max(map(len, by_source.values()))) for rows in by_source.values() if i < len(rows)]
    chosen = {"calibration": rr[:12], "in_sample": [a for a in priced if split[a["source"]] == "in_sample"][:4],
              "test": [a for a in priced if split[a["source"]] == "test"][:4]}
    for k, n in {"calibration": 12, "in_sample": 4, "test": 4}.items():
        assert len(chosen[k]) == n, k
    assert len({a["source"] for a in chosen["calibration"]}) >= 4
    for k, rows in chosen.items():
        for a in rows:
            if k == scale_split:
                a["value"] = a["value"] * factor
    doc["anchors"] = [a for rows in chosen.values() for a in rows]
    p = tmp_path / name
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p


def test_the_error_bands_come_from_calibration_anchors_only(tmp_path):
    """Split conformal: changing a test anchor's published value changes no band and no interval, nor does
    changing a calibration anchor of a source a prior cites (priced in-sample); changing the other
    calibration anchors' does."""
    cols = ["id", "low", "high"]
    base = anchors.table(_subset(tmp_path, "base.yaml"))
    moved_test = anchors.table(_subset(tmp_path, "t.yaml", "test", 3.0))
    moved_cited = anchors.table(_subset(tmp_path, "i.yaml", "in_sample", 3.0))
    moved_cal = anchors.table(_subset(tmp_path, "c.yaml", "calibration", 1.6))
    assert base["prior_cited"].sum() == 4 and not base[base["split"] == "test"]["prior_cited"].any()
    for moved in (moved_test, moved_cited):
        assert moved.attrs["bands_log"] == base.attrs["bands_log"]
        assert moved[cols].equals(base[cols])
    assert moved_cal.attrs["bands_log"]["all"] > base.attrs["bands_log"]["all"]
    assert not moved_cal[cols].equals(base[cols])
    # a band widens both ends by its factor, typical kept, in either direction of the unit
    from roofline.parallel.whatif import widen
    iv = widen(dict(optimistic=1.0, typical=2.0, pessimistic=3.0), 0.1)
    assert iv["optimistic"] == pytest.approx(math.exp(-0.1)) and iv["pessimistic"] == pytest.approx(3 * math.exp(0.1))
    iv = widen(dict(optimistic=3.0, typical=2.0, pessimistic=1.0), 0.1)  # tokens/s: the optimistic end is the high
    assert iv["optimistic"] == pytest.approx(3 * math.exp(0.1)) and iv["typical"] == 2.0


@pytest.mark.slow
def test_a_file_with_too_few_calibration_anchors_takes_the_shipped_bands(tmp_path):
    """Below 4 kept calibration sources an 80% split-conformal band has no finite quantile: the table takes
    bands.yaml's instead of an interval of 0 to infinity, and says so."""
    from roofline.parallel.whatif import load_bands
    doc = yaml.safe_load(_subset(tmp_path, "base.yaml").read_text())
    text = anchors.prior_sources(anchors.PRIOR_PATHS)
    kept = [a for a in doc["anchors"] if doc["sources"][a["source"]].get("split") == "calibration"
            and not anchors.cited_by(a["source"], doc["sources"][a["source"]], text)]
    doc["anchors"] = kept[:2] + [a for a in doc["anchors"] if doc["sources"][a["source"]].get("split") == "test"]
    p = tmp_path / "few.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert math.isinf(anchors.conformal_bands(anchors.table(p, bands=()))["bands_log"]["all"])
    t = anchors.table(p)
    assert t.attrs["bands_log"] == dict(load_bands()) and "bands.yaml" in t.attrs["bands_from"]
    priced = t[t["predicted"].notna()]
    assert len(priced) >= 4 and np.isfinite(priced[["low", "high"]].to_numpy(float)).all()
    assert _shipped_table().attrs["bands_from"] == "this file's calibration anchors"


def test_the_shipped_error_bands_are_those_of_the_calibration_anchors():
    """roofline/data/bands.yaml (read by every what-if prediction) equals the bands the calibration split
    gives now: regenerate it (anchors.write_bands) after a change to the priors or the anchors."""
    from roofline.parallel.whatif import load_bands
    got = anchors.conformal_bands(anchors.table(bands=()))["bands_log"]
    assert {k: round(v, 4) for k, v in got.items()} == pytest.approx(dict(load_bands()), abs=1e-4)


def _graph_fit(tmp_path):
    """A GPU-fit-shaped document: the shipped CPU fit's groups relabelled as a graph-mode fit."""
    fit = json.loads((ROOT / "results" / "cpu-demo" / "fit.json").read_text())
    for g in fit["groups"]:
        g["key"]["mode"] = "graph"
    return fit


def test_a_graph_mode_fit_transferred_to_qwen3_moe_prices_touched_experts(tmp_path):
    from roofline.analysis.costmodel import predict_detail
    fit, cfg = _graph_fit(tmp_path), get_preset("qwen3-30b-a3b")
    d1 = predict_detail(fit, "forward", "bfloat16", 1, 1, 128, "graph", cfg)
    d2 = predict_detail(fit, "forward", "bfloat16", 1, 2, 128, "graph", cfg)
    assert d1["source"] == "device-fit-transfer" and d1["extrapolated"]
    assert d2["seconds"] / d1["seconds"] > 1.3  # a second token touches ~7.5 more experts; dense was 1.00
    assert d1["band_widened_by_pct"] > 0 and d1["p90_s"] > d1["seconds"]


def test_a_dequantise_per_step_kv_row_is_priced_as_what_it_moved():
    from roofline.model.accounting import forward_cost
    cfg = get_preset("llama-3.1-8b")  # 32 layers, 8 KV heads x 128: 2048 K+V elements per token and layer
    fused = forward_cost(cfg, "bfloat16+kv=fp8_e4m3", 4, 1, 1023)
    moved = forward_cost(cfg, "bfloat16+kv=fp8_e4m3", 4, 1, 1023, kv_impl="dequant")
    # + the bf16 copy written and read again: 2 x 4 seqs x 32 layers x 1024 positions x 2048 elements x 2 B
    assert moved.kv_read_bytes - fused.kv_read_bytes == 2 * 4 * 32 * 1024 * 2048 * 2
    assert forward_cost(cfg, "bfloat16", 4, 1, 1023, kv_impl="dequant").kv_read_bytes == \
        forward_cost(cfg, "bfloat16", 4, 1, 1023).kv_read_bytes  # a float cache has no copy


def test_one_moe_mode_rule_covers_one_device_and_sharded_runs():
    """accounting.moe_impl_for_mode is the one home: the sweep (one device) and the sharded runner
    both take it; sharded graph mode is refused for an MoE with the rule's reason."""
    from roofline.model.accounting import SHARDED_MOE_NO_GRAPH, moe_impl_for_mode
    assert [moe_impl_for_mode(m) for m in ("eager", "graph", "compiled")] == ["touched", "dense", "dense"]
    assert [moe_impl_for_mode(m, sharded=True) for m in ("eager", "compiled")] == ["touched", "touched"]
    with pytest.raises(ValueError, match="CUDA-graph capture"):
        moe_impl_for_mode("graph", sharded=True)
    import inspect
    from roofline.measure import sweep
    from roofline.parallel import runner
    for mod in (sweep, runner):  # no second home: neither names an implementation itself
        src = inspect.getsource(mod)
        assert 'moe_impl="touched"' not in src and 'moe_impl="dense"' not in src, mod.__name__
    from roofline.measure.sweep import SweepRequest
    from roofline.model.presets import scaled_down
    cfg = scaled_down(get_preset("mixtral-8x7b"), layers=2)
    with pytest.raises(ConfigError) as e:
        SweepRequest(model=cfg, q=(1,), B=(2,), L=(8,), parallel=Layout(tp=2, ep=2), modes=("graph",), device="cuda")
    assert SHARDED_MOE_NO_GRAPH in str(e.value)


def test_a_new_single_device_sweep_of_an_moe_in_graph_or_compiled_mode_is_refused_with_why():
    """Where the grouped MoE path cannot capture (no Hopper/Blackwell GPU, or not bfloat16) the rule
    refuses a new run (one line naming the mode and why, exit 2 through ConfigError); rows measured in
    those modes before ran every expert and are still priced so; modes=[auto] runs an MoE eager and says so."""
    from roofline.measure.sweep import SweepRequest, _runnable_mode
    from roofline.model.accounting import MOE_NO_STATIC_GRAPH, moe_impl_for_mode
    from roofline.model.presets import scaled_down
    cfg = scaled_down(get_preset("mixtral-8x7b"), layers=2)
    for mode, device in (("graph", "cuda"), ("compiled", "cpu")):
        with pytest.raises(ConfigError) as e:
            SweepRequest(model=cfg, q=(1,), B=(2,), L=(8,), modes=(mode,), device=device)
        assert f"modes=['{mode}']" in str(e.value) and MOE_NO_STATIC_GRAPH in str(e.value)
        with pytest.raises(ValueError, match="use modes=\\[eager\\]"):
            moe_impl_for_mode(mode, new_run=True)
        assert moe_impl_for_mode(mode) == "dense"  # how such a row, measured before, is priced
    SweepRequest(model=cfg, q=(1,), B=(2,), L=(8,), modes=("eager",), device="cpu")  # eager runs touched experts
    SweepRequest(model=get_preset("tiny"), q=(1,), B=(2,), L=(8,), modes=("compiled",), device="cpu")  # dense models: as before
    mode, why = _runnable_mode(cfg, "graph", "cpu", "bfloat16")  # what modes=[auto] becomes for an MoE here
    assert mode == "eager" and "an MoE model runs eager" in why
    assert _runnable_mode(get_preset("tiny"), "graph", "cpu", "bfloat16") == ("graph", "")


def test_where_the_grouped_moe_captures_a_graph_or_compiled_sweep_runs_it_priced_touched(monkeypatch):
    """On a GPU whose grouped GEMM runs on the device (bfloat16, sm90/sm100) the rule gives graph and
    compiled mode the grouped path: the same touched experts, priced as touched; other dtypes there
    are still refused, naming what the grouped path needs."""
    from roofline.measure import sweep
    from roofline.model import decoder
    from roofline.model.accounting import MOE_NO_STATIC_GRAPH, experts_touched, forward_cost, moe_impl_for_mode
    from roofline.model.presets import scaled_down
    assert [moe_impl_for_mode(m, new_run=True, grouped=True) for m in ("eager", "graph", "compiled")] == \
        ["touched", "grouped", "grouped"]
    cfg = scaled_down(get_preset("qwen3-30b-a3b"), layers=2)
    assert experts_touched(cfg, 3, "grouped") == experts_touched(cfg, 3, "touched") < cfg.experts
    big = get_preset("qwen3-30b-a3b")
    assert forward_cost(big, "bfloat16", 1, 1, 128, moe_impl="grouped").weight_bytes == \
        forward_cost(big, "bfloat16", 1, 1, 128, moe_impl="touched").weight_bytes
    monkeypatch.setattr(decoder, "grouped_capturable", lambda dev, dt: dt == decoder.torch.bfloat16)
    sweep.SweepRequest(model=cfg, q=(1,), B=(2,), L=(8,), modes=("graph",), dtypes=("bfloat16",), device="cuda")
    assert sweep._moe_impl(cfg, "graph", "cuda", "bfloat16") == "grouped"
    assert sweep._runnable_mode(cfg, "graph", "cuda", "bfloat16") == ("graph", "")
    with pytest.raises(ConfigError) as e:
        sweep.SweepRequest(model=cfg, q=(1,), B=(2,), L=(8,), modes=("graph",), dtypes=("float16",), device="cuda")
    assert "dtypes=['float16']" in str(e.value) and MOE_NO_STATIC_GRAPH in str(e.value) and "sm90" in str(e.value)
    with pytest.raises(ConfigError):  # quantized experts have no grouped path
        sweep.SweepRequest(model=cfg, q=(1,), B=(2,), L=(8,), modes=("graph",), dtypes=("bfloat16+weights=int8",),
                           device="cuda")


@pytest.mark.parametrize("ran, source", [("grouped", "fit"), ("dense", "device-fit-transfer"),
                                         (None, "device-fit-transfer")])
def test_a_graph_mode_fit_of_an_moe_is_its_own_when_its_rows_ran_the_grouped_path(ran, source):
    """A GPU fit of Qwen3-30B-A3B in graph mode: rows of the grouped path ran the touched experts, so the
    fit predicts its own model; rows that ran every expert (or a fit from before the group recorded
    what ran, graph mode then meaning dense) are applied to the touched accounting as a transfer.
    Either way the step is priced touched: a second token costs more than the first."""
    from roofline.analysis.costmodel import predict_detail
    cfg = get_preset("qwen3-30b-a3b")
    fit = json.loads((ROOT / "results" / "cpu-demo" / "fit.json").read_text())
    fit["model_spec"] = cfg.to_dict()
    for g in fit["groups"]:
        g["key"].update(mode="graph", model=cfg.name)
        if ran is None:
            g.pop("moe_impl", None)
        else:
            g["moe_impl"] = ran
    d1 = predict_detail(fit, "forward", "bfloat16", 1, 1, 128, "graph", cfg)
    d2 = predict_detail(fit, "forward", "bfloat16", 1, 2, 128, "graph", cfg)
    assert d1["source"] == source
    assert d2["seconds"] > d1["seconds"]


@pytest.mark.parametrize("graphs", [True, False])
def test_a_datasheet_what_if_of_qwen3_moe_in_graph_mode_prices_the_touched_experts(graphs):
    """The shipped engine data, CUDA graphs on (graph mode) or off: the experts are the ones B*q
    tokens touch (8 of 128 at one token, ~15.5 at two), never all of them; graphs change the launch
    floor (or, off, the host's issue beside the GPU) only: the step's GPU work is under half a dense read."""
    from roofline.model.accounting import experts_touched
    cfg, dev = get_preset("qwen3-30b-a3b"), get_datasheet("h100_sxm")
    w = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="vllm", graphs=graphs))
    assert w.experts_touched(1) == pytest.approx(8.0) and w.experts_touched(2) == pytest.approx(
        experts_touched(cfg, 2))
    t1, t2 = w.target(1, 1, 1024, 1), w.target(1, 2, 1024, 1)
    e1, e2 = (w.pass_detail(Pass(B, 1, 1024), 1, "vllm")["terms"]["experts"] for B in (1, 2))
    assert t2 > t1 and e2 / e1 > 1.3  # priced dense (all 128 experts read at any batch) both ratios were 1.00
    dense_GB = 2 * 30.5e9 / 1e9
    d1 = w.pass_detail(Pass(1, 1, 1024), 1, "vllm")
    gpu1 = d1["seconds"] - d1["terms"]["per_layer"] - d1["terms"]["step_overhead"]
    assert gpu1 < 0.5 * dense_GB / 3350 and (t1 < 0.5 * dense_GB / 3350 or not graphs)


def test_a_graph_mode_fit_of_qwen3_moe_itself_prices_the_touched_experts():
    """A fit of Qwen3-30B-A3B's own graph-mode rows (which ran and were priced dense: all 128 experts)
    predicts a step of that model with the touched experts, as a device-fit transfer: T(2)/T(1)
    follows the experts a second token touches, where the dense rows' own table says ~1.00."""
    import dataclasses
    import pandas as pd
    from roofline.analysis import costmodel as cm
    cfg = get_preset("qwen3-30b-a3b")
    rows = []
    for q in (1, 2, 4, 8, 16, 32):
        for B in (1, 2, 4):
            for L in (128, 1024):
                r = cm.cost_row(cfg, "forward", "bfloat16", q, B, L, "graph")
                assert r["experts_touched"] == cfg.experts  # what the decoder ran under capture
                t = 2e-4 + (r["weight_bytes"] + r["kv_read_bytes"] + r["kv_write_bytes"]) / 3.0e12 \
                    + r["flops_matmul"] * max(0, 1 - 64 / (B * q)) / 6e14 + r["flops_attention"] / 3e14
                rows.append({**r, "device_name": "NVIDIA H100 80GB HBM3", "model": cfg.name, "dtype": "bfloat16",
                             "mode": "graph", "kind": "forward", "q": q, "B": B, "L": L, "t_median_s": t,
                             "status": "ok", "layers_run": cfg.layers, "layers_full": cfg.layers})
    group, _ = cm.fit_group(pd.DataFrame(rows), cm.FitSettings(), ceilings=None)
    fit = dict(schema=cm.FIT_SCHEMA, groups=[group], model_spec=dataclasses.asdict(cfg),
               provenance=dict(device_name="NVIDIA H100 80GB HBM3"))
    d1 = cm.predict_detail(fit, "forward", "bfloat16", 1, 1, 128, "graph")
    d2 = cm.predict_detail(fit, "forward", "bfloat16", 1, 2, 128, "graph")
    assert d1["source"] == "device-fit-transfer" and d1["step_source"] == "fit"
    dense_ratio = rows[2]["t_median_s"] / rows[0]["t_median_s"]  # the rows' own B=2 / B=1 at q=1, L=128
    assert dense_ratio < 1.01 and d2["seconds"] / d1["seconds"] > 1.3
    assert d1["seconds"] < 0.3 * rows[0]["t_median_s"]  # 8 of 128 experts read, not all


def test_predict_what_if_honours_drafter_mode_and_out_dir_and_refuses_what_only_a_fit_reads(fixture_data, tmp_path):
    """The datasheet what-if of `predict` prices the drafter asked for (it printed the MTP module's speedups for
    drafter=ngram or draft_model, and a model without MTP at k = 0 only whatever the drafter), takes mode= as
    CUDA graphs or not, writes its table where out_dir= says, and refuses, by name, the keys only a fit's
    prediction reads (they were ignored)."""
    from roofline.commands.predict import DEVICE_AS, predict_command

    def run(*over):
        c = composed("predict", "model=llama-3.1-8b", "device=h100_sxm", "engine=vllm", "B=[1,16]", "L=[1024]",
                     "k=[0,2]", "alphas=[0.8]", *over, device_as=DEVICE_AS)
        c.pop("overrides", None)
        return predict_command(c)

    def table(text):
        return pd.read_fwf(__import__("io").StringIO(text.split("\nwarning")[0]))

    _, s_mtp = run()
    assert s_mtp["rows"] == 2 and "no MTP module" in s_mtp["note"]  # llama: drafter=mtp is plain decode only
    t_ng, s_ng = run("drafter=ngram")
    t_dm, s_dm = run("drafter=draft_model", "draft_model=llama-3.1-8b")
    ng, dm = table(t_ng), table(t_dm)
    assert s_ng["rows"] == s_dm["rows"] == 4 and s_ng["note"] is None and s_dm["draft_model"] == "llama-3.1-8b"
    assert set(ng["drafter"]) == {"ngram"} and set(dm["drafter"]) == {"draft_model"}
    k2 = lambda t: t[t["k"] == 2].set_index("B")["S"]  # noqa: E731
    assert (k2(dm) < k2(ng)).all() and (k2(dm) < 1.0).all()  # an 8B drafting for itself costs more than it saves
    t_e, s_e = run("mode=eager")
    t_g, s_g = run("mode=graph")
    assert s_e["cuda_graphs"] is False and s_g["cuda_graphs"] is True
    assert (table(t_e)["itl_ms"] > table(t_g)["itl_ms"]).all()
    _, s_out = run(f"out_dir={tmp_path / 'wi'}")
    assert len(pd.read_csv(tmp_path / "wi" / "predict.csv")) == 2
    assert json.loads((tmp_path / "wi" / "predict.json").read_text())["source"] == "what-if"
    for bad, name in (("overhead_share=2.0", "overhead_share"), ("plot_B=16", "plot_B"), ("draft_fit=x.json", "draft_fit"),
                      ("mode=fast", "mode"), ("drafter=draft_model", "draft_model")):
        with pytest.raises(ConfigError, match=name):
            run(bad)


def test_an_ngram_round_pays_the_hosts_scan_of_every_sequences_tokens():
    """n-gram drafting was priced 0; vLLM's proposer scans each running sequence's tokens on the host between
    GPU steps (priors.yaml ngram_lookup_ns_per_token): the round grows by ns x the rank's sequences x context."""
    from roofline.parallel.whatif import load_priors
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h200_sxm"), "bfloat16", Layout(), Setting(engine="vllm"))
    ns = load_priors()["ngram_lookup_ns_per_token"]["values"]
    for B, L in ((1, 2048), (64, 32768)):
        ngram = w.round_seconds(3, B, L, 1, "vllm", "ngram")
        free = w.forward(Pass(B, 4, L), 1, "vllm") + load_priors()["spec_round_overhead_us"]["values"][1] * 1e-6
        assert ngram - free == pytest.approx(ns[1] * 1e-9 * B * L)
    assert ns[0] < ns[1] <= ns[2]


def test_plain_decode_is_one_row_per_batch_and_context_not_one_per_alpha():
    """predict's what-if printed k = 0 (plain decode, no draft to accept) once per alpha, the same numbers
    under four acceptance rates."""
    rows = whatif.speedup_table(get_preset("llama-3.1-8b"), get_datasheet("h200_sxm"), "bfloat16", Layout(),
                                (0.6, 0.7, 0.8), (0, 2), (1, 4), (2048,), Setting(engine="vllm"), drafter="ngram")
    t = pd.DataFrame(rows)
    plain, spec = t[t["k"] == 0], t[t["k"] == 2]
    assert len(plain) == 2 and plain["alpha"].isna().all() and (plain["S"] == 1.0).all()
    assert len(spec) == 6 and sorted(set(spec["alpha"])) == [0.6, 0.7, 0.8]


def test_a_tpot_is_priced_as_the_runs_mean_time_per_token_and_a_random_range_ratio_at_its_mean_lengths():
    """tpot_ms (bench_serving's TPOT: (e2e - TTFT) / (output - 1) of a request) is serve's mean time per output
    token, not the median token gap (itl_ms), which a fixed-length run's ramp does not move; a random dataset's
    range_ratio r prices the mean lengths L(1 + r)/2 with staggered requests; a bad r names the field."""
    models, _, rows = anchors.load()
    cfg = get_preset("llama-3.1-8b")
    base = dict(id="x", source="s", engine="vllm", device="h100_sxm", model="llama-3.1-8b", tp=1, dtype="bfloat16",
                weights="bf16", kv="bf16", workload=dict(concurrency=64, input_len=2048, output_len=256, num_prompts=640))
    w = WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine="vllm"))
    fixed = serve(w, 2048, 256, 64, 640)
    tpot = anchors.what_if(dict(base, metric="tpot_ms"), cfg)
    itl = anchors.what_if(dict(base, metric="itl_ms"), cfg)
    assert tpot["typical"] == pytest.approx(1e3 * fixed["itl_mean_s"]["typical"])
    assert itl["typical"] == pytest.approx(1e3 * fixed["itl_s"]["typical"]) and tpot["typical"] > itl["typical"]
    ranged = dict(base, metric="tpot_ms", workload=dict(base["workload"], range_ratio=0.8))
    stag = serve(w, round(2048 * 0.9), round(256 * 0.9), 64, 640, staggered=True)
    assert anchors.what_if(ranged, cfg)["typical"] == pytest.approx(1e3 * stag["itl_mean_s"]["typical"])
    assert anchors.random_lengths(dict(input_len=1000, output_len=100)) == (1000, 100, False)
    for bad in (0, 1.5, "0.8", True):
        with pytest.raises(ConfigError, match="range_ratio"):
            anchors.random_lengths(dict(input_len=1000, output_len=100, range_ratio=bad))
    assert all(a["metric"] != "itl_ms" for a in rows if "TPOT" in str(a.get("quote", "")) + str(a.get("note", "")))


def test_an_engine_that_merges_gate_up_and_qkv_a_makes_one_call_of_each_pair_with_the_same_bytes():
    """vLLM, SGLang and TensorRT-LLM run a SwiGLU's gate and up projections as one GEMM (and DeepSeek's q_a and
    kv_a as one): one call, N summed, the same bytes (engines.yaml merged_gemms); gpt-fast runs them apart. A
    weight-only int4 step of Llama-3.1-8B pays 4 call floors per layer under vLLM, 5 apart."""
    import copy
    import dataclasses

    from roofline.model.accounting import block_matrices
    from roofline.parallel.whatif import engine_matrices, load_priors, pass_seconds
    ds = get_preset("deepseek-r1")
    mats = block_matrices(ds, True)
    merged = engine_matrices(mats, ("gate_up", "qkv_a"))
    assert [m[0] for m in merged] == ["attn.q_a+kv_a", "attn.q_b", "attn.wo", "ffn.shared.w1+w3", "ffn.shared.w2"]
    assert sum(N * K for _, N, K in merged) == sum(N * K for _, N, K in mats)
    assert engine_matrices(mats, ()) == mats and len(engine_matrices(mats, ("gate_up",))) == 6
    assert engines.profile("vllm", 1).merged == ("gate_up", "qkv_a") and engines.profile("gpt-fast", 1).merged == ()
    assert engines.profile("vllm-v0", 1).merged == ("gate_up",)
    cfg, dev, dt = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16+weights=int4_g128"
    eng = engines.profile("vllm", 1)
    kern, pri = kernels.load_kernels(str(kernels.KERNELS_PATH)), load_priors()

    no_floor = copy.deepcopy(kern)
    no_floor["weight_only"]["call_floor_us"]["values"] = [0.0, 0.0, 0.0]

    def dense(e, k):
        return pass_seconds(cfg, Layout(), dt, Pass(1, 1, 1024), dev, e, 1, k, pri, Setting(engine="vllm"))["terms"]
    floor = kernels.call_floor_s("int4", 1, kern)
    for e, calls in ((eng, 4), (dataclasses.replace(eng, merged=()), 5)):
        assert dense(e, kern)["dense"] - dense(e, no_floor)["dense"] == pytest.approx(cfg.layers * calls * floor, rel=1e-6)
    one, apart = dense(eng, kern), dense(dataclasses.replace(eng, merged=()), kern)
    assert one["dense"] < apart["dense"]
    assert {k: v for k, v in one.items() if k != "dense"} == {k: v for k, v in apart.items() if k != "dense"}


def _fused_moe_us(device_key: str, fmt: str, bytes_per_weight: float, flops_key: str, E: int, N: int, Kd: int,
                  top_k: int, M: int, fused_moe: bool = True) -> float:
    """One MoE layer of benchmark_moe.py's shape (E experts, shard intermediate N, hidden Kd, top_k, M tokens,
    uniform routing) priced by the grouped-GEMM curves, in us."""
    from roofline.parallel import kernels as K
    from roofline.parallel.anchors import get_datasheet
    kern = K.load_kernels()
    dev = get_datasheet(device_key)
    pairs = M * top_k
    touched = E * (1 - (1 - top_k / E) ** M)
    r = K.grouped_gemm_seconds(touched * 3 * N * Kd * bytes_per_weight, 2.0 * pairs * 3 * N * Kd, pairs / touched,
                               2 * N, dev.mem_bw_GBps * 1e9, dev.dense_tflops[flops_key] * 1e12, device_key, 1, kern,
                               fmt, fused_moe, touched, 1.0)
    return r["seconds"] * 1e6


def test_triton_fused_moe_is_priced_at_its_own_measured_compute_share_where_it_was_measured():
    # vLLM PR #44818 (H200, bf16, E=128 N=704 K=2816 top-8, tuned): M = 4096 in 1189.6 us, compute-bound at 0.33 of
    # the bf16 rate; the dense GEMM's share (0.67) priced it at 593 us. Its memory-bound M = 256 (419.6 us) is the
    # streaming curve's, which the compute share must leave alone.
    assert _fused_moe_us("h200_sxm", "dense", 2.0, "bf16", 128, 704, 2816, 8, 4096) == pytest.approx(1189.6, rel=0.10)
    assert _fused_moe_us("h200_sxm", "dense", 2.0, "bf16", 128, 704, 2816, 8, 256) == pytest.approx(419.6, rel=0.10)
    # vLLM PR #53710 (L40S, fp8 w8a8, E=128 N=768 K=2048 top-8): M = 8192 in 3195.68 us
    assert _fused_moe_us("l40s", "fp8", 1.0, "fp8", 128, 768, 2048, 8, 8192) == pytest.approx(3195.68, rel=0.10)
    # Hopper fp8: no tuned large-M table read; the H100's default config of before vLLM PR #24700 (Qwen3-30B-A3B fp8,
    # E=128 N=768 K=2048 top-8, M = 4096: 1647.57 us) is the pessimistic end, the typical about half of it
    from roofline.parallel import kernels as K
    from roofline.parallel.anchors import get_datasheet
    kern, h100 = K.load_kernels(), get_datasheet("h100_sxm")
    pairs, flops8 = 4096 * 8, 2.0 * 4096 * 8 * 3 * 768 * 2048

    def h100_fp8(s):
        return K.grouped_gemm_seconds(128 * 3 * 768 * 2048, flops8, pairs / 128, 2 * 768, h100.mem_bw_GBps * 1e9,
                                      1979e12, "h100_sxm", s, kern, "fp8", True, 128, 1.0)["seconds"] * 1e6
    assert h100_fp8(2) == pytest.approx(1647.57, rel=0.10)
    assert 0.4 * 1647.57 < h100_fp8(1) < 0.7 * 1647.57
    # only where measured: an A100 (no Ampere table at large M) and another engine's MoE kernel keep the dense share
    dense = K.peak_fraction("dense", 1, kern, "a100_80gb_sxm")
    a100 = _fused_moe_us("a100_80gb_sxm", "dense", 2.0, "bf16", 128, 704, 2816, 8, 4096)
    flops = 2.0 * 4096 * 8 * 3 * 704 * 2816
    assert flops / (a100 * 1e-6) / 312e12 == pytest.approx(dense, rel=0.05)
    other = _fused_moe_us("h200_sxm", "dense", 2.0, "bf16", 128, 704, 2816, 8, 4096, fused_moe=False)
    assert other < 0.6 * _fused_moe_us("h200_sxm", "dense", 2.0, "bf16", 128, 704, 2816, 8, 4096)


def test_weight_only_experts_are_priced_at_their_own_kernels_measured_compute_share():
    """vLLM's Marlin MoE (W4A16, int4 + a bf16 scale per 128) on an H20, FlagGems PR #4350's Mixtral rows (E 8, top 2,
    4096 x 14336): compute-bound from 64 tokens at 0.25-0.55 of the bf16 rate, which the dense GEMM's share (0.67
    times Hopper's 64-row tiles) priced up to 1.5x too fast; its memory-bound rows (16 tokens: 4 per expert) keep the
    streaming curve. The same share on an H100 (989 TFLOPS), and the architecture's own kernel on CDNA3."""
    from roofline.parallel import kernels as K
    bpw = 0.5 + 2 / 128
    for M, ms in ((16, 0.444231), (64, 1.189485), (256, 3.362423), (1024, 10.31), (4096, 36.741793)):
        assert _fused_moe_us("h20", "int4", bpw, "bf16", 8, 14336, 4096, 2, M) == pytest.approx(ms * 1e3, rel=0.10)
    kern = K.load_kernels()
    share = kern["grouped_gemm"]["weight_only"]["int4"]["compute_share_vs_tokens_per_expert"]
    flops = 2.0 * 4096 * 2 * 3 * 4096 * 14336  # M = 4096 tokens, top 2: 2048 tokens per expert
    h100 = _fused_moe_us("h100_sxm", "int4", bpw, "bf16", 8, 14336, 4096, 2, 4096) * 1e-6
    assert flops / h100 / 989.5e12 == pytest.approx(K.table_value(share, 2048, 1, ""), rel=0.02)
    assert flops / h100 / 989.5e12 < 0.85 * K.peak_fraction("int4", 1, kern, "h100_sxm")  # not the dense GEMM's share
    fp4 = K.grouped_gemm_seconds(1e9, flops, 2048, 2 * 14336, 3.35e12, 989.5e12, "h100_sxm", 1, kern, "fp4_weight_only")
    assert fp4["compute"] == pytest.approx(h100, rel=0.02)  # mxfp4 experts on Hopper borrow the int4 kernel's shares
    mi300x = K.grouped_gemm_seconds(1e9, flops, 2048, 2 * 14336, 5.3e12, 1307e12, "mi300x", 1, kern, "int4")
    assert mi300x["compute"] == pytest.approx(flops / (1307e12 * K.peak_fraction("int4", 1, kern, "mi300x")
                                                       * K.tile_wave_utilisation(2048, 2 * 14336, "mi300x", kern)))


def test_a_weight_only_moe_kernels_pessimistic_share_on_a_larger_hopper_part_is_the_h20s_flops_per_sm():
    """The Marlin MoE share was read on an H20 (148 TFLOPS on 78 SMs); on an H100 (989.5 on 132) its pessimistic end is
    the H20's FLOP/s per SM on the H100's SMs (0.253 x the share), the typical the share as read; the H20 itself, and
    a part of another architecture (an A100), keep the share at every end."""
    from roofline.parallel import kernels as K
    kern = K.load_kernels()
    own = kern["grouped_gemm"]["weight_only"]["int4"]
    table = own["compute_share_vs_tokens_per_expert"]
    f = (148 / 78) / (989.5 / 132)
    assert K.per_sm_share(own, 0.5, 989.5e12, "h100_sxm", kern) == pytest.approx(0.5 * f)
    assert K.per_sm_share(own, 0.5, 148e12, "h20", kern) == pytest.approx(0.5)
    assert K.per_sm_share(own, 0.5, 312e12, "a100_80gb_sxm", kern) == 0.5
    flops = 2.0 * 4096 * 2 * 3 * 4096 * 14336

    def t(dev, rate, scenario):
        return K.grouped_gemm_seconds(1e9, flops, 2048, 2 * 14336, 3.35e12, rate, dev, scenario, kern, "int4")["compute"]
    assert t("h100_sxm", 989.5e12, 1) == pytest.approx(flops / (989.5e12 * K.table_value(table, 2048, 1, "")))
    assert t("h100_sxm", 989.5e12, 2) == pytest.approx(flops / (989.5e12 * f * K.table_value(table, 2048, 2, "")))
    assert t("h20", 148e12, 2) == pytest.approx(flops / (148e12 * K.table_value(table, 2048, 2, "")))


# ---- EAGLE heads ------------------------------------------------------------------------------------------------------

def test_an_eagle_head_is_one_dense_layer_with_its_fc_and_lm_head_unquantized_beside_any_target():
    """An EAGLE head is one dense decoder layer at the target's width: EAGLE-1 reads [embedding; hidden] through an fc
    and logits through the target's LM head; EAGLE-3 fuses three hidden states (its fc 3d -> d), its q/k/v read 2d,
    and its own LM head has draft_vocab rows. For Llama-3.1-8B's 128256-row vocabulary the EAGLE-3 head is the cheaper
    pass; its LM head grows with draft_vocab; a released head is unquantized, so an fp8 target's head costs what a bf16
    target's does; a target with no dense FFN (every layer MoE) gives its head the width of the experts a token runs."""
    dev, S = get_datasheet("h100_sxm"), Setting(engine="vllm", bands=())
    cfg = get_preset("llama-3.1-8b")
    w = WhatIf(cfg, dev, "bfloat16", Layout(), S)
    e1, e3 = (w.draft_head(h, 1, 1, 512, 1) for h in ("eagle", "eagle3"))
    assert e3 < e1 < w.target(1, 1, 512, 1) / 5  # one layer of 32 plus a head: a small share of the step
    terms = {h: w.pass_detail(Pass(1, 1, 512), 1, "vllm", h)["terms"] for h in ("eagle", "eagle3")}
    assert terms["eagle"]["lm_head"] > 2 * terms["eagle3"]["lm_head"]  # 128256 rows against 32000 (+ the fcs)
    assert w.draft_head("eagle3", 1, 1, 512, 1, draft_vocab=128256) > e3
    fp8 = WhatIf(cfg, dev, "bfloat16+weights=fp8", Layout(), S)
    assert fp8.draft_head("eagle3", 1, 1, 512, 1) == pytest.approx(e3)
    assert fp8.target(1, 1, 512, 1) < w.target(1, 1, 512, 1)
    from roofline.parallel.cost import eagle_layer_cfg
    oss = get_preset("gpt-oss-120b")
    assert oss.ffn == 0 and eagle_layer_cfg(oss).ffn == 4 * 2880 and eagle_layer_cfg(cfg) is cfg
    moe = WhatIf(oss, dev, "bfloat16", Layout(), S)
    dense_twin = WhatIf(oss.scaled(ffn=4 * 2880), dev, "bfloat16", Layout(), S)
    assert moe.draft_head("eagle3", 1, 1, 512, 1) == pytest.approx(dense_twin.draft_head("eagle3", 1, 1, 512, 1))


def test_an_eagle_round_chains_its_heads_passes_and_pays_the_engines_own_round_and_pass_times():
    """A round of k EAGLE drafts: the k+1-token verification, the head over the verified positions, then k-1 single
    passes; an engine that measures its round's own time and its passes' beyond their GPU time (engines.yaml vllm
    spec_round_us / spec_draft_pass_us) pays those in place of priors.yaml's round overhead, and an n-gram round (no
    drafter forward) keeps that prior unless the profile's round time is paid by every round (sglang: `rounds: all`,
    its overlap scheduler off for n-gram too). With no such field (trtllm) the prior applies."""
    from roofline.parallel.whatif import load_priors
    dev, cfg = get_datasheet("h100_sxm"), get_preset("llama-3.1-8b")
    w = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(bands=()))
    prior = load_priors()["spec_round_overhead_us"]["values"][1] * 1e-6
    for eng in ("vllm", "sglang", "trtllm"):
        prof = engines.profile(eng, 1)
        own = prof.spec_round_s if prof.spec_round_s is not None else prior
        for k in (2, 5):
            heads = w.draft_head("eagle3", k + 1, 1, 512, 1, eng) + (k - 1) * w.draft_head("eagle3", 1, 1, 512, 1, eng)
            expect = w.forward(Pass(1, k + 1, 512), 1, eng) + own + k * prof.spec_draft_pass_s + heads
            assert w.round_seconds(k, 1, 512, 1, eng, "eagle3") == pytest.approx(expect, rel=1e-3)
        ngram = w.round_seconds(3, 1, 512, 1, eng, "ngram")
        assert prof.spec_round_ngram == (eng == "sglang")
        assert ngram == pytest.approx(w.forward(Pass(1, 4, 512), 1, eng) + (own if prof.spec_round_ngram else prior)
                                      + load_priors()["ngram_lookup_ns_per_token"]["values"][1] * 1e-9 * 512)
    vllm = engines.profile("vllm", 1)
    assert vllm.spec_round_s == pytest.approx(1199e-6) and vllm.spec_draft_pass_s == pytest.approx(386e-6)
    assert engines.profile("sglang", 1).spec_round_s == pytest.approx(1535e-6)
    assert engines.profile("sglang", 1).spec_draft_pass_s == 0.0
    assert engines.profile("trtllm", 1).spec_round_s is None and engines.profile("trtllm", 1).spec_draft_pass_s == 0.0


def test_sglangs_spec_round_time_is_the_host_time_its_overlap_hides_in_two_measured_runs():
    """engines.yaml sglang spec_round_us: SGLang turns its overlap scheduler off for EAGLE / MTP rounds (its
    server_args, quoted in the source), so each round pays the host time that overlap hides. The triple is recomputed
    here from the two runs measured with and without the overlap (their numbers as the sources' titles quote them):
    a round is acceptance length / speed, or the latency over tokens / acceptance length. The 0.4 releases' profile
    inherits it."""
    doc = yaml.safe_load(engines.ENGINES_PATH.read_text())
    src = doc["sources"]
    assert "overlap scheduler are disabled because of using eagle" in src["sglang_eagle_no_overlap"]["title"]
    for quote in ("'Beta Eagle: acc_length=3.01 speed=273.43 token/s'", "'Main Eagle: acc_length=2.99 speed=246.80"):
        assert quote in src["sglang_pr11398_spec_v2"]["title"]
    for quote in ("'| 3.644 | 512 | 2.296 | 140.52 |'", "'| 3.206 | 512 | 2.296 | 159.71 |'"):
        assert quote in src["sglang_pr12128_spec_v2_fa3"]["title"]
    llama = (2.99 / 246.80 - 3.01 / 273.43) * 1e6
    dsr1 = (3.644 - 3.206) / (512 / 2.296) * 1e6
    assert doc["engines"]["sglang"]["spec_round_us"]["values"] == pytest.approx([llama, (llama + dsr1) / 2, dsr1],
                                                                                abs=1.0)
    for i in range(3):
        assert engines.profile("sglang-0.4", i).spec_round_s == engines.profile("sglang", i).spec_round_s
    assert "disabled because of using ngram speculative decoding" in src["sglang_eagle_no_overlap"]["title"]
    assert doc["engines"]["sglang"]["spec_round_us"]["rounds"] == "all"


def test_a_profiles_spec_round_rounds_is_drafted_or_all_and_anything_else_one_line(tmp_path):
    """engines.yaml spec_round_us.rounds: absent, the drafted rounds (vLLM's); `all`, n-gram's too (SGLang's); any
    other value a one-line error naming the field."""
    doc = yaml.safe_load(engines.ENGINES_PATH.read_text())
    assert not engines.profile("vllm", 1).spec_round_ngram and engines.profile("sglang", 1).spec_round_ngram
    doc["engines"]["sglang"]["spec_round_us"]["rounds"] = "ngram_only"
    path = tmp_path / "engines.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"^engines\.sglang\.spec_round_us\.rounds: 'ngram_only': allowed "
                                          r"\['drafted', 'all'\]$"):
        engines.profile("sglang", 1, str(path))


def test_vllms_spec_round_times_are_the_fit_of_their_calibration_source():
    """engines.yaml vllm spec_round_us / spec_draft_pass_us say they are the lines anchors.spec_round_fit draws through
    vLLM issue #20780's EAGLE-1 and EAGLE-3 rounds (a calibration source): optimistic the EAGLE-1 line, pessimistic the
    EAGLE-3 line, typical their mean. Recomputed here, to the microsecond the file rounds to."""
    fit = anchors.spec_round_fit("vllm_issue20780_eagle", "vllm")
    doc = yaml.safe_load(engines.ENGINES_PATH.read_text())["engines"]["vllm"]
    (a1, b1), (a3, b3) = fit["eagle"], fit["eagle3"]
    assert doc["spec_round_us"]["values"] == pytest.approx([a1, (a1 + a3) / 2, a3], abs=1.0)
    assert doc["spec_draft_pass_us"]["values"] == pytest.approx([b1, (b1 + b3) / 2, b3], abs=1.0)
    _, sources, _ = anchors.load()
    assert sources["vllm_issue20780_eagle"]["split"] == "calibration"


def test_a_stated_acceptance_length_is_the_iid_alpha_with_that_many_tokens_a_round():
    """A source that states the mean acceptance length (tokens a round, bonus included) prices its speedup with the
    i.i.d. alpha whose tau_iid is that length; a length outside 1..k+1 is a one-line error naming it."""
    from roofline.model.speculation import tau_iid
    for tau, k in ((2.29, 3), (3.54, 7), (1.0, 2), (4.0, 3)):
        assert tau_iid(anchors.alpha_for_tau(tau, k), k) == pytest.approx(tau, abs=1e-9)
    assert anchors.spec_alphas({"k": 3, "accepted_length": 2.29})[1] == pytest.approx(anchors.alpha_for_tau(2.29, 3))
    assert anchors.spec_alphas({"k": 3, "acceptance": [0.9, 0.8, 0.7]}) == (0.9, pytest.approx(0.8), 0.7)
    assert anchors.spec_alphas({"k": 3}) is None
    with pytest.raises(ConfigError, match="accepted_length=5.0: allowed 1 to k"):
        anchors.alpha_for_tau(5.0, 3)


def test_an_eagle_head_is_held_beside_the_target_and_its_cache_out_of_the_pool():
    """An EAGLE head's weights (one dense layer in the activation dtype, its fc, EAGLE-3's own LM head) and its one
    layer's cache are held on every rank as the MTP module's are: about 0.5 GB (EAGLE-1) and 0.85 GB (EAGLE-3, 32000
    rows) beside Llama-3.1-8B, each sequence's cache one layer in 32 more, so fewer sequences fit the pool."""
    from roofline.parallel.cost import eagle_head_bytes, memory_per_rank
    cfg, lay = get_preset("llama-3.1-8b"), Layout()
    plain_w, plain_kv = memory_per_rank(cfg, lay, "bfloat16", 8, 2048)
    for head, lo, hi in (("eagle", 0.45e9, 0.55e9), ("eagle3", 0.8e9, 0.9e9)):
        w, kv = memory_per_rank(cfg, lay, "bfloat16", 8, 2048, eagle=head, draft_vocab=32000)
        assert lo < w - plain_w < hi
        assert w - plain_w == pytest.approx(eagle_head_bytes(cfg, lay, "bfloat16", head, 32000))
        assert kv == pytest.approx(plain_kv * 33 / 32)
    # an fp8 target's head is still bf16
    assert eagle_head_bytes(cfg, lay, "bfloat16+weights=fp8", "eagle3", 32000) == \
        pytest.approx(eagle_head_bytes(cfg, lay, "bfloat16", "eagle3", 32000))
    w = WhatIf(cfg, get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine="vllm", bands=()))
    plain = w.max_running("vllm", 4096)
    eagle = w.max_running("vllm", 4096, spec=SpecDecode(3, (0.6,), "eagle3"))
    assert eagle < plain and eagle == pytest.approx(plain * 32 / 33, rel=0.03)


def test_capacity_plans_an_eagle_head_on_one_layout_and_on_every_layout_and_a_fit_refuses_it():
    """capacity prices an EAGLE head where it prices the what-if: its speculative rows are rounds of the head (fewer
    ms a token than plain decode at batch 1 on a memory-bound step at alpha 0.6, k = 3) and hold its weights; the
    layouts plan prices it on every rank and names it in the summary; a fit's path refuses it in one line."""
    from roofline.analysis import capacity
    from roofline.analysis.predict import DraftCost
    from roofline.commands.capacity import plan_layouts
    from tests.test_parallel_quant import _capacity_config
    req = capacity.CapacityRequest(model=get_preset("llama-3.1-8b"), device="h100_sxm", engine="vllm",
                                   work=capacity.Workload(1024, 256, 50.0, 1000.0), B=(1, 8),
                                   speculation=capacity.Speculation(0.6, 3, DraftCost("eagle3")))
    table, summary = capacity.plan_whatif(req)
    plain, spec = table[~table["spec"]].set_index("B"), table[table["spec"]].set_index("B")
    assert spec.loc[1, "itl_ms"] < plain.loc[1, "itl_ms"] and spec.loc[1, "mem_GB"] > plain.loc[1, "mem_GB"]
    assert summary["speculation"]["drafter"] == "eagle3"
    t, s = plan_layouts(_capacity_config("llama-3.1-8b", "h100_sxm", drafter="eagle", alpha=0.6, k=3, engine="vllm"))
    assert s["speculation"] == dict(alpha=0.6, k=3, drafter="eagle") and s["note"] is None
    assert t["speculative"].any() and (~t["speculative"]).any()
    with pytest.raises(ConfigError, match="drafter=eagle: priced by the what-if only"):
        from roofline.analysis.predict import step_costs
        step_costs(json.loads((ROOT / "results" / "cpu-demo" / "fit.json").read_text()), "float32",
                   DraftCost("eagle"))


def test_lmdeploys_nccl_all_reduce_is_the_fit_of_its_tp4_token_latency_medians():
    """TurboMind v0.1 - v0.2 reduces with NCCL; engines.yaml lmdeploy allreduce.nvlink3 says it is the line
    anchors.allreduce_fit draws through the A100 table's TP4 token-latency medians (a calibration source): recomputed
    here to the 0.1 us and 0.1 GB/s the file rounds to. The step prices one call at that latency plus its bus bytes over
    that bandwidth, in place of priors.yaml's custom all-reduce, on that link only."""
    lat, bw = anchors.allreduce_fit("lmdeploy_a100_fp16", "lmdeploy", "nvlink3")
    doc = yaml.safe_load(engines.ENGINES_PATH.read_text())["engines"]["lmdeploy"]["allreduce"]["nvlink3"]
    assert doc["latency_us"][1] == pytest.approx(lat, abs=0.06) and doc["busbw_GBps"][1] == pytest.approx(bw, abs=0.06)
    prof = engines.profile("lmdeploy", 1)
    assert prof.allreduce_latency_s["nvlink3"] == pytest.approx(lat * 1e-6, rel=0.01)
    assert dict(prof.allreduce_busbw_Bps)["nvlink3"] == pytest.approx(bw * 1e9, rel=0.01)
    cfg = get_preset("llama-2-70b")
    w = WhatIf(cfg, get_datasheet("a100_80gb_sxm"), "float16", Layout(tp=4), Setting(engine="lmdeploy", bands=()))
    d = w.pass_detail(Pass(64, 1, 64), 1, "lmdeploy")
    ar = [c for c in d["collectives"] if c[0] == "all_reduce"]
    assert {c[1] for c in ar} == {"nvlink3"} and sum(c[2] for c in ar) == 160  # two a layer (and the logits' gather)
    for _, _, n, bus, each in ar:
        assert each == pytest.approx(doc["latency_us"][1] * 1e-6 + bus / (doc["busbw_GBps"][1] * 1e9))
    assert d["terms"]["comm"] == pytest.approx(sum(c[2] * c[4] for c in d["collectives"]))
    vllm = WhatIf(cfg, get_datasheet("a100_80gb_sxm"), "float16", Layout(tp=4), Setting(engine="vllm", bands=()))
    assert vllm.pass_detail(Pass(64, 1, 64), 1, "vllm")["terms"]["comm"] < d["terms"]["comm"] / 3  # custom all-reduce


def test_hf_eagers_host_time_is_the_fit_of_qwen1s_eager_runs_by_depth():
    """engines.yaml hf-eager's host_issue.us_per_launch (typical) and step_overhead_us (typical) say they are what
    anchors.eager_host_fit draws through the Qwen README's BF16 runs (a calibration source: Qwen-1.8B / 7B / 14B, 24 /
    32 / 40 layers, host-bound on one A100): the host's time a layer over the 26 launches a Qwen 1 block makes
    (hf-eager-qwen1's count), and the intercept; recomputed here. Host-bound, the three runs grow with the layer count,
    which a step whose GPU work adds to the host's issue could not give (the 14B's GPU work is 8 times the 1.8B's); the
    priced runs land within 2%. autoawq's are the same values ("as hf-eager")."""
    per_layer, step = anchors.eager_host_fit("qwen_readme_inference_performance")
    doc = yaml.safe_load(engines.ENGINES_PATH.read_text())["engines"]
    launches = engines.profile("hf-eager-qwen1", 1).launches_per_layer
    assert launches == 26 and engines.profile("hf-eager", 1).launches_per_layer == 50
    assert 700 < per_layer < 800 and 0 <= step < 100
    for name in ("hf-eager", "autoawq"):
        assert doc[name]["host_issue"]["us_per_launch"]["values"][1] == pytest.approx(per_layer / launches, abs=0.01)
        assert doc[name]["step_overhead_us"]["values"][1] == pytest.approx(step, abs=0.5)
    assert engines.profile("hf-eager-qwen1", 1).host_s_per_launch == engines.profile("hf-eager", 1).host_s_per_launch
    priced = _shipped_table().set_index("id")
    rows = [r for r in priced.index if r.startswith("qwen-readme-a100-")]
    assert len(rows) == 3 and (priced.loc[rows, "error_pct"].abs() < 2.0).all()
    assert (priced.loc[rows, "split"] == "calibration").all() and priced.loc[rows, "prior_cited"].all()


def test_a_draft_tree_verifies_its_draft_tokens_and_drafts_its_width_in_each_pass_after_the_first():
    """SGLang's EAGLE with topk > 1 drafts a tree: each pass after the first carries `width` tokens a sequence and the
    round verifies num_draft_tokens a sequence; a chain is width 1, k + 1 verified (the same round as before). The
    shape is checked by name (width >= 1; k + 1 <= verified <= 1 + k x width; only a head drafts a tree), and the
    card prints it."""
    from roofline.commands.card import CardRequest, card_record, render_card
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    w = WhatIf(cfg, dev, "bfloat16", Layout(), Setting(engine="sglang", bands=()))
    chain = w.round_seconds(4, 8, 512, 1, "sglang", "eagle3")
    assert chain == pytest.approx(w.round_seconds(4, 8, 512, 1, "sglang", "eagle3", width=1, verify_tokens=5))
    tree = w.round_seconds(4, 8, 512, 1, "sglang", "eagle3", width=4, verify_tokens=16)
    expect = (chain - w.forward(Pass(8, 5, 512), 1, "sglang") + w.forward(Pass(8, 16, 512), 1, "sglang")
              + sum(w.draft_head("eagle3", 4, 8, 512 + i - 1, 1, "sglang") - w.draft_head("eagle3", 1, 8, 512 + i - 1,
                                                                                      1, "sglang") for i in (2, 3, 4)))
    assert tree == pytest.approx(expect, rel=1e-9) and tree > chain
    for kw, msg in ((dict(width=0), "draft_topk=0"), (dict(width=4, verify_tokens=4), "draft_tokens=4"),
                    (dict(width=2, verify_tokens=10), "draft_tokens=10")):
        with pytest.raises(ConfigError, match=msg):
            w.round_seconds(4, 8, 512, 1, "sglang", "eagle3", **kw)
    with pytest.raises(ConfigError, match="a draft tree is priced for a head"):
        SpecDecode(3, (0.6,), "ngram", width=2)
    rec = card_record(CardRequest(model=cfg, device=dev, engine="sglang", input_len=200, output_len=256, concurrency=1,
                                  k=4, acceptance=0.7, drafter="eagle3", draft_topk=4, draft_tokens=16))
    assert rec["run_spec_draft_topk"] == 4 and rec["run_spec_verify_tokens"] == 16
    assert "a tree of width 4 verifying 16 tokens a sequence" in render_card(rec)


def test_the_card_says_when_a_speculative_rounds_own_time_is_the_unmeasured_prior():
    """A speculative card names the engines whose round time is priors.yaml's (no engines.yaml spec_round_us:
    TensorRT-LLM today), and none where the engine has its own (vLLM, SGLang) or the drafter is n-gram lookup (the
    prior's case)."""
    from roofline.commands.card import CardRequest, card_record, render_card
    cfg, dev = get_preset("llama-3.1-8b"), get_datasheet("h100_sxm")
    kw = dict(model=cfg, device=dev, input_len=200, output_len=256, concurrency=1, k=3, acceptance=0.6)
    trt = card_record(CardRequest(engine="trtllm", drafter="eagle3", **kw))
    assert trt["run_spec_round_unmeasured"] == ["trtllm"] and "no measurement of it was read" in render_card(trt)
    for eng in ("vllm", "sglang"):
        rec = card_record(CardRequest(engine=eng, drafter="eagle3", **kw))
        assert rec["run_spec_round_unmeasured"] == [] and "no measurement of it was read" not in render_card(rec)
    assert card_record(CardRequest(engine="trtllm", drafter="ngram", **kw))["run_spec_round_unmeasured"] == []


@pytest.mark.parametrize("model, device, tp, dtype", [("llama-3.1-8b", "a100_80gb_sxm", 4, "bfloat16"),
                                                      ("llama-3.1-70b", "h100_sxm", 4, "bfloat16+weights=fp8"),
                                                      ("qwen3-30b-a3b", "h200_sxm", 1, "bfloat16"),
                                                      ("qwen2.5-7b", "a100_80gb_sxm", 1, "bfloat16")])
def test_more_sequences_never_price_a_faster_step_nor_a_run_of_less_throughput(model, device, tp, dtype):
    """Invariants a sweep of the what-if found broken (stop 72): a decode step of more sequences, or at a longer
    context, is never faster (an A100's skinny-GEMM share priced B = 160 3% faster than 128), and a staggered run of
    more requests in flight never yields materially fewer output tokens/s (a run past a multiple of its slots was a
    whole wave longer; a prefill-bound one priced every chunk beside all its slots)."""
    for engine in ("vllm", "sglang", "llama.cpp", "vllm-v0"):
        w = WhatIf(get_preset(model), get_datasheet(device), dtype, Layout(tp=tp), Setting(engine=engine))
        for L in (128, 2048):
            steps = [w.itl(B, L)["typical"] for B in (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 256)]
            assert all(b >= a * (1 - 1e-9) for a, b in zip(steps, steps[1:])), (engine, L, steps)
        assert w.itl(64, 4096)["typical"] >= w.itl(64, 2048)["typical"]
        for I, O in ((1024, 1024), (8192, 256)):
            runs = [serve(w, I, O, C, 4 * C, staggered=True) for C in (16, 32, 64, 128, 256, 512)]
            for a, b in zip(runs, runs[1:]):
                if b["running"]["typical"] > a["running"]["typical"]:
                    assert b["output_tok_s"]["typical"] >= 0.97 * a["output_tok_s"]["typical"], (engine, I, O)
