"""Spawned ranks: a crash in the process-group teardown after every rank finished keeps the
result; a crash while the work is running fails the run."""

import os

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from roofline.parallel.launch import run


def _abort_in_teardown(rank, world, device):
    """Rank 1 aborts when it destroys its group, as gloo sometimes does."""
    if rank == 1:
        dist.destroy_process_group = lambda *a, **k: os.abort()
    return dist.get_world_size() * 10 + rank


def _abort_while_working(rank, world, device):
    if rank == 1:
        os.abort()
    dist.barrier()
    return rank


@pytest.mark.slow
def test_a_teardown_crash_after_the_work_keeps_rank_0s_result(capfd):
    assert run(_abort_in_teardown, 2, "cpu", (), timeout_s=60) == 20
    assert "died in its process-group teardown" in capfd.readouterr().err


@pytest.mark.slow
def test_a_crash_during_the_work_fails_the_run():
    with pytest.raises(mp.ProcessExitedException):
        run(_abort_while_working, 2, "cpu", (), timeout_s=20)
