"""The CPU's compiled mode: the token axes and the cache length dynamic (one graph serves every
q > 1 at B = 1), checked against eager before it is timed, and a recompile-limit fallback caught
and recorded. One layer of the tiny preset: every Inductor compile lowers each layer."""

import pytest
import torch

from roofline.measure.forward import CompiledForward, compiled_calls
from roofline.measure.timer import _cxx_compiler
from roofline.model.decoder import build_model
from roofline.model.presets import get_preset

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_cxx_compiler() is None, reason="Inductor on the CPU needs a C++ compiler")]


@pytest.fixture(scope="module")
def model():
    return build_model(get_preset("tiny").scaled(layers=1), max_batch=2, max_context=64, dtype=torch.float32)


def test_compiled_forward_equals_eager_and_one_graph_serves_every_cache_length_and_token_count(model):
    calls = compiled_calls(model, model.cfg.layers, "float32", max_autotune=False)
    fwd = calls["forward"]
    tok = torch.randint(0, model.cfg.vocab, (1, 3))
    first = fwd.prepare(tok, 8)
    assert first["compile_fallback"] is None and first["compile_new_graph"]
    assert first["compile_vs_eager_cosine"] > 0.9999 and first["compile_s"] > 0
    graphs = first["compile_graphs"]
    for L in (9, 20, 40):  # same M, another cache length: no new graph
        fwd.prepare(tok, L)
        with torch.no_grad():
            out, ref = fwd(tok, L), model(tok, L)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    tok5 = torch.randint(0, model.cfg.vocab, (1, 5))  # another q > 1 at B = 1: the same graph (q is symbolic)
    fifth = fwd.prepare(tok5, 8)
    assert not fifth["compile_new_graph"] and fifth["compile_graphs"] == graphs
    with torch.no_grad():
        torch.testing.assert_close(fwd(tok5, 8), model(tok5, 8), rtol=1e-4, atol=1e-4)
    tok2 = torch.randint(0, model.cfg.vocab, (2, 2))  # B > 1 (Dynamo specialises a size of 1): a graph of its own
    second = fwd.prepare(tok2, 8)
    assert second["compile_new_graph"] and second["compile_vs_eager_cosine"] > 0.9999


def test_a_recompile_limit_hit_falls_back_to_eager_and_says_so(model):
    torch._dynamo.reset()
    fwd = CompiledForward(lambda t, s: model(t, s), model.cfg.layers, "float32", max_autotune=False,
                          recompile_limit=1)
    a = torch.randint(0, model.cfg.vocab, (1, 1))
    b = torch.randint(0, model.cfg.vocab, (1, 2))
    assert fwd.prepare(a, 4)["compile_fallback"] is None
    info = fwd.prepare(b, 4)
    assert info["compile_fallback"] and "recompile limit" in info["compile_fallback"]
    with torch.no_grad():
        torch.testing.assert_close(fwd(b, 4), model(b, 4))  # the eager call, not an error


def test_an_unprepared_shape_is_never_compiled_inside_a_timed_call(model):
    fwd = CompiledForward(lambda t, s: model(t, s), model.cfg.layers, "float32", max_autotune=False)
    with pytest.raises(RuntimeError, match="prepare"):
        fwd(torch.zeros(1, 1, dtype=torch.long), 4)


def test_a_compiled_graph_that_differs_from_eager_is_refused(model, monkeypatch):
    fwd = CompiledForward(lambda t, s: model(t, s), model.cfg.layers, "float32", max_autotune=False)
    fwd.compiled = lambda t, s: -model(t, s)  # a wrong "compiled" result
    with pytest.raises(RuntimeError, match="differs from eager"):
        fwd.prepare(torch.randint(0, model.cfg.vocab, (1, 2)), 4)


def test_a_compiled_sweep_row_records_its_compile_apart_from_its_timing(tmp_path):
    from roofline.io import results
    from roofline.measure.sweep import SweepRequest, run_sweep
    from roofline.measure.timer import TimerSettings
    req = SweepRequest(model=get_preset("tiny").scaled(layers=1), q=(1,), B=(1,), L=(4, 8), dtypes=("float32",), modes=("compiled",),
                     timer=TimerSettings(warmup=1, min_reps=3, max_reps=5, budget_s=0.05))
    run_sweep(req, tmp_path, progress=False, noise=None)
    rows = [r for r in results.read_rows(tmp_path / "points.jsonl") if r["kind"] == "forward"]
    assert [r["status"] for r in rows] == ["ok", "ok"], rows[0].get("error")
    first, second = sorted(rows, key=lambda r: r["L"])
    assert first["t_mode"] == "compiled" and first["compile_fallback"] is None
    assert first["compile_gemm_backends"] == "CPP"  # the CPP template took every GEMM, nothing autotuned
    assert first["compile_vs_eager_cosine"] > 0.9999
    assert first["compile_new_graph"] and not second["compile_new_graph"]  # L is dynamic: one graph for both
    assert second["compile_s"] == first["compile_s"]  # the compile of the graph it ran, measured once, outside the reps
    assert not first["compile_recompiled_while_timed"] and not second["compile_recompiled_while_timed"]


def test_a_gemm_the_cpp_template_cannot_take_is_compiled_again_with_aten_beside_it(model):
    import torch._inductor.config as inductor_config
    from roofline.measure.forward import _no_gemm_choice
    NoValidChoicesError = type("NoValidChoicesError", (RuntimeError,), {})
    assert not _no_gemm_choice(RuntimeError("something else"))
    fwd = CompiledForward(lambda t, s: model(t, s), model.cfg.layers, "float32")
    tried = []

    def compiled(t, s):  # stands in for torch.compile: the CPP backend alone finds no kernel
        tried.append(inductor_config.max_autotune_gemm_backends)
        if tried[-1] == "CPP":
            raise RuntimeError("backend compiler failed") from NoValidChoicesError("No choices exist for backend.")
        return model(t, s)
    fwd.compiled = compiled
    info = fwd.prepare(torch.randint(0, model.cfg.vocab, (1, 2)), 4)
    assert tried == ["CPP", "CPP,ATEN"] and info["compile_gemm_backends"] == "CPP,ATEN"
    assert info["compile_fallback"] is None
