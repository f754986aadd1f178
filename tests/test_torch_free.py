"""The pricing and analysis commands never start torch: they read datasheets, priors and result files,
and importing torch costs seconds per command (about 3 s of a 4 s `card` on a 2-core machine).
A command that measures (sweep, ceilings, specdec, ...) imports it where it runs."""

import subprocess
import sys

import pytest

from tests.helpers import make_synthetic_run

PRICING = ("card", "capacity", "predict", "anchors", "fit", "report", "plots")

WRAP = """
import atexit, importlib, sys
cmd = sys.argv.pop(1)
atexit.register(lambda: print("torch loaded: " + str("torch" in sys.modules)))
importlib.import_module("roofline.cli." + cmd).main()
"""


def test_importing_every_pricing_and_analysis_command_leaves_torch_unloaded():
    code = ("import sys, roofline.cli.entry, roofline.cli.main\n"
            + "".join(f"import roofline.cli.{c}, roofline.commands.{c}\n" for c in PRICING)
            + "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout


@pytest.mark.parametrize("args", [
    ["card", "model=llama-3.1-8b", "device=h100_sxm", "engine=vllm"],
    ["capacity", "model=qwen3-30b-a3b", "device=h200_sxm", "layouts=true"],
    ["predict", "model=deepseek-v3", "device=h200_sxm", "B=[1]", "L=[1024]", "alphas=[0.8]", "k=[0,2]"],
    ["fit", "results_dir={run}"],
], ids=lambda a: a[0])
def test_a_pricing_or_analysis_command_runs_to_the_end_without_torch(args, tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    argv = [a.format(run=run) for a in args] + [f"hydra.run.dir={tmp_path / 'hydra'}"]
    if args[0] == "predict":
        argv.append(f"out_dir={tmp_path / 'predict'}")
    r = subprocess.run([sys.executable, "-c", WRAP, *argv], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert r.stdout.strip().splitlines()[-1] == "torch loaded: False", r.stdout[-2000:]
