"""Bandwidth kernels: every Triton kernel agrees with torch before anything is timed.

Without a GPU the Triton kernels run on the CPU under Triton's interpreter: conftest.py sets
TRITON_INTERPRET=1 there (and only there) before anything imports triton. With a GPU the same
checks run on it, with real kernels. roofline.measure.kernels jits on first launch, so an
earlier import of it without the variable still works (test_interpreter_set_after_import).
"""

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="Triton kernels need triton (pip install -e .[triton])")

from roofline.measure import kernels  # noqa: E402
from roofline.measure.kernels import KERNEL_DTYPES, KERNELS, check  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
interpreter_only = pytest.mark.skipif(DEVICE != "cpu", reason="a property of the CPU interpreter's fixed grid")
SIZES = [1, 1000, 4097, 65537]  # none a multiple of BLOCK (4096 fp32, 8192 bf16/fp16)
TRITON_SPECS = [name for name, kernel in KERNELS.items() if kernel.uses_triton]
TORCH_SPECS = [name for name, kernel in KERNELS.items() if not kernel.uses_triton]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_interpreter_makes_triton_available():
    assert kernels.triton_available()


def test_registry_has_every_op_in_every_variant():
    got = {(s.op, s.variant) for s in KERNELS.values()}
    assert got == {(op, v) for op in kernels.OPS for v in kernels.VARIANTS}
    assert all(name == s.name for name, s in KERNELS.items())
    assert {"torch_copy", "torch_read", "torch_triad", "torch_write"} <= set(KERNELS)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("name", TRITON_SPECS)
def test_triton_kernel_matches_torch(name, dtype, n):
    check(KERNELS[name], n, dtype, DEVICE)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("name", TORCH_SPECS)
def test_torch_line_matches_reference(name, dtype, n):
    check(KERNELS[name], n, dtype, DEVICE)


@interpreter_only
def test_persistent_programs_loop_over_blocks_at_test_sizes():
    # Under the interpreter: 2 SMs x 4 programs = 8 programs; 65537 elements are 17 fp32
    # blocks and 9 bf16 blocks, so the persistent loop runs more than once per program.
    programs = kernels.num_sms("cpu") * kernels.PROGRAMS_PER_SM
    assert programs == 8
    for elem_bytes in (4, 2):
        assert math.ceil(max(SIZES) / kernels.block_elems(elem_bytes)) > programs


def test_block_is_16_bytes_per_thread_per_access():
    threads = 32 * kernels.NUM_WARPS
    for elem_bytes in (4, 2):
        per_thread = kernels.block_elems(elem_bytes) * elem_bytes // threads
        assert per_thread == 16 * kernels.ACCESSES_PER_THREAD


@pytest.mark.parametrize(
    "name, n, elem_bytes, expected",
    [
        ("triton_copy_grid", 10_000, 4, 80_000),  # read n·4 + write n·4
        ("torch_copy", 10_000, 2, 40_000),
        ("triton_triad_persistent", 10_000, 4, 120_000),  # read b, c + write a
        ("torch_triad", 10_000, 2, 60_000),
        ("triton_write_grid", 10_000, 4, 40_000),
        ("torch_write", 10_000, 2, 20_000),
        ("torch_read", 100_000, 2, 200_002),  # + the bf16 scalar written
        # 13 blocks of 8192 bf16: 13 fp32 partials written and read back, + the fp32 result
        ("triton_read_grid", 100_000, 2, 200_000 + 2 * 13 * 4 + 4),
        # persistent under the interpreter: 8 programs, so 8 partials
        pytest.param("triton_read_persistent", 100_000, 2, 200_000 + 2 * 8 * 4 + 4, marks=interpreter_only),
    ],
)
def test_bytes_moved_hand_checked(name, n, elem_bytes, expected):
    assert KERNELS[name].bytes_moved(n, elem_bytes) == expected


def test_read_partials_buffer_matches_bytes_counted():
    kernel = KERNELS["triton_read_persistent"]
    bufs = kernel.make_buffers(100_000, torch.bfloat16, DEVICE)
    partials = bufs["partials"].numel()
    assert kernel.bytes_moved(100_000, 2) == 100_000 * 2 + 2 * partials * 4 + 4


