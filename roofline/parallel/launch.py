"""Start N ranks of torch.distributed and run one function on each: the only launcher we have.

- Already launched (torchrun sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; Slurm's
  srun sets SLURM_PROCID / SLURM_NTASKS, the job script exports MASTER_ADDR / MASTER_PORT):
  this process is one rank; it joins the group and runs the function.
- Otherwise torch.multiprocessing spawns `world` processes on this machine with a free port.

Backend: NCCL when the device is CUDA, gloo on the CPU (one intra-op thread per rank there,
so that ranks do not fight over cores). Rank 0's return value comes back to the caller.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from roofline.measure.devices import is_cuda
from roofline.io.fields import ConfigError


def launched_world() -> tuple[int, int] | None:
    """(rank, world) when an external launcher started this process as one rank, else None."""
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in os.environ and w in os.environ and int(os.environ[w]) > 1:
            return int(os.environ[r]), int(os.environ[w])
    return None


def backend_for(device: str) -> str:
    return "nccl" if is_cuda(device) else "gloo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init(rank: int, world: int, device: str, timeout_s: float) -> str:
    """Join the group; returns the device string this rank uses. Under Slurm without an explicit
    MASTER_ADDR / MASTER_PORT the node srun launched from and a port derived from the job id are used."""
    if "SLURM_PROCID" in os.environ:
        os.environ.setdefault("MASTER_ADDR", os.environ.get("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"))
        os.environ.setdefault("MASTER_PORT", str(29500 + int(os.environ.get("SLURM_JOB_ID", "0")) % 1000))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if is_cuda(device):
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", rank))) % torch.cuda.device_count()
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend_for(device), rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return device


def _entry(rank: int, world: int, port: int, device: str, timeout_s: float, fn, args, queue) -> None:
    os.environ["MASTER_PORT"] = str(port)
    try:
        dev = init(rank, world, device, timeout_s)
        out = fn(rank, world, dev, *args)
        dist.barrier()  # no rank tears its group down while a peer is still inside a collective
        if rank == 0:
            queue.put(("ok", out))
        queue.put(("done", rank))  # this rank's work is over; only the group's teardown is left
    except BaseException as e:  # the parent re-raises rank 0's error with its traceback
        if rank == 0:
            queue.put(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run(fn: Callable[..., Any], world: int, device: str = "cpu", args: tuple = (), timeout_s: float = 600.0) -> Any:
    """fn(rank, world, device, *args) on every rank; returns rank 0's result (None on other
    ranks of an external launch). `fn` must be importable (a module-level function)."""
    if world < 1:
        raise ConfigError(f"world={world}: must be >= 1")
    outside = launched_world()
    if outside is not None:
        rank, w = outside
        if w != world:
            raise ConfigError(f"world={world}: the launcher started {w} ranks")
        dev = init(rank, w, device, timeout_s)
        try:
            return fn(rank, w, dev, *args)
        finally:
            dist.destroy_process_group()
    if is_cuda(device) and torch.cuda.device_count() < world:
        raise ConfigError(f"world={world}: only {torch.cuda.device_count()} CUDA devices here")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    try:
        mp.start_processes(_entry, args=(world, _free_port(), device, timeout_s, fn, args, queue), nprocs=world,
                           join=True, start_method="spawn")
    except mp.ProcessExitedException as e:
        # gloo can abort a process while it destroys its group ("terminate called without an active
        # exception"). Once every rank has passed the final barrier the work and rank 0's result
        # are complete, so such a teardown crash is reported and the result kept; a crash before
        # that is the run's failure.
        msgs = _drain(queue)
        if "ok" not in msgs or len(msgs.get("done", ())) < world:
            raise
        print(f"warning: rank {e.error_index} died in its process-group teardown ({e}) after every rank had "
              "finished; the result stands", file=sys.stderr)
        return msgs["ok"][0]
    msgs = _drain(queue)
    if "ok" not in msgs:
        raise RuntimeError(f"rank 0 failed: {msgs.get('error', ['no result'])[0]}")
    return msgs["ok"][0]


def _drain(queue) -> dict[str, list]:
    """Every message the ranks left: status -> payloads."""
    out: dict[str, list] = {}
    while not queue.empty():
        status, payload = queue.get()
        out.setdefault(status, []).append(payload)
    return out
