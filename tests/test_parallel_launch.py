"""Spawned ranks: a crash in the process-group teardown after every rank finished keeps the
result; a crash while the work is running fails the run in one line. External launches fail
fast: a rank outside the world, a master that does not resolve, a follower alone (N8)."""

import os

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from roofline.io.fields import ConfigError
from roofline.parallel.launch import RankFailed, _free_port, run


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
    with pytest.raises(RankFailed, match=r"rank 1 of 2 died \(signal SIGABRT\) before the run finished"):
        run(_abort_while_working, 2, "cpu", (), timeout_s=20)


def _world(rank, world, device):
    return dist.get_world_size()


@pytest.mark.parametrize("env, match", [
    (dict(RANK="5", WORLD_SIZE="2"), r"RANK=5: allowed 0..1"),
    (dict(RANK="0", WORLD_SIZE="abc"), r"WORLD_SIZE='abc': allowed an integer"),
    (dict(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="notaport"), "MASTER_PORT='notaport'"),
])
def test_a_bad_launch_environment_is_one_line_before_anything_waits(monkeypatch, env, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=match):
        run(_world, 2, "cpu", (), timeout_s=5)


def test_a_follower_alone_stops_at_the_rendezvous_bound(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))  # nobody listens there
    monkeypatch.setenv("ROOFLINE_RENDEZVOUS_S", "2")
    with pytest.raises(ConfigError, match=r"rendezvous at MASTER_ADDR=127.0.0.1 .* rank 1 of 2 within 2 s"):
        run(_world, 2, "cpu", (), timeout_s=5)


@pytest.mark.slow
def test_spawned_ranks_meet_on_this_host_whatever_master_addr_says(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "no.such.host.invalid")
    assert run(_world, 2, "cpu", (), timeout_s=60) == 2


def test_a_busy_master_port_is_one_line(monkeypatch):
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(busy.getsockname()[1]))
        monkeypatch.setenv("ROOFLINE_RENDEZVOUS_S", "2")
        with pytest.raises(ConfigError, match="rendezvous at MASTER_ADDR=127.0.0.1"):
            run(_world, 2, "cpu", (), timeout_s=5)
