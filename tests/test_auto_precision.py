"""dtypes=[auto]: the precision the measured ceilings keep memory-bound longest, in the device's fast mode."""

import json

import pytest

from roofline.measure import ceilings
from roofline.measure.ceilings import SCHEMA_VERSION, choose_precision, knee_tokens
from roofline.measure.sweep import SweepRequest, grid, resolve_auto, spec_device_name
from roofline.model.presets import get_preset


def doc(bf16_tflops: float, fp32_tflops: float, bw: float = 15.0) -> dict:
    peaks = {"bfloat16": bf16_tflops, "float32": fp32_tflops}
    return {"schema_version": SCHEMA_VERSION, "provenance": {"device_name": spec_device_name("cpu")},
            "datasheet": None, "bandwidth": [], "matmul": [], "telemetry": [], "failures": [],
            "summary": {"mem_bw_GBps": bw, "mem_bw_kernel": "torch_read", "peak_tflops": peaks,
                        "ridge_measured": {d: f * 1e3 / bw for d, f in peaks.items()}, "cache_bytes": 2**26}}


@pytest.fixture(autouse=True)
def compiler_present(monkeypatch):
    monkeypatch.setattr(ceilings.timer, "_cxx_compiler", lambda: "c++")
    monkeypatch.setattr(ceilings.cpu_gemm, "available", lambda: (True, ""))


def test_emulated_bf16_picks_float32_eager_on_the_skinny_gemm():
    # 0.06 TFLOP/s bf16 (emulated), 0.3 fp32: fp32's knee 0.3e12/15e9*4/2 = 40 tokens, bf16's 4
    dtype, mode, why = choose_precision("cpu", doc(0.06, 0.3))
    assert (dtype, mode) == ("float32", "eager")
    assert "float32" in why and "knee ~40 tokens" in why and "knee ~4 tokens" in why
    assert "skinny float32 GEMM" in why


def test_float32_is_compiled_where_the_skinny_gemm_cannot_be_built(monkeypatch):
    monkeypatch.setattr(ceilings.cpu_gemm, "available", lambda: (False, "no compiler"))
    dtype, mode, why = choose_precision("cpu", doc(0.06, 0.3))
    assert (dtype, mode) == ("float32", "compiled") and "skinny" not in why


def test_native_bf16_picks_bfloat16_eager_on_the_skinny_gemm(monkeypatch):
    # AMX-class bf16 (5 TFLOP/s) against 0.3 fp32: bf16's knee 333 tokens beats fp32's 40
    dtype, mode, why = choose_precision("cpu", doc(5.0, 0.3))
    assert (dtype, mode) == ("bfloat16", "eager") and "skinny bfloat16 GEMM" in why
    monkeypatch.setattr(ceilings.cpu_gemm, "available", lambda: (False, "no compiler"))
    assert choose_precision("cpu", doc(5.0, 0.3))[:2] == ("bfloat16", "compiled")


def test_a_tie_in_tokens_goes_to_the_smaller_dtype():
    k = knee_tokens(doc(0.2, 0.1))  # bf16 ridge twice fp32's at half the bytes per weight: same knee
    assert k["bfloat16"] == pytest.approx(k["float32"])
    assert choose_precision("cpu", doc(0.2, 0.1))[0] == "bfloat16"


def test_without_a_compiler_the_cpu_mode_is_eager(monkeypatch):
    monkeypatch.setattr(ceilings.timer, "_cxx_compiler", lambda: None)
    monkeypatch.setattr(ceilings.cpu_gemm, "available", lambda: (False, "no compiler"))
    assert choose_precision("cpu", doc(0.06, 0.3))[1] == "eager"
    assert choose_precision("cpu", doc(5.0, 0.3))[1] == "eager"
    assert "skinny" not in choose_precision("cpu", doc(0.06, 0.3))[2]


def _request(tmp_path, d, **kw):
    path = tmp_path / "ceilings.json"
    path.write_text(json.dumps(d))
    base = dict(model=get_preset("tiny"), q=(1, 2), B=(1,), L=(8,), ceilings=str(path))
    return SweepRequest(**{**base, **kw})


def test_auto_beside_a_named_dtype_gives_both_regimes_in_one_grid(tmp_path):
    req = _request(tmp_path, doc(0.06, 0.3), dtypes=("auto", "bfloat16"), modes=("auto",))
    out, fresh = resolve_auto(req, tmp_path)
    assert fresh is None  # the given ceilings were used, nothing measured
    assert out.pairs == (("float32", "eager"), ("bfloat16", "eager"))
    assert {(p.dtype, p.mode) for p in grid(out)} == {("float32", "eager"), ("bfloat16", "eager")}
    assert "chose float32" in out.auto_choice


def test_modes_given_override_the_auto_mode(tmp_path):
    req = _request(tmp_path, doc(5.0, 0.3), dtypes=("auto",), modes=("eager",))
    out, _ = resolve_auto(req, tmp_path)
    assert out.pairs == (("bfloat16", "eager"),)


def test_the_reason_is_not_part_of_the_fingerprint(tmp_path):
    a, _ = resolve_auto(_request(tmp_path, doc(0.06, 0.3), dtypes=("auto",), modes=("auto",)), tmp_path)
    b, _ = resolve_auto(_request(tmp_path, doc(0.05, 0.31), dtypes=("auto",), modes=("auto",)), tmp_path)
    assert a.auto_choice != b.auto_choice and a.fingerprint() == b.fingerprint()


def test_modes_auto_for_a_named_dtype_is_eager_and_keeps_the_fingerprint(tmp_path):
    named = SweepRequest(model=get_preset("tiny"), q=(1,), B=(1,), L=(8,), dtypes=("bfloat16",), modes=("auto",))
    out, fresh = resolve_auto(named, tmp_path)
    assert fresh is None and out.modes == ("eager",) and not out.pairs
    plain = SweepRequest(model=get_preset("tiny"), q=(1,), B=(1,), L=(8,), dtypes=("bfloat16",), modes=("eager",))
    assert out.fingerprint() == plain.fingerprint()
