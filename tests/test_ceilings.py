"""Measured ceilings: schema, the arithmetic of every rate, the summary's choice, files,
decode GEMM shapes, correctness before timing, bad input, and the entry point."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roofline.measure import ceilings

from roofline.measure import kernels
from roofline.measure.ceilings import (BANDWIDTH_COLUMNS, MATMUL_COLUMNS, SUMMARY_KEYS, TOP_KEYS,
                               CeilingsRequest, check_gemm, decode_gemm_shapes, load_ceilings,
                               measure_ceilings, summarize, write_ceilings)
from roofline.io.fields import ConfigError
from roofline.model.presets import get_preset
from roofline.measure.timer import TimerSettings

REPO = Path(__file__).resolve().parents[1]
KiB, MiB = 2**10, 2**20
FAST = TimerSettings(warmup=0, min_reps=2, max_reps=2, budget_s=5.0, l2_bytes=64 * KiB)


def tiny_spec(**changes) -> CeilingsRequest:
    base = dict(device="cpu", dtypes=("float32",), working_sets=(16 * KiB, 256 * KiB),
                kernels=("torch_copy", "torch_read"), square_sizes=(48,),
                decode_model=get_preset("tiny"), decode_ms=(1, 4), formats=(), timer=FAST, busy_check=False)
    return CeilingsRequest(**{**base, **changes})


@pytest.fixture(scope="module")
def result():
    torch.manual_seed(0)
    return measure_ceilings(tiny_spec())


# ----------------------------------------------------------------------------- schema


def test_document_has_every_key(result):
    assert list(result) == TOP_KEYS
    assert result["schema_version"] == 1
    assert set(SUMMARY_KEYS) <= set(result["summary"])
    assert result["datasheet"] is None  # the CPU row is measured only
    for key in ("device_name", "torch_version", "threads", "git_commit", "config"):
        assert key in result["provenance"]


def test_rows_have_exactly_the_schema_columns(result):
    assert result["bandwidth"] and result["matmul"]
    assert all(list(r) == BANDWIDTH_COLUMNS for r in result["bandwidth"])
    assert all(list(r) == MATMUL_COLUMNS for r in result["matmul"])


def test_one_bandwidth_row_per_kernel_dtype_working_set_and_l2_mode(result):
    keys = {(r["kernel"], r["dtype"], r["l2"], r["working_set_bytes"] // KiB)
            for r in result["bandwidth"]}
    assert len(keys) == len(result["bandwidth"]) == 2 * 1 * 2 * 2


def test_working_set_covers_the_nominal_size(result):
    for r in result["bandwidth"]:
        nominal = 16 * KiB if r["working_set_bytes"] < 100 * KiB else 256 * KiB
        assert nominal <= r["working_set_bytes"] <= nominal + 64


def test_gbps_is_bytes_over_median(result):
    for r in result["bandwidth"]:
        assert r["GBps"] == r["bytes_moved"] / r["t_median_s"] / 1e9
        assert r["t_p10_s"] <= r["t_median_s"] <= r["t_p90_s"]
        assert r["pct_datasheet"] is None


def test_copy_moves_read_plus_written_bytes(result):
    for r in result["bandwidth"]:
        if r["kernel"] == "torch_copy":
            assert r["bytes_moved"] == r["working_set_bytes"]


def test_matmul_rates_follow_flops_and_bytes(result):
    for r in result["matmul"]:
        M, N, K, t = r["M"], r["N"], r["K"], r["t_median_s"]
        assert r["TFLOPs"] == pytest.approx(2 * M * N * K / t / 1e12, rel=1e-12)
        assert r["GBps"] == pytest.approx((M * K + N * K + M * N) * 4 / t / 1e9, rel=1e-12)


def test_matmul_rows_cover_square_and_every_decode_shape(result):
    square = [r for r in result["matmul"] if r["kind"] == "square"]
    decode = {(r["name"], r["N"], r["K"], r["M"]) for r in result["matmul"] if r["kind"] == "decode"}
    assert [(r["M"], r["N"], r["K"]) for r in square] == [(48, 48, 48)]
    assert decode == {(n, N, K, M) for n, N, K in decode_gemm_shapes(get_preset("tiny"))
                      for M in (1, 4)}


def test_telemetry_brackets_every_block(result):
    blocks = [t["block"] for t in result["telemetry"]]
    assert "bandwidth/torch_copy/float32" in blocks and "matmul/decode/float32" in blocks
    assert all(t["before"]["available"] is False for t in result["telemetry"])


def test_summary_ridge_is_peak_over_bandwidth(result):
    s = result["summary"]
    assert s["cache_bytes"] == 64 * KiB
    assert s["peak_tflops"]["float32"] == max(r["TFLOPs"] for r in result["matmul"])  # square or decode
    assert s["ridge_measured"]["float32"] == pytest.approx(
        s["peak_tflops"]["float32"] * 1e12 / (s["mem_bw_GBps"] * 1e9), rel=1e-12)


# ----------------------------------------------------------------------------- summary


def bw_row(kernel, ws, gbps, l2="cold"):
    return dict(kernel=kernel, variant="torch", dtype="float32", l2=l2, working_set_bytes=ws,
                bytes_moved=ws, t_median_s=ws / gbps / 1e9, t_p10_s=0, t_p90_s=0, GBps=gbps,
                pct_datasheet=None)


def test_summary_takes_the_best_kernel_at_large_working_sets_only():
    cache = 32 * MiB
    rows = [bw_row("torch_copy", 1 * MiB, 900.0),  # cache-resident: must not win
            bw_row("torch_copy", 128 * MiB, 20.0), bw_row("torch_copy", 512 * MiB, 22.0),
            bw_row("torch_read", 512 * MiB, 25.0), bw_row("torch_read", 512 * MiB, 99.0, "warm")]
    s = summarize(rows, [], cache)
    assert (s["mem_bw_GBps"], s["mem_bw_kernel"]) == (25.0, "torch_read")
    assert s["mem_bw_by_kernel"] == {"torch_copy": 22.0, "torch_read": 25.0}


def test_summary_falls_back_to_the_largest_measured_working_set():
    rows = [bw_row("torch_copy", 1 * MiB, 900.0), bw_row("torch_copy", 4 * MiB, 40.0)]
    s = summarize(rows, [], 64 * MiB)
    assert (s["mem_bw_GBps"], s["mem_bw_kernel"]) == (40.0, "torch_copy")


# ----------------------------------------------------------------------------- files


def test_write_then_load_round_trips(result, tmp_path):
    run = write_ceilings(result, tmp_path / "run")
    assert {p.name for p in run.iterdir()} == {"ceilings.json", "ceilings_bandwidth.csv",
                                               "ceilings_matmul.csv"}
    assert load_ceilings(run) == json.loads(json.dumps(result, default=str))
    import pandas as pd
    assert list(pd.read_csv(run / "ceilings_bandwidth.csv").columns) == BANDWIDTH_COLUMNS
    assert len(pd.read_csv(run / "ceilings_matmul.csv")) == len(result["matmul"])


def test_load_rejects_a_file_missing_a_summary_key(result, tmp_path):
    doc = json.loads(json.dumps(result, default=str))
    del doc["summary"]["ridge_measured"]
    path = tmp_path / "ceilings.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="ridge_measured"):
        load_ceilings(path)


def test_load_rejects_another_schema_version(result, tmp_path):
    doc = json.loads(json.dumps(result, default=str))
    doc["schema_version"] = 2
    (tmp_path / "ceilings.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="schema_version"):
        load_ceilings(tmp_path)


# ----------------------------------------------------------------------------- shapes


def test_decode_gemm_shapes_llama_3_1_8b():
    assert decode_gemm_shapes(get_preset("llama-3.1-8b")) == [
        ("qkv_proj", (32 + 2 * 8) * 128, 4096),
        ("o_proj", 4096, 32 * 128),
        ("ffn_up", 14336, 4096),
        ("ffn_down", 4096, 14336),
        ("lm_head", 128256, 4096),
    ]


def test_decode_gemm_shapes_mla_moe_use_their_own_projections():
    names = [n for n, _, _ in decode_gemm_shapes(get_preset("deepseek-v3"))]
    assert names == ["q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "o_proj", "ffn_up",
                     "ffn_down", "expert_up", "expert_down", "lm_head"]


# ----------------------------------------------------------------------------- correctness first


def test_a_kernel_that_fails_its_check_is_never_timed(monkeypatch):
    ran = []
    copy = kernels.KERNELS["torch_copy"]
    monkeypatch.setitem(kernels.KERNELS, "torch_copy",
                        dataclasses.replace(copy, run=lambda bufs: ran.append(1)))
    real_check = kernels.check

    def check(kernel, n, dtype, device):
        if kernel.op == "copy":
            raise AssertionError("torch_copy: not bit-exact")
        real_check(kernel, n, dtype, device)

    monkeypatch.setattr(kernels, "check", check)
    out = measure_ceilings(tiny_spec(square_sizes=(8,), decode_ms=()))
    assert ran == []
    assert {r["kernel"] for r in out["bandwidth"]} == {"torch_read"}
    (failure,) = out["failures"]
    assert failure["kernel"] == "torch_copy" and failure["stage"] == "check"
    assert "not bit-exact" in failure["error"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_check_gemm_passes_a_correct_product_and_catches_a_wrong_one(dtype):
    a, w = torch.randn(8, 300, dtype=dtype), torch.randn(64, 300, dtype=dtype)
    out = torch.nn.functional.linear(a, w)
    check_gemm(out, a, w.t())
    wrong = out.clone()
    wrong[3, 5] += 1.0 + out[3, 5].abs()
    with pytest.raises(AssertionError, match=r"\[3,5\]"):
        check_gemm(wrong, a, w.t())


# ----------------------------------------------------------------------------- the request


@pytest.mark.parametrize("change, field", [
    (dict(kernels=("torch_copy", "nope")), "kernels"),
    (dict(dtypes=("float64",)), "dtypes"),
    (dict(bandwidth_dtypes=("int8",)), "bandwidth_dtypes"),
    (dict(device="tpu"), "device"),
    (dict(working_sets=(0,)), "working_sets"),
    (dict(l2_modes=("lukewarm",)), "l2_modes"),
    (dict(timer=TimerSettings(mode="graph")), "timer.mode"),
    (dict(gemm_budget_s=-1), "gemm_budget_s"),
])
def test_bad_input_names_the_field(change, field):
    with pytest.raises(ConfigError, match=field):
        tiny_spec(**change)


def test_a_square_over_the_time_budget_is_skipped_unrun_with_the_larger_ones(monkeypatch):
    """The time of a square GEMM grows with the cube of its size: from 48^3 at 20 ms a call, 96^3
    predicts 8 x 20 ms for each of its 2 timed calls, over a 0.1 s budget: skipped without a call,
    and 192^3 not tried; ceilings.json names both in its failures."""
    real, sizes = torch.matmul, []

    def slow(a, b, out=None):
        sizes.append(a.shape[0])
        import time
        time.sleep(0.02 * (a.shape[0] / 48) ** 3)
        return real(a, b, out=out)

    monkeypatch.setattr(torch, "matmul", slow)
    out = measure_ceilings(tiny_spec(square_sizes=(192, 48, 96), decode_ms=(), gemm_budget_s=0.1))
    assert [r["M"] for r in out["matmul"] if r["kind"] == "square"] == [48]
    assert set(sizes) == {48}
    (skip,) = out["failures"]
    assert skip["stage"] == "skipped" and skip["M"] == 96
    assert "cube of the size" in skip["error"] and "larger squares not tried" in skip["error"]
    assert "1 of them GEMMs skipped over the time budget" in ceilings.format_summary(out)


def test_a_decode_gemm_whose_first_call_is_over_the_budget_ends_its_shape(monkeypatch):
    real = torch.nn.functional.linear

    def slow(x, w, b=None):
        if x.shape[0] >= 4:
            import time
            time.sleep(0.08)  # one call, times the 2 timed calls: 0.16 s, over the 0.1 s budget
        return real(x, w, b)

    monkeypatch.setattr(torch.nn.functional, "linear", slow)
    out = measure_ceilings(tiny_spec(square_sizes=(8,), decode_ms=(1, 4, 16), gemm_budget_s=0.1))
    decode = [r for r in out["matmul"] if r["kind"] == "decode"]
    shapes = {r["name"] for r in decode}
    assert decode and {r["M"] for r in decode} == {1}
    skips = [f for f in out["failures"] if f["stage"] == "skipped"]
    assert {f["name"] for f in skips} == shapes and {f["M"] for f in skips} == {4}
    assert all("larger M not tried" in f["error"] for f in skips)


def test_a_slow_first_call_alone_does_not_skip_a_gemm(monkeypatch):
    """One-time costs of a first call (cuBLAS heuristics, oneDNN primitives) are not the GEMM's
    time: a 0.3 s first call, times 2 timed calls over a 0.5 s budget, is timed again, and the fast
    second call keeps it; a first call over the whole budget (0.2 s) is not given a second one."""
    real, calls = torch.matmul, []

    def first_slow(a, b, out=None):
        calls.append(1)
        if len(calls) == 1:
            import time
            time.sleep(0.3)
        return real(a, b, out=out)

    monkeypatch.setattr(torch, "matmul", first_slow)
    out = measure_ceilings(tiny_spec(square_sizes=(48,), decode_ms=(), gemm_budget_s=0.5))
    assert [r["M"] for r in out["matmul"] if r["kind"] == "square"] == [48] and out["failures"] == []
    calls.clear()
    out = measure_ceilings(tiny_spec(square_sizes=(48,), decode_ms=(), gemm_budget_s=0.2))
    assert len(calls) == 1 and [f["stage"] for f in out["failures"]] == ["skipped"]


def test_the_gemm_budget_defaults_and_zero_means_no_limit():
    assert CeilingsRequest(device="cpu").gemm_budget_s == 5.0
    assert CeilingsRequest(device="cpu", quick=True).gemm_budget_s == 2.0
    assert CeilingsRequest(device="cpu", gemm_budget_s=0).gemm_budget_s == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the no-CUDA message")
def test_cuda_without_a_gpu_fails_fast():
    with pytest.raises(ConfigError, match="device='cuda'"):
        CeilingsRequest(device="cuda")


def test_cpu_defaults_are_torch_kernels_and_the_documented_ranges():
    s = CeilingsRequest(device="cpu")
    assert s.kernels == tuple(n for n in kernels.KERNELS if n.startswith("torch_"))
    assert s.working_sets == (MiB, 16 * MiB, 256 * MiB)  # in cache, LLC-sized, DRAM: what a 2-core CPU waits for
    assert s.dtypes == ("bfloat16", "float32") and s.bandwidth_dtypes == ("float32",)
    assert s.decode_ms == (1, 4, 16, 64, 256)
    full = CeilingsRequest(device="cpu", full=True)
    assert full.working_sets == tuple(2**p for p in range(18, 30))  # 256 KiB .. 512 MiB
    assert full.decode_ms == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    with pytest.raises(ConfigError, match="full=true with quick=true"):
        CeilingsRequest(device="cpu", full=True, quick=True)
    assert s.decode_model.name == "cpu-demo"


def test_from_dict_fills_nulls_with_defaults_and_reads_a_preset_name():
    s = CeilingsRequest.from_dict({"device": "cpu", "quick": True, "dtypes": ["bf16"],
                                "decode_model": "tiny", "kernels": None,
                                "timer": {"warmup": None, "min_reps": 4, "budget_s": None}})
    assert s.dtypes == ("bfloat16",) and s.decode_model.name == "tiny"
    assert s.timer.min_reps == 4 and s.timer.budget_s == ceilings._TIMERS["cpu"][1].budget_s
    with pytest.raises(ConfigError, match="unknown field"):
        CeilingsRequest.from_dict({"devcie": "cpu"})


# ----------------------------------------------------------------------------- entry point


def run_entry(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "roofline.cli.ceilings", *overrides], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_entry_point_rejects_an_unknown_kernel_before_measuring(tmp_path):
    p = run_entry("kernels=[torch_copy,warp_drive]", f"out_dir={tmp_path / 'run'}")
    assert p.returncode == 2
    assert "kernels" in p.stderr and "warp_drive" in p.stderr
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_cuda_quick_ceilings_include_triton_and_reach_a_plausible_roof():
    req = CeilingsRequest(device="cuda", quick=True, working_sets=(16 * MiB, 1024 * MiB),
                        square_sizes=(2048,), decode_ms=(1,))
    if kernels.triton_available():
        assert any(kernels.KERNELS[k].uses_triton for k in req.kernels)
    out = measure_ceilings(req)
    assert not out["failures"], out["failures"]
    s = out["summary"]
    if out["datasheet"]:
        assert 0.3 * out["datasheet"]["mem_bw_GBps"] < s["mem_bw_GBps"] < 1.05 * out["datasheet"]["mem_bw_GBps"]


def test_format_gemms_read_the_format_bytes_and_record_what_has_no_kernel():
    """Decode GEMMs per weight format: int8 through its packed CPU kernel with bytes = the
    format's exact bytes (scales included) + bf16 input and output; fp8 has no fast CPU kernel
    and int4_g128 cannot group K=64: both failures named, never timed."""
    r = measure_ceilings(tiny_spec(formats=("int8", "fp8", "int4_g128"), decode_ms=(1,), kernels=("torch_read",)))
    int8 = [m for m in r["matmul"] if m["dtype"] == "bfloat16+weights=int8"]
    assert {m["name"] for m in int8} == {n for n, _, _ in decode_gemm_shapes(get_preset("tiny"))}
    for m in int8:
        nbytes = m["N"] * m["K"] + 2 * m["N"] + 2 * (m["K"] + m["N"])
        assert m["GBps"] == pytest.approx(nbytes / m["t_median_s"] / 1e9, rel=1e-12)
    assert r["summary"]["decode_m1_GBps"]["bfloat16+weights=int8"] == max(m["GBps"] for m in int8)
    failed = {f["dtype"]: f for f in r["failures"]}
    assert "weights=fp8_e4m3 on device=cpu" in failed["bfloat16+weights=fp8_e4m3"]["error"]
    assert failed["bfloat16+weights=fp8_e4m3"]["status"] == "unsupported"
    assert "K=64" in failed["bfloat16+weights=int4_g128"]["error"]
    assert not [m for m in r["matmul"] if "fp8" in m["dtype"]]
    assert {m["K"] for m in r["matmul"] if "int4" in m["dtype"]} == {128}  # ffn_down only


# ----------------------------------------------------------------------------- trust: roofs, busy machine, cut runs


def mm_row(kind, dtype, M, tflops):
    return dict(kind=kind, name=f"{kind}_{M}", dtype=dtype, M=M, N=64, K=64, t_median_s=1.0, TFLOPs=tflops,
                GBps=1.0, pct_datasheet_flops=None)


def test_the_compute_roof_is_the_best_of_square_and_decode_shaped_gemms():
    # a slow square bf16 path (0.0008) must not set the roof below what decode-shaped GEMMs reach (0.015)
    rows = [mm_row("square", "bfloat16", 1024, 0.0008), mm_row("decode", "bfloat16", 128, 0.015),
            mm_row("square", "float32", 1024, 0.2), mm_row("decode", "float32", 128, 0.1),
            mm_row("decode", "bfloat16+weights=int8", 128, 9.0)]
    s = summarize([bw_row("torch_copy", 2**30, 10.0)], rows, 64 * MiB)
    assert s["peak_tflops"] == {"bfloat16": 0.015, "float32": 0.2}  # a packed format's rate is not a dtype's roof
    assert s["peak_from"]["bfloat16"] == "decode decode_128 M=128"


class FakeMonitor:
    def __init__(self, busy):
        self.busy, self.checks = busy, 0

    def check(self):
        self.checks += 1
        return dict(busy=self.busy, why="reference got 20% of its threads' CPU time" if self.busy else "")


@pytest.mark.parametrize("busy", [False, True])
def test_a_group_on_a_busy_machine_is_measured_again_then_marked(busy):
    calls = []
    run = ceilings._Run(tiny_spec(), 1, False, None, monitor=FakeMonitor(busy))
    rows = run.group("torch_copy/float32", lambda: calls.append(1) or [{"GBps": 1.0}])
    assert len(calls) == (2 if busy else 1)
    assert ("busy" in rows[0]) == busy and bool(run.busy) == busy
    if busy:
        assert run.busy[0]["group"] == "torch_copy/float32" and "20%" in rows[0]["busy"]


def test_a_busy_ceilings_run_says_so_in_its_summary(monkeypatch):
    import roofline.measure.noise as noise
    monkeypatch.setattr(noise, "NoiseMonitor", lambda *a, **k: FakeMonitor(True))
    doc = measure_ceilings(tiny_spec(busy_check=True, dtypes=("float32",), decode_ms=(1,)))
    groups = [b["group"] for b in doc["summary"]["busy_machine"]]
    assert "torch_copy/float32" in groups and "matmul/decode/float32" in groups
    assert "busy machine" in ceilings.format_summary(doc)


def test_a_cut_run_keeps_every_finished_group_on_disk(tmp_path, monkeypatch):
    def cut(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(ceilings, "_measure_matmul", cut)
    with pytest.raises(KeyboardInterrupt):
        measure_ceilings(tiny_spec(), out_dir=tmp_path)
    doc = load_ceilings(tmp_path)
    assert doc["summary"]["complete"] is False
    assert {r["kernel"] for r in doc["bandwidth"]} == {"torch_copy", "torch_read"}
    assert doc["summary"]["mem_bw_GBps"] > 0  # the copy roof survives the cut
