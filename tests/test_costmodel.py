"""The cost model recovers known physics, reports honest errors, and round-trips through fit.json."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from roofline.analysis import costmodel as cm
from roofline.analysis.costmodel import ERROR_COLUMNS, FitSettings
from tests.helpers import write_run

REPO = Path(__file__).resolve().parent.parent
BW, F, T0, BW_KV, KNEE = 20e9, 0.5e12, 1e-3, 10e9, 8  # B/s, FLOP/s, s, B/s, tokens
FLOP_PER_TOKEN = 2e8


def synthetic_rows(noise: float, seed: int) -> pd.DataFrame:
    """MoE-like rows (weight bytes grow with the experts touched) that follow the model's form."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in (1, 2, 4, 8, 12, 16, 24, 32, 64):
        for B in (1, 2, 4):
            for L in (128, 1024, 4096):
                N = B * q
                w = 1e7 + 2e8 * (1 - (1 - 8 / 64) ** N)
                kv = B * L * 1e4
                t = T0 + w / BW + kv / BW_KV + max(0, N - KNEE) * FLOP_PER_TOKEN / F
                rows.append(dict(device_name="synthetic", model="syn", dtype="bfloat16", mode="eager",
                                 kind="forward", q=q, B=B, L=L, tokens=N, weight_bytes=w, embed_bytes=0.0,
                                 kv_read_bytes=kv, kv_write_bytes=0.0, flops_matmul=FLOP_PER_TOKEN * N,
                                 flops_attention=0.0, bytes_total=w + kv, flops=FLOP_PER_TOKEN * N,
                                 t_median_s=t * (1 + noise * rng.standard_normal()), status="ok",
                                 layers_run=4, layers_full=4))
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_known_parameters_at_2pct_noise(seed):
    """Tolerances are about 5 standard errors of each estimate over seeds at this noise (measured
    over 40 seeds: BW 0.9%, F 0.6%, BW_kv 0.9%, t0 4.1%): t0 is a small term (1 ms of 10-100 ms)."""
    df = synthetic_rows(noise=0.02, seed=seed)
    coefs, knee = cm.fit_coefs(df)
    p = cm.physical(coefs, knee)
    assert p["BW_eff_GBps"] == pytest.approx(BW / 1e9, rel=0.05), seed
    assert p["F_eff_TFLOPs"] == pytest.approx(F / 1e12, rel=0.05), seed
    assert p["BW_kv_GBps"] == pytest.approx(BW_KV / 1e9, rel=0.05), seed
    assert p["t0_ms"] == pytest.approx(T0 * 1e3, rel=0.20), seed
    assert knee == KNEE, seed


def test_error_table_has_columns_splits_and_both_baselines():
    df = synthetic_rows(noise=0.02, seed=1)
    group, points = cm.fit_group(df, FitSettings(), ceilings=None)
    table = pd.DataFrame(group["errors"])
    assert tuple(table.columns) == ERROR_COLUMNS
    methods = set(table["method"])
    assert "fit" in methods and "verify is free T(q)=T(1)" in methods
    assert any(m.startswith("n/a") for m in methods)  # no ceilings, no datasheet row: said so
    assert {s.split(",")[0] for s in table["split"]} >= {"5-fold held-out", "train q<=16", "train B=1",
                                                         "train L<4096"}
    assert set(points["regime"]) <= {"overhead", "memory", "kv", "compute"}


def test_fit_beats_verify_is_free_on_flat_then_linear_data():
    group, _ = cm.fit_group(synthetic_rows(noise=0.02, seed=2), FitSettings(), ceilings=None)
    t = pd.DataFrame(group["errors"]).query("regime == 'all' and split == '5-fold held-out'").set_index("method")
    assert t.loc["fit", "MAPE_pct"] < 4.0
    assert t.loc["fit", "MAPE_pct"] < 0.25 * t.loc["verify is free T(q)=T(1)", "MAPE_pct"]


