"""The reliability findings of the third audit (H1...L15 still open, N1...N19), one reproduction each.

Each test names its finding; the reproduction is the audit's, cut to what the library does
(no real timing is asserted: the few sweeps here use the tiny preset and count rows)."""

import dataclasses
import os
import json
import math
import re

import pandas as pd
import pytest

from roofline.analysis import costmodel, fitcheck, quality
from roofline.io import results, runfolder
from roofline.io.fields import ConfigError
from roofline.measure import sweep as sw
from roofline.measure.sweep import SweepRequest, check_run_dir, dry_run, extrapolate_layers, grid, run_sweep
from roofline.measure.timer import TimerSettings
from roofline.model.presets import REPO_ROOT, get_preset
from tests.helpers import make_synthetic_run

FAST = TimerSettings(warmup=1, min_reps=3, max_reps=4, budget_s=0.02)
DEMO_FIT = REPO_ROOT / "results" / "cpu-demo" / "fit.json"


def sweep_request(**kw):
    base = dict(model=get_preset("tiny"), q=(1, 2), B=(1,), L=(8,), mtp_q=(), timer=FAST)
    base.update(kw)
    return SweepRequest(**base)


# ---- HIGH --------------------------------------------------------------------------------------

def test_N1_force_sets_aside_the_fit_report_noise_verdict_and_temp_files(tmp_path):
    for name in ("run.json", "points.jsonl", "fit.json", "report.md", "report.html", "report_costmodel.md",
                 "noise.json", ".fit.json.123.tmp"):
        (tmp_path / name).write_text("old")
    (tmp_path / "figures").mkdir()
    (tmp_path / "mine.txt").write_text("not the run's")
    dest = runfolder.set_aside(tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir() if p != dest)
    assert left == ["mine.txt"]  # nothing of the old run stays beside the new one; the user's own file does
    assert {"fit.json", "report.md", "noise.json", "figures", ".fit.json.123.tmp"} <= {p.name for p in dest.iterdir()}


def test_N2_a_stale_points_csv_is_not_used(tmp_path, capsys):
    run = make_synthetic_run(tmp_path / "r")
    rows = results.read_rows(run / "points.jsonl")
    extra = dict(rows[0], point_id="p999", q=256)  # a row the sweep appended after its last csv
    results.append_row(run / "points.jsonl", extra)
    df = results.load_run(run)
    assert len(df) == len(rows) + 1 and "p999" in set(df["point_id"])
    assert any("stale" in w for w in df.attrs["load_warnings"])
    assert "stale" in capsys.readouterr().err
    assert any("stale" in w for w in quality.run_warnings(run, df))


def test_N2_a_bad_line_does_not_hide_the_rows_after_it(tmp_path):
    run = make_synthetic_run(tmp_path / "r")
    (run / "points.csv").unlink()
    lines = (run / "points.jsonl").read_text().splitlines()
    lines[3] = "GARBAGE"
    (run / "points.jsonl").write_text("\n".join(lines) + "\n")
    df = results.load_run(run)
    assert len(df) == len(lines) - 1  # 31 good rows after the bad line are read, not 3
    assert "1 bad line(s)" in df.attrs["load_warnings"][0]
    assert len(results.read_rows(run / "points.jsonl")) == len(lines) - 1
    assert (run / "points.jsonl").read_text().splitlines()[3] == "GARBAGE"  # a reader moves nothing


def test_N2_an_unreadable_csv_falls_back_to_the_jsonl_and_alone_names_the_file(tmp_path):
    run = make_synthetic_run(tmp_path / "r")
    (run / "points.csv").write_text('a,b\n"1,2\n')
    assert len(results.load_run(run)) == len(results.read_rows(run / "points.jsonl"))
    (run / "points.jsonl").unlink()
    with pytest.raises(ConfigError, match="points.csv is unreadable"):
        results.load_run(run)


def _table(S, k):
    return pd.DataFrame(dict(alpha=[0.6] * len(S), k=k, B=1, L=64, S=S))


def test_N3_a_speedup_above_k_plus_1_is_flagged():
    t, warn = fitcheck.speedup_problems(_table([1.8, 27.2], [1, 3]))
    assert list(t["impossible"]) == [False, True]
    assert len(warn) == 1 and "S=27.2" in warn[0] and "k + 1" in warn[0]
    assert fitcheck.speedup_problems(_table([1.8, 3.9], [1, 3]))[1] == []


def test_N3_predict_says_the_fit_did_not_converge():
    fit = json.loads(DEMO_FIT.read_text())
    fit["groups"][0]["problems"] = ["16 of 16 points did not converge (median CI above the target)"]
    assert "16 of 16 points did not converge" in fitcheck.unconverged(fit)[0]


def test_L7_repeated_grid_values_are_one_point_each():
    s = sweep_request(q=(1, 1, 2), dtypes=("bf16", "bfloat16"))
    ids = [p.point_id for p in grid(s)]
    assert len(ids) == len(set(ids)) == 2 and s.q == (1, 2)
    assert sweep_request(q=(1, 1)).fingerprint() == sweep_request(q=(1,)).fingerprint()


def test_L7_extend_with_a_repeated_value_adds_it_once(tmp_path):
    run_sweep(sweep_request(), tmp_path, progress=False, noise=None)
    out = run_sweep(sweep_request(q=(4, 4)), tmp_path, progress=False, extend=True, noise=None)
    rows = results.read_rows(tmp_path / "points.jsonl")
    assert out["points"] == 3 and len(rows) == len({r["point_id"] for r in rows}) == 3


def test_L8_no_extrapolated_copy_when_2n_is_the_full_depth():
    base = dict(kind="forward", dtype="bfloat16", mode="eager", q=1, B=1, L=0, status="ok", t_p10_s=1, t_p90_s=1)
    rows = [dict(base, layers_run=1, t_median_s=1.0), dict(base, layers_run=2, t_median_s=2.0)]
    assert extrapolate_layers(rows, 2) == []
    assert len(extrapolate_layers(rows, 4)) == 1


