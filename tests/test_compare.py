"""compare: two runs joined by point, the ratio, and whether it exceeds the noise."""

import json
import subprocess
import sys

import numpy as np
import pytest

from roofline.analysis.compare import compare_runs, format_comparison
from roofline.io import results
from roofline.io.fields import ConfigError
from roofline.model.presets import REPO_ROOT


def run(folder, medians, seed, spread=0.01, n=30):
    """A run folder with one ok point per median (seconds) and its repetitions."""
    rng = np.random.default_rng(seed)
    folder.mkdir()
    rows = []
    for i, med in enumerate(medians):
        pid = f"forward|bfloat16|eager|q{i + 1}|B1|L0|l2"
        s = med * (1 + spread * rng.standard_normal(n))
        results.append_samples(folder, pid, list(s))
        rows.append(dict(point_id=pid, kind="forward", dtype="bfloat16", mode="eager", q=i + 1, B=1, L=0,
                         status="ok", t_median_s=float(np.median(s)), t_n=n, t_ci_rel=0.01, device_name="cpu X"))
    results.write_csv(rows, folder / "points.csv")
    return folder


def test_a_real_slowdown_is_beyond_the_noise_and_equal_points_are_not(tmp_path):
    a = run(tmp_path / "a", [1e-3, 2e-3, 4e-3], seed=0)
    b = run(tmp_path / "b", [1e-3, 2.4e-3, 4e-3], seed=1)
    m, summary = compare_runs(a, b)
    assert list(m["verdict"]) == ["same within noise", "b slower", "same within noise"]
    assert m["ratio"].iloc[1] == pytest.approx(1.2, rel=0.02)
    assert summary["beyond_noise"] == 1 and summary["points_compared"] == 3
    assert "1 differ beyond the noise (1 b slower, 0 b faster" in format_comparison(m, summary)


def test_points_only_in_one_run_are_counted_not_joined(tmp_path):
    m, summary = compare_runs(run(tmp_path / "a", [1e-3, 2e-3], 0), run(tmp_path / "b", [1e-3], 1))
    assert len(m) == 1 and summary["only_in_a"] == 1 and summary["only_in_b"] == 0


def test_runs_with_nothing_in_common_or_missing_are_refused(tmp_path):
    a = run(tmp_path / "a", [1e-3], 0)
    with pytest.raises(ConfigError, match="b='/nope': not a run folder"):
        compare_runs(a, "/nope")


def test_compare_entry_point(tmp_path):
    a, b = run(tmp_path / "a", [1e-3, 2e-3], 0), run(tmp_path / "b", [1.5e-3, 2e-3], 1)
    r = subprocess.run([sys.executable, "-m", "roofline.cli.compare", f"a={a}", f"b={b}", f"out={tmp_path / 'c.csv'}"],
                       cwd=REPO_ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["b_slower"] == 1
    assert (tmp_path / "c.csv").exists()