def test_datasheet_baseline_used_when_ceilings_given():
    df = synthetic_rows(noise=0.0, seed=3)
    ceilings = {"summary": {"mem_bw_GBps": 20.0, "peak_tflops": {"bf16": 0.5}}}
    pred, label = cm.roofline_baseline(df, "bfloat16", ceilings)
    expect = np.maximum(df["bytes_total"] / BW, df["flops"] / F)
    np.testing.assert_allclose(pred, expect, rtol=1e-12)
    assert "measured" in label


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "tiny"
    subprocess.run([sys.executable, "-m", "roofline.cli.sweep", "model=tiny", "q=[1,2,4,8,16,32]", "B=[1,2]",
                    "L=[16,64]", f"out_dir={out}", "progress=false", "timer.min_reps=3", "timer.budget_s=0.05",
                    "noise.enabled=false"],  # the table must hold every point here, whatever the load
                   cwd=REPO, check=True, capture_output=True, timeout=120)
    return out


@pytest.mark.slow
def test_fit_entry_point_writes_fit_json_report_and_figure(tiny_run):
    r = subprocess.run([sys.executable, "-m", "roofline.cli.fit", f"results_dir={tiny_run}"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    fit = json.loads((tiny_run / "fit.json").read_text())
    assert fit["provenance"]["fingerprint"] == json.loads((tiny_run / "run.json").read_text())["fingerprint"]
    assert {g["key"]["kind"] for g in fit["groups"]} == {"forward", "mtp"}
    assert "Cost model" in (tiny_run / "report_costmodel.md").read_text()
    assert (tiny_run / "figures" / "costmodel_pred_vs_meas.png").stat().st_size > 1000


@pytest.mark.slow
def test_fit_entry_point_without_results_dir_fails_naming_it():
    r = subprocess.run([sys.executable, "-m", "roofline.cli.fit"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "results_dir" in r.stderr


def test_predict_of_a_measured_point_matches_its_fitted_row_and_json_round_trips(tiny_run, tmp_path):
    fit, points = cm.fit_run(tiny_run)
    loaded = cm.load_fit(cm.save_fit(fit, tmp_path / "fit.json"))
    assert loaded["groups"][0]["coefs"] == fit["groups"][0]["coefs"]
    row = points[(points["kind"] == "forward")].iloc[len(points) // 3]
    d = cm.predict_detail(loaded, "forward", "bfloat16", int(row["q"]), int(row["B"]), int(row["L"]))
    # inside the measured range: the measured median itself; the fit's terms from the accounting of the call
    assert d["step_source"] == "table" and d["seconds"] == pytest.approx(row["t_median_s"], rel=1e-9)
    assert sum(d["terms_s"].values()) == pytest.approx(row["t_pred_s"], rel=1e-9)
    far = cm.predict_detail(loaded, "forward", "bfloat16", int(row["q"]), 3 * int(row["B"]), int(row["L"]))
    assert far["step_source"] == "fit" and far["seconds"] == pytest.approx(sum(far["terms_s"].values()), rel=1e-12)


def test_longest_context_split_trains_without_it():
    """The L hold-out is a real extrapolation: a fit that never saw L=4096 predicts it, so a
    KV term that is wrong only at 4096 (here: the KV bandwidth halves there) shows in its error
    and not in the 5-fold error's training."""
    df = synthetic_rows(noise=0.0, seed=4)
    group, _ = cm.fit_group(df, FitSettings(), ceilings=None)
    clean = pd.DataFrame(group["errors"]).query("regime == 'all' and method == 'fit'").set_index("split")
    assert clean.loc["train L<4096, predict L=4096", "median_abs_pct"] < 1.0
    bent = df.copy()
    far = bent["L"] == 4096
    bent.loc[far, "t_median_s"] += bent.loc[far, "kv_read_bytes"] / BW_KV  # KV streams at half the rate there
    group, _ = cm.fit_group(bent, FitSettings(), ceilings=None)
    e = pd.DataFrame(group["errors"]).query("regime == 'all' and method == 'fit'").set_index("split")
    assert e.loc["train L<4096, predict L=4096", "bias_pct"] < -5.0  # under-predicted: it never saw the bend


def depth_rows(layers, full=4):
    """Rows at `layers` of a `full`-layer model: weights per layer 5e7 B plus a 2e7 B head."""
    out = []
    for q in (1, 2, 8, 16, 64):  # B*q = 8 is the knee: it must be among the token counts
        for B in (1, 4):
            for L in (128, 1024):
                w, kv, N = 2e7 + 5e7 * layers, B * L * 1e4 * layers, B * q
                t = T0 + w / BW + kv / BW_KV + max(0, N - KNEE) * FLOP_PER_TOKEN * layers / F
                out.append(dict(device_name="synthetic", model="syn", dtype="bfloat16", mode="eager",
                                kind="forward", q=q, B=B, L=L, tokens=N, weight_bytes=w, embed_bytes=0.0,
                                kv_read_bytes=kv, kv_write_bytes=0.0, flops_matmul=FLOP_PER_TOKEN * N * layers,
                                flops_attention=0.0, t_median_s=t, status="ok", layers_run=layers,
                                layers_full=full, extrapolated=False))
    return pd.DataFrame(out)


def test_depth_split_predicts_full_depth_from_shallow_rows():
    """Rows at 1 and 2 layers train a fit that predicts the 4-layer rows; the physics is the
    same, so the error is small."""
    rows = depth_rows
    full, shallow = rows(4), pd.concat([rows(1), rows(2)], ignore_index=True)
    group, _ = cm.fit_group(full, FitSettings(), ceilings=None, sliced=shallow)
    e = pd.DataFrame(group["errors"]).query("regime == 'all' and method == 'fit'").set_index("split")
    assert e.loc["train layers 1,2, predict full depth", "n"] == len(full)
    assert e.loc["train layers 1,2, predict full depth", "max_abs_pct"] < 1.0


def test_noisy_points_are_left_out_and_counted(tmp_path):
    df = synthetic_rows(noise=0.0, seed=5).assign(noisy=False, extrapolated=False)
    df.loc[:9, "t_median_s"] *= 10  # ten points timed on a busy machine, marked by the sweep
    df.loc[:9, "noisy"] = True
    write_run(tmp_path, df.to_dict("records"), jsonl=False)
    fit, points = cm.fit_run(tmp_path)
    assert fit["excluded"]["noisy_points"] == 10 and len(points) == len(df) - 10
    e = pd.DataFrame(fit["groups"][0]["errors"]).query("regime == 'all' and method == 'fit'")
    assert e["max_abs_pct"].max() < 1.0  # the ten-fold outliers never reached the fit


def test_a_run_timed_mostly_on_a_busy_machine_is_fitted_but_its_noisy_points_are_no_profile(tmp_path):
    df = synthetic_rows(noise=0.0, seed=6).assign(noisy=False, extrapolated=False)
    n_noisy = len(df) // 2  # too few clean points: the fit has to keep the noisy ones, and says so
    df.loc[: n_noisy - 1, "noisy"] = True
    write_run(tmp_path, df.to_dict("records"), jsonl=False)
    fit, points = cm.fit_run(tmp_path)
    assert not fit["excluded"]["left_out"] and len(points) == len(df)
    group = fit["groups"][0]
    assert group["table_left_out_noisy"] == n_noisy
    assert len(group["table"]["q"]) == len(df) - n_noisy


def test_a_sliced_run_lends_only_its_measured_shallow_rows(tmp_path):
    """`fit sliced_dir=S`: S's layer-extrapolated full-depth rows are predictions, not
    measurements; they must neither join the full-depth fit nor switch the depth split off."""
    full_dir, sliced_dir = tmp_path / "full", tmp_path / "sliced"
    full = depth_rows(4)
    write_run(full_dir, full.to_dict("records"), jsonl=False)
    guessed = depth_rows(4).assign(extrapolated=True, t_median_s=lambda d: 3 * d["t_median_s"])
    write_run(sliced_dir, pd.concat([depth_rows(1), depth_rows(2), guessed], ignore_index=True).to_dict("records"),
              jsonl=False)
    fit, _ = cm.fit_run(full_dir, sliced_dir=sliced_dir)
    group = fit["groups"][0]
    assert group["n_points"] == len(full)
    e = pd.DataFrame(group["errors"]).query("regime == 'all' and method == 'fit'").set_index("split")
    assert e.loc["train layers 1,2, predict full depth", "max_abs_pct"] < 1.0
    alone, _ = cm.fit_run(full_dir)  # the 3x guesses never reached the fit: same coefficients as without S
    assert group["coefs"] == pytest.approx(alone["groups"][0]["coefs"], rel=1e-9)


# ---- a bounded, identified fit (issue 21, build item 6) ---------------------------------------

TRUTH = dict(t0=2e-3, bw=18e9, f=0.3e12, f_attn=0.1e12, knee=8)  # s, B/s, FLOP/s, FLOP/s, tokens


def _fit_of(tmp_path, **kw):
    from tests.helpers import make_synthetic_run
    fit, _ = cm.fit_run(make_synthetic_run(tmp_path / "run", **kw))
    return next(g for g in fit["groups"] if g["key"]["kind"] == "forward"), fit


def _checks(group) -> dict:
    return {c["term"]: c["status"] for c in group["term_checks"]}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_synthetic_run_of_the_form_gives_back_its_parameters(tmp_path, seed):
    """A run folder whose times follow the form with known parameters (0.2% noise, ceilings.json of
    21 GB/s and 0.42 TFLOP/s, every rate below them): BW within 3%, the matmul and attention rates
    within 2%, t0 (2 ms of 25-700 ms steps) within 35%; every term identified, no problem."""
    g, _ = _fit_of(tmp_path, truth=TRUTH, noise=0.002, seed=seed)
    p = g["params"]
    assert p["BW_eff_GBps"] == pytest.approx(TRUTH["bw"] / 1e9, rel=0.03)
    assert p["F_eff_TFLOPs"] == pytest.approx(TRUTH["f"] / 1e12, rel=0.02)
    assert p["F_attn_TFLOPs"] == pytest.approx(TRUTH["f_attn"] / 1e12, rel=0.02)
    assert p["t0_ms"] == pytest.approx(TRUTH["t0"] * 1e3, rel=0.35)
    assert g["knee_tokens"] == TRUTH["knee"]
    assert set(_checks(g).values()) == {"identified"} and g["problems"] == []


def test_no_fitted_rate_above_its_ceiling_and_the_term_at_its_bound_is_a_problem(tmp_path):
    """Attention that costs nothing in the times (50 TFLOP/s on a 0.42 TFLOP/s device): the fit may
    not claim it (unbounded it did: 6.9e7 TFLOP/s on a CPU); it sits at 1.15x the measured ceiling
    and the gate says so in problems and in the warnings the report prints."""
    from roofline.analysis import quality
    from tests.helpers import MEASURED_BF16_TFLOPS, MEASURED_BW_GBPS
    g, fit = _fit_of(tmp_path, truth=dict(TRUTH, f_attn=50e12), noise=0.002)
    p = g["params"]
    assert p["F_attn_TFLOPs"] <= cm.ROOF_SLACK * MEASURED_BF16_TFLOPS * (1 + 1e-6)
    assert p["F_eff_TFLOPs"] <= cm.ROOF_SLACK * MEASURED_BF16_TFLOPS * (1 + 1e-6)
    assert p["BW_eff_GBps"] <= cm.ROOF_SLACK * MEASURED_BW_GBPS * (1 + 1e-6)
    assert _checks(g)["attention"] == "at bound"
    assert any(w.startswith("term attention at bound") for w in g["problems"])
    assert any("term attention at bound" in w for w in quality.fit_warnings(fit))
    assert g["bounds"]["F_max_TFLOPs"] == pytest.approx(cm.ROOF_SLACK * MEASURED_BF16_TFLOPS)


def test_without_ceilings_the_datasheet_row_bounds_the_fit(tmp_path):
    """No ceilings.json: the device's datasheet row bounds the rates (here a CPU without one: no
    bound, and the fit says where its bounds came from)."""
    g, _ = _fit_of(tmp_path, truth=TRUTH, noise=0.002, ceilings=False)
    assert g["bounds"]["BW_max_GBps"] is None and g["bounds"]["F_max_TFLOPs"] is None
    sheet = cm.fit_roofs("bfloat16", None, "NVIDIA H100 80GB HBM3")
    assert sheet.bw_Bps == pytest.approx(3.35e12, rel=0.01) and "datasheet" in sheet.bw_source


def test_a_grid_that_does_not_vary_bytes_leaves_t0_unidentified_and_says_so(tmp_path):
    """One batch and no context: every pass reads the same bytes (to 0.1%), so t0 and W/BW are one
    column; t0 is not fitted (0) and the gate names it, instead of a split the noise chooses."""
    g, _ = _fit_of(tmp_path, truth=TRUTH, noise=0.002, Bs=(1,), Ls=(0,))
    assert _checks(g)["t0"] == "unidentified" and g["params"]["t0_ms"] == 0.0
    assert any(w.startswith("term t0 unidentified") for w in g["problems"])


def test_a_noisy_grid_marks_t0_weakly_identified(tmp_path):
    """At 1% noise the bytes vary too little (7% of the t0 column outside W's span) to pin a 2 ms t0."""
    g, _ = _fit_of(tmp_path, truth=TRUTH, noise=0.01)
    assert _checks(g)["t0"] == "weakly identified"
    assert any(w.startswith("term t0 weakly identified") for w in g["problems"])


def test_an_extrapolated_prediction_band_is_widened_by_the_measured_extrapolation_error():
    """In the measured box the band is the K-fold one, [T/p90, T/p10]; outside it (B = 64 of a B <= 4
    fit) each side is widened by the group's measured extrapolation error (the largest median |err|
    of its 'train ..., predict ...' splits): without that the band claims the in-box accuracy."""
    fit = json.loads((REPO / "results" / "cpu-demo" / "fit.json").read_text())
    g = cm.find_group(fit, "forward", "bfloat16")
    inside = cm.predict_detail(fit, "forward", "bfloat16", 1, 1, 128)
    assert not inside["extrapolated"] and inside["band_widened_by_pct"] == 0.0
    assert inside["p90_s"] == pytest.approx(inside["seconds"] / g["band"]["p10"], rel=1e-12)
    widen = max(e["median_abs_pct"] for e in g["errors"]
                if e["method"] == "fit" and e["regime"] == "all" and e["split"].startswith("train "))
    assert widen > 5.0
    far = cm.predict_detail(fit, "forward", "bfloat16", 1, 64, 128)
    assert far["extrapolated"] and far["band_widened_by_pct"] == pytest.approx(widen)
    assert far["p90_s"] == pytest.approx(far["seconds"] / g["band"]["p10"] * (1 + widen / 100), rel=1e-12)
    assert far["p10_s"] == pytest.approx(far["seconds"] / g["band"]["p90"] / (1 + widen / 100), rel=1e-12)
    assert far["p90_s"] / far["seconds"] > inside["p90_s"] / inside["seconds"]


def test_a_cache_resident_working_set_is_not_bounded_by_the_dram_ceiling():
    ceilings = {"summary": {"mem_bw_GBps": 21.0, "peak_tflops": {"bfloat16": 0.42}, "llc_bytes": 64 * 2**20}}
    small = cm.fit_roofs("bfloat16", ceilings, "some CPU", working_set=8e6)
    large = cm.fit_roofs("bfloat16", ceilings, "some CPU", working_set=4.3e8)
    assert small.bw_Bps is None and small.flops == pytest.approx(0.42e12)
    assert large.bw_Bps == pytest.approx(21e9) and "measured ceiling of 21 GB/s" in large.bw_source


def test_a_term_the_training_points_do_not_see_takes_its_bound_not_an_arbitrary_rate():
    """A knee at or above every training point's tokens leaves the matmul column all zero: the points give
    that rate nothing. The optimiser left it wherever its start put it (1.34 s/FLOP in a CPU dry run's held-out
    fold), and the held-out point past the knee was priced 1.5e9 times its measured time (a 5-fold MAPE of
    1.25e10%). The unseen rate takes its bound, the ceiling's: predictions beyond the knee stay physical."""
    roofs = cm.Roofs(bw_Bps=BW, flops=F)
    df = synthetic_rows(noise=0.0, seed=0)
    train = df[df["tokens"] <= 16]
    X = cm.features(train, 16.0)
    assert not X[:, 3].any()  # the knee at the largest training tokens: no training point sees the matmul column
    names = ["t0", "weights", "matmul", "attention"]
    D = X[:, [0, 1, 3, 4]]
    lower = roofs.lower(names)
    z = cm._solve(D, cm._col(train, "t_median_s"), X[:, 6], lower)
    assert z[2] == pytest.approx(lower[2]) and z[2] < 1e-11  # the ceiling's rate, s/FLOP
    big = df[df["tokens"] == 256]
    pred = cm.features(big, 16.0)[:, [0, 1, 3, 4]] @ z
    assert np.all(pred < 10 * cm._col(big, "t_median_s"))