def test_H1_is_in_test_memory():  # the hybrid-cgroup reproduction lives beside the other cgroup tests
    from tests import test_memory
    assert hasattr(test_memory, "test_a_hybrid_v1_v2_host_finds_the_memory_controllers_limit")


# ---- MEDIUM ------------------------------------------------------------------------------------

def test_M2_a_broken_checkpoint_is_refused_naming_the_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":")  # truncated header
    with pytest.raises(ConfigError, match="model.safetensors is not a readable safetensors file"):
        sweep_request(checkpoint=str(tmp_path))


@pytest.mark.parametrize("seed", ["abc", 1.5, True, -1])
def test_M3_a_seed_that_is_no_integer_is_refused(seed):
    with pytest.raises(ConfigError, match="seed="):
        sweep_request(seed=seed)


@pytest.mark.parametrize("config, index", [("[1, 2, 3]", None), ("{}", '{"weight_map": [1, 2]}'),
                                           ("{}", '{"weight_map": {"a": ["x"]}}'), ("{bad", None)])
def test_M5_inventory_on_list_shaped_or_broken_json_is_one_line(tmp_path, config, index):
    from roofline.checkpoints.inventory import read_checkpoint
    from tests.helpers import torch
    from safetensors.torch import save_file
    save_file({"a": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(config)
    if index:
        (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ConfigError, match="after"):
        read_checkpoint(tmp_path, "after")


def test_M11_other_ceilings_on_a_reopened_run_are_refused(tmp_path):
    tmp_path.joinpath("c1.json").write_text("{}")
    s = sweep_request(ceilings=str(tmp_path / "c1.json"))
    (tmp_path / "run").mkdir()
    sw.files.write_json_atomic(tmp_path / "run" / "run.json", dict(
        fingerprint=s.fingerprint(), schema_version=results.SCHEMA_VERSION, identity=s.identity(),
        spec=dataclasses.asdict(s)))
    check_run_dir(s, tmp_path / "run")  # the same ceilings: reopened
    with pytest.raises(ConfigError, match="ceilings=.*c2.json.*put against"):
        check_run_dir(dataclasses.replace(s, ceilings=str(tmp_path / "c2.json")), tmp_path / "run", extend=True)


def test_N6_a_thin_mtp_group_does_not_stop_a_plain_plan():
    fit = json.loads(DEMO_FIT.read_text())
    mtp = dict(fit["groups"][0], key=dict(fit["groups"][0]["key"], kind="mtp"),
               problems=["too few points to fit (4, at least 6)"])
    fit["groups"].append(mtp)
    assert fitcheck.unusable_groups(fit, {"forward"}) == []
    assert fitcheck.unusable_groups(fit, {"forward", "mtp"}) == [mtp]


def _fit_with(**group):
    fit = json.loads(DEMO_FIT.read_text())
    fit["groups"][0].update(group)
    return fit


@pytest.mark.parametrize("doc, match", [
    ([1, 2], "JSON object"), ({"schema": costmodel.FIT_SCHEMA}, "no fitted groups"),
    (_fit_with(coefs=[1e-3, -5e-11, 1e-11, 1e-12, 1e-12]), r"coefs\[1\]=-5e-11"),
    (_fit_with(coefs=["a", 1, 1, 1, 1]), r"coefs\[0\]='a'"), (_fit_with(coefs=[0.1, 0.2]), "coefs"),
    (_fit_with(coefs=[0, 0, 0, 0, 0]), "all zero"), (_fit_with(knee_tokens=-5), "knee_tokens=-5"),
])
def test_N7_N18_a_fit_json_is_checked_on_load(tmp_path, doc, match):
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=match):
        costmodel.load_fit(path)


def test_N18_the_committed_fit_passes_and_L3_a_truncated_one_names_the_file(tmp_path):
    assert costmodel.load_fit(DEMO_FIT)["groups"]
    path = tmp_path / "fit.json"
    path.write_text(DEMO_FIT.read_text()[:40])
    with pytest.raises(ConfigError, match=r"fit=.*fit.json.*not a readable fit.json"):
        costmodel.load_fit(path)


def test_N9_rows_without_the_key_columns_are_quarantined(tmp_path):
    good = dict(point_id="a", status="ok", t_median_s=1.0, schema_version=results.SCHEMA_VERSION)
    assert "missing field(s)" in runfolder._problem(good)
    full = dict(good, **{k: 1 for k in runfolder.REQUIRED})
    assert runfolder._problem(full) is None


@pytest.mark.parametrize("t", [float("nan"), float("inf"), 0.0, -1e-3, True])
def test_N19_an_ok_row_without_a_usable_time_is_no_ok_row(t):
    row = dict(point_id="a", status="ok", t_median_s=t, schema_version=results.SCHEMA_VERSION,
               **{k: 1 for k in runfolder.REQUIRED})
    assert "positive finite t_median_s" in runfolder._problem(row)


def test_N19_fit_says_how_many_ok_rows_it_left_out(tmp_path):
    run = make_synthetic_run(tmp_path / "r")
    df = pd.read_csv(run / "points.csv")
    df.loc[df.index[:5], "t_median_s"] = [float("nan"), float("inf"), 0.0, -1e-3, float("nan")]
    df.to_csv(run / "points.csv", index=False)
    (run / "points.jsonl").unlink()
    note = quality.untimed_note(df)
    assert note["untimed_ok_rows"] == 5
    warn = quality.fit_warnings(dict(groups=[], excluded=note))
    assert "5 ok row(s) left out" in warn[0]


def test_N10_rows_and_run_json_of_another_schema_are_refused(tmp_path):
    row = dict(point_id="a", status="ok", t_median_s=1.0, schema_version=99, **{k: 1 for k in runfolder.REQUIRED})
    assert "schema_version=99" in runfolder._problem(row)
    s = sweep_request()
    (tmp_path / "run.json").write_text(json.dumps(dict(fingerprint=s.fingerprint(), schema_version=0)))
    with pytest.raises(ConfigError, match="schema_version=0"):
        check_run_dir(s, tmp_path)


def test_N12_a_dry_run_on_another_sweeps_folder_is_refused_as_the_sweep_is(tmp_path):
    s = sweep_request()
    sw.files.write_json_atomic(tmp_path / "run.json", dict(
        fingerprint=s.fingerprint(), schema_version=results.SCHEMA_VERSION, identity=s.identity()))
    other = dataclasses.replace(s, timer=TimerSettings(warmup=1, min_reps=3, max_reps=4, budget_s=0.3))
    with pytest.raises(ConfigError, match="different sweep"):
        dry_run(other, tmp_path)
    assert "to measure" in dry_run(other, tmp_path, force=True)


# ---- capacity / predict input --------------------------------------------------------------------

CAP = dict(memory_gb=None, price_per_device_hour=None, alpha=0.8, k=2, drafter="ngram", draft_model=None, context=1024,
           output=256)


@pytest.mark.parametrize("over, match", [
    (dict(alpha=7), "alpha=7"), (dict(k=-3), "k=-3"), (dict(memory_gb="lots"), "memory_gb='lots'"),
    (dict(price_per_device_hour=-1), "price_per_device_hour=-1"),
    (dict(price_per_device_hour=float("nan")), "price_per_device_hour=nan"),
    (dict(price_per_device_hour="cheap"), "price_per_device_hour='cheap'"),
    (dict(draft_model="llama-3.1-70b"), "draft_model='llama-3.1-70b' is given with drafter='ngram'"),
])
def test_M8_L10_N7_capacity_input_is_checked_even_without_speculation(over, match):
    with pytest.raises(ConfigError, match=match):
        fitcheck.check_capacity_config(dict(CAP, **over))
    fitcheck.check_capacity_config(CAP)


@pytest.mark.parametrize("over, match", [
    (dict(alphas=()), r"alphas=\[\]"), (dict(k=(1.5,)), r"k=\[1.5\]"), (dict(k=()), r"k=\[\]"),
    (dict(B=()), r"B=\[\]"), (dict(alphas=(2.0,)), "alphas"), (dict(plot_B=0), "plot_B"),
])
def test_L4_L6_predict_grids_are_checked(over, match):
    kw = dict(alphas=(0.6,), k=(1, 2), B=(1,), L=(16,), plot_B=1, plot_L=16)
    kw.update(over)
    with pytest.raises(ConfigError, match=match):
        fitcheck.check_predict_grid(**kw)


def test_L6_L14_plot_L_past_the_context_is_refused_naming_plot_L():
    with pytest.raises(ConfigError, match="plot_L=1024: plot_L"):
        fitcheck.check_context(1024, 8, 128, "tiny")
    fitcheck.check_context(16, 8, 128, "tiny")


# ---- LOW ---------------------------------------------------------------------------------------

def test_L15_a_flag_takes_only_true_or_false():
    from roofline.cli.entry import _check_flags
    defaults = dict(force=False, noise=dict(enabled=True, every=6), q=[1])
    _check_flags(dict(force=True, noise=dict(enabled=False, every=3), q=[2]), defaults)
    with pytest.raises(ConfigError, match="force='maybe'"):
        _check_flags(dict(force="maybe"), defaults)
    with pytest.raises(ConfigError, match="noise.enabled=1"):
        _check_flags(dict(noise=dict(enabled=1)), defaults)


def test_L12_fit_json_is_strict_json():
    fit = json.loads(DEMO_FIT.read_text())
    fit["groups"][0]["band"] = dict(p10=float("nan"), p90=float("inf"))
    text = sw.files.json_text(fit)
    json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert json.loads(text)["groups"][0]["band"] == dict(p10=None, p90=None)
    assert math.isnan(float("nan"))


# ---- compare: models and a CI threshold ---------------------------------------------------------

def _other_model(run):
    for name in ("points.jsonl", "points.csv"):
        p = run / name
        p.write_text(p.read_text().replace("cpu-demo", "llama-3.1-8b"))
    return run


def test_N5_compare_refuses_runs_of_different_models(tmp_path):
    from roofline.analysis.compare import compare_runs, format_comparison
    a, b = make_synthetic_run(tmp_path / "a"), _other_model(make_synthetic_run(tmp_path / "b"))
    with pytest.raises(ConfigError, match="allow_other_model=true"):
        compare_runs(a, b)
    m, summary = compare_runs(a, b, allow_other_model=True)
    assert "different models" in format_comparison(m, summary)


def test_compare_fail_above_counts_regressions_beyond_the_noise(tmp_path):
    from roofline.analysis.compare import compare_runs
    a, b = make_synthetic_run(tmp_path / "a"), make_synthetic_run(tmp_path / "b")
    df = pd.read_csv(b / "points.csv")
    df.loc[df["point_id"] == "p000", "t_median_s"] *= 1.5  # one point 50% slower, far beyond a 3% CI
    df["t_ci_rel"] = 0.03
    df.to_csv(b / "points.csv", index=False)
    (b / "points.jsonl").unlink()
    pd.read_csv(a / "points.csv").assign(t_ci_rel=0.03).to_csv(a / "points.csv", index=False)
    (a / "points.jsonl").unlink()
    assert compare_runs(a, b, fail_above=1.2)[1]["regressions"] == 1
    assert compare_runs(a, b, fail_above=2.0)[1]["regressions"] == 0
    assert compare_runs(a, b)[1]["regressions"] is None
    with pytest.raises(ConfigError, match="fail_above=0.5"):
        compare_runs(a, b, fail_above=0.5)


# ---- the report (item 6) and the console summary (item 4) ---------------------------------------

def test_report_has_contents_folded_config_percentiles_and_library_rendered_html(tmp_path):
    from roofline.report.document import write_report
    run = make_synthetic_run(tmp_path / "r")
    df = pd.read_csv(run / "points.csv")
    df["t_p99_s"] = df["t_median_s"] * 1.234567891234
    df.to_csv(run / "points.csv", index=False)
    (run / "points.jsonl").unlink()
    md_path, html_path = write_report(run)
    md, page = md_path.read_text(), html_path.read_text()
    assert "**Contents**" in md and "- [Failed points](#failed-points)" in md
    assert '<h2 id="failed-points">' in page and '<a href="#failed-points">' in page  # the contents' links land
    assert "<details><summary>run.json" in md and "<details><summary>run.json" in page
    assert md.index("<details><summary>run.json") < md.index('"model": "cpu-demo"')  # the dump is folded
    assert "p99 / p50" in md and "| 1.235 |" in md  # the tail, to 4 significant digits
    assert "1.234567891" not in md and "<table>" in page and "### roofline_bf16" not in md  # titles, not file names
    assert 'src="data:image/png;base64,' in page


def test_the_console_summary_carries_p50_p90_p99():
    from roofline.measure.sweep import summary_table
    base = dict(kind="forward", dtype="bf16", mode="eager", B=1, L=0, status="ok", layers_run=1, layers_full=1,
                achieved_GBps=1.0, achieved_TFLOPs=0.1)
    df = pd.DataFrame([dict(base, q=1, t_median_s=1e-3, t_p90_s=1.2e-3, t_p99_s=2e-3),
                       dict(base, q=2, t_median_s=1.5e-3, t_p90_s=1.6e-3, t_p99_s=3e-3)])
    t = summary_table(df)
    assert list(t["p99_ms"]) == [2.0, 3.0] and list(t["p90_ms"]) == pytest.approx([1.2, 1.6])


def test_dry_run_time_counts_min_reps_of_a_slow_step():
    from roofline.measure.sweep import point_seconds
    t = TimerSettings(warmup=1, min_reps=5, max_reps=40, budget_s=0.02)
    assert point_seconds(1.0, t) == pytest.approx(6.0)  # 1 warm-up + 5 reps of 1 s, whatever the 0.02 s budget
    assert point_seconds(1e-3, t) == pytest.approx(1e-3 * (1 + 21))  # a fast step: the budget, then one more
    assert "about" in dry_run(sweep_request(), REPO_ROOT / "nonexistent-run-dir")


# ---- loose ends: contradictions, fit settings, paths ----------------------------------------------

@pytest.mark.parametrize("kw, match", [(dict(folds=-3), "folds=-3"), (dict(folds=0), "folds=0"),
                                       (dict(folds="abc"), "folds='abc'"), (dict(folds=2.5), "folds=2.5"),
                                       (dict(q_split=-1), "q_split=-1"), (dict(q_split="abc"), "q_split"),
                                       (dict(band=(0.9, 0.1)), "band"), (dict(band=("a", "b")), "band"),
                                       (dict(band=(2, 3)), "band"), (dict(band=(0.5,)), "band"),
                                       (dict(band=(float("nan"), 0.9)), "band")])
def test_L4_L5_fit_settings_are_checked(kw, match):
    with pytest.raises(ConfigError, match=match):
        costmodel.FitSettings(**kw)


def test_N17_force_and_extend_together_and_boolean_grid_values_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="force=true and extend=true"):
        check_run_dir(sweep_request(), tmp_path, force=True, extend=True)
    with pytest.raises(ConfigError, match=r"q=\[True\]"):
        sweep_request(q=(True,))
    with pytest.raises(ConfigError, match="layers=True"):
        sweep_request(layers=True)


