"""The CPU's skinny float32 GEMM (roofline.measure.cpu_gemm): exact against float64, used only
where it applies, swapped into a model without changing its logits, and named in every row."""

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


def test_other_dtypes_are_refused():
    with pytest.raises(ValueError, match="float32"):
        cpu_gemm.skinny_linear(torch.randn(1, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16))


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
    assert calls == [(2, 3, 16), (1, 16)]
    x = torch.randn(4, 16, requires_grad=True)
    mod(x).sum().backward()  # autograd: F.linear, gradients flow
    assert len(calls) == 2 and x.grad is not None and lin.weight.grad is not None


@needs_compiler
def test_swapping_keeps_the_logits_and_takes_only_float32_linears():
    cfg = get_preset("tiny")
    a = build_model(cfg, max_batch=2, max_context=16, dtype=torch.float32, device="cpu", seed=0)
    b = build_model(cfg, max_batch=2, max_context=16, dtype=torch.float32, device="cpu", seed=0)
    linears = sum(type(m) is torch.nn.Linear for m in b.modules())
    assert cpu_gemm.use_skinny_linears(b) == linears > 0
    assert not any(type(m) is torch.nn.Linear for m in b.modules())
    tok = torch.randint(0, cfg.vocab, (2, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(b(tok, 0), a(tok, 0), rtol=1e-4, atol=1e-4)
    half = build_model(cfg, max_batch=1, max_context=16, dtype=torch.bfloat16, device="cpu", seed=0)
    assert cpu_gemm.use_skinny_linears(half) == 0


def _no_compiler(monkeypatch):
    monkeypatch.setattr(cpu_gemm, "_compiler", lambda: None)
    cpu_gemm.library.cache_clear()
    monkeypatch.setattr(cpu_gemm, "library", cpu_gemm.library.__wrapped__)


def test_without_a_compiler_the_kernel_is_unavailable_and_says_why(monkeypatch):
    _no_compiler(monkeypatch)
    ok, why = cpu_gemm.available()
    assert not ok and "C++ compiler" in why
    with pytest.raises(cpu_gemm.KernelUnavailable):
        cpu_gemm.use_skinny_linears(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def _spec(tmp_path, **kw):
    return SweepRequest(**{**dict(model=get_preset("tiny"), q=(1, 2), B=(1,), L=(8,), dtypes=("float32",),
                                  modes=("eager",), out_dir=str(tmp_path)), **kw})


@needs_compiler
@pytest.mark.parametrize("choice,kernel", [("auto", "skinny_f32"), ("skinny", "skinny_f32"), ("aten", "aten")])
def test_a_sweep_row_names_its_gemm_kernel(tmp_path, choice, kernel):
    w = BuiltModel(_spec(tmp_path, cpu_gemm=choice), "float32", get_preset("tiny").layers, "eager")
    assert w.gemm_kernel.startswith(kernel)
    assert any(isinstance(m, cpu_gemm.SkinnyLinear) for m in w.model.modules()) == (kernel != "aten")
    assert BuiltModel(_spec(tmp_path, dtypes=("bfloat16",)), "bfloat16", 2, "eager").gemm_kernel == "aten"


def test_auto_falls_back_to_aten_saying_why_and_skinny_is_unsupported(tmp_path, monkeypatch):
    _no_compiler(monkeypatch)
    w = BuiltModel(_spec(tmp_path), "float32", 2, "eager")
    assert w.gemm_kernel.startswith("aten (") and "C++ compiler" in w.gemm_kernel
    with pytest.raises(NotImplementedError):  # an `unsupported` row in a sweep, not a bug
        BuiltModel(_spec(tmp_path, cpu_gemm="skinny"), "float32", 2, "eager")


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
