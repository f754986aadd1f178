"""Start N ranks of torch.distributed and run one function on each: the only launcher we have.

- Already launched (torchrun sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT; Slurm's
  srun sets SLURM_PROCID / SLURM_NTASKS, the job script exports MASTER_ADDR / MASTER_PORT):
  this process is one rank; it joins the group and runs the function.
- Otherwise torch.multiprocessing spawns `world` processes on this machine with a free port.

Backend: NCCL when the device is CUDA, gloo on the CPU (one intra-op thread per rank there,
so that ranks do not fight over cores). Rank 0's return value comes back to the caller.

Failing fast: the launcher's variables are checked before anything waits (RANK within
WORLD_SIZE, integers, MASTER_ADDR resolvable); the rendezvous has its own bound
(ROOFLINE_RENDEZVOUS_S, default 120 s: a follower started without rank 0, a busy port, an
unreachable master end there with one line naming MASTER_ADDR / MASTER_PORT), apart from
the collectives' timeout; a rank that dies is one line (RankFailed), not a traceback.
Spawned ranks always meet on 127.0.0.1 (an inherited MASTER_ADDR is not theirs).
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


RENDEZVOUS_S = 120.0  # default bound on joining the group (ROOFLINE_RENDEZVOUS_S overrides)


class RankFailed(ChildProcessError):
    """A rank died or raised before the run finished (one line; exit 1: not bad input)."""


def _int_env(name: str) -> int:
    raw = os.environ[name]
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: allowed an integer (set by torchrun / srun)") from None


def launched_world() -> tuple[int, int] | None:
    """(rank, world) when an external launcher started this process as one rank, else None."""
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if r in os.environ and w in os.environ and _int_env(w) > 1:
            rank, world = _int_env(r), _int_env(w)
            if not 0 <= rank < world:
                raise ConfigError(f"{r}={rank}: allowed 0..{world - 1} ({w}={world})")
            return rank, world
    return None


def rendezvous_s() -> float:
    raw = os.environ.get("ROOFLINE_RENDEZVOUS_S", str(RENDEZVOUS_S))
    try:
        v = float(raw)
    except ValueError:
        v = -1.0
    if not 0 < v < float("inf"):
        raise ConfigError(f"ROOFLINE_RENDEZVOUS_S={raw!r}: allowed seconds > 0")
    return v


def _store(rank: int, world: int, timeout_s: float):
    """The group's TCP store at MASTER_ADDR:MASTER_PORT, joined within the rendezvous bound."""
    addr, port = os.environ["MASTER_ADDR"], os.environ.get("MASTER_PORT", "29500")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"MASTER_PORT={port!r}: allowed a port number 1..65535")
    try:
        socket.getaddrinfo(addr, int(port))
    except OSError as e:
        raise ConfigError(f"MASTER_ADDR={addr!r}: does not resolve ({e.strerror or e})") from None
    try:
        return dist.TCPStore(addr, int(port), world, rank == 0, timeout=datetime.timedelta(seconds=timeout_s),
                             wait_for_workers=True)
    except Exception as e:  # DistNetworkError / DistStoreError / RuntimeError: a busy port, nobody there
        what = "rank 0 could not listen there, or the other ranks did not join" if rank == 0 else \
            "no rank 0 answered there"
        raise ConfigError(f"rendezvous at MASTER_ADDR={addr} MASTER_PORT={port} failed for rank {rank} of {world} "
                          f"within {timeout_s:g} s: {what} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                          "ROOFLINE_RENDEZVOUS_S sets the bound") from None


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
    store = _store(rank, world, rendezvous_s())
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return device


def _entry(rank: int, world: int, port: int, device: str, timeout_s: float, fn, args, queue) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)  # the port is free on this host
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
    except mp.ProcessRaisedException as e:
        msgs = _drain(queue)
        first = (msgs.get("error") or [str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__])[0]
        raise RankFailed(f"rank {e.error_index} of {world} failed: {first.splitlines()[0]}") from None
    except mp.ProcessExitedException as e:
        # gloo can abort a process while it destroys its group ("terminate called without an active
        # exception"). Once every rank has passed the final barrier the work and rank 0's result
        # are complete, so such a teardown crash is reported and the result kept; a crash before
        # that is the run's failure.
        msgs = _drain(queue)
        if "ok" not in msgs or len(msgs.get("done", ())) < world:
            how = f"signal {e.signal_name}" if getattr(e, "signal_name", None) else f"exit code {e.exit_code}"
            raise RankFailed(f"rank {e.error_index} of {world} died ({how}) before the run finished; the rows "
                             "written so far are kept and the same command resumes") from None
        print(f"warning: rank {e.error_index} died in its process-group teardown ({e}) after every rank had "
              "finished; the result stands", file=sys.stderr)
        return msgs["ok"][0]
    msgs = _drain(queue)
    if "ok" not in msgs:
        raise RankFailed(f"rank 0 failed: {msgs.get('error', ['no result'])[0].splitlines()[0]}")
    return msgs["ok"][0]


def _drain(queue) -> dict[str, list]:
    """Every message the ranks left: status -> payloads."""
    out: dict[str, list] = {}
    while not queue.empty():
        status, payload = queue.get()
        out.setdefault(status, []).append(payload)
    return out