def test_L10_checkpoint_and_model_together_are_refused():
    from roofline.commands import not_both
    with pytest.raises(ConfigError, match="model= and checkpoint= are both given"):
        not_both(dict(checkpoint="/x", overrides=["checkpoint=/x", "model=llama-3.1-70b"]), "checkpoint", "model")
    not_both(dict(checkpoint="/x", overrides=["checkpoint=/x", "q=[1]"]), "checkpoint", "model")


def test_N16_compare_out_in_a_missing_folder_is_bad_input(tmp_path):
    from roofline.analysis.compare import write_table
    with pytest.raises(ConfigError, match="no such folder"):
        write_table(pd.DataFrame(dict(a=[1])), tmp_path / "nope" / "x.csv")


def test_L11_specdec_default_folders_differ_per_request():
    from roofline.commands.specdec import _fingerprint
    from roofline.spec.validation import SpecValidationRequest
    a = SpecValidationRequest(model=get_preset("tiny"), ks=(1,))
    b = dataclasses.replace(a, ks=(2,))
    assert _fingerprint(a) != _fingerprint(b) and _fingerprint(a) == _fingerprint(dataclasses.replace(a))


def test_profiler_chatter_stays_off_the_console_and_a_real_native_error_does_not():
    import subprocess
    import sys
    code = ("import os, torch\n"
            "from roofline.measure.forward import count_kernels\n"
            "from roofline.measure.quiet import native_stderr_filtered\n"
            "count_kernels(lambda: torch.ones(4) @ torch.ones(4), 'cpu')\n"
            "with native_stderr_filtered():\n"
            "    os.write(2, b'USDT:x profiler_start\\nreal native error\\n')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert r.returncode == 0, r.stderr
    assert "USDT" not in r.stderr and "real native error" in r.stderr


def test_L3_fit_on_a_run_with_a_broken_run_json_names_the_file(tmp_path):
    run = make_synthetic_run(tmp_path / "r")
    (run / "run.json").write_text('{"model": ')
    with pytest.raises(ConfigError, match=r"results_dir=.*run.json is not readable JSON"):
        costmodel.fit_run(run)


def test_N15_a_failed_atomic_write_leaves_no_temp_file(tmp_path):
    class Unwritable:
        pass
    with pytest.raises(TypeError):
        sw.files.write_atomic(tmp_path / "fit.json", Unwritable())
    assert list(tmp_path.iterdir()) == []


def test_N17_a_fit_on_all_noisy_points_warns_in_fit_and_predict(tmp_path):
    """N17: no console warning when a fit or a prediction rests on points all timed on a busy machine."""
    run = make_synthetic_run(tmp_path / "r")
    df = pd.read_csv(run / "points.csv")
    df["noisy"] = True
    df.to_csv(run / "points.csv", index=False)
    (run / "points.jsonl").unlink()
    fit, _ = costmodel.fit_run(run, costmodel.FitSettings())
    kept = [w for w in quality.fit_warnings(fit) if "busy machine" in w]
    assert kept and "KEPT in the fit" in kept[0] and f"{len(df[df['status'] == 'ok'])} of" in kept[0]
    assert quality.noise_warnings(fit) == kept  # predict's warnings take the same line
    df["noisy"] = False
    df.to_csv(run / "points.csv", index=False)
    assert quality.noise_warnings(costmodel.fit_run(run, costmodel.FitSettings())[0]) == []


def test_L10_specdec_real_acceptance_refuses_the_options_it_would_ignore():
    """L10: `specdec checkpoint=... 'alphas=[5]' out_dir=...` exited 0 and never wrote out_dir."""
    from roofline.commands.specdec import specdec
    c = dict(checkpoint="any", prompts_eval=None, overrides=["checkpoint=any", "alphas=[5]", "out_dir=/x", "k=3"])
    with pytest.raises(ConfigError, match=r"^alphas=, out_dir= given with checkpoint=.*drop them"):
        specdec(c)
    c["overrides"] = ["checkpoint=any", "timer.max_reps=3"]
    with pytest.raises(ConfigError, match=r"^timer= given with checkpoint="):
        specdec(c)


def test_M3_a_weights_group_the_model_cannot_take_is_bad_input_before_anything_runs():
    """M3: weights=int4_g1024 on tiny (K=64) passed the dry run and became an `unsupported` row, exit 0."""
    with pytest.raises(ConfigError, match=r"weights=int4_g1024: the group size 1024 does not divide K=64"):
        sweep_request(dtypes=("bfloat16+weights=int4_g1024",))
    sweep_request(dtypes=("bfloat16+weights=int4_g32",))  # 32 divides every K of tiny


@pytest.mark.parametrize("text, says", [("{\"a\":\n", "ceilings.json is not JSON"), ("[1, 2]", "ceilings.json is not a JSON object (a JSON list"),
                                        ("{\"schema_version\": 99}", "schema_version=99")])
def test_L3_a_broken_ceilings_file_is_one_line_naming_the_option_and_file(tmp_path, text, says):
    from roofline.measure.ceilings import load_ceilings
    f = tmp_path / "ceilings.json"
    f.write_text(text)
    with pytest.raises(ConfigError, match=r"^ceilings=.*ceilings\.json.: " + re.escape(says)):
        load_ceilings(f)


def test_L3_a_json_option_that_is_not_json_names_the_option_and_file(tmp_path):
    from roofline.io.files import read_json
    f = tmp_path / "o.json"
    f.write_text("{\"a\":\n")
    with pytest.raises(ConfigError, match=r"^overhead='.*o\.json': overhead.json is not JSON \(Expecting value"):
        read_json(f, f"overhead={str(f)!r}", "overhead.json")
    with pytest.raises(ConfigError, match=r"^overhead='.*nope\.json': no such file"):
        read_json(tmp_path / "nope.json", f"overhead={str(tmp_path / 'nope.json')!r}")


@pytest.mark.parametrize("doc", [{"x": 1}, {"coef": [1, 2]}, {"coef": [1, "a", 3]}, [1, 2, 3], {"coef": [1, 2, float("nan")]}])
def test_L6_an_overhead_file_that_is_not_one_is_one_line(doc):
    """L6: `overhead=<{"x":1}>` ended in `KeyError: 'coef'`."""
    with pytest.raises(ConfigError, match=r"^overhead='o.json': not an overhead.json"):
        fitcheck.check_overhead(doc, "overhead='o.json'")
    assert fitcheck.check_overhead({"coef": [1e-3, 2e-4, 0]}) == (1e-3, 2e-4, 0.0)


def test_L6_a_fit_without_its_model_names_an_option_that_exists():
    """L6: the message said "pass cfg=", which is no command-line option."""
    with pytest.raises(ConfigError, match="give the fitted model as model=<preset>"):
        costmodel.fitted_model({"groups": []})


def test_N16_an_out_dir_that_is_a_dangling_symlink_a_loop_or_a_file_says_which(tmp_path):
    """N16: a dangling symlink or a symlink loop as out_dir said only "File exists"."""
    (tmp_path / "dangle").symlink_to(tmp_path / "nowhere")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "f").write_text("x")
    for where, says in (("dangle", "is a symlink to .*nowhere.*, which does not exist"),
                        ("a/x", "is a symlink loop"), ("f/run", "is a file, not a folder"),
                        ("x" * 256, "longer than 255 bytes")):
        with pytest.raises(ConfigError, match=r"^out_dir=.*" + says):
            runfolder.check_folder_path(tmp_path / where, "out_dir")
    runfolder.check_folder_path(tmp_path / "new" / "run", "out_dir")  # a folder yet to be made is fine


