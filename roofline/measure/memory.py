"""Resident memory: what a model needs on one device, and whether that fits, per point.

Resident bytes = every weight in its dtype (the MTP modules too when they draft) + the
static KV cache of every sequence at its longest context (the MTP layers' cache too). The
peak adds what is transient while it is built and run: one float32 parameter (the model is
built on the meta device and materialised straight into its dtype, one parameter at a time)
and the activations of the largest pass (float32 logits B·q·V, the FFN and attention
intermediates; the attention scores B·h·q·(L+q) in float32 where SDPA falls back to its
math kernel).

What the device can give: the CUDA device's free bytes; on the CPU the host's available
RAM, capped by the container's cgroup limit (v2 memory.max − memory.current, v1
memory.limit_in_bytes − memory.usage_in_bytes), because a cgroup kills a process over its
limit without a message however much the host has free.

The sweep asks per point (`plan_builds`): a grid value too large becomes a `too_big` row,
the points that fit are still measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

from roofline.measure.devices import parse_device
from roofline.model.accounting import kv_token_layer_bytes, linear_state_bytes_per_seq, resident_weight_bytes
from roofline.model.config import ModelConfig
from roofline.model.dtypes import dtype_bytes
from roofline.model.formats import activation_dtype, parse_precision

HEADROOM = 0.9  # share of the available memory a workload may claim (allocator slack)
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
_UNLIMITED = 2**60  # cgroup v1 writes ~2^63 for "no limit"


class TooBig(MemoryError):
    """A workload whose peak bytes exceed what the device can give (a result, not a crash)."""


@dataclass(frozen=True)
class Resident:
    weights: float  # bytes
    kv: float  # bytes, all sequences
    transient: float = 0.0  # bytes: one float32 parameter while built + the largest pass's activations

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.transient

    def describe(self) -> str:
        return (f"{self.total / 1e9:.2f} GB (weights {self.weights / 1e9:.2f} GB + KV cache {self.kv / 1e9:.2f} GB"
                + (f" + transient {self.transient / 1e9:.2f} GB" if self.transient else "") + ")")


def resident_bytes(cfg: ModelConfig, dtype: str, batch: int, tokens_per_seq: int, with_mtp: bool = True) -> Resident:
    """Weights and KV cache of `batch` sequences of `tokens_per_seq` tokens, in bytes; `dtype` may
    be a precision label (roofline.model.formats): each tensor class in its format, scales included."""
    weights = resident_weight_bytes(cfg, dtype, with_mtp)
    # every layer's cache at the layers' mean positions (windowed and linear-attention layers hold fewer or none),
    # + the Gated DeltaNet layers' states, whatever the length
    kv_tok = kv_token_layer_bytes(cfg, parse_precision(dtype)) * (cfg.layers + (cfg.mtp_layers if with_mtp else 0))
    kv = kv_tok * cfg.kv_positions(tokens_per_seq) * batch + linear_state_bytes_per_seq(cfg, dtype) * batch
    return Resident(float(weights), float(kv))


def largest_parameter(cfg: ModelConfig) -> int:
    """Elements of the largest single weight (the vocabulary matrices, or a stacked expert tensor)."""
    ffn = max(cfg.ffn, (cfg.moe_ffn or 0) * (cfg.experts or 0) if cfg.is_moe else 0)
    return max(cfg.vocab * cfg.d, ffn * cfg.d)


def activation_bytes(cfg: ModelConfig, dtype: str, batch: int, q: int, context: int) -> float:
    """Transient bytes of one forward pass of B·q tokens at `context` tokens (an upper estimate)."""
    b, n = dtype_bytes(activation_dtype(dtype)), batch * q
    ffn = max(cfg.ffn, (cfg.moe_ffn or 0) * max(cfg.experts_per_token or 0, 1) + (cfg.moe_ffn or 0) * (cfg.shared_experts or 0))
    hidden = n * (3 * ffn + 8 * cfg.d) * b
    logits = n * cfg.vocab * (b + 4)  # the model's dtype and its float32 copy
    scores = batch * cfg.heads * q * context * 4
    return float(hidden + logits + scores)


def peak_bytes(cfg: ModelConfig, dtype: str, batch: int, context: int, q: int = 1, with_mtp: bool = True,
               pass_batch: int | None = None) -> Resident:
    """Peak bytes of a model whose static cache holds `batch` x `context` tokens while it runs a
    pass of q tokens for `pass_batch` (default `batch`) sequences at that context."""
    r = resident_bytes(cfg, dtype, batch, context, with_mtp)
    act = activation_bytes(cfg, dtype, pass_batch or batch, q, context)
    return Resident(r.weights, r.kv, largest_parameter(cfg) * 4.0 + act)


def _cgroup_paths(proc: Path) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory-controller path) of this process from /proc/self/cgroup. A hybrid
    host lists both (`N:memory:/a/b` and `0::/`): each is kept for its own hierarchy, so the
    unified `0::` line never hides the memory controller's path."""
    v2 = v1 = None
    try:
        for line in proc.read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            if parts[0] == "0" and parts[1] == "":
                v2 = parts[2].strip().lstrip("/")
            elif "memory" in parts[1].split(","):
                v1 = parts[2].strip().lstrip("/")
    except OSError:
        pass
    return v2, v1


