"""Quality gates: unconverged points, impossible fits, too few points, extrapolation marks,
the report's warnings block and the speculative-decoding mismatch flag."""

import re
import subprocess
import sys

import pandas as pd
import pytest

from roofline.analysis import capacity, costmodel, quality
from roofline.analysis.predict import DraftCost as Drafter, table
from roofline.io import results
from roofline.io.fields import ConfigError
from roofline.model.presets import REPO_ROOT, get_preset
from roofline.commands.sweep import summary_text
from roofline.measure.sweep import SweepRequest, run_sweep
from roofline.measure.timer import TimerSettings
from tests.helpers import roof_run


def test_a_fit_that_would_beat_the_measured_roof_sits_at_its_bound_and_is_flagged(tmp_path):
    """Times made at 10 GB/s on a device whose measured ceiling is 3 GB/s: the fit may not claim more
    than 1.15x the ceiling (it did: 10 GB/s, flagged only above 2x); the term at its bound is a problem."""
    fit, _ = costmodel.fit_run(roof_run(tmp_path, bw_GBps=10.0, ceiling_GBps=3.0))
    g = fit["groups"][0]
    assert g["params"]["BW_eff_GBps"] <= costmodel.ROOF_SLACK * 3.0 * (1 + 1e-6)
    assert any(p.startswith("term weights + kv at bound") and "measured ceiling of 3 GB/s" in p
               for p in g["problems"]), g["problems"]


def test_an_old_fit_above_twice_the_roof_is_still_flagged():
    """A fit.json written before the bounds (or edited) keeps its check."""
    g = dict(n_points=10, key=dict(dtype="bfloat16"), params=dict(t0_ms=0.1, BW_eff_GBps=10.0, BW_kv_GBps=10.0,
                                                                   F_eff_TFLOPs=0.1, F_attn_TFLOPs=0.1))
    ceilings = dict(summary=dict(mem_bw_GBps=3.0, peak_tflops={"bfloat16": 1.0}))
    assert any("BW_eff_GBps" in p and "above 2x the measured ceiling of 3 GB/s" in p
               for p in quality.fit_problems(g, ceilings, None))


def test_a_fit_within_the_roof_has_no_problems(tmp_path):
    fit, _ = costmodel.fit_run(roof_run(tmp_path, bw_GBps=10.0, ceiling_GBps=12.0))
    # the synthetic times carry no FLOP terms: their rates sit at the ceiling's bound, and the gate says so
    assert [p for p in fit["groups"][0]["problems"]
            if not re.match(r"term (matmul|attention) at bound|term t0 weakly", p)] == []
    assert 5.0 < fit["groups"][0]["params"]["BW_eff_GBps"] < 20.0  # near the 10 GB/s the times were made with


def test_too_few_points_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="too few points to fit.*has 1"):
        costmodel.fit_run(roof_run(tmp_path, qs=(1,), Bs=(1,), Ls=(0,)))


def test_fit_of_an_all_failed_run_is_one_line(tmp_path):
    rows = [dict(point_id=f"p{i}", kind="forward", model="tiny", dtype="bfloat16", mode="eager", q=1, B=1, L=0,
                 layers_run=2, layers_full=2, status="oom", error="out of memory") for i in range(3)]
    results.write_csv(rows, tmp_path / "points.csv")
    r = subprocess.run([sys.executable, "-m", "roofline.cli.fit", f"results_dir={tmp_path}"], cwd=REPO_ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"error: results_dir={str(tmp_path)!r}: no ok full-depth rows to fit"]


