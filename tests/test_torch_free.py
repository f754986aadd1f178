"""The pricing and analysis commands never start torch: they read datasheets, priors and result files,
and importing torch costs seconds per command (about 3 s of a 4 s `card` on a 2-core machine).
A command that measures (sweep, ceilings, specdec, ...) imports it where it runs."""

import subprocess
import sys

from tests.helpers import make_synthetic_run

PRICING = ("card", "capacity", "predict", "anchors", "fit", "report", "plots")

# one process (one interpreter start): import every pricing command, then run four of them to the end,
# reporting after each whether torch is loaded; `::` separates the commands' arguments
DRIVER = """
import importlib, sys
for c in sys.argv[1].split(","):
    importlib.import_module("roofline.cli." + c)
print("imported: torch loaded", "torch" in sys.modules, flush=True)
job = []
for a in sys.argv[2:] + ["::"]:
    if a != "::":
        job.append(a)
        continue
    sys.argv = job
    importlib.import_module("roofline.cli." + job[0]).main()
    print(job[0] + ": torch loaded", "torch" in sys.modules, flush=True)
    job = []
"""


def test_pricing_and_analysis_commands_import_and_run_without_torch(tmp_path):
    run = make_synthetic_run(tmp_path / "run")
    jobs = [["card", "model=llama-3.1-8b", "device=h100_sxm", "engine=vllm"],
            ["capacity", "model=qwen3-30b-a3b", "device=h200_sxm", "layouts=true", f"out_dir={tmp_path / 'cap'}"],
            ["predict", "model=deepseek-v3", "device=h200_sxm", "B=[1]", "L=[1024]", "alphas=[0.8]", "k=[0,2]"],
            ["fit", f"results_dir={run}"]]
    argv = []
    for i, job in enumerate(jobs):
        argv += (["::"] if i else []) + job + [f"hydra.run.dir={tmp_path / ('hydra' + str(i))}"]
    r = subprocess.run([sys.executable, "-c", DRIVER, ",".join(PRICING), *argv], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    lines = [ln for ln in r.stdout.splitlines() if ": torch loaded" in ln]
    assert lines == [f"{name}: torch loaded False" for name in ["imported"] + [j[0] for j in jobs]], r.stdout[-3000:]
    assert '"source": "what-if"' in r.stdout and (run / "fit.json").is_file()
