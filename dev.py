#!/usr/bin/env python3
"""Set-up and the project's jobs with nothing but Python 3.11 and pip.

    python3 dev.py demo    # set up .venv, run the main job on the CPU
    python3 dev.py test    # set up .venv, run the tests
    python3 dev.py bench   # set up .venv, run the kernel benchmarks (never part of CI)

Set-up creates .venv and, on a machine without an NVIDIA driver (no nvidia-smi), installs the
CPU build of torch first, so that the project's open "torch>=2.5" is already met and pip does
not pull a multi-GB CUDA build; with a driver, pip resolves a CUDA build.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
TORCH_CPU = "torch==2.13.0"
DEMO = "results/runs/demo"


def run(*cmd: str | Path) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    code = subprocess.call([str(c) for c in cmd], cwd=ROOT)
    if code:
        sys.exit(code)


def setup() -> None:
    stamp = VENV / ".installed"
    if stamp.exists() and stamp.stat().st_mtime >= (ROOT / "pyproject.toml").stat().st_mtime:
        return
    if not PY.exists():
        venv.create(VENV, with_pip=True)
        run(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
    if shutil.which("nvidia-smi") is None:
        run(PY, "-m", "pip", "install", "-q", TORCH_CPU)
    run(PY, "-m", "pip", "install", "-q", "-e", ".[test]")
    stamp.touch()


def demo() -> None:
    """Cost card, measured ceilings, the cpu-demo sweep against them, the cost-model fit, the report."""
    run(PY, "-m", "experiments.card", "model=cpu-demo", "device=null")
    run(PY, "-m", "experiments.ceilings", "device=cpu", "quick=true", f"out_dir={DEMO}")
    run(PY, "-m", "experiments.sweep", "model=cpu-demo", f"out_dir={DEMO}", f"ceilings={DEMO}/ceilings.json")
    run(PY, "-m", "experiments.fit", f"results_dir={DEMO}")
    run(PY, "-m", "experiments.report", f"results_dir={DEMO}")


def test() -> None:
    run(PY, "-m", "pytest", "-q")


def bench() -> None:
    run(PY, "-m", "pytest", "benchmarks", "-q", "--benchmark-only")


JOBS = {"setup": lambda: None, "demo": demo, "test": test, "bench": bench}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in JOBS:
        sys.exit(f"usage: python3 dev.py {{{'|'.join(JOBS)}}}")
    setup()
    JOBS[sys.argv[1]]()