def test_unconverged_points_are_recorded_and_listed(tmp_path):
    timer = TimerSettings(warmup=0, min_reps=3, max_reps=3, rel_ci=1e-9, budget_s=0.01)
    s = SweepRequest(model=get_preset("tiny"), q=(1,), B=(1,), L=(0,), timer=timer)
    out = run_sweep(s, tmp_path, progress=False)
    assert out["not_converged"] == out["ok"] == 2 and len(out["not_converged_points"]) == 2
    assert not pd.read_csv(tmp_path / "points.csv")["converged"].any()
    text = summary_text(tmp_path)
    assert text.splitlines()[0].startswith("key figure: decode (q=1) moves")
    assert "warning: 2 of 2 points did not converge" in text


def test_the_report_opens_with_the_key_figure_and_a_warnings_block(tmp_path):
    from roofline.report.document import write_report
    run = roof_run(tmp_path, ceiling_GBps=20.0, converged=False)
    md, html = write_report(run)
    lines = [l for l in md.read_text().splitlines() if l.strip()]
    assert lines[1].startswith("**Key figure:** decode (q=1) reaches") and "% of the measured memory roof" in lines[1]
    w = lines.index("## Warnings")  # after the headline paragraphs (key figure, regime, decode) and the contents
    assert all(l.startswith(("**", "- [")) for l in lines[1:w]) and "did not converge" in lines[w + 1]
    assert lines[lines.index("**Contents**") + 1] == "- [Warnings](#warnings)"  # the first section
    assert re.search(r'<h2[^>]*>Warnings</h2>', html.read_text())


def test_key_figure_is_the_median_percent_of_the_measured_roof():
    df = pd.DataFrame(dict(status="ok", kind="forward", q=[1, 1, 1, 2], achieved_GBps=[5.0, 6.0, 8.0, 9.0],
                           pct_measured_bw=[50.0, 60.0, 80.0, 90.0], ceiling_bw_GBps=10.0, layers_run=2,
                           layers_full=2))
    assert quality.key_figure(df).startswith("decode (q=1) reaches 60% of the measured memory roof (6 of 10 GB/s, "
                                             "median of 3 points; range 50-80%)")


def test_key_figure_keeps_precisions_and_modes_apart_the_best_first():
    """A run of several dtypes (dtypes=[auto] measures bf16 and fp32) or modes: one median per precision and
    mode, never one across them (their kernels reach different rooflines)."""
    one = pd.DataFrame(dict(status="ok", kind="forward", q=1, achieved_GBps=[5.0, 6.0, 8.0],
                            pct_measured_bw=[50.0, 60.0, 80.0], ceiling_bw_GBps=10.0))
    two = pd.concat([one.assign(dtype="bfloat16", mode="eager", achieved_GBps=[1.0, 1.5, 2.0],
                                pct_measured_bw=[10.0, 15.0, 20.0]),
                     one.assign(dtype="float32", mode="eager")])
    assert quality.key_figure(two) == (
        "decode (q=1) reaches, of the measured memory roof, 60% in float32 (6 of 10 GB/s, median of 3 points; "
        "range 50-80%), 15% in bfloat16 (1.5 of 10 GB/s, median of 3 points; range 10-20%)")
    assert quality.key_figure(one.assign(dtype="float32", mode="eager")).startswith("decode (q=1) reaches 60% of")


def test_a_fit_of_one_model_applied_to_another_is_refused_unless_asked(tmp_path):
    fit, _ = costmodel.fit_run(roof_run(tmp_path))
    with pytest.raises(ConfigError, match="allow_other_model=true"):
        quality.check_model(fit, "llama-3.1-8b", allow_other_model=False)
    quality.check_model(fit, "llama-3.1-8b", allow_other_model=True)
    t = table(fit, {0.8: 0.8}, [1], [1, 64], [32], "bfloat16", Drafter("ngram"), get_preset("llama-3.1-8b"))
    assert t["extrapolated"].all()
    assert t["extrapolation"].str.contains("model: fit of tiny applied to llama-3.1-8b").all()
    assert t.loc[t["B"] == 64, "extrapolation"].str.contains(r"range: B=\[64\] outside the measured \[1, 2\]").all()


