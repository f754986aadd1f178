import os
import shutil

# Without a GPU, Triton kernels can only run under the interpreter. Triton reads the flag when
# a kernel is jitted, and roofline.measure.kernels jits on first launch, so setting it here,
# before any test launches a kernel, is enough.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


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
