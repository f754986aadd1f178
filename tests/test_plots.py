"""Figures of a run folder, from a synthetic run with CPU-like physics (docs/design.md §5): a 0.43 GB
bf16 model decoding at ~19 GB/s, step time flat to q≈8 then linear."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from roofline.report import plots
from roofline.measure.devices import get_datasheet
from tests.helpers import MEASURED_BF16_TFLOPS, MEASURED_BW_GBPS, make_synthetic_run

@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return make_synthetic_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="module")
def frame(run) -> pd.DataFrame:
    return pd.read_csv(run / "points.csv")


@pytest.fixture(scope="module")
def ceilings(run) -> dict:
    return json.loads((run / "ceilings.json").read_text())


def _texts(fig) -> str:
    out = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()] + [t.get_text() for t in ax.texts]
        if ax.get_legend():
            out += [t.get_text() for t in ax.get_legend().get_texts()]
    return "\n".join(out)


def test_every_figure_is_written_as_png_and_svg(frame, ceilings, tmp_path):
    figs = plots.plot_all(frame, ceilings, None, tmp_path)
    assert set(figs.paths) == set(plots.BUILDERS) and not figs.skipped
    for paths in figs.paths.values():
        assert {p.suffix for p in paths} == {".png", ".svg"}
        assert all(p.stat().st_size > 10_000 for p in paths)


@pytest.mark.parametrize("name", list(plots.BUILDERS))
def test_footer_names_device_dtype_timer_l2_and_date(name, frame, ceilings):
    for fig in plots.BUILDERS[name](frame, ceilings, None).values():
        footer = fig.texts[-1].get_text()
        for needle in ("AMD EPYC 9R14 (synthetic)", "timer: eager", "L2 warm", "2026-03-01"):
            assert needle in footer
        assert ("bfloat16" if name != "bandwidth_vs_working_set" else "fp32") in footer


def test_step_time_prediction_is_max_of_memory_and_compute_time(frame, ceilings):
    fig = plots.build_step_time_vs_q(frame, ceilings, None)["step_time_vs_q_bf16"]
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.lines}
    bw, F = MEASURED_BW_GBPS * 1e9, MEASURED_BF16_TFLOPS * 1e12
    # B=1, L=0, q=1: 0.43 GB + 16 KiB KV + 4 KiB embedding at 21 GB/s -> memory-bound, 20.478 ms
    dec = lines[f"{plots.PREDICTION_LABEL}: B=1, L=0"]
    bytes_dec = 0.43e9 + 4 * 1024 * 1 * 2 + 4 * 1024 * 1 * 2 + 2048 * 2
    assert bytes_dec / bw > 2 * 0.43e9 / F
    assert dec.get_ydata()[0] == pytest.approx(1e3 * bytes_dec / bw, rel=1e-9)
    assert dec.get_ydata()[0] == pytest.approx(20.478, abs=1e-3)
    # B=4, L=0, q=128: 512 tokens x 2 x 0.215 G params -> compute-bound at 0.42 TFLOP/s
    big = lines[f"{plots.PREDICTION_LABEL}: B=4, L=0"]
    row = frame[(frame.kind == "forward") & (frame.B == 4) & (frame.L == 0) & (frame.q == 128)].iloc[0]
    assert row["flops"] / F > row["bytes_total"] / bw
    assert big.get_xdata()[-1] == 128
    assert big.get_ydata()[-1] == pytest.approx(1e3 * max(row["bytes_total"] / bw, row["flops"] / F), rel=1e-9)


def test_prediction_falls_back_to_the_datasheet_without_measured_ceilings():
    roofs = plots.roofs_for("bfloat16", None, get_datasheet("h200_sxm"))
    assert roofs.for_prediction() == (4800e9, 989.5e12, "datasheet")
    assert roofs.ridge_datasheet == pytest.approx(206.1, abs=0.1)
    one = pd.DataFrame({"bytes_total": [4.8e9], "flops": [989.5e12 * 2]})
    assert plots.predict_step_time(one, roofs).iloc[0] == pytest.approx(2.0)


def test_roofline_draws_measured_solid_datasheet_dashed_and_both_ridges(frame, ceilings):
    fig = plots.build_roofline(frame, ceilings, None)["roofline_bf16"]
    ax = fig.axes[0]
    styles = {ln.get_label().split(" roof")[0]: ln.get_linestyle() for ln in ax.lines if " roof:" in ln.get_label()}
    assert styles == {"measured": "-", "datasheet": "--"}
    measured = next(ln for ln in ax.lines if ln.get_label().startswith("measured roof"))
    x, y = measured.get_xdata(), measured.get_ydata()
    np.testing.assert_allclose(y, np.minimum(21e9 * x, 0.42e12) / 1e12, rtol=1e-12)
    text = _texts(fig)
    assert "ridge 20 FLOP/B\n(measured)" in text and "ridge 31.2 FLOP/B\n(datasheet)" in text
    n_ok = int(((frame.status == "ok")).sum())
    assert sum(len(c.get_offsets()) for c in ax.collections) == n_ok


def test_figures_without_their_data_are_skipped_with_a_reason(frame, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="roofline.report.plots"):
        assert plots.plot_bandwidth_vs_working_set(frame, None, None, tmp_path) == []
        assert plots.plot_utilisation_vs_batch(frame, None, None, tmp_path) == []
    assert list(tmp_path.iterdir()) == []
    assert "bandwidth_vs_working_set skipped: no bandwidth rows" in caplog.text
    assert "utilisation_vs_batch skipped: no measured or datasheet ceiling" in caplog.text


def test_failed_rows_are_not_plotted(frame, ceilings):
    only_failed = frame[frame.status != "ok"]
    with pytest.raises(plots.Skip):
        plots.build_step_time_vs_q(only_failed, ceilings, None)


def test_pick_q_keeps_one_and_spreads_the_rest():
    assert plots.pick_q([1, 2, 4, 8, 16, 32, 64, 128]) == [1, 4, 32, 128]
    assert plots.pick_q([1, 2]) == [1, 2]


def test_layer_sliced_depths_get_their_own_lines(frame, ceilings):
    sliced = pd.concat([frame.assign(layers_run=2), frame.assign(layers_run=4)], ignore_index=True)
    fig = plots.build_step_time_vs_q(sliced, ceilings, None)["step_time_vs_q_bf16"]
    labels = fig.axes[0].get_legend().get_texts()
    assert "layers=2, B=1, L=0" in [t.get_text() for t in labels]
    for line in fig.axes[0].lines:
        assert np.all(np.diff(line.get_xdata()) > 0)  # one point per q on every line


def test_ceilings_with_torch_dtype_names_give_the_same_roofs(ceilings):
    long = json.loads(json.dumps(ceilings))
    long["summary"]["peak_tflops"] = {"bfloat16": MEASURED_BF16_TFLOPS}
    long["datasheet"]["peak_tflops"] = {"bfloat16": 1.2, "float32": 0.6}
    assert plots.roofs_for("bf16", long, None) == plots.roofs_for("bfloat16", ceilings, None)


def test_figures_from_the_committed_reference_run(tmp_path):
    """The committed results/cpu-demo folder (a real CPU run) still draws every picture."""
    from roofline.model.presets import REPO_ROOT
    from roofline.report.document import write_figures
    figs = write_figures(REPO_ROOT / "results" / "cpu-demo", out_dir=tmp_path)
    stems = {p.stem for paths in figs.paths.values() for p in paths}
    assert {"roofline_bf16", "step_time_vs_q_bf16", "bandwidth_vs_working_set", "utilisation_vs_batch_bf16"} <= stems
    assert not figs.skipped
    assert all(p.stat().st_size > 10_000 for paths in figs.paths.values() for p in paths)


@pytest.mark.parametrize("lo, hi", [(0.006, 0.02), (0.3, 0.9), (2e-5, 9e-5), (0.5, 400.0)])
def test_every_tick_label_of_a_log_axis_is_distinct(lo, hi):
    """A log axis spanning less than a decade: matplotlib falls back to linear minor ticks
    (0.012, 0.014, ...), which a one-significant-digit formatter printed as "1e-02" twice."""
    from roofline.report import figures
    fig, ax = figures.subplots(figsize=(6, 4))
    ax.plot([1, 2], [lo, hi])
    ax.set(yscale="log", ylim=(lo, hi))
    figures.label_log_axes(fig)
    fig.canvas.draw()
    y0, y1 = ax.get_ylim()
    labels = {}
    for label in ax.get_yticklabels(which="both"):
        text, at = label.get_text(), label.get_position()[1]
        if text and y0 <= at <= y1:
            assert labels.setdefault(text, at) == pytest.approx(at), f"{text!r} labels {labels[text]} and {at}"
    assert len(labels) >= 2  # the axis can be read
