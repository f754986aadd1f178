"""The suite's workers share the cores: each pytest-xdist worker, and each command its tests start, runs torch
on cores // workers threads (tests/conftest.py), unless OMP_NUM_THREADS says otherwise."""

import os

import pytest
import torch

from tests.conftest import _share_the_cores_among_workers, usable_cores


@pytest.fixture
def threads_restored(monkeypatch):
    before = torch.get_num_threads()
    yield monkeypatch
    torch.set_num_threads(before)


def test_two_workers_take_half_the_cores_each_and_pass_it_to_their_commands(threads_restored):
    threads_restored.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    threads_restored.delenv("OMP_NUM_THREADS", raising=False)
    want = max(1, usable_cores() // 2)
    assert _share_the_cores_among_workers() == want
    assert os.environ["OMP_NUM_THREADS"] == str(want) and torch.get_num_threads() == want


@pytest.mark.parametrize("env", [{"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"},
                                 {"PYTEST_XDIST_WORKER_COUNT": "1"}])
def test_a_users_setting_or_a_single_process_is_left_alone(threads_restored, env):
    threads_restored.delenv("OMP_NUM_THREADS", raising=False)
    threads_restored.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    for k, v in env.items():
        threads_restored.setenv(k, v)
    torch.set_num_threads(1)
    assert _share_the_cores_among_workers() is None
    assert os.environ.get("OMP_NUM_THREADS") == env.get("OMP_NUM_THREADS") and torch.get_num_threads() == 1
