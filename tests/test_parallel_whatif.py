"""The one what-if model: kernels by shape, engine profiles, touched experts in every mode, one
answer behind capacity (with and without layouts) / predict / card, workload pricing, calibration,
and the anchors' split. Logic tests run on tests/fixtures/whatif (PLACEHOLDER numbers, not priors)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from roofline.io.fields import ConfigError
from roofline.measure.devices import get_spec
from roofline.model.presets import get_preset
from roofline.parallel import anchors, engines, kernels
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import Pass, Setting, WhatIf, candidate_layouts, capacity, memory_check, serve

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


def test_weight_only_int4_streams_fewer_bytes_but_loses_its_edge_as_M_grows():
    dev = get_spec("h100_sxm")
    bw, f, f32 = dev.bandwidth_Bps(), dev.peak_flops("bf16"), dev.peak_flops("fp32")
    N = K = 8192

    def t(M, kind, nbytes, ops):
        return kernels.gemm_seconds(M, N, K, nbytes, kind, ops, bw, f, f32, dev.key, 1, KERN)["seconds"]
    r1 = t(1, "int4", N * K / 2, 3) / t(1, "dense", N * K * 2, 0)
    r128 = t(128, "int4", N * K / 2, 3) / t(128, "dense", N * K * 2, 0)
    assert r1 < 0.5 and r128 > r1 * 1.5


def test_decode_attention_overlaps_kv_traffic_and_arithmetic():
    d = kernels.attention_seconds(1e9, 1e12, 8, 4096, 3e12, 1e15, 1, KERN)
    assert d["seconds"] == pytest.approx(max(d["memory"], d["compute"]))
    assert d["seconds"] < d["memory"] + d["compute"]


def test_bad_kernel_triple_names_the_field():
    with pytest.raises(ConfigError, match="kernels.gemm.peak_fraction"):
        kernels.pick({"values": [0.5, 0.6]}, 1, "kernels.gemm.peak_fraction")


# ---- MoE: touched experts in every mode ------------------------------------------------------

def test_qwen3_moe_what_if_prices_touched_experts_not_all_of_them():
    cfg = get_preset("qwen3-30b-a3b")
    w = WhatIf(cfg, get_spec("h100_sxm"), "bfloat16", Layout(), S)
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
        WhatIf(cfg, get_spec("h100_sxm"), "bfloat16", Layout(), Setting(engine="nope", engines=S.engines,
                                                                          kernels=S.kernels)).itl(1, 128)
    span = WhatIf(cfg, get_spec("h100_sxm"), "bfloat16", Layout(), Setting(engines=S.engines, kernels=S.kernels))
    one = {e: WhatIf(cfg, get_spec("h100_sxm"), "bfloat16", Layout(),
                     Setting(engine=e, engines=S.engines, kernels=S.kernels)).itl(1, 128) for e in ("vllm", "hf-eager")}
    s = span.itl(1, 128)
    assert s["optimistic"] == min(v["optimistic"] for v in one.values())
    assert s["pessimistic"] == max(v["pessimistic"] for v in one.values())
    assert one["hf-eager"]["typical"] > one["vllm"]["typical"]  # eager launches + a slower host loop


def test_tp_all_reduces_stay_on_nvlink_beyond_eight_devices():
    from roofline.parallel.whatif import collective_link, load_priors
    p = load_priors()
    lay = Layout(tp=8, pp=2)
    assert collective_link("all_reduce", lay, get_spec("h100_sxm"), S, p) == "nvlink4"
    assert collective_link("send_recv", lay, get_spec("h100_sxm"), S, p) == "infiniband_ndr"


def test_memory_check_counts_the_draft_model_and_a_plan_that_does_not_fit_says_so():
    cfg, dev = get_preset("llama-3.1-70b"), get_spec("h100_sxm")
    plain = memory_check(get_preset("llama-3.1-8b"), dev, "bfloat16", Layout(), 8, 2048)
    with_draft = memory_check(get_preset("llama-3.1-8b"), dev, "bfloat16", Layout(), 8, 2048,
                              draft=get_preset("llama-3.1-8b"))
    assert with_draft["weights_GB"] == pytest.approx(2 * plain["weights_GB"], rel=1e-9)
    rows = capacity(cfg, dev, "bfloat16", 1024, 256, 1000.0, 1000.0, setting=S, layouts=[Layout()])
    assert rows[0]["note"] == "does not fit the device at any batch"


# ---- one answer behind every command ---------------------------------------------------------

def test_capacity_with_and_without_layouts_give_one_answer(fixture_data):
    from roofline.analysis.capacity import plan_whatif
    from roofline.commands.capacity import plan_layouts, request_from_config
    c = yaml.safe_load((ROOT / "conf" / "capacity.yaml").read_text())
    c = {k: v for k, v in c.items() if k not in ("defaults", "layouts", "out_dir")}
    c.update(model=get_preset("llama-3.1-8b").__dict__ | {}, device="h100_sxm", engine={"profile": "vllm"},
             B=[16], itl_target_ms=1e4, out_dir="")
    from dataclasses import asdict
    c["model"] = asdict(get_preset("llama-3.1-8b"))
    one, _ = plan_whatif(request_from_config(dict(c)))
    rows, summary = plan_layouts(dict(c))
    tp1 = rows[rows["layout"] == "tp1"].iloc[0]
    assert int(tp1["batch"]) == 16  # layouts honour B
    assert float(one.iloc[0]["itl_ms"]) == pytest.approx(float(tp1["itl_ms"]), rel=1e-12)
    assert summary["engine"] == "vllm"


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
    t_bf = WhatIf(get_preset("llama-3.1-8b"), get_spec("h100_sxm"), "bfloat16", Layout(), S).itl(1, 1024)
    t_i8 = WhatIf(get_preset("llama-3.1-8b"), get_spec("h100_sxm"), "bfloat16+weights=int8", Layout(), S).itl(1, 1024)
    assert t_i8["typical"] < 0.8 * t_bf["typical"]


# ---- workload pricing and calibration ---------------------------------------------------------

def test_finite_run_prices_ttft_itl_and_throughput_consistently():
    w = WhatIf(get_preset("llama-3.1-8b"), get_spec("h100_sxm"), "bfloat16", Layout(), S)
    r = serve(w, 1024, 256, 32, 256)
    t = {k: v["typical"] for k, v in r.items()}
    assert t["itl_p90_s"] >= t["itl_s"] and t["ttft_s"] > 0
    assert t["e2e_s"] == pytest.approx(t["ttft_s"] + 255 * t["itl_mean_s"])
    assert t["output_tok_s"] < 32 / t["itl_s"]  # prefill chunks and the ramp cost throughput
    with pytest.raises(ConfigError, match="concurrency=0"):
        serve(w, 1024, 256, 0)


def test_calibration_rescales_to_the_points_and_keeps_their_spread(tmp_path):
    from roofline.analysis.calibrate import calibrated
    w = WhatIf(get_preset("llama-3.1-8b"), get_spec("h100_sxm"), "bfloat16", Layout(), S)
    t1, t8 = w.itl(1, 1024)["typical"], w.itl(8, 1024)["typical"]
    pts = [dict(B=1, L=1024, itl_ms=1.2e3 * t1), dict(B=8, L=1024, itl_ms=1.3e3 * t8),
           dict(B=8, L=512, tok_s_per_user=1 / (1.25 * w.itl(8, 512)["typical"]))]
    (tmp_path / "cal.yaml").write_text(yaml.safe_dump(dict(points=pts)))
    c = calibrated(w, tmp_path / "cal.yaml")
    assert c.itl(1, 1024)["typical"] == pytest.approx(1.25 * t1)
    lo, hi = c.itl(1, 1024)["optimistic"] / (1.25 * t1), c.itl(1, 1024)["pessimistic"] / (1.25 * t1)
    assert lo == pytest.approx(1.2 / 1.25) and hi == pytest.approx(1.3 / 1.25)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(dict(points=[dict(B=0, L=1, itl_ms=3)])))
    with pytest.raises(ConfigError, match=r"points\[0\].B=0"):
        calibrated(w, tmp_path / "bad.yaml")


# ---- anchors -----------------------------------------------------------------------------------

def test_user_anchors_file_with_a_missing_key_is_one_line_exit_2(tmp_path):
    doc = yaml.safe_load((ROOT / "roofline" / "data" / "deployments.yaml").read_text())
    del doc["anchors"][0]["metric"]
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="missing key 'metric'"):
        anchors.load(tmp_path / "a.yaml")
    r = subprocess.run([sys.executable, "-m", "experiments.anchors", f"anchors={tmp_path / 'a.yaml'}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "missing key 'metric'" in r.stderr and "Traceback" not in r.stderr


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


@pytest.mark.slow
def test_test_set_error_and_bias_are_bounded_at_the_measured_level():
    """The held-out (test-split) anchors, priced with the engine each ran: bounds at the level measured
    when this test was written (median |error| 19.4%, signed median +9.5% too fast, 60% inside the
    interval, 35 anchors priced) plus a small margin. The issue's targets (10%, +-5%, 80%) are NOT met."""
    t = anchors.table()
    s = anchors.summary(t)["test"]["all"]
    assert s["n"] >= 30
    assert s["median_abs_error_pct"] <= 22.0
    assert abs(s["signed_median_fast_pct"]) <= 12.0
    assert s["inside_interval"] >= 0.55


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
