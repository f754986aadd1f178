"""Kernel efficiency as a function of the kernel and its shape (roofline/data/kernels.yaml).

Each kernel of a decode or mixed step is priced at the roofline max of its own bytes and its
own FLOPs, each at the efficiency its kernel reaches at that shape:

- dense GEMM [M tokens] x [K, N] (cuBLAS / CUTLASS tensor-core tiles): compute at
  `gemm.peak_fraction` x the tile quantization M/(ceil(M/tm)·tm) · N/(ceil(N/tn)·tn) x the wave
  quantization ctas/(waves·SMs) (ctas = ceil(M/tm)·ceil(N/tn); fewer CTAs than SMs is filled
  by split-K, as decode GEMV kernels do); weights streamed at the weight format's bandwidth
  fraction at that M (`weight_only.<fmt>`: a weight-only int8/int4/fp8 kernel streams at its
  M = 1 fraction and falls with M; the dequantisation, N·K·ops per M tile, runs on the CUDA
  cores at the fp32 rate and is added to the compute side; a weight-only quantized kernel also pays
  a fixed floor per call, `weight_only.call_floor_us`);
- decode attention (paged / flash decoding): max(KV bytes / (BW · fraction(B, context)),
  attention FLOPs / (F · peak_fraction)): the KV traffic and the arithmetic overlap in one kernel;
- grouped-GEMM MoE: in an engine running vLLM's fused_moe (the measured kernel), a fixed cost per layer
  (`grouped_gemm.floor_us`) + the touched experts' bytes at the kernel's floor-free streaming fraction for
  its tokens per expert; in another engine the measured kernel's whole-kernel fraction, no floor; against
  their FLOPs at the tile quantization of those tokens (an own int4 or architecture curve carries its floor
  inside its fraction).

The curves are NVIDIA measurements; an architecture with its own published kernels
(`arch_overrides.<arch>`: AMD CDNA3) replaces the GEMM peak share and the grouped-GEMM curve.

Every efficiency is a triple (optimistic, typical, pessimistic) with its source in the data file;
`scenario` picks one (0, 1, 2). Tables are (x, triple) rows interpolated linearly in log x and
held at their ends.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from roofline.io.fields import ConfigError
from roofline.io.yamltext import load_yaml

KERNELS_PATH = Path(__file__).resolve().parents[1] / "data" / "kernels.yaml"


@lru_cache(maxsize=4)
def load_kernels(path: str = str(KERNELS_PATH)) -> dict:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"kernels={path!r}: no such file (the kernel-efficiency priors)")
    return load_yaml(p.read_text())


def pick(entry, scenario: int, field: str = "") -> float:
    """One value of a triple (a list of three, or a mapping with `values`)."""
    v = entry.get("values") if isinstance(entry, dict) else entry
    if not (isinstance(v, (list, tuple)) and len(v) == 3):
        raise ConfigError(f"{field or 'prior'}: expected a triple (optimistic, typical, pessimistic), got {v!r}")
    return float(v[scenario])


def table_value(rows, x: float, scenario: int, field: str) -> float:
    """Interpolate a table [[x, [opt, typ, pess]], ...] (or {x: triple}) at x, linear in log x."""
    xs, ys = _prepared_table(rows, scenario, field)
    return float(np.interp(math.log(max(x, 1e-9)), xs, ys))


_TABLES: dict = {}  # id(table), scenario -> (the table, its log x, its y): a what-if reads the same tables 1e5 times


def _prepared_table(rows, scenario: int, field: str):
    """A table's sorted log x and its scenario's y, prepared once per table object (the entry keeps the object, so
    its id is not reused while cached; a table rebuilt or copied is a new object, prepared anew). Tables are read
    as data: one changed in place would be answered from its first preparation."""
    hit = _TABLES.get((id(rows), scenario))
    if hit is not None and hit[0] is rows:
        return hit[1], hit[2]
    table = rows["table"] if isinstance(rows, dict) and "table" in rows else rows
    items = sorted(table.items()) if isinstance(table, dict) else sorted((r[0], r[1]) for r in table)
    if not items:
        raise ConfigError(f"{field}: empty table")
    xs = np.log([max(float(a), 1e-9) for a, _ in items])
    ys = np.array([pick(t, scenario, field) for _, t in items])
    if len(_TABLES) > 4096:  # tables built on the fly (tests) do not pile up
        _TABLES.clear()
    _TABLES[(id(rows), scenario)] = (rows, xs, ys)
    return xs, ys


def fp16_accumulate_speedup(kern: dict, device_key: str) -> float:
    """How much faster the device's tensor cores run fp16 GEMMs that accumulate in fp16 than the
    datasheet's fp32-accumulate rate (`devices.<key>.fp16_accumulate_speedup`; 1 where the rates are equal)."""
    return float(((kern.get("devices") or {}).get(device_key) or {}).get("fp16_accumulate_speedup", 1.0))


