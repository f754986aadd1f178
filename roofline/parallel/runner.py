"""The sweep across ranks: rank 0 runs the ordinary sweep, the other ranks follow it in lockstep.

Rank 0 runs `roofline.measure.sweep.run_sweep` unchanged (resume, failures as rows, the one
timer) with two injections: a workload that builds ITS shard and a model proxy that tells
the other ranks what to run. The followers build their shards when told, replay every call
rank 0 makes (the correctness check, the point's first call), and then, for the timed
repetitions, one call per 8-byte broadcast from rank 0: the broadcast opens every timed step,
so each step starts with all ranks synchronised and the timer's adaptive stopping on rank 0
decides for everyone. That broadcast is part of the step and is charged in its collectives.

The followers' caches are not refilled with each point's random context: attention reads the
same positions whatever they hold. Rows hold rank 0's share (per-rank bytes, FLOPs and collectives from
`roofline.parallel.cost`), GB/s and TFLOP/s of that rank, and the layout columns; for MoE the expert
bytes are those of each layer's busiest rank (every rank's per-layer counts are gathered after the
timed steps; `experts_touched_ranks` keeps each rank's mean), since each layer waits for it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from roofline.model.dtypes import torch_dtype
from roofline.model.accounting import moe_impl_for_mode
from roofline.model.decoder import build_model
from roofline.measure.sweep import BuiltModel, Point, SweepRequest, check_request, run_sweep
from roofline.measure.timer import TimerSettings, time_fn
from roofline.parallel.cost import Collective, rank_forward_cost, rank_mtp_cost
from roofline.parallel.launch import run
from roofline.parallel.sharded import busiest_rank_touched, shard

SYNC = Collective("broadcast", 8, 1)  # the step's opening broadcast (int64 flag)


def _send(obj) -> object:
    box = [obj]
    dist.broadcast_object_list(box, 0)
    return box[0]


def _gather(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _flag(device: str, value: int = 0) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.broadcast(t, 0)
    return int(t.item())


def _sharded(req: SweepRequest, dtype: str, depth: int, max_ctx: int, rank: int, device: str):
    per = max(req.B) // req.parallel.batch_split
    model = build_model(req.model.scaled(layers=depth), max_batch=per, max_context=max_ctx, dtype=torch_dtype(dtype),
                        device=device, seed=req.seed, moe_impl=moe_impl_for_mode("eager", sharded=True))
    return shard(model, req.parallel, rank)


def _cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


class LeaderModel:
    """Rank 0's model: every call is announced to the followers (with its inputs) unless
    `fast`, when one broadcast flag replays the announced call."""

    def __init__(self, inner, device: str):
        self.inner, self.device, self.fast = inner, device, False

    def _call(self, method: str, *args, **kw):
        if self.fast:
            _flag(self.device, 1)
        else:
            _send(("call", method, [_cpu(a) for a in args], {k: _cpu(v) for k, v in kw.items()}))
        return getattr(self.inner, method)(*args, **kw)

    def __call__(self, *args, **kw):
        return self._call("forward", *args, **kw)

    def mtp_forward(self, *args, **kw):
        return self._call("mtp_forward", *args, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class LeaderWorkload(BuiltModel):
    def build(self, max_ctx: int):
        _send(("build", self.dtype, self.cfg.layers, max_ctx))
        return LeaderModel(_sharded(self.req, self.dtype, self.cfg.layers, max_ctx, 0, self.req.device),
                           self.req.device)

    def callable_for(self, p: Point):
        return super().callable_for(dataclasses.replace(p, B=p.B // self.req.parallel.batch_split))


def leader_measure(w: LeaderWorkload, p: Point, timer: TimerSettings) -> dict:
    """Time one point on rank 0 with every rank stepping in lockstep; rank 0's per-rank physics."""
    w.fill_cache(p.L)
    fn, _ = w.callable_for(p)
    fn()  # announced: the followers run it too and keep it as their step
    proxy = w.model
    _send(("follow",))
    proxy.fast = True
    try:
        t = time_fn(fn, dataclasses.replace(timer, mode=p.mode), w.req.device)
    finally:
        proxy.fast = False
        _flag(w.req.device, 0)
    touched, ranks = None, None
    moe_impl = moe_impl_for_mode(p.mode, sharded=True)
    if w.cfg.is_moe:  # every rank's per-layer counts of the last step: the step waits for each layer's busiest
        _send(("touched", p.kind))
        per_rank = _gather(proxy.inner.last_touched_per_layer(p.kind))
        touched = busiest_rank_touched(per_rank)
        ranks = ";".join(f"{sum(c) / len(c):.3g}" for c in per_rank)
    cost = (rank_forward_cost if p.kind == "forward" else rank_mtp_cost)(
        w.cfg, w.req.parallel, p.dtype, p.B, p.q, p.L, p.L + p.q, moe_impl, touched)
    cost = dataclasses.replace(cost, collectives=cost.collectives + (SYNC,))
    row = t.to_row()
    row.update(cost.as_row())
    if ranks is not None:
        row["experts_touched_ranks"] = ranks  # each rank's mean per MoE layer; experts_touched is the busiest's
    row.update(moe_impl=moe_impl, achieved_GBps=cost.bytes_total / t.median_s / 1e9,
               achieved_TFLOPs=cost.flops / t.median_s / 1e12, tokens_per_s=p.B * p.q / t.median_s,
               per_rank=True)
    return row


def follow(rank: int, req: SweepRequest, device: str) -> None:
    """A follower rank: build, replay and step as rank 0 says, until it says done."""
    model, last = None, None
    while True:
        cmd = _send(None)
        if cmd[0] == "build":
            model = None
            _, dtype, depth, max_ctx = cmd
            model = _sharded(req, dtype, depth, max_ctx, rank, device)
        elif cmd[0] == "call":
            _, method, args, kw = cmd
            args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
            kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
            last = (getattr(model, method), args, kw)
            last[0](*args, **kw)
        elif cmd[0] == "touched":
            _gather(model.last_touched_per_layer(cmd[1]))
        elif cmd[0] == "follow":
            while _flag(device) == 1:
                last[0](*last[1], **last[2])
        elif cmd[0] == "done":
            return


def _rank_main(rank: int, world: int, device: str, req: SweepRequest, run_dir: str, progress: bool, options: dict):
    req = dataclasses.replace(req, device=device)
    if rank != 0:
        return follow(rank, req, device)
    try:  # no busy-machine re-measurement: the followers replay rank 0's steps in lockstep, and a
        # re-measured point or an unannounced reference call on rank 0 alone would desynchronise them
        return run_sweep(req, Path(run_dir), progress, measure=leader_measure, workload=LeaderWorkload,
                         noise=None, **options)
    finally:
        _send(("done",))


def run_parallel_sweep(req: SweepRequest, run_dir: Path, progress: bool = True, timeout_s: float = 1800.0,
                       **options) -> dict:
    """The sweep of `req` over req.parallel.devices ranks (spawned here, or under torchrun/srun);
    options (force, extend, retry_failed) go to roofline.measure.sweep.run_sweep on rank 0."""
    check_request(req)
    return run(_rank_main, req.parallel.devices, req.device, (req, str(run_dir), progress, options), timeout_s)
