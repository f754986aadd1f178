"""Step time of a layout on a device that was never measured: its datasheet row + sourced priors.

Per rank (roofline.parallel.cost), for one forward:

    T = max(W / BW, F_mm / F) + KV / BW + F_attn / F + n_blocks · t_layer + n_moe · t_moe + T_comm

BW = eff_bw × datasheet bandwidth, F = eff_f × datasheet dense FLOP/s (the hinge of the
fitted cost model with its knee at the roofline ridge; the matmuls at the FLOP/s of the
precision's compute dtype, fp8 tensor cores for fp8 weights, attention at the activation
dtype's), W, KV each in its format (a precision label: roofline.model.formats), t_layer the launch floor of one
decoder block (with or without CUDA graphs), t_moe the fixed cost of an MoE block's routing
and grouped-expert kernels, T_comm = Σ calls · (latency + S · factor / busbw)
with the interconnect's priors and nccl-tests' bus factors (roofline.parallel.collectives);
layouts wider than one node price their collectives on the inter-node link.

Every prior is a triple (roofline/data/priors.yaml); the prediction is computed with all
optimistic, all typical and all pessimistic values and returned as that interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from roofline.measure.devices import DeviceSpec
from roofline.io.fields import ConfigError
from roofline.model.config import ModelConfig
from roofline.model.formats import activation_dtype, compute_dtype
from roofline.parallel.collectives import bus_factor
from roofline.parallel.cost import RankCost, rank_forward_cost, rank_mtp_cost
from roofline.parallel.layout import Layout

SCENARIOS = ("optimistic", "typical", "pessimistic")
PRIORS_PATH = Path(__file__).resolve().parents[1] / "data" / "priors.yaml"


@lru_cache(maxsize=4)
def load_priors(path: str = str(PRIORS_PATH)) -> dict:
    return yaml.safe_load(Path(path).read_text())


@dataclass(frozen=True)
class Setting:
    """How the engine runs: CUDA graphs or eager launches, and the link between ranks."""
    graphs: bool = True
    link: str = ""  # an interconnects key of priors.yaml; "" = the device's own (device_links)


def link_for(device: DeviceSpec, layout: Layout, setting: Setting, priors: dict) -> str:
    if layout.devices > priors["devices_per_node"]:
        return "infiniband_ndr"
    link = setting.link or priors["device_links"].get(device.key)
    if link not in priors["interconnects"]:
        raise ConfigError(f"link={link!r} for device {device.key!r}: allowed {sorted(priors['interconnects'])}")
    return link


def comm_seconds(cost: RankCost, layout: Layout, link: str, scenario: int, priors: dict) -> float:
    p = priors["interconnects"][link]
    lat, busbw = p["latency_us"][scenario] * 1e-6, p["busbw_GBps"][scenario] * 1e9
    n = max(layout.tp, 2)
    return sum(c.count * (lat + c.size_bytes * bus_factor(c.kind, n) / busbw) for c in cost.collectives)


def step_seconds(cost: RankCost, device: DeviceSpec, dtype: str, layout: Layout, setting: Setting,
                 scenario: int, priors: dict | None = None) -> dict:
    """Seconds of one forward with its terms, every prior at index `scenario` (0 opt, 1 typ, 2 pess)."""
    priors = priors or load_priors()
    mm_dtype, attn_dtype = compute_dtype(dtype), activation_dtype(dtype)
    bw_peak, f_peak, f_attn_peak = device.bandwidth_Bps(), device.peak_flops(mm_dtype), device.peak_flops(attn_dtype)
    if bw_peak is None or f_peak is None or f_attn_peak is None:
        raise ConfigError(f"device={device.key!r}: no datasheet bandwidth or {mm_dtype} / {attn_dtype} FLOP/s "
                          "for a what-if")
    eff = priors["efficiency"]
    bw = eff["memory_bw"]["values"][scenario] * bw_peak
    f = eff["flops"]["values"][scenario] * f_peak
    f_attn = eff["flops"]["values"][scenario] * f_attn_peak
    floor = priors["launch_floor_us_per_layer"]["graph" if setting.graphs else "eager"]["values"][scenario] * 1e-6
    moe_floor = priors["moe_floor_us_per_layer"]["values"][scenario] * 1e-6
    terms = dict(weights_or_matmul=max((cost.weight_bytes + cost.embed_bytes) / bw, cost.flops_matmul / f),
                 kv=(cost.kv_read_bytes + cost.kv_write_bytes) / bw, attention=cost.flops_attention / f_attn,
                 per_layer=cost.blocks * floor + cost.moe_blocks * moe_floor,
                 comm=comm_seconds(cost, layout, link_for(device, layout, setting, priors), scenario, priors))
    return dict(seconds=sum(terms.values()), terms=terms)


def interval(fn) -> dict:
    """fn(scenario) -> seconds for each scenario: {optimistic, typical, pessimistic} (s)."""
    return {name: fn(i) for i, name in enumerate(SCENARIOS)}


@dataclass(frozen=True)
class WhatIf:
    cfg: ModelConfig
    device: DeviceSpec
    dtype: str
    layout: Layout
    setting: Setting = Setting()

    def __post_init__(self) -> None:
        self.layout.check(self.cfg)

    def target(self, q: int, B: int, L: int, scenario: int) -> float:
        """One forward through every pipeline stage (pp stages run one after the other for a token)."""
        c = rank_forward_cost(self.cfg, self.layout, self.dtype, B, q, L)
        return self.layout.pp * step_seconds(c, self.device, self.dtype, self.layout, self.setting, scenario)["seconds"]

    def mtp(self, q: int, B: int, L: int, scenario: int) -> float:
        c = rank_mtp_cost(self.cfg, self.layout, self.dtype, B, q, L)
        return step_seconds(c, self.device, self.dtype, self.layout, self.setting, scenario)["seconds"]

    def itl(self, B: int, L: int) -> dict:
        """Inter-token latency of plain decode (s), as an interval."""
        return interval(lambda s: self.target(1, B, L, s))

    def round_seconds(self, k: int, B: int, L: int, scenario: int) -> float:
        """One speculative round with the MTP module chained k times: verify k+1 positions, the
        first draft re-reads the k+1 verified positions (as roofline.analysis.predict prices it)."""
        r = self.target(k + 1, B, L, scenario) + load_priors()["spec_round_overhead_us"]["values"][scenario] * 1e-6
        return r + sum(self.mtp(k + 1 if i == 1 else 1, B, L + i - 1, scenario) for i in range(1, k + 1))

    def mtp_speedup(self, alphas: tuple[float, float, float], k: int, B: int, L: int) -> dict:
        """tau · T(1) / R for an i.i.d. acceptance alpha per scenario (optimistic alpha first)."""
        from roofline.spec.theory import tau_iid
        return interval(lambda s: tau_iid(alphas[s], k) * self.target(1, B, L, s) / self.round_seconds(k, B, L, s))


def smallest_layout(cfg: ModelConfig, device: DeviceSpec, dtype: str, batch: int, tokens_per_seq: int,
                    with_mtp: bool = False, max_devices: int = 64, headroom: float = 0.9) -> Layout | None:
    """The layout with the fewest devices whose per-rank weights + KV fit in headroom × device memory
    (tp up to a node's 8, then pipeline stages); None when nothing up to max_devices fits."""
    from roofline.parallel.cost import memory_per_rank
    if not device.mem_bytes:
        raise ConfigError(f"device={device.key!r}: no datasheet memory size")
    for lay in candidate_layouts(cfg, max_devices):
        w, kv = memory_per_rank(cfg, lay, dtype, batch, tokens_per_seq, with_mtp)
        if w + kv <= headroom * device.mem_bytes:
            return lay
    return None


def candidate_layouts(cfg: ModelConfig, max_devices: int = 64) -> list[Layout]:
    """Valid layouts ordered by devices: tp in 1, 2, 4, 8 (ep = 1 or tp for MoE, dp_attention for
    MoE), then pp stages of 8-wide groups."""
    out = []
    for pp in (1, 2, 4, 8):
        for tp in (1, 2, 4, 8):
            if pp > 1 and tp != 8:
                continue
            for ep, dpa in ((1, False), (tp, False), (tp, True)):
                if (ep > 1 or dpa) and (not cfg.is_moe or tp == 1):
                    continue
                try:
                    lay = Layout(tp=tp, ep=ep, pp=pp, dp_attention=dpa)
                    lay.check(cfg)
                except ConfigError:
                    continue
                if lay.devices <= max_devices and lay not in out:
                    out.append(lay)
    return sorted(out, key=lambda lay: lay.devices)


def capacity(cfg: ModelConfig, device: DeviceSpec, dtype: str, context: int, output: int, itl_target_ms: float,
             target_tok_s: float, price_per_device_hour: float | None = None, alpha: float | None = None,
             k: int = 1, setting: Setting = Setting(), batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
             max_devices: int = 64) -> list[dict]:
    """For every layout that fits: the largest batch meeting the ITL target (typical priors, with
    the optimistic-pessimistic interval), tokens/s per replica, devices for the target, and the
    price per million tokens. alpha: also plan with the preset's MTP module (k drafts)."""
    from roofline.parallel.cost import memory_per_rank
    L = context + output // 2
    rows = []
    for lay in candidate_layouts(cfg, max_devices):
        w = WhatIf(cfg, device, dtype, lay, setting)
        for spec in ([False, True] if alpha is not None and cfg.mtp_layers else [False]):
            best = None
            for B in batches:
                if B % lay.batch_split:
                    continue
                mem = sum(memory_per_rank(cfg, lay, dtype, B, context + output, spec))
                if mem > 0.9 * (device.mem_bytes or 0):
                    break
                if spec:
                    from roofline.spec.theory import tau_iid
                    tau = tau_iid(alpha, k)
                    per_tok = interval(lambda s: w.round_seconds(k, B, L, s) / tau)
                else:
                    per_tok = w.itl(B, L)
                if per_tok["typical"] * 1e3 <= itl_target_ms:
                    best = (B, per_tok, mem)
            if best is None:
                continue
            B, per_tok, mem = best
            tok_s = {name: B / t for name, t in per_tok.items()}  # generated tokens/s of one replica
            devices = {name: math.ceil(target_tok_s / v) * lay.devices for name, v in tok_s.items()}
            row = dict(layout=lay.label(), devices_per_replica=lay.devices, speculative=spec, batch=B,
                       itl_ms=per_tok["typical"] * 1e3, itl_ms_optimistic=per_tok["optimistic"] * 1e3,
                       itl_ms_pessimistic=per_tok["pessimistic"] * 1e3, tok_s_per_replica=tok_s["typical"],
                       tok_s_per_replica_optimistic=tok_s["optimistic"],
                       tok_s_per_replica_pessimistic=tok_s["pessimistic"],
                       replicas=devices["typical"] // lay.devices, devices=devices["typical"],
                       devices_optimistic=devices["optimistic"], devices_pessimistic=devices["pessimistic"],
                       mem_per_device_GB=mem / 1e9,
                       energy_J_per_token="n/a (what-if device: no NVML energy counter read)")
            tok_s = tok_s["typical"]
            if price_per_device_hour is not None:
                row["usd_per_million_tokens"] = price_per_device_hour * lay.devices / (tok_s * 3600) * 1e6
            rows.append(row)
    return rows


def speedup_table(cfg: ModelConfig, device: DeviceSpec, dtype: str, layout: Layout, alphas, ks, Bs, Ls,
                  setting: Setting = Setting()) -> list[dict]:
    """MTP speculative speedup and plain ITL per (alpha, k, B, L) from the datasheet row + priors,
    each as the interval of the three prior scenarios (the preset must have an MTP module)."""
    if cfg.mtp_layers < 1:
        raise ConfigError(f"model {cfg.name!r} has no MTP module (mtp_layers=0): the what-if prices MTP drafts")
    w = WhatIf(cfg, device, dtype, layout, setting)
    rows = []
    for L in Ls:
        for B in Bs:
            itl = w.itl(B, L)
            for a in alphas:
                for k in ks:
                    s = w.mtp_speedup((a, a, a), k, B, L) if k else dict.fromkeys(SCENARIOS, 1.0)
                    rows.append(dict(layout=layout.label(), alpha=a, k=k, B=B, L=L, S=s["typical"], S_low=min(s.values()),
                                     S_high=max(s.values()), itl_ms=itl["typical"] * 1e3,
                                     itl_ms_low=itl["optimistic"] * 1e3, itl_ms_high=itl["pessimistic"] * 1e3))
    return rows
