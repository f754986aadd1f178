"""The report says what the data say: predicted and measured knee, the regime, roofs exceeded."""

import math

import pandas as pd
import pytest

from roofline.report import regime


def rows(ratio, ridge=20.0, i1=1.0, dtype="float32", mode="compiled", B=1, L=128, qs=(1, 2, 4, 8, 16, 32, 64)):
    return pd.DataFrame([dict(point_id=f"forward|{dtype}|{mode}|q{q}|B{B}|L{L}|l2", status="ok", kind="forward",
                              dtype=dtype, mode=mode, q=q, B=B, L=L, t_median_s=0.01 * ratio(q),
                              ridge_measured=ridge, intensity=i1 * q, layers_run=2, layers_full=2) for q in qs])


def test_a_hinge_curve_gives_its_knee_back():
    t = regime.knee_table(rows(lambda q: max(1.0, q / 12.0)))
    r = t.iloc[0]
    assert r["knee_measured"] == pytest.approx(12, rel=0.05)
    assert r["knee_predicted"] == pytest.approx(20)  # ridge 20 / I(1) 1
    assert r["regime"].startswith("memory-bound") and r["ratio_at_probe"] == 1.0


def test_a_flat_curve_has_its_knee_beyond_the_grid():
    t = regime.knee_table(rows(lambda q: 1.0 + 0.01 * (q % 3 == 0)))
    assert math.isinf(t.iloc[0]["knee_measured"])
    assert "> 64" in regime.sentence(t.iloc[0].to_dict())


def test_a_compute_bound_run_says_so_in_headline_and_title():
    df = rows(lambda q: q ** 0.9, ridge=2.0, dtype="bfloat16", mode="eager")
    line = regime.headline(df)[0]
    assert "compute-bound" in line and "not free" in line
    assert "compute-bound" in regime.short_title(df, "bf16") and "free" not in regime.short_title(df, "bf16").split(":")[1][:5]
    flat = regime.short_title(rows(lambda q: 1.0), "fp32")
    assert "nearly free" in flat


def test_both_regimes_side_by_side():
    df = pd.concat([rows(lambda q: max(1.0, q / 12.0)), rows(lambda q: q ** 0.9, ridge=2.0, dtype="bfloat16", mode="eager")])
    lines = regime.headline(df)
    assert len(lines) == 2 and any("nearly free" in x for x in lines) and any("compute-bound" in x for x in lines)


def test_a_curve_that_rises_below_the_ridge_is_not_called_compute_bound():
    """T(8)/T(1) = 1.33 with the predicted knee at 44 tokens (the AMX Xeon's bf16 demo): the FLOP
    roof is far away, so the line says overhead-bound, and compute-bound only once q reaches the knee."""
    rising = lambda q: 1.0 + 0.33 * (q - 1) / 7  # noqa: E731
    df = rows(rising, ridge=44.0, dtype="bfloat16", mode="eager", qs=(1, 2, 4, 8))
    (line,) = regime.headline(df)
    assert "T(8)/T(1) = 1.33" in line and "overhead-bound" in line and "compute-bound:" not in line.split(";")[0]
    assert regime.knee_table(df).iloc[0]["regime"] == regime.OVERHEAD_REGIME
    assert "overhead-bound below the ridge" in regime.short_title(df, "bf16")
    (line,) = regime.headline(rows(rising, ridge=4.0, dtype="bfloat16", mode="eager", qs=(1, 2, 4, 8)))  # knee 4 <= 8
    assert "compute-bound, every extra token" in line


def test_a_point_above_the_measured_roof_is_named():
    df = rows(lambda q: 1.0).assign(pct_measured_bw=[50, 60, 70, 80, 90, 100, 140], ceiling_bw_GBps=10.0)
    (w,) = regime.roof_violations(df)
    assert "memory roof (10 GB/s" in w and "q64" in w and "140%" in w
    assert regime.roof_violations(df.assign(pct_measured_bw=99.0)) == []


def test_decode_below_the_target_names_the_kernel_measured():
    df = rows(lambda q: 1.0).assign(achieved_GBps=5.0)
    ceil = {"summary": {"mem_bw_GBps": 30.0, "mem_bw_by_kernel": {"torch_read": 20.0},
                        "decode_m1_GBps": {"float32": 8.0}}}
    (line,) = regime.decode_notes(df, ceil)
    assert "25% of the measured read bandwidth (20 GB/s" in line  # the read kernel, not the best of all
    assert "M=1 GEMM kernel itself is below the target" in line and "reach 8 GB/s (40%)" in line
    (fast,) = regime.decode_notes(df.assign(achieved_GBps=17.0), ceil)
    assert "85%" in fast and "below" not in fast


def test_a_pass_faster_than_decode_names_the_decode_kernels():
    df = rows(lambda q: {1: 1.0, 2: 0.8, 4: 0.7}.get(q, 1.1)).assign(achieved_GBps=10.0)
    df.loc[df["q"] == 4, "achieved_GBps"] = 14.0
    ceil = {"summary": {"mem_bw_GBps": 20.0, "mem_bw_by_kernel": {"torch_read": 20.0},
                        "decode_m1_GBps": {"float32": 12.0}}}
    (line,) = regime.decode_notes(df, ceil)
    assert "a q=4 pass (B=1, L=128) takes only 0.70x the q=1 step" in line and "14 GB/s (70%)" in line
    assert "own kernels, not the memory, hold decode back" in line
    (plain,) = regime.decode_notes(rows(lambda q: max(1.0, q / 12.0)).assign(achieved_GBps=10.0), ceil)
    assert "hold decode back" not in plain


def test_the_compile_note_counts_graphs_and_their_time_apart_from_the_rows():
    df = rows(lambda q: 1.0, qs=(1, 2, 4)).assign(compile_s=[60.0, 70.0, 3.0], compile_new_graph=[True, True, False],
                                                  compile_gemm_backends="CPP", compile_fallback=None)
    (line,) = regime.compile_notes(df)
    assert "2 graph(s) compiled in 130 s (60-70 s each)" in line and "serving 3 rows" in line and "CPP" in line
    fell = df.assign(compile_fallback=[None, None, "recompile limit (1 graphs) hit"])
    assert "1 row(s) ran eagerly after the recompile limit" in regime.compile_notes(fell)[0]
    assert regime.compile_notes(rows(lambda q: 1.0)) == []  # eager rows: no compile


def test_decode_note_gives_the_measured_split_of_the_step():
    """Rows with t_gemm_s (the skinny GEMMs timed inside the pass): 40 of 50 ms in the GEMMs,
    0.8 GB of weights over 40 ms = 20 GB/s = 100% of a 20 GB/s read roof, 10 ms the rest."""
    df = rows(lambda q: 5.0).assign(achieved_GBps=16.0, t_gemm_s=0.04, weight_bytes=0.8e9)
    ceil = {"summary": {"mem_bw_GBps": 20.0, "mem_bw_by_kernel": {"torch_read": 20.0}}}
    (line,) = regime.decode_notes(df, ceil)
    assert "its GEMMs take 40 ms (80% of the step)" in line
    assert "streaming the weights at 20 GB/s (100% of the read bandwidth)" in line
    assert "dispatch) 10 ms" in line
    (plain,) = regime.decode_notes(df.drop(columns="t_gemm_s"), ceil)
    assert "measured inside the pass" not in plain
