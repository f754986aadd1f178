"""Resident memory: what a model needs to stay on one device, and whether that fits.

Resident bytes = every weight (the MTP modules too when they draft) + the KV cache of every
sequence at its longest context (the MTP layers' cache too). Activations are transient and
left to the headroom. The sweep refuses a workload that does not fit before building it
(`TooBig` becomes a `too_big` result row); capacity planning asks the same question of a
datasheet's memory size.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil
import torch

from roofline.measure.devices import parse_device
from roofline.model.accounting import kv_bytes_per_token, resident_weight_bytes
from roofline.model.config import ModelConfig

HEADROOM = 0.9  # share of the available memory a workload may claim (allocator slack, activations)


class TooBig(MemoryError):
    """A workload whose resident bytes exceed what the device can give (a result, not a crash)."""


@dataclass(frozen=True)
class Resident:
    weights: float  # bytes
    kv: float  # bytes, all sequences

    @property
    def total(self) -> float:
        return self.weights + self.kv

    def describe(self) -> str:
        return f"{self.total / 1e9:.2f} GB (weights {self.weights / 1e9:.2f} GB + KV cache {self.kv / 1e9:.2f} GB)"


def resident_bytes(cfg: ModelConfig, dtype: str, batch: int, tokens_per_seq: int, with_mtp: bool = True) -> Resident:
    """Weights and KV cache of `batch` sequences of `tokens_per_seq` tokens, in bytes; `dtype` may
    be a precision label (roofline.model.formats): each tensor class in its format, scales included."""
    weights = resident_weight_bytes(cfg, dtype, with_mtp)
    kv_tok = kv_bytes_per_token(cfg, dtype) * (1 + (cfg.mtp_layers / cfg.layers if with_mtp else 0.0))
    return Resident(float(weights), float(kv_tok * tokens_per_seq * batch))


def available_bytes(device: str) -> float:
    """Free memory now: the CUDA device's free bytes, or the host's available RAM for the CPU."""
    dev = parse_device(device)
    if dev.type == "cuda":
        return float(torch.cuda.mem_get_info(dev)[0])
    return float(psutil.virtual_memory().available)


def require_fit(cfg: ModelConfig, dtype: str, batch: int, tokens_per_seq: int, device: str,
                with_mtp: bool = True, headroom: float = HEADROOM) -> Resident:
    """The resident bytes, or TooBig when they exceed `headroom` of what the device has free."""
    need, free = resident_bytes(cfg, dtype, batch, tokens_per_seq, with_mtp), available_bytes(device)
    if need.total >= headroom * free:
        raise TooBig(f"needs {need.describe()}, {free / 1e9:.2f} GB free on {device} "
                     f"(at most {headroom:.0%} of it may be claimed)")
    return need


def max_batch(cfg: ModelConfig, dtype: str, mem_bytes: float, tokens_per_seq: int, with_mtp: bool) -> int:
    """The most sequences of `tokens_per_seq` tokens whose KV cache fits beside the weights."""
    one = resident_bytes(cfg, dtype, 1, tokens_per_seq, with_mtp)
    return max(0, int((mem_bytes - one.weights) // one.kv)) if one.kv > 0 else 0