def _off_by_one(ref: torch.Tensor) -> torch.Tensor:
    ref = ref.clone()
    ref.view(-1)[-1] += 1.0
    return ref


@pytest.mark.parametrize(
    "name",
    [
        "triton_read_grid",
        "triton_write_grid",
        "triton_copy_persistent",
        "triton_triad_persistent",
        "torch_triad",
    ],
)
def test_check_raises_on_a_wrong_reference(name):
    kernel = KERNELS[name]
    wrong = dataclasses.replace(kernel, reference=lambda bufs: _off_by_one(kernel.reference(bufs)))
    with pytest.raises(AssertionError, match=name):
        check(wrong, 4097, torch.bfloat16, DEVICE)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["triton_read_grid", "triton_read_persistent"])
def test_check_catches_a_read_that_drops_the_last_element(name, dtype):
    kernel = KERNELS[name]

    def drops_last(bufs):
        bufs["x"][-1] = 0  # after the reference was taken: the kernel never sees it
        kernel.run(bufs)

    with pytest.raises(AssertionError, match="sum"):
        check(dataclasses.replace(kernel, run=drops_last), 65537, dtype, DEVICE)


def test_check_catches_a_copy_that_skips_the_tail():
    kernel = KERNELS["triton_copy_grid"]

    def skips_tail(bufs):
        last = bufs["out"][-1].clone()
        kernel.run(bufs)
        bufs["out"][-1] = last

    with pytest.raises(AssertionError, match="bit-exact"):
        check(dataclasses.replace(kernel, run=skips_tail), 4097, torch.float32, DEVICE)


@pytest.mark.parametrize("n, dtype, field", [(0, torch.float32, "n"), (10, torch.int32, "dtype")])
def test_make_buffers_rejects_bad_input(n, dtype, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        KERNELS["torch_copy"].make_buffers(n, dtype, "cpu")


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_interpreter_set_after_import():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import os, torch\n"
        "from roofline.measure import kernels\n"
        "os.environ['TRITON_INTERPRET'] = '1'\n"
        "kernels.check(kernels.KERNELS['triton_copy_persistent'], 4097, torch.float32, 'cpu')\n"
    )
    proc = _python(code, env)
    assert proc.returncode == 0, proc.stderr


def test_imports_and_runs_torch_lines_without_triton():
    code = (
        "import sys, torch\n"
        "sys.modules['triton'] = None  # import triton -> ImportError\n"
        "from roofline.measure import kernels\n"
        "assert not kernels.triton_available()\n"
        "kernels.check(kernels.KERNELS['torch_triad'], 1000, torch.float32, 'cpu')\n"
        "kernel = kernels.KERNELS['triton_copy_grid']\n"
        "try:\n"
        "    kernel.run(kernel.make_buffers(8, torch.float32, 'cpu'))\n"
        "except RuntimeError as e:\n"
        "    assert 'TRITON_INTERPRET' in str(e)\n"
        "else:\n"
        "    raise SystemExit('a Triton row ran without triton')\n"
    )
    proc = _python(code, dict(os.environ))
    assert proc.returncode == 0, proc.stderr


def test_interpreter_is_set_only_where_there_is_no_gpu():
    """conftest.py and this module, imported as pytest would on a machine with CUDA (simulated)
    and without: TRITON_INTERPRET is set in the second case only, so on a GPU the ceilings and the
    GPU-marked tests launch real kernels, not the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import os, sys, torch\n"
        "torch.cuda.is_available = lambda: {cuda}\n"
        "import tests.conftest\n"
        "import tests.test_kernels as t\n"
        "print(os.environ.get('TRITON_INTERPRET'), t.DEVICE)\n"
    )
    with_gpu = _python(code.format(cuda=True), env)
    without = _python(code.format(cuda=False), env)
    assert with_gpu.returncode == 0 and without.returncode == 0, with_gpu.stderr + without.stderr
    assert with_gpu.stdout.split() == ["None", "cuda"]
    assert without.stdout.split() == ["1", "cpu"]