def _arch(kern: dict, device_key: str) -> dict:
    dev = (kern.get("devices") or {}).get(device_key) or {}
    arch = dev.get("arch", "default")
    tiles = (kern.get("gemm", {}).get("tiles") or {})
    t = tiles.get(arch) or tiles.get("default") or {"tile_m": 64, "tile_n": 128}
    return dict(sm=int(dev.get("sm_count", 108)), tile_m=int(t["tile_m"]), tile_n=int(t["tile_n"]))


def tile_wave_utilisation(M: float, N: int, device_key: str, kern: dict, groups: float = 1.0) -> float:
    """Share of the tensor cores' issued work that is useful for an [M, N] output, or for `groups` of them run as
    one grouped GEMM (MoE experts: one launch whose tiles over every group fill the waves together)."""
    a = _arch(kern, device_key)
    tm, tn, sm = a["tile_m"], a["tile_n"], a["sm"]
    m_tiles, n_tiles = math.ceil(max(M, 1) / tm), math.ceil(N / tn)
    tile = (M / (m_tiles * tm)) * (N / (n_tiles * tn))
    ctas = max(groups, 1.0) * m_tiles * n_tiles
    wave = 1.0 if ctas < sm else ctas / (math.ceil(ctas / sm) * sm)  # split-K fills a partial single wave
    return tile * wave


