import os

import torch

# Without a GPU, Triton kernels can only run under the interpreter: set it before anything
# imports triton. With one, never: the GPU-marked tests and the ceilings must launch real
# kernels (test_kernels.py checks this in a subprocess that pretends to have CUDA).
# torch.cuda.is_available (not the presence of nvidia-smi) is what decides where kernels run.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS says, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _share_the_cores_among_workers() -> int | None:
    """Under pytest-xdist, each worker (and every command its tests start, which inherits the environment) runs
    torch on its share of the cores, cores // workers threads, unless OMP_NUM_THREADS is set already. Left at
    torch's default, every worker and every command took all the cores, and their OpenMP threads, which spin while
    they wait, took the CPU from each other: tests/test_model.py in 2 workers on 2 cores ran 320 s, one thread each
    18 s. Returns the threads set (None: nothing set)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return None
    threads = max(1, usable_cores() // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    return threads


_share_the_cores_among_workers()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fixed_seeds():
    """Every test starts from the same random state: a failure reproduces, and none depends on luck."""
    import random

    import numpy as np
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture
def whatif_fixture_data(monkeypatch):
    """The what-if's default kernel and engine files pointed at tests/fixtures/whatif (PLACEHOLDER numbers)."""
    from pathlib import Path

    from roofline.parallel import engines, kernels
    fx = Path(__file__).parent / "fixtures" / "whatif"
    monkeypatch.setattr(kernels, "KERNELS_PATH", fx / "kernels.yaml")
    monkeypatch.setattr(engines, "ENGINES_PATH", fx / "engines.yaml")
