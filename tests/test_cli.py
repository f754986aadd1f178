"""Every public command: `--help` and one tiny invocation, in one process per command.

The driver runs the Hydra entry point twice in one interpreter (help, then the invocation),
so each command costs one Python start-up. Outputs go to a temporary folder; the committed
reference run is copied before anything writes into it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from roofline.measure.ceilings import SUMMARY_KEYS, load_ceilings
from tests.helpers import make_synthetic_run

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # one Python start-up and a real run per command
HELP_END = "=== end of help ==="
DRIVER = f"""
import runpy, sys
from hydra.core.global_hydra import GlobalHydra
module, args = sys.argv[1], sys.argv[2:]
path = module.replace(".", "/") + ".py"
sys.argv = [path, "--help"]
try:
    runpy.run_module(module, run_name="__main__")
except SystemExit as e:
    if e.code not in (0, None):
        raise
print({HELP_END!r}, flush=True)
GlobalHydra.instance().clear()
sys.argv = [path, *args]
runpy.run_module(module, run_name="__main__")
"""


def run_cli(module: str, *args: str) -> tuple[str, subprocess.CompletedProcess]:
    r = subprocess.run([sys.executable, "-c", DRIVER, f"roofline.cli.{module}", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    help_text, _, rest = r.stdout.partition(HELP_END + "\n")
    assert f"{module}: every key, with the value it takes unless you give one" in help_text, r.stderr
    return rest, r


def last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> Path:
    """A copy of the committed CPU reference run (points, ceilings, fit)."""
    out = tmp_path_factory.mktemp("ref") / "cpu-demo"
    shutil.copytree(REPO / "results" / "cpu-demo", out)
    return out


def test_card(tmp_path):
    out, r = run_cli("card", "model=tiny", "device=h200_sxm", "context=16")
    assert r.returncode == 0, r.stderr
    card = last_json(out)
    assert card["model"] == "tiny" and card["device"] == "h200_sxm" and card["decode_floor_s"] > 0


def test_card_prices_a_speculative_finite_run_from_the_command_line():
    """k= and a per-position acceptance list reach the card's finite run through Hydra; a wrong one is one line
    naming the key, exit 2."""
    out, r = run_cli("card", "model=deepseek-v3", "device=h200_sxm", "tp=8", "engine=sglang", "input_len=1000",
                     "output_len=1000", "concurrency=8", "k=3", "acceptance=[0.8,0.6,0.45]")
    assert r.returncode == 0, r.stderr
    card = last_json(out)
    assert card["run_spec_k"] == 3 and card["run_spec_acceptance"] == [0.8, 0.6, 0.45]
    assert card["run_spec_speedup"] > 1 and "without speculation" in out
    _, bad = run_cli("card", "model=llama-3.1-8b", "device=h200_sxm", "input_len=100", "output_len=10", "k=2",
                     "acceptance=[0.8,0.6,0.45]", "drafter=ngram")
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: acceptance=[0.8, 0.6, 0.45]")


def test_sweep(tmp_path):
    out, r = run_cli("sweep", "model=tiny", "q=[1,2]", "B=[1]", "L=[0]", "dtypes=[float32]", "mtp_q=[1]",
                     "timer=quick", f"out_dir={tmp_path}", "progress=false")
    assert r.returncode == 0, r.stderr
    assert last_json(out)["ok"] == 3  # q=1, q=2 forward + one MTP step
    assert (pd.read_csv(tmp_path / "points.csv")["status"] == "ok").all()


def test_ceilings(tmp_path):
    out, r = run_cli("ceilings", "quick=true", f"out_dir={tmp_path}", "working_sets=[262144]",
                     "square_sizes=[64]", "decode_model=tiny", "decode_ms=[1]", "kernels=[torch_copy,torch_read]",
                     "l2_modes=[warm]", "timer.min_reps=2", "timer.max_reps=3")
    assert r.returncode == 0, r.stderr
    last = last_json(out)
    assert Path(last["run_dir"]) == tmp_path
    assert set(SUMMARY_KEYS) <= set(last["summary"]) and last["summary"]["mem_bw_GBps"] > 0
    assert "GFLOP/s" in out and "GB/s" in out
    assert load_ceilings(tmp_path)["summary"] == last["summary"]
    assert (tmp_path / "ceilings_bandwidth.csv").exists() and (tmp_path / "ceilings_matmul.csv").exists()


def test_fit(reference_run):
    out, r = run_cli("fit", f"results_dir={reference_run}", "folds=2")
    assert r.returncode == 0, r.stderr
    assert Path(last_json(out)["fit"]) == reference_run / "fit.json"


def test_plots(reference_run, tmp_path):
    out, r = run_cli("plots", f"results_dir={reference_run}", f"out_dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert {p.suffix for p in tmp_path.iterdir()} == {".png", ".svg"}


def test_report(tmp_path):
    run = make_synthetic_run(tmp_path / "run", ceilings=False)
    out, r = run_cli("report", f"results_dir={run}")
    assert r.returncode == 0, r.stderr
    paths = last_json(out)
    assert Path(paths["report_md"]).exists() and Path(paths["report_html"]).exists()


def test_predict(reference_run, tmp_path):
    out, r = run_cli("predict", f"fit={reference_run / 'fit.json'}", "model=tiny", "allow_other_model=true", "k=[0,1,2]",
                     "B=[1,4]", "L=[128]", "plot_B=1", "plot_L=128", f"out_dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    t = pd.read_csv(tmp_path / "predict.csv")
    assert {"tau", "S", "k_star", "extrapolated", "source", "overhead_source"} <= set(t.columns)
    assert len(t) == 4 * 3 * 2 and set(t["source"]) == {"device-fit-transfer"}
    assert {p.name for p in (tmp_path / "figures").iterdir()} == {"speedup_vs_alpha.png", "kstar_map.png",
                                                                  "breakeven_batch.png"}


def test_capacity(tmp_path):
    out, r = run_cli("capacity", "model=llama-3.1-8b", "B=[1,16]", "speculative=true", f"out_dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    folder = next(tmp_path.iterdir())
    summary = json.loads((folder / "capacity.json").read_text())
    assert summary["extrapolated"] is True and "spec" in summary
    assert (folder / "capacity.csv").exists() and (folder / "throughput_vs_latency.png").stat().st_size > 1000


def test_one_value_for_a_list_option_is_the_list_of_it(tmp_path):
    """`B=16` on the command line (a list option given one number) plans B = 16, as `B=[16]` does; it used to
    end in a TypeError traceback (exit 1) in capacity and predict."""
    from roofline.cli.entry import _lists_from_scalars
    c = dict(B=16, L=None, k="2", nest=dict(q=4, flag=True), model="x")
    _lists_from_scalars(c, dict(B=[1, 2], L=[128], k=[0], nest=dict(q=[1], flag=False), model="???"))
    assert c == dict(B=[16], L=None, k=["2"], nest=dict(q=[4], flag=True), model="x")
    out, r = run_cli("capacity", "model=llama-3.1-8b", "device=h100_sxm", "B=16", f"out_dir={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert list(pd.read_csv(next(tmp_path.iterdir()) / "capacity.csv")["B"]) == [16]


def test_capacity_layouts_take_the_precision_overrides():
    out, r = run_cli("capacity", "model=llama-3.1-70b", "device=h100_sxm", "weights=int4_g128", "layouts=true")
    assert r.returncode == 0, r.stderr
    summary = last_json(out)
    assert summary["weights_format"] == "int4_g128" and summary["layouts"] >= 1
    assert any(line.split()[:1] == ["tp1"] for line in out.splitlines())  # int4 fits one 80 GB device


def test_slicing(tmp_path):
    full = make_synthetic_run(tmp_path / "full", ceilings=False)
    sliced = tmp_path / "sliced"
    sliced.mkdir()
    df = pd.read_csv(full / "points.csv")
    df.assign(extrapolated=True, layers_measured="2,4", t_median_s=df["t_median_s"] * 1.1).to_csv(
        sliced / "points.csv", index=False)
    out, r = run_cli("slicing", f"full_dir={full}", f"sliced_dir={sliced}")
    assert r.returncode == 0, r.stderr
    summary = last_json(out)
    assert summary["points"] == int((df["status"] == "ok").sum())
    assert summary["median_abs_err"] == pytest.approx(0.1, rel=1e-9)


def test_inventory(tmp_path):
    save_file = pytest.importorskip("safetensors.torch").save_file
    import torch
    for side in ("before", "after"):
        (tmp_path / side).mkdir()
        (tmp_path / side / "config.json").write_text(json.dumps({"num_hidden_layers": 1}))
        save_file({"model.layers.0.w": torch.arange(6.0).reshape(2, 3)}, str(tmp_path / side / "model.safetensors"))
    out, r = run_cli("inventory", f"before={tmp_path / 'before'}", f"after={tmp_path / 'after'}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert last_json(out)["missing"] == 0


def test_acceptance_without_a_checkpoint_fails_naming_it():
    _, r = run_cli("acceptance", "prompts=chats.jsonl")
    assert r.returncode == 2 and "checkpoint is required" in r.stderr


def test_specdec_with_a_bad_grid_fails_before_measuring(tmp_path):
    _, r = run_cli("specdec", "model=tiny", "ks=[0]", f"out_dir={tmp_path}")
    assert r.returncode == 2 and "ks" in r.stderr
    assert not any(tmp_path.iterdir())
