"""Report and figure fixes: the real last-level cache (not the flush size)."""

from roofline.measure.devices import last_level_cache_bytes
from roofline.report import plots


def _sysfs(root, caches):
    for i, (level, kind, size) in enumerate(caches):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")


def test_the_last_level_cache_is_read_from_sysfs(tmp_path):
    _sysfs(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"), (3, "Unified", "32768K")])
    assert last_level_cache_bytes("cpu", str(tmp_path)) == 32 * 2**20
    assert last_level_cache_bytes("cpu", str(tmp_path / "none")) is None


def test_the_figure_marks_the_queried_cache_not_the_flush_size():
    ceilings = {"summary": {"mem_bw_GBps": 10.0, "peak_tflops": {"bfloat16": 1.0}, "cache_bytes": 64 * 2**20,
                            "llc_bytes": 32 * 2**20}}
    assert plots.roofs_for("bfloat16", ceilings, None).cache_bytes == 32 * 2**20
    flush_only = {"summary": {"mem_bw_GBps": 10.0, "peak_tflops": {}, "cache_bytes": 64 * 2**20}}
    assert plots.roofs_for("bfloat16", flush_only, None).cache_bytes is None


def _legend_texts(fig) -> list[str]:
    return [t.get_text() for leg in fig.legends for t in leg.get_texts()]


def test_no_percent_of_datasheet_legend_without_a_datasheet(tmp_path):
    from roofline.io.results import load_run
    from tests.helpers import make_synthetic_run, synthetic_ceilings
    run = make_synthetic_run(tmp_path / "run", ceilings=False)
    df = load_run(run)
    without = plots.build_utilisation_vs_batch(df, synthetic_ceilings(datasheet=False), None)
    fig = next(iter(without.values()))
    assert "% of measured" in _legend_texts(fig) and "% of datasheet" not in _legend_texts(fig)
    assert "dashed: % of datasheet" not in fig._suptitle.get_text()
    with_sheet = plots.build_utilisation_vs_batch(df, synthetic_ceilings(datasheet=True), None)
    assert "% of datasheet" in _legend_texts(next(iter(with_sheet.values())))


def test_a_log_axis_within_one_decade_gets_tick_labels(tmp_path):
    from roofline.report import figures
    fig, ax = figures.subplots(figsize=(4, 3))
    ax.plot([2, 3, 5], [20, 30, 50])
    ax.set(xscale="log", yscale="log")
    figures.save(fig, tmp_path, "f")
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.yaxis.get_minorticklabels() if t.get_text()]
    assert labels == ["20", "50"]  # two readable labels a decade (2x, 5x), not eight overlapping ones


def test_breakeven_lines_that_coincide_stay_distinguishable(tmp_path):
    from roofline.analysis.predict import Costs
    from roofline.commands.predict import plot_all
    from roofline.model.speculation import StepCosts, no_cost
    steps = StepCosts(target=lambda q, B, L: 1e-3 * (1 + 0.001 * q * B), draft=no_cost, overhead=lambda k, B: 0.0)
    paths = plot_all(Costs(steps, "fit", "test", 0.0), [1, 2, 4], [128, 1024], 1, 128, tmp_path, "t")
    assert any(p.name.startswith("breakeven_batch") for p in paths)