def first_rows_alike(M: float, N: int, device_key: str, kern: dict) -> int:
    """The fewest rows whose [rows, N] GEMM runs as M's does: in one wave, the same tiles of rows (each row added
    inside a tile is free work); in several, the same number of waves (the tiles added inside a wave are free)."""
    a = _arch(kern, device_key)
    tm, sm = a["tile_m"], a["sm"]
    m_tiles, n_tiles = math.ceil(max(M, 1) / tm), math.ceil(N / a["tile_n"])
    if m_tiles * n_tiles < sm:
        first_tiles = m_tiles
    else:
        waves = math.ceil(m_tiles * n_tiles / sm)
        first_tiles = max(math.ceil(sm / n_tiles), (waves - 1) * sm // n_tiles + 1)
    return min((first_tiles - 1) * tm + 1, max(int(M), 1))


def arch_name(kern: dict, device_key: str | None) -> str | None:
    """The device's architecture (kernels.yaml devices: ampere, hopper, ada, cdna3; None where not listed)."""
    return ((kern.get("devices") or {}).get(device_key) or {}).get("arch") if device_key is not None else None


def arch_override(kern: dict, device_key: str | None) -> dict:
    """The device architecture's own entries (`arch_overrides.<arch>`, e.g. AMD CDNA3: its own GEMM
    peak share and grouped-GEMM curve), {} where the NVIDIA-measured curves apply."""
    return (kern.get("arch_overrides") or {}).get(arch_name(kern, device_key)) or {}


def peak_fraction(fmt_kind: str, scenario: int, kern: dict, device_key: str | None = None) -> float:
    """Share of the datasheet tensor rate a large GEMM reaches: the architecture's own
    (`arch_overrides.<arch>.gemm_peak_fraction`, every format), else `gemm.peak_fraction_by_format.<fmt>`
    (fp8 GEMMs on fp8 tensor cores) or `gemm.peak_fraction`."""
    own_arch = arch_override(kern, device_key).get("gemm_peak_fraction")
    if own_arch is not None:
        return pick(own_arch, scenario, "kernels.arch_overrides.gemm_peak_fraction")
    g = kern["gemm"]
    by_fmt = g.get("peak_fraction_by_format") or {}
    own = by_fmt.get(fmt_kind, by_fmt.get(_like(kern, fmt_kind)))
    if own is not None:
        return pick(own, scenario, f"kernels.gemm.peak_fraction_by_format.{fmt_kind}")
    return pick(g["peak_fraction"], scenario, "kernels.gemm.peak_fraction")


def prefill_attention_fraction(scenario: int, kern: dict, device_key: str | None = None) -> float:
    """Share of the dense tensor rate a prompt's (causal, flash) attention reaches: the architecture's own
    attention kernel (`arch_overrides.<arch>.prefill_attention_fraction`, e.g. AITER's on CDNA3), else a large
    dense GEMM's (`peak_fraction`: FlashAttention on NVIDIA parts runs near its GEMMs' share)."""
    own = arch_override(kern, device_key).get("prefill_attention_fraction")
    if own is not None:
        return pick(own, scenario, "kernels.arch_overrides.prefill_attention_fraction")
    return peak_fraction("dense", scenario, kern, device_key)


def step_seconds_per_seq(scenario: int, kern: dict, device_key: str | None = None) -> float:
    """Seconds a decode step costs per running sequence on the device's architecture beyond its bytes, FLOPs,
    launches and the engine's host time (`arch_overrides.<arch>.step_us_per_seq`, e.g. CDNA3's, measured the same
    under two vLLM engines and two models), 0 where the NVIDIA-measured curves apply."""
    own = arch_override(kern, device_key).get("step_us_per_seq")
    return pick(own, scenario, "kernels.arch_overrides.step_us_per_seq") * 1e-6 if own is not None else 0.0


def _like(kern: dict, fmt_kind: str) -> str | None:
    """The format whose curves a weight_only entry borrows (`like:`), e.g. fp8_block streams like fp8."""
    return ((kern.get("weight_only") or {}).get(fmt_kind) or {}).get("like")


def weight_bw_fraction(fmt_kind: str, M: float, scenario: int, kern: dict) -> float:
    """Streaming efficiency of the weight reads of a GEMM whose weights are in `fmt_kind`
    (dense: the activation dtype) at M tokens per pass; an entry with `like: <fmt>` streams as that one."""
    wo = kern.get("weight_only", {})
    entry = wo.get(_like(kern, fmt_kind) or fmt_kind) or wo.get("dense")
    if entry is None:
        raise ConfigError(f"kernels.weight_only: no entry for weight format {fmt_kind!r} nor 'dense'")
    if "table" in entry:
        return table_value(entry["table"], M, scenario, f"kernels.weight_only.{fmt_kind}")
    return pick(entry["bw_fraction"], scenario, f"kernels.weight_only.{fmt_kind}.bw_fraction")


def gemm_seconds(M: float, N: int, K: int, weight_bytes: float, fmt_kind: str, dequant_ops_per_weight: int,
                 bw_Bps: float, flops: float, fp32_flops: float, device_key: str, scenario: int, kern: dict,
                 io_bytes: float = 0.0) -> dict:
    """max(weights / bandwidth at this M + io_bytes / plain streaming, FLOPs / tensor rate at this shape +
    dequantisation). io_bytes: the M rows of input read and of output written, beside the weights (at 256 rows a
    tenth of a TP-8 shard's fp8 weights), streamed at the dense M = 1 fraction. A dense GEMM's compute side takes the
    architecture's measured skinny-GEMM loss where one was read (`arch_overrides.<arch>.gemm_compute_vs_m`), and
    then at least the time it gives at the fewest rows that run in M's tiles and waves (`first_rows_alike`) and at
    each of that table's row counts below M: the table's loss, measured on one shape, holds that shape's own tile
    and wave losses, which the tile / wave utilisation here counts again, so between two rows (128 -> 256 on
    Ampere) the rising share made a GEMM of more rows price faster than one of fewer (an A100's Llama-3.1-8B TP 4
    step at 160 sequences 3% below its step at 128; inside one wave, whose time the rows added do not lengthen, by
    up to 8%)."""
    if M <= 0:
        return dict(memory=0.0, compute=0.0, seconds=0.0)
    t_mem = (weight_bytes / (bw_Bps * weight_bw_fraction(fmt_kind, M, scenario, kern))
             + io_bytes / (bw_Bps * weight_bw_fraction("dense", 1, scenario, kern)))
    skinny = arch_override(kern, device_key).get("gemm_compute_vs_m")  # the architecture's measured loss at small M
    skinny = skinny if skinny is not None and fmt_kind == "dense" else None
    rate = flops * peak_fraction(fmt_kind, scenario, kern, device_key)

    def t_compute(m: float) -> float:
        s_m = table_value(skinny["table"], m, scenario, "kernels.arch_overrides.gemm_compute_vs_m") if skinny else 1.0
        return 2.0 * m * N * K / (rate * s_m * tile_wave_utilisation(m, N, device_key, kern))
    t_mm = t_compute(M)
    if skinny:  # more rows never finish sooner: at least the time at the first row count of M's tiles and waves and at
        # the measured row counts below M (see docstring)
        below = [m for m in _table_rows(skinny["table"]) if m < M] + [first_rows_alike(M, N, device_key, kern)]
        t_mm = max([t_mm] + [t_compute(m) for m in below])
    tm = _arch(kern, device_key)["tile_m"]
    t_dq = dequant_ops_per_weight * N * K * math.ceil(M / tm) / fp32_flops if dequant_ops_per_weight else 0.0
    return dict(memory=t_mem, compute=t_mm + t_dq, seconds=call_floor_s(fmt_kind, scenario, kern) + max(t_mem, t_mm + t_dq))


def _table_rows(table) -> list[float]:
    """The x values of a table [[x, triple], ...] (or {x: triple})."""
    return [float(x) for x in (table if isinstance(table, dict) else (r[0] for r in table))]


def call_floor_s(fmt_kind: str, scenario: int, kern: dict) -> float:
    """Fixed seconds per call of a quantized GEMM: the format's own (`weight_only.<fmt>.call_floor_us`: the
    block-scaled fp8 kernels'), else a weight-only int8 / int4 kernel's (`weight_only.call_floor_us`); 0 for others."""
    own = ((kern.get("weight_only") or {}).get(fmt_kind) or {}).get("call_floor_us")
    if own is not None:
        return pick(own, scenario, f"kernels.weight_only.{fmt_kind}.call_floor_us") * 1e-6
    fl = kern.get("weight_only", {}).get("call_floor_us")
    if not fl or fmt_kind not in fl.get("applies_to", ()):
        return 0.0
    return pick(fl, scenario, "kernels.weight_only.call_floor_us") * 1e-6


def attention_seconds(kv_bytes: float, attn_flops: float, B: float, context: float, bw_Bps: float, flops: float,
                      scenario: int, kern: dict, calls: int = 1, bw_fraction: float | None = None) -> dict:
    """Decode attention of B sequences at `context` over `calls` layers: KV traffic and arithmetic
    overlapped (max); each call costs at least the kernel's floor (`floor_us`, when given). bw_fraction:
    an engine's own attention kernel's streaming fraction (engines.yaml attention_bw_fraction), in place of
    the FlashAttention-measured one."""
    if kv_bytes <= 0 and attn_flops <= 0:
        return dict(memory=0.0, compute=0.0, seconds=0.0)
    da = kern["decode_attention"]
    frac = (bw_fraction if bw_fraction is not None else
            table_value(da["bw_fraction_vs_batch"], max(B, 1), scenario, "kernels.decode_attention.bw_fraction_vs_batch"))
    if "context_factor" in da:
        frac *= table_value(da["context_factor"], max(context, 1), scenario, "kernels.decode_attention.context_factor")
    floor = pick(da["floor_us"], scenario, "kernels.decode_attention.floor_us") * 1e-6 if "floor_us" in da else 0.0
    t_mem = calls * floor + kv_bytes / (bw_Bps * frac)
    t_f = attn_flops / (flops * pick(da["flops_fraction"], scenario, "kernels.decode_attention.flops_fraction"))
    return dict(memory=t_mem, compute=t_f, seconds=max(t_mem, t_f))


def _same_arch_part(own: dict, device_key: str | None, kern: dict) -> tuple[dict, dict] | None:
    """(`measured_on`, the device's kernels.yaml row) of a kernel entry measured on one part, where `device_key` is
    a part of that architecture with a known SM count; None otherwise (the measured values are read as they are)."""
    m = own.get("measured_on")
    dev = ((kern.get("devices") or {}).get(device_key) or {}) if device_key else {}
    if not m or dev.get("arch") != m.get("arch") or not dev.get("sm_count"):
        return None
    return m, dev


def sm_bound_transfer(own: dict, frac: float, bw_Bps: float, device_key: str | None, kern: dict, cap: float) -> float:
    """A grouped weight-only kernel's bandwidth fraction on `device_key`, from the part it was measured on
    (`measured_on`: its architecture, SM count and DRAM bandwidth). A dequantising kernel on a part with few SMs
    per byte/s of DRAM (the H20: 78 SMs for 4.0 TB/s) is bound by its SMs' work per byte, not by the DRAM: on a part
    of the same architecture (same SM, assumption: same clocks) its bytes/s go with the SM count, measured
    fraction x (SMs / measured SMs) x (measured bandwidth / bandwidth), never below the measured fraction and
    never above `cap`, the same-family kernel without dequantisation at those tokens per expert. Another
    architecture, an unknown part, or no `measured_on`: the measured fraction as read."""
    part = _same_arch_part(own, device_key, kern)
    if part is None or bw_Bps <= 0:
        return frac
    m, dev = part
    scaled = frac * dev["sm_count"] / m["sm_count"] * m["mem_bw_GBps"] * 1e9 / bw_Bps
    return max(frac, min(scaled, cap))


def per_sm_share(own: dict, share: float, flops: float, device_key: str | None, kern: dict) -> float:
    """The pessimistic end of a weight-only grouped kernel's compute share on another part of the architecture it was
    measured on (`measured_on`: its SMs and dense bf16 rate): the measured part's FLOP/s per SM at that share, on this
    part's SMs, where that is below the share. A part with more tensor FLOP/s per SM (an H100 / H200 against the
    H20) may leave the kernel bound by its SMs' other work (dequantisation, issue), as sm_bound_transfer takes its
    streaming side to be; the share as read is the typical. Another architecture, an unknown part: the share."""
    part = _same_arch_part(own, device_key, kern)
    if part is None or not part[0].get("dense_tflops_bf16") or flops <= 0:
        return share
    m, dev = part
    return min(share, share * m["dense_tflops_bf16"] * 1e12 / m["sm_count"] * dev["sm_count"] / flops)


def grouped_gemm_seconds(expert_bytes: float, expert_flops: float, tokens_per_expert: float, N: int,
                         bw_Bps: float, flops: float, device_key: str, scenario: int, kern: dict,
                         fmt_kind: str = "dense", fused_moe: bool = True, groups: float = 1.0,
                         bw_ratio: float = 1.0, io_seconds: float = 0.0) -> dict:
    """The touched experts of one MoE layer as one grouped GEMM: bytes at the grouped kernel's
    bandwidth fraction for its tokens per expert (a weight-only format with its own grouped kernel,
    `grouped_gemm.weight_only.<fmt>`, at that kernel's fraction), FLOPs at the tile quantization of
    those tokens, the wave quantization over the tiles of all `groups` (the touched experts: one launch).
    `bw_ratio`: an engine's own expert kernel as a ratio to the NVIDIA-measured curves (engines.yaml
    grouped_weight_only), not applied where the device's architecture prices with its own curve. `io_seconds`:
    the routed pairs' activation traffic (accounting.expert_pair_io_bytes) streamed beside the weights, in the
    memory term.

    fused_moe (the engine runs vLLM's Triton fused_moe, the kernel `grouped_gemm` was measured on):
    the layer's fixed cost (`floor_us`, or the architecture's own) is paid beside the bytes, which
    stream at the floor-free fraction `bw_fraction_vs_tokens_per_expert`. An engine with another MoE
    kernel, which no benchmark read measures, streams at the measured kernel's whole-kernel fraction
    (`whole_kernel_fraction_vs_tokens_per_expert`, the floor folded in) with no floor of its own.

    The FLOPs run at the architecture's own grouped share (CDNA3), else, for weight-only experts whose kernel's
    compute-bound share was read (`grouped_gemm.weight_only.<fmt>.compute_share_vs_tokens_per_expert`, whole-kernel
    shares at those tokens per expert), at that share, else, for fused_moe on an architecture where its
    compute-bound share was read (`fused_moe_peak_fraction.<arch>.<fmt>`), at that kernel's own share, else at the
    dense GEMM's (`peak_fraction`), each of the last two times the tile and wave utilisation."""
    if expert_bytes <= 0:
        return dict(memory=0.0, compute=0.0, seconds=0.0)
    g = kern["grouped_gemm"]
    gw = g.get("weight_only") or {}
    own = gw.get(fmt_kind) or {}
    own = gw.get(own["like"]) if "like" in own else own  # an entry that borrows another format's kernel curves
    arch = arch_override(kern, device_key).get("grouped_gemm")
    if arch is not None and not own:  # the architecture's own grouped kernel (its bf16 / fp8 experts)
        rows, field = arch["table"], "kernels.arch_overrides.grouped_gemm"
        bw_ratio = 1.0  # an engine's ratio is to the NVIDIA-measured curves, not this one
    else:
        rows, field = ((own["table"], f"kernels.grouped_gemm.weight_only.{fmt_kind}") if own else
                       (g["bw_fraction_vs_tokens_per_expert"], "kernels.grouped_gemm.bw_fraction_vs_tokens_per_expert"))
    floor = 0.0
    if own and "floor_us" in own:  # a weight-only grouped kernel read as a floor + floor-free streaming
        if fused_moe:
            floor = pick(own["floor_us"], scenario, f"kernels.grouped_gemm.weight_only.{fmt_kind}.floor_us") * 1e-6
        elif "whole_kernel_table" in own:
            rows, field = own["whole_kernel_table"], f"kernels.grouped_gemm.weight_only.{fmt_kind}.whole_kernel_table"
    if field.endswith(".bw_fraction_vs_tokens_per_expert"):  # the NVIDIA fused_moe curve (bf16 / fp8 experts)
        if fused_moe:  # its floor-free fraction + the layer's floor (the architecture's own where measured)
            own_floor = arch_override(kern, device_key).get("grouped_gemm_floor_us")
            if own_floor is not None:
                floor = pick(own_floor, scenario, "kernels.arch_overrides.grouped_gemm_floor_us") * 1e-6
            elif "floor_us" in g:
                floor = pick(g["floor_us"], scenario, "kernels.grouped_gemm.floor_us") * 1e-6
        elif "whole_kernel_fraction_vs_tokens_per_expert" in g:  # another engine's MoE kernel: the measured
            rows, field = (g["whole_kernel_fraction_vs_tokens_per_expert"]["table"],  # kernel's whole-kernel fraction
                           "kernels.grouped_gemm.whole_kernel_fraction_vs_tokens_per_expert")
    # the ROCm curve was read as whole-kernel fractions: its floor is inside them
    frac = table_value(rows, max(tokens_per_expert, 1), scenario, field)
    if own:  # a dequantising kernel measured on another part of the architecture: its bytes/s go with the SMs
        same_family = (g["whole_kernel_fraction_vs_tokens_per_expert"]["table"] if field.endswith("whole_kernel_table")
                       else g["bw_fraction_vs_tokens_per_expert"])
        frac = sm_bound_transfer(own, frac, bw_Bps, device_key, kern,
                                 table_value(same_family, max(tokens_per_expert, 1), scenario, field))
    t_mem = floor + expert_bytes / (bw_Bps * bw_ratio * frac) + io_seconds
    dev_arch = arch_name(kern, device_key)
    fm = ((g.get("fused_moe_peak_fraction") or {}).get(dev_arch) or {}).get(fmt_kind)
    share = own.get("compute_share_vs_tokens_per_expert") if own else None
    if share is not None and arch is None:  # a weight-only grouped kernel's own measured compute-bound share
        s_f = table_value(share["table"], max(tokens_per_expert, 1), scenario,
                          f"kernels.grouped_gemm.weight_only.{fmt_kind}.compute_share_vs_tokens_per_expert")
        if scenario == 2:  # the pessimistic end: the measured part's FLOP/s per SM, where lower
            s_f = per_sm_share(own, s_f, flops, device_key, kern)
        t_f = expert_flops / (flops * s_f)  # whole-kernel shares: the tile and wave losses are inside them
        return dict(memory=t_mem, compute=t_f, seconds=max(t_mem, t_f))
    if arch is not None and not own and "peak_fraction" in arch:
        peak = pick(arch["peak_fraction"], scenario, "kernels.arch_overrides.grouped_gemm.peak_fraction")
    elif fused_moe and not own and fm is not None:  # Triton fused_moe's own share, where read for the architecture
        peak = pick(fm, scenario, f"kernels.grouped_gemm.fused_moe_peak_fraction.{dev_arch}.{fmt_kind}")
    else:
        peak = peak_fraction(fmt_kind, scenario, kern, device_key)
    t_f = expert_flops / (flops * peak * tile_wave_utilisation(tokens_per_expert, N, device_key, kern, groups))
    return dict(memory=t_mem, compute=t_f, seconds=max(t_mem, t_f))
