"""The CPU's skinny GEMM (roofline.measure.cpu_gemm), float32 and bfloat16: exact against float64,
used only where it applies (and up to the crossover the ceilings measured), swapped into a model
without changing its logits, and named in every row."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from roofline.measure import cpu_gemm
from roofline.measure.sweep import BuiltModel, SweepRequest, run_sweep
from roofline.model.decoder import build_model
from roofline.model.presets import get_preset

needs_compiler = pytest.mark.skipif(cpu_gemm._compiler() is None, reason="no C++ compiler to build the kernel")


def _ref(x, w, b=None):
    y = x.double() @ w.double().T
    return y if b is None else y + b.double()


@needs_compiler
@pytest.mark.parametrize("N,K", [(1, 1), (11, 7), (12, 8), (37, 13), (100, 1024), (25, 4096)])
@pytest.mark.parametrize("M", [0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13, 17, 33, 128])
def test_skinny_linear_equals_float64(M, N, K):
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    y = cpu_gemm.skinny_linear(x, w, b)
    assert y.shape == (M, N) and y.dtype == torch.float32
    # fp32 accumulation over K terms: |err| <= K·eps32·(|x| @ |w|^T) (+ the output's rounding)
    tol = (K + 2) * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T + b.double().abs())
    assert bool(((y.double() - _ref(x, w, b)).abs() <= tol + 1e-30).all())


@needs_compiler
def test_leading_dims_and_non_contiguous_inputs():
    x = torch.randn(3, 2, 50)[:, :, ::2]  # a strided view: [3, 2, 25]
    w = torch.randn(40, 25)
    torch.testing.assert_close(cpu_gemm.skinny_linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)


BF16_ENTRIES = ["skinny_bf16w", "skinny_bf16", "skinny_amx"]


def _has_entry(entry):
    if cpu_gemm._compiler() is None:
        return False
    if entry == cpu_gemm.DPBF16:
        return bool(cpu_gemm.library().skinny_has_dpbf16())
    if entry == cpu_gemm.AMX:
        return cpu_gemm._amx(cpu_gemm.library())
    return True


@needs_compiler
@pytest.mark.parametrize("entry", BF16_ENTRIES)
@pytest.mark.parametrize("N,K", [(1, 1), (13, 31), (12, 32), (37, 70), (25, 1024), (16, 32), (80, 96), (64, 1024)])
@pytest.mark.parametrize("M", [1, 2, 5, 6, 7, 13, 16, 17, 33])
def test_bfloat16_weights_equal_float64_rounded_once(monkeypatch, entry, M, N, K):
    """Every entry, on shapes its tiles cover and on shapes they do not (skinny_amx hands those
    to skinny_bf16), against the float64 product."""
    if not _has_entry(entry):
        pytest.skip(f"{entry}: this CPU has no {'AMX-BF16' if entry == cpu_gemm.AMX else 'AVX512-BF16'}")
    monkeypatch.setattr(cpu_gemm, "_entry", lambda dtype: entry if dtype == torch.bfloat16 else cpu_gemm.SYMBOLS[dtype])
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    x, w, b = (torch.randn(*s, generator=g).bfloat16() for s in ((M, K), (N, K), (N,)))
    y = cpu_gemm.skinny_linear(x, w, b)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    # products of bfloat16 are exact in float32; float32 sums over K terms, then one bfloat16 rounding
    exact = _ref(x, w, b)
    tol = ((K + 2) * torch.finfo(torch.float32).eps * (x.double().abs() @ w.double().abs().T + b.double().abs())
           + exact.abs() * 2.0 ** -8)
    assert bool(((y.double() - exact).abs() <= tol + 1e-30).all())


def test_other_dtypes_are_refused():
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        cpu_gemm.skinny_linear(torch.randn(1, 8, dtype=torch.float16), torch.randn(4, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="one dtype"):
        cpu_gemm.skinny_linear(torch.randn(1, 8), torch.randn(4, 8, dtype=torch.bfloat16))


@needs_compiler
def test_skinny_linear_module_uses_the_kernel_only_where_it_applies(monkeypatch):
    lin = torch.nn.Linear(16, 8)
    mod = cpu_gemm.SkinnyLinear(lin)
    assert mod.weight is lin.weight  # no copy of the weight
    calls = []
    real = cpu_gemm.skinny_linear
    monkeypatch.setattr(cpu_gemm, "skinny_linear", lambda *a: calls.append(a[0].shape) or real(*a))
    with torch.no_grad():
        mod(torch.randn(2, 3, 16))  # M = 6: the kernel
        mod(torch.randn(cpu_gemm.MAX_M + 1, 16))  # past MAX_M: F.linear
        mod(torch.randn(1, 16, dtype=torch.float64).float().bfloat16().float())
        cpu_gemm.SkinnyLinear(lin, max_m=4)(torch.randn(5, 16))  # past the crossover given: F.linear
    assert calls == [(2, 3, 16), (1, 16)]
    x = torch.randn(4, 16, requires_grad=True)
    mod(x).sum().backward()  # autograd: F.linear, gradients flow
    assert len(calls) == 2 and x.grad is not None and lin.weight.grad is not None


@needs_compiler
def test_swapping_keeps_the_logits_and_takes_only_float32_and_bfloat16_linears():
    cfg = get_preset("tiny")
    a = build_model(cfg, max_batch=2, max_context=16, dtype=torch.float32, device="cpu", seed=0)
    b = build_model(cfg, max_batch=2, max_context=16, dtype=torch.float32, device="cpu", seed=0)
    linears = sum(type(m) is torch.nn.Linear for m in b.modules())
    assert cpu_gemm.use_skinny_linears(b) == linears > 0
    assert not any(type(m) is torch.nn.Linear for m in b.modules())
    tok = torch.randint(0, cfg.vocab, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(b(tok, 0), a(tok, 0), rtol=1e-4, atol=1e-4)
    half = build_model(cfg, max_batch=1, max_context=16, dtype=torch.float16, device="cpu", seed=0)
    assert cpu_gemm.use_skinny_linears(half) == 0
    a, b = (build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16, device="cpu", seed=0) for _ in range(2))
    assert cpu_gemm.use_skinny_linears(b) == linears
    with torch.no_grad():  # float32 sums rounded once vs oneDNN's: a bfloat16 ulp or so per layer
        torch.testing.assert_close(b(tok, 0).float(), a(tok, 0).float(), rtol=0.05, atol=0.05)


def _no_compiler(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "_compiler", lambda: None)
    cpu_gemm.library.cache_clear()
    monkeypatch.setattr(cpu_gemm, "library", _uncached)


def _uncached():
    """library() without its memo, so a monkeypatched compiler is asked again."""
    return cpu_gemm._build_and_load()


def test_without_a_compiler_the_kernel_is_unavailable_and_says_why(monkeypatch):
    _no_compiler(monkeypatch)
    ok, why = cpu_gemm.available()
    assert not ok and "C++ compiler" in why
    with pytest.raises(cpu_gemm.KernelUnavailable):
        cpu_gemm.use_skinny_linears(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def _request(tmp_path, **kw):
    return SweepRequest(**{**dict(model=get_preset("tiny"), q=(1, 2), B=(1,), L=(8,), dtypes=("float32",),
                                  modes=("eager",), out_dir=str(tmp_path)), **kw})


@needs_compiler
@pytest.mark.parametrize("choice,kernel", [("auto", "skinny_f32"), ("skinny", "skinny_f32"), ("aten", "aten")])
def test_a_sweep_row_names_its_gemm_kernel(tmp_path, choice, kernel):
    w = BuiltModel(_request(tmp_path, cpu_gemm=choice), "float32", get_preset("tiny").layers, "eager")
    assert w.gemm_kernel.startswith(kernel)
    assert any(isinstance(m, cpu_gemm.SkinnyLinear) for m in w.model.modules()) == (kernel != "aten")
    bf16 = BuiltModel(_request(tmp_path, cpu_gemm=choice, dtypes=("bfloat16",)), "bfloat16", 2, "eager").gemm_kernel
    assert bf16.startswith(cpu_gemm.kernel_name(torch.bfloat16) if kernel != "aten" else "aten")
    assert BuiltModel(_request(tmp_path, dtypes=("float16",)), "float16", 2, "eager").gemm_kernel == "aten"


def test_auto_falls_back_to_aten_saying_why_and_skinny_is_unsupported(tmp_path, monkeypatch):
    _no_compiler(monkeypatch)
    w = BuiltModel(_request(tmp_path), "float32", 2, "eager")
    assert w.gemm_kernel.startswith("aten (") and "C++ compiler" in w.gemm_kernel
    with pytest.raises(NotImplementedError):  # an `unsupported` row in a sweep, not a bug
        BuiltModel(_request(tmp_path, cpu_gemm="skinny"), "float32", 2, "eager")


def _rows(dtype, ratios: dict[int, list[float]]):
    """Decode rows of a ceilings file: per M, t(skinny) / t(F.linear) for each shape."""
    out = []
    for M, rs in ratios.items():
        for i, r in enumerate(rs):
            base = dict(kind="decode", dtype=dtype, name=f"shape{i}", M=M)
            out += [dict(base, kernel="F.linear", t_median_s=1.0), dict(base, kernel="skinny_bf16", t_median_s=r)]
    return out


def test_the_crossover_is_the_last_measured_win_from_one_token():
    doc = {"matmul": _rows("bfloat16", {1: [0.5, 0.6, 0.4], 4: [0.8, 0.9, 1.2], 16: [2.0, 2.5, 1.9], 128: [0.9, 0.8, 0.7]})
           + _rows("float32", {1: [1.1, 1.2, 0.9], 4: [0.5, 0.5, 0.5]})
           + [dict(kind="decode", dtype="float16", name="x", M=1, kernel="F.linear", t_median_s=1.0)]}
    # bf16 wins at 1 and 4 (median 0.9), loses at 16: a win at 128 after the loss does not count
    # fp32 loses at M = 1 (median 1.1): 0, F.linear everywhere; float16 timed no skinny rows: absent
    assert cpu_gemm.crossovers(doc) == {"bfloat16": 4, "float32": 0}
    assert cpu_gemm.crossovers(None) == {} == cpu_gemm.crossovers({"matmul": []})


@needs_compiler
def test_a_sweep_takes_the_crossover_and_records_it(tmp_path):
    req = _request(tmp_path, skinny_max_m=(("float32", 4),))
    w = BuiltModel(req, "float32", 2, "eager")
    assert "M <= 4; F.linear above" in w.gemm_kernel
    assert {m.max_m for m in w.model.modules() if isinstance(m, cpu_gemm.SkinnyLinear)} == {4}
    w = BuiltModel(_request(tmp_path, skinny_max_m=(("float32", 0),)), "float32", 2, "eager")
    assert w.gemm_kernel.startswith("aten (F.linear measured faster")
    assert not any(isinstance(m, cpu_gemm.SkinnyLinear) for m in w.model.modules())
    w = BuiltModel(_request(tmp_path, cpu_gemm="skinny", skinny_max_m=(("float32", 0),)), "float32", 2, "eager")
    assert w.gemm_kernel.startswith("skinny_f32")  # asked for by name: the measurement does not overrule it
    assert _request(tmp_path).fingerprint() == req.fingerprint()  # derived from the ceilings: not the grid


def test_a_failed_build_is_tried_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_gemm, "_compiler", lambda: calls.append(1))  # None: no compiler
    cpu_gemm.library.cache_clear()
    try:
        assert [cpu_gemm.available()[0] for _ in range(3)] == [False] * 3
        with pytest.raises(cpu_gemm.KernelUnavailable, match="C\\+\\+ compiler"):
            cpu_gemm.library()
        assert len(calls) == 1
    finally:
        cpu_gemm.library.cache_clear()


def test_an_unknown_choice_is_a_config_error():
    from roofline.io.fields import ConfigError
    with pytest.raises(ConfigError, match="cpu_gemm"):
        SweepRequest(model=get_preset("tiny"), q=(1,), B=(1,), L=(8,), cpu_gemm="mkl").validate()


@needs_compiler
def test_the_build_is_cached_per_source_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE", str(tmp_path))
    cpu_gemm.library.cache_clear()
    try:
        cpu_gemm.library()
        built = list((tmp_path / "cpu_gemm").glob("skinny_f32-*.so"))
        assert len(built) == 1
        cpu_gemm.library.cache_clear()
        cpu_gemm.library()  # loaded, not rebuilt
        assert list((tmp_path / "cpu_gemm").glob("*")) == built
    finally:
        cpu_gemm.library.cache_clear()


@needs_compiler
def test_amx_runs_the_shapes_it_tiles_and_declines_the_rest():
    """skinny_amx returns 0 where it ran (N a multiple of 16, K of 32) and -1 where skinny_bf16
    must (so a declined shape is never a silent zero output)."""
    if not _has_entry(cpu_gemm.AMX):
        pytest.skip("this CPU has no AMX-BF16")
    lib = cpu_gemm.library()
    for (M, N, K), ran in {(3, 32, 64): True, (20, 48, 32): True, (3, 40, 64): False, (3, 32, 48): False}.items():
        x, w = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
        y = torch.full((M, N), float("nan"))
        rc = lib.skinny_amx(w.data_ptr(), x.data_ptr(), y.data_ptr(), M, N, K, 2)
        assert (rc == 0) == ran
        if ran:
            torch.testing.assert_close(y.double(), x.double() @ w.double().T, rtol=1e-5, atol=1e-4)


@needs_compiler
def test_kernel_seconds_counts_the_time_inside_the_kernel_only():
    w, x = torch.randn(64, 256), torch.randn(2, 256)
    import time

    def step():
        cpu_gemm.skinny_linear(x, w)
        time.sleep(0.03)  # the rest of a pass: not the kernel's

    inside = cpu_gemm.kernel_seconds(step)
    assert 0 < inside < 0.03
    assert not cpu_gemm._Clock.on
    with pytest.raises(ZeroDivisionError):
        cpu_gemm.kernel_seconds(lambda: 1 / 0)
    assert not cpu_gemm._Clock.on  # a failing step leaves the clock off


@needs_compiler
@pytest.mark.parametrize("choice", ["skinny", "aten"])
def test_a_skinny_sweep_row_splits_its_step_into_gemms_and_the_rest(tmp_path, choice):
    import pandas as pd
    from roofline.measure.sweep import run_sweep
    from roofline.measure.timer import TimerSettings
    req = _request(tmp_path, q=(1,), cpu_gemm=choice, mtp_q=(),
                 timer=TimerSettings(warmup=1, min_reps=3, max_reps=3, budget_s=0.05))
    run_sweep(req, tmp_path, progress=False)
    df = pd.read_csv(tmp_path / "points.csv")
    if choice == "aten":
        assert "t_gemm_s" not in df or df["t_gemm_s"].isna().all()
    else:
        assert (df["t_gemm_s"] > 0).all()
