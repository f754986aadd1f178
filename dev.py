#!/usr/bin/env python3
"""Set-up and the project's jobs with nothing but Python 3.11 and pip.

    python3 dev.py demo    # set up .venv, run the main job on the CPU
    python3 dev.py test    # set up .venv, run the tests
    python3 dev.py bench   # set up .venv, run the kernel benchmarks (never part of CI)
    python3 dev.py wheels  # ./wheelhouse for an offline GPU node (no .venv needed; needs the index)

Set-up creates .venv and, on a machine without an NVIDIA driver (no nvidia-smi), installs the
CPU build of torch through requirements/cpu.txt (PyTorch's CPU index), so that the project's
open "torch>=2.5" is met without pip pulling a multi-GB CUDA build; with a driver, pip
resolves a CUDA build. The demo installs the core alone; test and bench add the test extra.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
CPU_REQUIREMENTS = "requirements/cpu.txt"  # the CPU build of torch (PyTorch's CPU index), pinned
DEMO = "results/runs/demo"
DEMO_CEILINGS = "results/runs/demo-ceilings"  # measured anew each run, copied into the sweep's run
WHEELHOUSE = ROOT / "wheelhouse"
# What a GPU node with its own torch lacks. Its image has the rest of the project's needs (numpy,
# pandas, matplotlib, scipy, pyyaml, tqdm, psutil, packaging, pytest, pytest-benchmark); these
# three are pure Python, so one wheelhouse serves any CPython 3 and any platform. Pinned to the
# versions the tests run with; antlr4 4.9.3 (hydra 1.3's grammar runtime) exists only as a
# source distribution, which `pip wheel` builds here into a py3-none-any wheel.
OFFLINE = ("hydra-core==1.3.8", "omegaconf==2.3.1", "antlr4-python3-runtime==4.9.3")


def run(*cmd: str | Path) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    code = subprocess.call([str(c) for c in cmd], cwd=ROOT)
    if code:
        sys.exit(code)


def setup(extra: str = "test") -> None:
    """.venv with the project installed (editable) and `extra` (test: pytest, triton, the
    Hugging Face libraries; "": the core alone, which is all the demo runs). Without an NVIDIA
    driver the CPU build of torch comes first, through requirements/cpu.txt (PyTorch's CPU
    index; a local wheel of that version serves too), so that pip never pulls the CUDA build."""
    stamp = VENV / f".installed{'-' + extra if extra else ''}"
    newest = max((ROOT / f).stat().st_mtime for f in ("pyproject.toml", CPU_REQUIREMENTS))
    done = [stamp] + ([VENV / ".installed-test"] if not extra else [])  # the test set-up holds the core too
    if any(p.exists() and p.stat().st_mtime >= newest for p in done):
        return
    if not PY.exists():
        venv.create(VENV, with_pip=True)
        run(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
    if shutil.which("nvidia-smi") is None:
        # torch alone through its CPU index (--no-deps: every other package, torch's own
        # dependencies included, is resolved by the next call from the default index only, so
        # an unreachable CPU index costs one look-up, not one per package)
        run(PY, "-m", "pip", "install", "-q", "--retries", "1", "--no-deps", "-r", CPU_REQUIREMENTS)
    run(PY, "-m", "pip", "install", "-q", "-e", f".[{extra}]" if extra else ".")
    stamp.touch()


def demo() -> None:
    """Cost card, measured ceilings, the cpu-demo sweep against them, the cost-model fit, the report.

    The sweep runs dtypes=[auto, bfloat16]: the precision this machine's measured ceilings keep
    memory-bound longest, in its fast mode (on a CPU without native bf16: float32 eager on the
    skinny GEMM of roofline.measure.cpu_gemm, no model compile; where bf16 is native: bf16
    compiled, about a minute per Inductor graph, docs/cpu.md), beside bf16 eager, so that the
    report shows both regimes, T(q)/T(1) at B = 1 and B = 4. Two cache lengths, no MTP points.
    Each run measures anew: the ceilings go to their own folder (the sweep copies them into its run), and the
    sweep sets a previous demo run aside (force=true: results/runs/demo/previous-<time>/), which it would
    otherwise refuse to resume once the code or the ceilings changed."""
    t0 = time.time()
    run(PY, "-m", "roofline.cli.card", "model=cpu-demo", "device=null")
    run(PY, "-m", "roofline.cli.ceilings", "device=cpu", "quick=true", f"out_dir={DEMO_CEILINGS}")
    run(PY, "-m", "roofline.cli.sweep", "model=cpu-demo", f"out_dir={DEMO}", f"ceilings={DEMO_CEILINGS}/ceilings.json",
        "dtypes=[auto,bfloat16]", "q=[1,2,4,8]", "B=[1,4]", "L=[128,1024]", "mtp_q=[]", "force=true")
    run(PY, "-m", "roofline.cli.fit", f"results_dir={DEMO}")
    run(PY, "-m", "roofline.cli.report", f"results_dir={DEMO}")
    print(f"demo: {time.time() - t0:.0f} s wall (set-up excluded)", flush=True)


def test() -> None:
    """The whole suite, in one pytest worker per core (pytest-xdist, at most 4; work-stealing, so that the
    few long end-to-end tests do not end up queued behind each other), the slowest tests named in every log.
    Most of the suite's time is commands run as a user runs them, each its own interpreter (a torch import
    is about 3 s of each). Each worker, and each command its tests start, runs torch on its share of the cores
    (tests/conftest.py): on a 2-core machine two workers take the run to about 9 minutes (14 with every worker on
    every core, whose spinning OpenMP threads took the CPU from each other)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = ["-n", str(min(4, cores)), "--dist", "worksteal"] if cores > 1 else []
    run(PY, "-m", "pytest", "-q", "--durations=15", *workers)


def bench() -> None:
    run(PY, "-m", "pytest", "benchmarks", "-q", "--benchmark-only")


def wheels() -> None:
    """Build ./wheelhouse (OFFLINE, no dependencies pulled), then prove it complete: install it
    with --no-index into a scratch folder, as scripts/gpu_check.sh does on the node, and import
    hydra from there."""
    shutil.rmtree(WHEELHOUSE, ignore_errors=True)  # one version of each, nothing stale
    WHEELHOUSE.mkdir()
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", WHEELHOUSE, *OFFLINE)
    built = sorted(WHEELHOUSE.glob("*.whl"))
    if len(built) != len(OFFLINE) or any(not w.name.endswith("-py3-none-any.whl") for w in built):
        sys.exit(f"wheelhouse: expected {len(OFFLINE)} pure-Python wheels, got {[w.name for w in built]}")
    with tempfile.TemporaryDirectory() as site:
        run(sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
            "--target", site, *built)
        run(sys.executable, "-c", f"import sys; sys.path.insert(0, {site!r}); import hydra, omegaconf, antlr4; "
            f"assert hydra.__file__.startswith({site!r}), hydra.__file__; "
            "print('wheelhouse complete: hydra-core', hydra.__version__, 'omegaconf', omegaconf.__version__)")
    print(f"{WHEELHOUSE}: {', '.join(w.name for w in built)} "
          f"({sum(w.stat().st_size for w in built) / 1e6:.2f} MB); carry it to the node with the repository")


JOBS = {"setup": lambda: None, "demo": demo, "test": test, "bench": bench, "wheels": wheels}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in JOBS:
        sys.exit(f"usage: python3 dev.py {{{'|'.join(JOBS)}}}")
    if sys.argv[1] != "wheels":  # the wheelhouse needs only pip and the index, not the project's venv
        setup("" if sys.argv[1] == "demo" else "test")
    JOBS[sys.argv[1]]()