def test_L12_every_command_prints_its_json_line_strictly():
    """L12: the "one JSON object" lines held NaN / Infinity, which strict parsers refuse. Every
    command's summary line goes through files.json_text (NaN and infinities become null)."""
    import ast
    from roofline.io.files import json_text
    assert json.loads(json_text({"a": float("nan"), "b": [float("inf"), 1.0]}), parse_constant=lambda c: 1 / 0) == \
        {"a": None, "b": [None, 1.0]}
    loose = []
    for path in sorted((REPO_ROOT / "roofline" / "commands").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print" and node.args:
                inner = node.args[0]
                if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "dumps":
                    loose.append(f"{path.name}:{node.lineno}")
    assert not loose, f"json.dumps printed without the strict encoder: {loose}"


def test_N16_an_invalid_mplbackend_does_not_stop_a_report():
    """N16: `MPLBACKEND=nonsense` made plots and report a matplotlib ValueError traceback;
    figures never use a backend, so the setting is hidden for matplotlib's import and given back."""
    import os
    import subprocess
    import sys
    code = ("import os; from roofline.report import figures, plots; "
            "fig, ax = figures.subplots(figsize=(1, 1)); print(os.environ['MPLBACKEND'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                       env=dict(os.environ, MPLBACKEND="nonsense"))
    assert r.returncode == 0 and r.stdout.strip() == "nonsense", r.stderr[-800:]


TRAINED = REPO_ROOT / "results" / "trained-stdlib"


@pytest.mark.parametrize("over, says", [
    (dict(k=10**9), "k=1000000000: more draft tokens than the model's context window (max_context=131072)"),
    (dict(context=10**12), "context=1000000000000 + output=256 = 1000000000256 tokens: more than"),
    (dict(context=130000, speculative=True, k=5000), "context=130000 + output=256 + k=5000 = 135256 tokens"),
])
def test_L14_capacity_past_the_context_window_names_context_output_and_k(over, says):
    c = dict(model=dataclasses.asdict(get_preset("llama-3.1-8b")), context=1024, output=256, k=2, alpha=0.8,
             speculative=False, drafter="mtp", draft_model=None, memory_gb=None, price_per_device_hour=None)
    c.update(over)
    with pytest.raises(ConfigError, match=re.escape(says)):
        fitcheck.check_capacity_config(c)
    fitcheck.check_capacity_config({**c, "context": 1024, "k": 2})  # the same plan in the window passes


def test_L14_acceptance_without_a_tokenizer_names_the_checkpoint_and_the_files(tmp_path):
    from roofline.checkpoints.prompts import load_tokenizer
    for f in ("config.json", "model.safetensors", "chat_template.jinja"):
        (tmp_path / f).write_bytes((TRAINED / "target" / f).read_bytes())
    with pytest.raises(ConfigError, match=r"checkpoint='.*': no tokenizer \(none of tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{garbage")
    with pytest.raises(ConfigError, match=r"checkpoint='.*': its tokenizer does not load \(JSONDecodeError"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize("over, says", [(dict(k=math.nan), "k=nan: allowed integers >= 1"),
                                        (dict(max_new=0), "max_new=0: allowed integers >= 1"),
                                        (dict(batch=1.5), "batch=1.5: allowed integers >= 1"),
                                        (dict(top_p=0.0), "top_p=0.0: allowed numbers in (0.0, 1.0]")])
def test_L14_acceptance_settings_are_checked_by_name(over, says):
    from roofline.spec.real_acceptance import AcceptanceRequest
    with pytest.raises(ConfigError, match=re.escape(says)):
        AcceptanceRequest(checkpoint="x", prompts="y", **over)


def test_L14_acceptance_past_the_context_window_names_k_and_max_new():
    from roofline.spec.real_acceptance import AcceptanceRequest, measure_acceptance
    req = AcceptanceRequest(checkpoint=str(TRAINED / "target"), prompts=str(TRAINED / "prompts_a.jsonl"),
                            k=100000, max_new=2, dtype="float32")
    with pytest.raises(ConfigError, match=r"max_new=2 \+ the drafts of k=100000 need \d+ positions: more than the "
                                          r"checkpoint's context window \(max_position_embeddings=\d+\)"):
        measure_acceptance(req)


def test_N16_an_index_naming_a_folder_says_so(tmp_path):
    from roofline.checkpoints.loader import shard_files
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(dict(weight_map={"a.weight": "."})))
    with pytest.raises(ConfigError, match=r"names \['\.'\] as shard\(s\): a folder, not a file"):
        shard_files(tmp_path)


def test_N16_an_edited_fingerprint_says_the_run_json_was_edited(tmp_path):
    s = sweep_request()
    sw.files.write_json_atomic(tmp_path / "run.json", dict(
        fingerprint="0123456789", schema_version=results.SCHEMA_VERSION, identity=s.identity()))
    with pytest.raises(ConfigError, match=r"fingerprint 0123456789 != \w+; its run.json was edited\)"):
        check_run_dir(s, tmp_path)


def test_N15_a_reopened_run_folder_drops_the_temp_files_of_dead_writers_only(tmp_path):
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".fit.json.{int(dead.stdout)}.tmp"
    live = tmp_path / f".report.md.{os.getppid()}.tmp"  # a live process (pytest's parent)
    stale.write_text("{")
    live.write_text("#")
    with runfolder.locked(tmp_path):
        pass
    assert not stale.exists() and live.exists()


def test_I1_ceilings_given_from_elsewhere_travel_with_the_run_and_their_busy_marks_are_said(tmp_path, capsys):
    """`sweep ceilings=<a ceilings.json elsewhere>` put the rows against that file, but the run
    folder had none: the report said "no ceilings.json in this run folder" and never showed that
    the roofs were measured on a busy machine. The file is now copied in, and the sweep says so."""
    from roofline.measure.sweep import spec_device_name
    from tests.helpers import synthetic_ceilings
    doc = synthetic_ceilings()
    doc["provenance"]["device_name"] = spec_device_name("cpu")
    doc["summary"]["busy_machine"] = [dict(group="torch_read/float32", why="reference 1.6x its quietest time")]
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "ceilings.json").write_text(json.dumps(doc))
    s = sweep_request(ceilings=str(tmp_path / "elsewhere" / "ceilings.json"), q=(1,))
    run_sweep(s, tmp_path / "run", progress=False)
    assert json.loads((tmp_path / "run" / "ceilings.json").read_text()) == doc
    assert "ceilings: 1 group(s) were measured on a busy machine (torch_read/float32)" in capsys.readouterr().err


@pytest.mark.parametrize("template, says", [
    ("{{ raise_exception('no') }}", "TemplateError: no"), ("{{ x.y.z }}", "UndefinedError"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError"), ("{{ cycler.__init__.__globals__ }}", "SecurityError"),
    ("{% for i in range(10**9) %}{% endfor %}", "OverflowError: Range too big"),
    ("{% include '/etc/passwd' %}", "TypeError: no loader"), ("{% import 'x' as y %}", "TypeError: no loader"),
    ("{{ m['content'] }", "TemplateSyntaxError")])
def test_N4_a_chat_template_that_fails_is_one_line_naming_the_checkpoint_and_line(tmp_path, template, says):
    """N4: a template that raises, reaches for attributes, asks for a huge range or includes a file
    ended in a jinja2 traceback (the sandbox held); each is one line naming checkpoint and line."""
    from roofline.checkpoints.prompts import load_tokenizer, render
    for f in ("config.json", "tokenizer.json", "special_tokens_map.json"):
        (tmp_path / f).write_bytes((TRAINED / "target" / f).read_bytes())
    text = "{{ bos_token }}\n" + template
    (tmp_path / "chat_template.jinja").write_text(text)
    cfg = json.loads((TRAINED / "target" / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(dict(cfg, chat_template=text)))
    with pytest.raises(ConfigError, match=r"^checkpoint='.*': chat_template line 2: " + re.escape(says)):
        render(load_tokenizer(tmp_path), [{"role": "user", "content": "x"}])


@pytest.mark.parametrize("text", ["", '{"fingerprint": ', "[1, 2]", "\xff\xfe"])
def test_M9_an_empty_torn_or_list_run_json_is_refused_naming_force(tmp_path, text):
    """M9: run.json empty, torn or a list: refused in one line that says force=true sets it aside."""
    (tmp_path / "run.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"run.json is unreadable .*force=true sets the folder aside"):
        check_run_dir(sweep_request(), tmp_path)


def _predict_config(tmp_path, **over):
    from tests.helpers import composed
    c = composed("predict", device_as="datasheet")
    c.update(fit=str(DEMO_FIT), out_dir=str(tmp_path / "p"))
    c.update(over)
    return c


def test_L10_L3_predict_refuses_an_ignored_draft_model_and_names_the_vllm_file(tmp_path):
    """L10: `predict drafter=ngram draft_model=llama-3.1-70b` ignored the draft model silently.
    L3: a vLLM dump that does not parse said "line 1: value 'are' is not a number", no file."""
    from roofline.commands.predict import predict_command
    with pytest.raises(ConfigError, match="draft_model='llama-3.1-70b' is given with drafter='ngram'"):
        predict_command(_predict_config(tmp_path, drafter="ngram", draft_model="llama-3.1-70b"))
    dump = tmp_path / "metrics.txt"
    dump.write_text("vllm:spec_decode_num_drafts_total are you\n")
    with pytest.raises(ConfigError, match=r"^vllm_metrics='.*metrics\.txt': .*line 1"):
        predict_command(_predict_config(tmp_path, vllm_metrics=str(dump)))
    with pytest.raises(ConfigError, match="^plot_L=99999: plot_L"):  # L6: once refused after predict.csv was written
        predict_command(_predict_config(tmp_path, plot_L=99999))
    assert not (tmp_path / "p").exists()  # refused before out_dir is written


def test_I7_median_ci_ranks_are_scipys_binomial_quantiles_and_the_report_uses_libraries():
    """I7: the median CI came from a hand-written binomial sum (a normal approximation past
    n = 1000, one rank off at n = 1001); Markdown -> HTML and log ticks by hand."""
    import ast
    from scipy.stats import binom
    from roofline.measure.timer import _median_ci_ranks
    for n in (6, 30, 100, 1001, 5000):
        l, u = _median_ci_ranks(n, 0.95)
        assert binom.cdf(l - 1, n, 0.5) <= 0.025 < binom.cdf(l, n, 0.5) and u == n + 1 - l
    assert _median_ci_ranks(1001, 0.95) == (470, 532)

    def names(rel):
        tree = ast.parse((REPO_ROOT / rel).read_text())
        return {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names} | {getattr(n.value, "id", "") + "." + n.attr for n in ast.walk(tree)
                                     if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    assert "MarkdownIt" in names("roofline/report/document.py")
    assert "ticker.LogLocator" in names("roofline/report/figures.py")


def test_I3_a_fitted_capacity_plan_counts_the_draft_models_weights_and_kv():
    """I3: `capacity fit=... drafter=draft_model draft_model=...` priced the same memory for plain
    and speculative rows (the draft model's weights and KV were not counted), and an ngram row
    was charged the MTP module it does not run."""
    from roofline.analysis.capacity import Speculation, Workload, plan
    from roofline.analysis.predict import DraftCost
    fit, cfg, work = costmodel.load_fit(DEMO_FIT), get_preset("cpu-demo"), Workload(context=128, output=32)
    mem = {}
    for kind in ("draft_model", "ngram", "mtp"):
        sp = Speculation(0.8, 2, DraftCost(kind, cfg if kind == "draft_model" else None))
        t, summary = plan(fit, cfg, "bfloat16", work, 16e9, [1, 4], sp)
        mem[kind] = (t[~t["spec"]]["mem_GB"].to_numpy(), t[t["spec"]]["mem_GB"].to_numpy(), summary)
    plain, with_draft, s = mem["draft_model"]
    assert with_draft == pytest.approx(2 * plain)  # the draft is the target's twin: twice the weights and KV
    assert s["spec"]["max_batch_by_memory"] < s["plain"]["max_batch_by_memory"]
    assert mem["ngram"][1] == pytest.approx(mem["ngram"][0])  # the ngram drafter holds nothing
    assert (mem["mtp"][1] > mem["mtp"][0]).all() == bool(cfg.mtp_layers)
    sp = Speculation(0.8, 2, DraftCost("draft_model", cfg))
    t, _ = plan(fit, cfg, "bfloat16", work, 1.5 * plain[0] * 1e9, [1], sp)
    assert list(t["fits_memory"]) == [True, False]  # the plan says the speculative row does not fit


def test_I5_a_cpu_set_up_takes_torch_from_the_cpu_index_the_demo_only_the_core_one_package(tmp_path, monkeypatch):
    """I5: `pip install .` on a CPU machine resolved the CUDA torch; the demo installed the test
    extras; the wheel put top-level `conf` and `experiments` packages into site-packages."""
    import importlib.util
    import tomllib
    text = (REPO_ROOT / "requirements" / "cpu.txt").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text and re.search(r"^torch==[\d.]+\+cpu$", text, re.M)
    mod = importlib.util.spec_from_file_location("dev_script", REPO_ROOT / "dev.py")
    dev = importlib.util.module_from_spec(mod)
    mod.loader.exec_module(dev)
    calls = []
    monkeypatch.setattr(dev, "VENV", tmp_path / "venv")
    monkeypatch.setattr(dev, "PY", tmp_path / "venv" / "bin" / "python")
    monkeypatch.setattr(dev.venv, "create", lambda *a, **k: None)
    monkeypatch.setattr(dev.shutil, "which", lambda name: None)  # no nvidia-smi: a CPU machine
    monkeypatch.setattr(dev, "run", lambda *cmd: calls.append([str(c) for c in cmd]))
    (tmp_path / "venv").mkdir()
    dev.setup("")  # what `dev.py demo` sets up
    installs = [c[c.index("install") + 1:] for c in calls if "install" in c and "--upgrade" not in c]
    assert ["-r", "requirements/cpu.txt"] == installs[0][-2:] and "--no-deps" in installs[0]
    assert installs[1][-2:] == ["-e", "."]  # the core alone: no [test] extra for the demo
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["roofline*"]
    assert project["project"]["scripts"] == {"roofline": "roofline.cli.main:main"}
    tops = {p.name for p in REPO_ROOT.iterdir() if (p / "__init__.py").exists()} - {"tests"}
    assert tops == {"roofline"}  # roofline/conf/ and the entry points live inside it


def test_I4_a_speculative_mismatch_and_a_compare_regression_exit_regression_when_asked(monkeypatch, capsys):
    """I4: a speculative MISMATCH exited 0, and compare had no CI threshold: with
    fail_on_mismatch=true / fail_above= each exits REGRESSION (3), and 0 when not asked."""
    from roofline.commands import REGRESSION, compare, specdec
    monkeypatch.setattr(specdec, "specdec", lambda c: ("table", dict(mismatches=1)))
    assert specdec.run(dict(fail_on_mismatch=True)) == REGRESSION == 3
    assert specdec.run(dict(fail_on_mismatch=False)) == 0
    monkeypatch.setattr(specdec, "specdec", lambda c: ("table", dict(mismatches=0)))
    assert specdec.run(dict(fail_on_mismatch=True)) == 0
    c = dict(a="a", b="b", allow_other_model=False, out=None)
    monkeypatch.setattr(compare, "format_comparison", lambda *a: "")
    for regressions, code in ((2, REGRESSION), (0, 0), (None, 0)):
        monkeypatch.setattr(compare, "compare_runs", lambda *a, r=regressions: (pd.DataFrame(), dict(regressions=r)))
        assert compare.run(dict(c, fail_above=1.05 if regressions is not None else None)) == code


def test_N3_N6_predict_repeats_the_fits_warnings_and_a_plain_plan_ignores_a_thin_mtp_group(tmp_path):
    """N3 through the command: predict's warnings carry the fit's "did not converge". N6 through
    the plan: a thin MTP group stops an MTP plan only, not a plain or an ngram one."""
    from roofline.analysis.capacity import Speculation, Workload, plan
    from roofline.analysis.predict import DraftCost
    from roofline.commands.predict import predict_command
    fit = json.loads(DEMO_FIT.read_text())
    fit["groups"][0]["problems"] = ["16 of 16 points did not converge (median CI above the target)"]
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fit))
    _, summary = predict_command(_predict_config(tmp_path, fit=str(path), drafter="ngram", k=[0, 1, 2], B=[1],
                                                 L=[128], plot_L=128, alphas=[0.6]))
    assert any("16 of 16 points did not converge" in w for w in summary["warnings"])
    fit = json.loads(DEMO_FIT.read_text())
    mtp = next(g for g in fit["groups"] if g["key"]["kind"] == "mtp")
    mtp["problems"] = ["too few points to fit (4, at least 6)"]
    cfg, work = get_preset("cpu-demo"), Workload(context=128, output=32)
    plan(fit, cfg, "bfloat16", work, 16e9, [1], None)
    plan(fit, cfg, "bfloat16", work, 16e9, [1], Speculation(0.8, 2, DraftCost("ngram")))
    with pytest.raises(ConfigError, match="mtp.*too few points"):
        plan(fit, cfg, "bfloat16", work, 16e9, [1], Speculation(0.8, 2, DraftCost("mtp")))


def test_M2_a_checkpoint_whose_weights_hold_nan_is_refused_naming_tensor_and_file(tmp_path):
    """The last case of M2: NaN weights loaded, and every point became an error row "logits not
    finite", exit 0, naming no file. The loader (which reads every tensor anyway) refuses them,
    and a sweep stops on that bad input instead of writing it as data."""
    import torch
    from tests.helpers import hf_model
    hf = hf_model("llama", seed=3)
    with torch.no_grad():
        hf.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    hf.save_pretrained(tmp_path / "ck")
    with pytest.raises(ConfigError, match=r"checkpoint='.*ck': tensor 'model.layers.1.mlp.up_proj.weight' in "
                                          r"model.safetensors holds NaN or infinite values"):
        from roofline.checkpoints.loader import checkpoint_config
        run_sweep(sweep_request(model=checkpoint_config(tmp_path / "ck"), checkpoint=str(tmp_path / "ck"), q=(1,), L=(4,)),
                  tmp_path / "run", progress=False)