def test_predictions_inside_the_measured_range_are_not_marked(tmp_path):
    fit, _ = costmodel.fit_run(roof_run(tmp_path))
    t = table(fit, {0.8: 0.8}, [1], [1, 2], [0, 32], "bfloat16", Drafter("ngram"), get_preset("tiny"))
    assert (t["extrapolation"] == "").all()


def test_capacity_marks_extrapolation_by_range_and_dtype(tmp_path):
    fit, _ = costmodel.fit_run(roof_run(tmp_path))
    _, summary = capacity.plan(fit, get_preset("tiny"), "bfloat16", capacity.Workload(context=16, output=16),
                               8e9, [1, 32], None)
    assert summary["extrapolated"] is True and summary["extrapolation"] == ["range: B=[32] outside the measured [1, 2]"]
    assert quality.extrapolation(fit, "tiny", "float32", device_name="NVIDIA H200") == [
        "dtype: fitted bfloat16, predicted float32", "device: fitted on test CPU, predicted for NVIDIA H200"]


@pytest.mark.parametrize("kw, msg", [
    (dict(context=-1), "context=-1"), (dict(output=0), "output=0"), (dict(itl_target_ms=-5.0), "itl_target_ms"),
    (dict(target_tok_s=0.0), "target_tok_s"),
])
def test_capacity_refuses_bad_workloads(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        capacity.Workload(**kw)


@pytest.mark.parametrize("kw, msg", [
    (dict(mem_bytes=-80e9), "memory_gb=-80"), (dict(bw_eff=2.0), "bw_efficiency=2"), (dict(Bs=[0]), "B=\\[0\\]"),
    (dict(spec=capacity.Speculation(alpha=1.5)), "alpha=1.5"), (dict(t0_s=-1.0), "t0_ms"),
])
def test_capacity_refuses_bad_inputs(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        capacity.check_inputs(**{**dict(mem_bytes=80e9, Bs=[1]), **kw})


@pytest.mark.parametrize("args, msg", [(["memory_gb=-80"], "memory_gb=-80"), (["calibrate=/no/such.yaml"], "calibrate=")])
def test_capacity_bad_input_exits_2_and_writes_nothing(tmp_path, args, msg):
    r = subprocess.run([sys.executable, "-m", "roofline.cli.capacity", *args, f"out_dir={tmp_path / 'out'}"],
                       cwd=REPO_ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and msg in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_a_gross_speculative_mismatch_is_flagged():
    assert quality.mismatch(0.019, 1.51) and quality.mismatch(4.0, 1.5)
    assert not quality.mismatch(1.4, 1.51)


def test_points_marked_noisy_are_named_in_the_warnings_block(tmp_path):
    run = roof_run(tmp_path)
    df = pd.read_csv(run / "points.csv")
    df["noisy"] = False
    df["noise_reason"] = None
    df.loc[0, ["noisy", "noise_reason"]] = [True, "its threads got 45% of their CPU time"]
    warnings = quality.run_warnings(run, df)
    assert any(w.startswith(f"1 of {len(df)} points were timed on a busy machine") and "45% of their CPU" in w
               for w in warnings), warnings
    assert not any("busy machine" in w for w in quality.run_warnings(run, df.assign(noisy=False)))


def test_an_attention_rate_above_the_roof_is_flagged():
    from roofline.analysis.quality import fit_problems
    g = dict(n_points=40, key=dict(dtype="bfloat16"),
             params=dict(t0_ms=0.1, BW_eff_GBps=8.0, BW_kv_GBps=8.0, F_eff_TFLOPs=0.05, F_attn_TFLOPs=6.9e7))
    ceilings = dict(summary=dict(mem_bw_GBps=10.0, peak_tflops={"bfloat16": 0.06}))
    problems = fit_problems(g, ceilings, None)
    assert len(problems) == 1 and problems[0].startswith("F_attn_TFLOPs = 6.9e+07")