def _ancestors(base: Path, rel: str | None) -> list[Path]:
    """base/rel and every folder above it up to base (a limit set on a parent cgroup binds too)."""
    parts = [p for p in (rel or "").split("/") if p]
    return [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_memory(root: Path = CGROUP_ROOT, proc: Path = PROC_CGROUP) -> dict | None:
    """{limit, usage, source} of this process's cgroup memory limit (the tightest found), or None."""
    v2, v1 = _cgroup_paths(proc)
    candidates = [(b / "memory.max", b / "memory.current") for b in _ancestors(root, v2)]
    for mount in (root / "memory", root):  # v1: the controller's own mount (or a v1-only root)
        candidates += [(b / "memory.limit_in_bytes", b / "memory.usage_in_bytes") for b in _ancestors(mount, v1)]
    best = None
    for limit_f, usage_f in dict.fromkeys(candidates):
        try:
            raw = limit_f.read_text().strip()
        except OSError:
            continue
        if raw == "max" or not raw.isdigit() or int(raw) >= _UNLIMITED:
            continue
        try:
            usage = float(usage_f.read_text().strip())
        except (OSError, ValueError):
            usage = 0.0
        if best is None or float(raw) - usage < best["limit"] - best["usage"]:
            best = dict(limit=float(raw), usage=usage, source=str(limit_f))
    return best


def available(device: str) -> tuple[float, str]:
    """(bytes the device can give now, where that figure comes from)."""
    dev = parse_device(device)
    if dev.type == "cuda":
        import torch
        free = float(torch.cuda.mem_get_info(dev)[0])
        return free, f"{free / 1e9:.2f} GB free on {device}"
    host = float(psutil.virtual_memory().available)
    cg = cgroup_memory()
    if cg is not None and cg["limit"] - cg["usage"] < host:
        left = max(0.0, cg["limit"] - cg["usage"])
        return left, (f"{left / 1e9:.2f} GB left under the cgroup limit ({cg['source']}: {cg['limit'] / 1e9:.2f} GB, "
                      f"{cg['usage'] / 1e9:.2f} GB in use; host {host / 1e9:.2f} GB available)")
    return host, f"{host / 1e9:.2f} GB available on {device}"


def available_bytes(device: str) -> float:
    return available(device)[0]


def require(need: Resident, device: str, what: str = "", headroom: float = HEADROOM) -> Resident:
    """`need`, or TooBig (before anything is allocated) when it exceeds `headroom` of what the device can give."""
    free, where = available(device)
    if need.total >= headroom * free:
        raise TooBig(f"{what + ' ' if what else ''}needs {need.describe()}, {where} "
                     f"(at most {headroom:.0%} of it may be claimed)")
    return need


def require_fit(cfg: ModelConfig, dtype: str, batch: int, tokens_per_seq: int, device: str,
                with_mtp: bool = True, headroom: float = HEADROOM, q: int = 1) -> Resident:
    """The peak bytes, or TooBig when they exceed `headroom` of what the device can give."""
    return require(peak_bytes(cfg, dtype, batch, tokens_per_seq, q, with_mtp), device, cfg.name, headroom)


def add(*parts: Resident) -> Resident:
    return Resident(sum(p.weights for p in parts), sum(p.kv for p in parts), sum(p.transient for p in parts))


def plan_builds(cfg: ModelConfig, dtype: str, points, free: float, where: str, with_mtp: bool = True,
                headroom: float = HEADROOM) -> tuple[list[tuple[int, int, list]], dict]:
    """Points (key, B, context, q) -> model builds whose static cache (batch x context) fits in
    `free` bytes: ([(cache batch, cache context, [keys])], {key: why too big}). A point too
    large on its own is refused alone; the others share a build while it fits, else get
    their own (one oversized grid value never costs the points that fit)."""
    limit = headroom * free
    too_big, alone = {}, []
    for key, B, ctx, q in points:
        need = peak_bytes(cfg, dtype, B, ctx, q, with_mtp)
        if need.total >= limit:
            too_big[key] = f"needs {need.describe()}, {where} (at most {headroom:.0%} may be claimed)"
        else:
            alone.append((need.total, key, B, ctx, q))
    builds: list[list] = []  # [cache batch, cache context, worst q, keys]
    for _, key, B, ctx, q in sorted(alone, key=lambda t: t[0]):
        for b in builds:
            nb, nc, nq = max(b[0], B), max(b[1], ctx), max(b[2], q)
            if peak_bytes(cfg, dtype, nb, nc, nq, with_mtp).total < limit:
                b[:3] = [nb, nc, nq]
                b[3].append(key)
                break
        else:
            builds.append([B, ctx, q, [key]])
    return [(b[0], b[1], b[3]) for b in builds], too_big


def max_batch(cfg: ModelConfig, dtype: str, mem_bytes: float, tokens_per_seq: int, with_mtp: bool) -> int:
    """The most sequences of `tokens_per_seq` tokens whose KV cache fits beside the weights."""
    one = resident_bytes(cfg, dtype, 1, tokens_per_seq, with_mtp)
    return max(0, int((mem_bytes - one.weights) // one.kv)) if one.kv > 0 else 0
