"""The what-if model: step time of a model, layout, precision and engine on a device that was
never measured, from its datasheet row and sourced priors. One model behind `card`, `predict`
(without a fit), `capacity` (with and without layouts) and `anchors`.

Per rank, one forward (a decode step of B sequences of q tokens at context L, plus `prefill`
tokens of new prompts chunked into the same step) is the sum of its kernels, each priced at the
roofline max of its own bytes and FLOPs at the efficiency its kernel reaches at its shape
(roofline.parallel.kernels, roofline/data/kernels.yaml):

    T = Σ_matrices max(W_m / BW(fmt, M), F_m / F(M, N) + dequant)            dense part, per block
      + Σ_moe max(W_touched / BW_grouped(m_e), F_experts / F(m_e))           experts, per MoE block
      + Σ_blocks max(KV / BW_attn(B, L), F_attn / F_attn)                    decode attention
      + prefill attention FLOPs / F_attn + LM head (a GEMM at M decode tokens)
      + n_blocks · t_layer + t_step + B · t_seq + T_comm                     engine (engines.yaml)

M = tokens through the rank's dense layers in this pass; m_e = routed token-slots per touched
expert on the busiest rank (roofline.parallel.layout.experts_touched_busiest_rank). The experts
are always the TOUCHED ones: serving engines' fused MoE kernels read only the routed experts and
capture in CUDA graphs, so graph mode prices touched experts too (roofline.model.accounting.
moe_impl_for_mode is what our own sweep ran). t_layer: the engine's per-layer launch floor
(or priors.yaml's graph floor; without graphs the host's issue beside the GPU's work), t_step its
host and scheduler time per step, t_seq its host time per running sequence per step (the scheduler's
loops over the batch, where measured), T_comm = Σ calls · (latency + S · factor / busbw) with the
engine's all-reduce latency on the link and priors.yaml's bus bandwidth; a tensor-parallel group
stays inside one node (NVLink), only the stage-to-stage sends of a layout wider than a node cross
the inter-node link.

Every prior is a triple; a prediction is computed with all optimistic, all typical, all
pessimistic values. With an engine named, that is the interval; with none, every profile runs and
the interval spans them (typical: the median of the engines' typical values). That priors' interval
is then widened by the what-if's own measured error (`widen`, a split-conformal band per category:
roofline/data/bands.yaml, computed from the calibration anchors only by roofline.parallel.anchors.
conformal_bands; docs/planning.md), unless measured points of the deployment calibrate it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from roofline.io.fields import ConfigError
from roofline.io.yamltext import load_yaml
from roofline.model.speculation import (DRAFTERS, EAGLE3_DRAFT_VOCAB, EAGLE_HEADS, HEAD_DRAFTERS,  # noqa: F401
                                        WHATIF_DRAFTERS)
from roofline.measure.devices import Datasheet
from roofline.measure.memory import HEADROOM
from roofline.model.accounting import (block_elementwise_elements, block_matrices, block_vector_bytes, expert_bytes,
                                       expert_pair_io_bytes, indexer_flops, kv_read_bytes_per_seq_layer,
                                       linear_flops_per_token, weight_matrix_bytes)
from roofline.model.config import ModelConfig, kind_counts
from roofline.model.dtypes import lookup as lookup_dtype
from roofline.model.formats import Precision, activation_dtype, compute_dtype, parse_precision
from roofline.parallel import engines as engines_mod
from roofline.parallel import kernels as K
from roofline.parallel.collectives import bus_factor
from roofline.parallel.cost import (_rank_cfgs, eagle_layer_cfg, kv_split_bytes_rank, kv_token_bytes_rank,
                                    linear_state_rank_bytes, memory_per_rank, rank_forward_cost, rank_head_bytes,
                                    stage_kinds)
from roofline.parallel.layout import Layout, experts_touched_busiest_rank, local_shapes


SCENARIOS = ("optimistic", "typical", "pessimistic")
PRIORS_PATH = Path(__file__).resolve().parents[1] / "data" / "priors.yaml"
BANDS_PATH = Path(__file__).resolve().parents[1] / "data" / "bands.yaml"
BAND_CATEGORIES = ("batch", "quantized", "tp", "moe", "speculative")


@lru_cache(maxsize=4)
def load_priors(path: str = str(PRIORS_PATH)) -> dict:
    return load_yaml(Path(path).read_text())


@lru_cache(maxsize=4)
def load_bands(path: str = str(BANDS_PATH)) -> tuple[tuple[str, float], ...]:
    """The measured error bands (log ratio, >= 0) by category ('all' among them) of bands.yaml."""
    doc = load_yaml(Path(path).read_text()) or {}
    return tuple((k, float(v)) for k, v in (doc.get("bands_log") or {}).items())


@dataclass(frozen=True)
class Setting:
    """How the step runs: which engine (None: span every profile but a release variant, engines.spanned),
    CUDA graphs (None: the engine's own), the link inside a node ("" = the device's own), the data files and the measured
    error bands that widen the priors' interval (None: roofline/data/bands.yaml; (): none, the priors'
    interval alone; else (category, log half-width) pairs, 'all' the fallback)."""
    graphs: bool | None = None
    link: str = ""
    engine: str | None = None
    kernels: str = ""  # "" = roofline/data/kernels.yaml
    engines: str = ""  # "" = roofline/data/engines.yaml
    bands: tuple[tuple[str, float], ...] | None = None
    graph_batch_sizes: tuple[int, ...] | None = None  # a run's own CUDA-graph batch sizes (None: the engine's)

    def band_table(self) -> dict[str, float]:
        return dict(load_bands() if self.bands is None else self.bands)

    def kernels_path(self) -> str:
        return self.kernels or str(K.KERNELS_PATH)

    def engines_path(self) -> str:
        return self.engines or str(engines_mod.ENGINES_PATH)

    def engine_names(self) -> list[str]:
        if self.engine is not None:
            engines_mod.profile(self.engine, 1, self.engines_path())  # ConfigError naming engine= when unknown
            return [self.engine]
        return engines_mod.spanned(self.engines_path())


def intra_node_link(device: Datasheet, setting: Setting, priors: dict) -> str:
    link = setting.link or priors["device_links"].get(device.key)
    if link not in priors["interconnects"]:
        raise ConfigError(f"link={link!r} for device {device.key!r}: allowed {sorted(priors['interconnects'])}")
    return link


def collective_link(kind: str, layout: Layout, device: Datasheet, setting: Setting, priors: dict) -> str:
    """A tensor-parallel group (tp <= devices per node) stays inside a node; only a layout wider
    than a node sends stage to stage (pp) or all-to-alls over more than a node on the inter-node link."""
    node = priors["devices_per_node"]
    if kind == "send_recv" and layout.devices > node:
        return "infiniband_ndr"
    if kind != "send_recv" and layout.tp > node:
        return "infiniband_ndr"
    return intra_node_link(device, setting, priors)


@dataclass(frozen=True)
class Pass:
    """One forward: B sequences of q new tokens at context L, plus `prefill` prompt tokens of new
    requests (chunked prefill) whose attention reads `prefill_context` tokens on average."""
    B: int
    q: int = 1
    L: int = 0
    prefill: int = 0
    prefill_context: float = 0.0


@dataclass(frozen=True)
class SpecDecode:
    """Speculative decoding in a finite run: k drafts per round, their conditional acceptance per position
    (alpha_1..alpha_k; one value: the same at every position), the drafter (`mtp`, `draft_model` with its
    WhatIf `draft`, `ngram`, or an EAGLE head `eagle` | `eagle3`, the latter's LM head `draft_vocab` rows).
    tau = 1 + sum_i prod_{j<=i} alpha_j tokens per round (roofline.model.speculation). A draft tree (SGLang's EAGLE
    with --speculative-eagle-topk > 1): `width` tokens a sequence in each draft pass after the first (its topk),
    `verify_tokens` verified a sequence (--speculative-num-draft-tokens); a chain: width 1, k + 1 verified."""
    k: int
    acceptance: tuple[float, ...]
    drafter: str = "mtp"
    draft: "WhatIf | None" = None
    draft_vocab: int = EAGLE3_DRAFT_VOCAB
    width: int = 1
    verify_tokens: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ConfigError(f"spec.k={self.k!r}: allowed integers >= 1")
        acc = tuple(self.acceptance)
        if len(acc) not in (1, self.k) or not all(isinstance(a, (int, float)) and 0 <= a <= 1 for a in acc):
            raise ConfigError(f"spec.acceptance={list(acc)!r}: allowed one rate or k={self.k} rates, each in [0, 1]")
        if self.drafter not in WHATIF_DRAFTERS:
            raise ConfigError(f"spec.drafter={self.drafter!r}: allowed {WHATIF_DRAFTERS}")
        check_draft_vocab(self.draft_vocab)
        check_tree(self.k, self.width, self.verify_tokens, self.drafter)
        if self.drafter == "draft_model" and self.draft is None:
            raise ConfigError("spec.draft_model: a draft model is needed for drafter=draft_model")

    def tau(self) -> float:
        from roofline.model.speculation import tau
        acc = tuple(self.acceptance)
        return tau(acc * self.k if len(acc) == 1 else acc)


def check_tree(k: int, width: int, verify_tokens: int | None, drafter: str) -> None:
    """A draft tree's shape: width (tokens a sequence in each draft pass after the first) an integer >= 1, the verified
    tokens an integer in k + 1 .. 1 + k x width (None: k + 1, a chain), a tree only from a head (MTP or EAGLE); each a
    one-line error naming it."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError(f"draft_topk={width!r}: allowed an integer >= 1 (tokens a sequence in each draft pass)")
    if verify_tokens is not None:
        if isinstance(verify_tokens, bool) or not isinstance(verify_tokens, int) or \
                not k + 1 <= verify_tokens <= 1 + k * width:
            raise ConfigError(f"draft_tokens={verify_tokens!r}: allowed an integer in k + 1 = {k + 1} .. 1 + k x "
                              f"draft_topk = {1 + k * width} (the tokens a sequence verifies in a round)")
    if (width > 1 or (verify_tokens or k + 1) > k + 1) and drafter not in HEAD_DRAFTERS:
        raise ConfigError(f"draft_topk={width}, draft_tokens={verify_tokens}: a draft tree is priced for a head "
                          f"(mtp, eagle, eagle3), not drafter={drafter!r}")


def check_draft_vocab(v) -> int:
    """An EAGLE-3 head's draft vocabulary: an integer >= 1, else a one-line error naming it."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"draft_vocab={v!r}: allowed an integer >= 1 (an EAGLE-3 head's draft_vocab_size)")
    return v


def native_rate(device: Datasheet, kind: str) -> bool:
    """Whether the device multiplies a low-precision kind (fp8, fp4) on its tensor cores: a datasheet rate for it
    (fp8: Hopper, Ada, Blackwell, CDNA3; fp4: Blackwell). Without one, an engine dequantises the weights to the
    activations in a weight-only kernel (vLLM's FP8 Marlin on Ampere: W8A16)."""
    return device.peak_flops(kind) is not None


MX_ACTIVATIONS = {"fp8": "float8_e4m3fn", "bf16": None}  # engines.yaml mxfp4_activations -> the MMA's other operand


def matmul_dtype(device: Datasheet, prec: Precision, cls: str = "weights", mx_act: str = "bf16") -> str:
    """The dtype whose datasheet FLOP/s a weight class's GEMMs run at on this device (formats.compute_dtype;
    fp8 / fp4 weights on a device without such tensor cores are dequantised to the activations). mxfp4 weights
    (OCP microscaling, gpt-oss's experts) carry no activation format of their own: on fp4 tensor cores an engine
    multiplies them with its own choice of activations (`mx_act`, engines.yaml mxfp4_activations: fp8, the W4A8
    MMA at the fp8 rate; bf16, at the bf16 rate), never at the fp4 x fp4 rate of nvfp4's W4A4."""
    mm = compute_dtype(prec.label, cls)
    if device.peak_flops(mm) is None:
        return prec.activations
    if mm == "float4_e2m1" and getattr(prec, cls).name == "mxfp4":
        mm = MX_ACTIVATIONS[mx_act] or prec.activations
        return mm if device.peak_flops(mm) is not None else prec.activations
    return mm


def _ceilings(device: Datasheet, prec: Precision, cls: str = "weights",
              mx_act: str = "bf16") -> tuple[float, float, float, float]:
    mm, attn = matmul_dtype(device, prec, cls, mx_act), activation_dtype(prec.label)
    bw, f, fa, f32 = device.bandwidth_Bps(), device.peak_flops(mm), device.peak_flops(attn), device.peak_flops("float32")
    if bw is None or f is None or fa is None:
        raise ConfigError(f"device={device.key!r}: no datasheet bandwidth or {mm} / {attn} FLOP/s for a what-if")
    return bw, f, fa, f32 or fa / 8


def _fmt_kind(fmt, device: Datasheet) -> str:
    """The kernel family of a weight format on a device: dense (the activation dtype), int8, int4, fp8 (one
    scale per tensor or channel), fp8_block (DeepSeek-style 128 x 128 block scales: its own kernels, kernels.yaml
    weight_only.fp8_block), fp4 (on fp4 tensor cores), or fp8_weight_only / fp4_weight_only (dequantised by a
    weight-only kernel where the device has no such tensor cores)."""
    if fmt.kind == "float":
        return "dense"
    if fmt.kind in ("fp8", "fp4") and not native_rate(device, fmt.kind):
        return f"{fmt.kind}_weight_only"
    return "fp8_block" if fmt.kind == "fp8" and fmt.granularity == "block" else fmt.kind


def _dequant_ops(fmt, device: Datasheet) -> int:
    """Element operations per weight a kernel spends dequantising: none for fp8 / fp4 on their tensor cores; a
    weight-only fp8 kernel converts each weight once (as int8), fp4 looks up its code and scale."""
    if fmt.kind in ("fp8", "fp4"):
        return 0 if native_rate(device, fmt.kind) else max(1, fmt.dequant_ops_per_weight())
    return fmt.dequant_ops_per_weight()


def gemm_call(M, N, Kd, nbytes, kind: str, ops: int, a_in: float, a: int, bw: float, f: float, f32: float,
              device_key: str, scenario: int, kern: dict) -> dict:
    """One GEMM call as a pass prices it: kernels.gemm_seconds on its weights (nbytes) beside its M input rows (in the
    GEMM's input dtype, a_in bytes per element) and M output rows (the activations', a)."""
    return K.gemm_seconds(M, N, Kd, nbytes, kind, ops, bw, f, f32, device_key, scenario, kern, M * (Kd * a_in + N * a))


def one_gemm_seconds(device: Datasheet, dtype: str, M: int, N: int, Kd: int, scenario: int, kern: dict) -> float:
    """One GEMM of M rows by an [N, Kd] weight matrix in the precision's weight format, as `pass_seconds` prices
    each of its GEMMs (`gemm_call`), with no engine's bandwidth scale or accumulation: a kernel alone."""
    prec = parse_precision(dtype)
    bw, f, _, f32 = _ceilings(device, prec, "weights")
    a_in, a = lookup_dtype(matmul_dtype(device, prec, "weights")).bytes, prec.act_bytes
    return gemm_call(M, N, Kd, prec.weights.matrix_bytes(N, Kd, a), _fmt_kind(prec.weights, device),
                     _dequant_ops(prec.weights, device), a_in, a, bw, f, f32, device.key, scenario, kern)["seconds"]


def engine_matrices(mats: list[tuple[str, int, int]], merged: tuple) -> list[tuple[str, int, int]]:
    """The GEMM calls an engine makes for a block's linears (accounting.block_matrices): those it runs as one
    (engines.yaml merged_gemms) concatenated along N, against the same input, so one call with the summed N
    and the same bytes: gate_up (a SwiGLU's w1 and w3) and qkv_a (an MLA layer's q_a and kv_a)."""
    pairs = [(f"{p}.w1", f"{p}.w3") for p in {n.rsplit(".", 1)[0] for n, _, _ in mats}] if "gate_up" in merged else []
    pairs += [("attn.q_a", "attn.kv_a")] if "qkv_a" in merged else []
    out = list(mats)
    for a, b in pairs:
        ia = next((i for i, m in enumerate(out) if m[0] == a), None)
        ib = next((i for i, m in enumerate(out) if m[0] == b), None)
        if ia is None or ib is None or out[ia][2] != out[ib][2]:
            continue
        out[ia] = (f"{a}+{b.rsplit('.', 1)[1]}", out[ia][1] + out[ib][1], out[ia][2])
        del out[ib]
    return out


def graph_batch(eng, setting: Setting, device: Datasheet, b: int, split: int, requests: bool = True) -> int:
    """The batch a rank's decode-only step runs at: under CUDA graphs captured with padding (engines.yaml graph_padding,
    or the run's own sizes: Setting.graph_batch_sizes) the smallest captured size >= b, unless that exceeds the
    largest size or, for b requests, the engine's cap on a rank's running sequences (TensorRT-LLM's
    _get_padded_batch: 'No padding if ... It would create too many concurrent requests'; engines.yaml
    max_running_seqs); else b. requests=False: b is the step's tokens (vLLM V1 pads num_scheduled_tokens), no cap.
    Assumption: the KV blocks the padding requests take are free (TensorRT-LLM pads only then; a fixed-length run's
    sequences hold a part of their reserved length while they decode)."""
    graphs = eng.graphs if setting.graphs is None else setting.graphs
    sizes = eng.graph_sizes if setting.graph_batch_sizes is None else setting.graph_batch_sizes
    if not graphs or not sizes:
        return b
    padded = engines_mod.padded_batch(b, sizes)
    if not requests:
        return padded
    cap = engines_mod.tier_value(eng.max_running_tiers, device.usable_mem_bytes(), device.key, "server")
    if cap is not None and eng.dp_limits != "per_rank":
        cap = math.ceil(cap / split)
    return b if cap is not None and padded > cap else padded


def launch_kind(eng, setting: Setting) -> str:
    """How engine `eng` launches a step's kernels under `setting`, which decides what pass_seconds' launch term
    (`per_layer`) prices: `graph` (CUDA graphs: the graph floor per layer and the MoE routing kernels), `host_issue`
    (no graphs and its host issues each kernel: host_issue_seconds, the issue time the GPU's work does not hide;
    every engine run without graphs by force, `setting.graphs` false, whose profile counts no launches issues the
    priors' eager host time a layer), `engine_floor` (an engine eager by its profile with a per-layer floor of its
    own: a C++ engine's, lmdeploy's per_layer_us)."""
    graphs = eng.graphs if setting.graphs is None else setting.graphs
    if graphs:
        return "graph"
    if eng.launches_per_layer is not None or eng.per_layer_s is None or setting.graphs is not None:
        return "host_issue"
    return "engine_floor"


def host_issue_seconds(eng, setting: Setting, n: int, n_moe: int, touched: float = 0.0,
                       priors: dict | None = None, scenario: int = 1) -> tuple[float, float] | None:
    """An engine whose host issues every kernel (`host_issue`, no CUDA graphs): (the host's seconds issuing the n
    layers' launches, every launch of a layer counted, matmuls and attention included; the seconds of an MoE layer's
    Python loop over its `touched` experts, launches_per_touched_expert each). Any other engine run without graphs
    (forced: `setting.graphs` false) issues priors.yaml eager_host_us_per_layer a layer (`priors` given; else None).
    Eager PyTorch enqueues a kernel and returns, so the issue runs beside the GPU: a step's kernels complete at the
    later of the host's last issue and the GPU's work (an in-order queue the host stays ahead of, or behind, over a
    step of many alike layers); the LM head, issued last, runs after either. The loop's launches do not overlap:
    each expert's torch.where is a nonzero that waits for the GPU, so its issue time adds.
    None for any other engine (launch_kind: graphs, or an engine eager by its profile with a per-layer floor of its
    own), and without `priors` for an engine that counts no launches."""
    if launch_kind(eng, setting) != "host_issue":
        return None
    if eng.launches_per_layer is not None:
        return n * eng.launches_per_layer * eng.host_s_per_launch, n_moe * touched * eng.launches_per_expert * \
            eng.host_s_per_launch
    if priors is None:
        return None
    per_layer = K.pick(priors["eager_host_us_per_layer"], scenario, "priors.eager_host_us_per_layer") * 1e-6
    return n * per_layer, 0.0


def launch_seconds(eng, setting: Setting, scenario: int, priors: dict, n: int, n_moe: int,
                   device_key: str, kern: dict, device_only: bool = False) -> float:
    """The launch cost of a stage's n blocks (n_moe of them MoE) under CUDA graphs: the graph floor per
    layer (priors.yaml, the device architecture's own where kernels.yaml arch_overrides gives one
    (`launch_floor_us_per_layer_graph`), or the engine's per_layer_us), and per MoE layer its router GEMM and gating
    kernels (priors.yaml moe_routing_us_per_layer: latency-bound at decode sizes); an engine eager by its profile, its
    own per_layer_us. `device_only`: the device's own share, the kernels' launch and drain gaps on the GPU that a
    graph still pays (the graph floor and the routing kernels), for an engine whose host issues its kernels
    (host_issue_seconds): eager or not, the GPU runs the same kernels with the same gaps."""
    graphs = True if device_only else (eng.graphs if setting.graphs is None else setting.graphs)
    per_layer = None if device_only else eng.per_layer_s
    if per_layer is None or setting.graphs is not None:
        own = K.arch_override(kern, device_key).get("launch_floor_us_per_layer_graph")
        per_layer = (K.pick(own, scenario, "kernels.arch_overrides.launch_floor_us_per_layer_graph") if own is not None
                     else K.pick(priors["launch_floor_us_per_layer"]["graph"], scenario,
                                 "priors.launch_floor_us_per_layer.graph")) * 1e-6
    routing = K.pick(priors["moe_routing_us_per_layer"], scenario, "priors.moe_routing_us_per_layer") * 1e-6
    return n * per_layer + (n_moe * routing if graphs else 0.0)


def pass_seconds(cfg: ModelConfig, layout: Layout, dtype, p: Pass, device: Datasheet, eng, scenario: int,
                 kern: dict, priors: dict, setting: Setting = Setting(), head: str = "",
                 draft_vocab: int = EAGLE3_DRAFT_VOCAB) -> dict:
    """Seconds of one rank's forward (one pipeline stage; a draft head's pass with `head`: the MTP module `mtp`, one
    layer of the target's kind; an EAGLE head `eagle` | `eagle3`, one dense layer of the target's width and dense
    FFN (cost.eagle_layer_cfg), its LM head the target's or `draft_vocab` rows), by term: the GEMMs
    of the dense part and the experts, the kernels between them (elementwise: norms, rotary, gated activation),
    attention, the LM head, the per-layer launch floor, the engine's host time per step (step_overhead), the
    architecture's cost per running sequence (per_seq, kernels.step_seconds_per_seq) and the collectives; a step
    carrying a prompt chunk in an engine that runs it eagerly, where its host time per layer is read for the layer kind
    (engines.yaml eager_prefill_host_us_per_layer), the host's excess over all of that (prefill_host)."""
    prec = parse_precision(dtype)
    if head in EAGLE_HEADS:  # a released EAGLE head is unquantized (activation dtype) whatever the target's weights;
        # its layer caches in the target's KV format, and EAGLE-1 shares the target's LM head
        prec = Precision(prec.activations, kv=prec.kv, lm_head=prec.lm_head if head == "eagle" else None)
    bw, f, fa, f32 = _ceilings(device, prec, "weights", eng.mxfp4_activations)
    bw *= eng.bw_scale
    if eng.fp16_accumulate and compute_dtype(prec.label) == "float16":  # the engine's fp16 GEMMs accumulate in fp16
        f *= K.fp16_accumulate_speedup(kern, device.key)
    a, s = prec.act_bytes, local_shapes(cfg, layout)
    is_head = bool(head)  # any draft head: no engine step of its own, one layer's collectives
    kinds = ({(False, False): 1} if head in EAGLE_HEADS else {(cfg.is_moe, False): 1}) if is_head \
        else stage_kinds(cfg, layout)
    n, n_moe, n_lin = kind_counts(kinds)
    split = layout.batch_split
    Br = math.ceil(p.B / split)
    by_tokens = eng.graph_pad_unit == "tokens"  # a decode-only step's graph rows: its tokens or its requests padded
    if p.prefill:  # a step carrying a prompt chunk: no graph, no padding
        Ng = Br * p.q
    elif by_tokens:
        Ng = graph_batch(eng, setting, device, Br * p.q, split, requests=False)
    else:
        Ng = graph_batch(eng, setting, device, Br, split) * p.q
    Nr = Ng + math.ceil(p.prefill / split)  # tokens through this rank's dense layers (padding rows included)
    block_cfg, expert_cfg = _rank_cfgs(eagle_layer_cfg(cfg) if head in EAGLE_HEADS else cfg, layout)
    wk, dq = _fmt_kind(prec.weights, device), _dequant_ops(prec.weights, device)
    ek, f_e = _fmt_kind(prec.experts, device), _ceilings(device, prec, "experts", eng.mxfp4_activations)[1]
    # the GEMMs' input bytes per element (dense part, experts): quantized for an fp8 / fp4 tensor-core GEMM (w8a8,
    # w4a4; mxfp4's w4a8 takes fp8 inputs), else the activations'
    a_in, a_in_e = (lookup_dtype(matmul_dtype(device, prec, cls, eng.mxfp4_activations)).bytes
                    for cls in ("weights", "experts"))
    stream = bw * K.weight_bw_fraction("dense", 1, scenario, kern)  # plain streaming: activations, cache writes

    def gemm(M, N, Kd, nbytes, kind=wk, ops=dq, a_in=a_in):
        return gemm_call(M, N, Kd, nbytes, kind, ops, a_in, a, bw, f, f32, device.key, scenario, kern)

    def block(moe: bool, linear: bool = False) -> dict:
        mats = block_matrices(block_cfg, moe, linear)
        g = [gemm(Nr, N, Kd, weight_matrix_bytes(block_cfg, prec.weights, name, N, Kd, a))
             for name, N, Kd in engine_matrices(mats, eng.merged)]
        rest = block_vector_bytes(block_cfg, moe, a, linear)  # norms, router in act dtype
        t_rest = rest / (bw * K.weight_bw_fraction("dense", Nr, scenario, kern))
        out = dict(dense=sum(x["seconds"] for x in g) + t_rest, experts=0.0,
                   elementwise=Nr * a * block_elementwise_elements(block_cfg, moe, linear) / stream)
        if moe:
            routed = p.B * p.q + p.prefill
            touched = experts_touched_busiest_rank(cfg, routed, layout.ep)
            pairs = routed * cfg.experts_per_token / layout.ep
            m_e = pairs / touched if touched else 0.0
            w_e = 3 * cfg.d * s.moe_ffn
            io = pairs * expert_pair_io_bytes(cfg.d, s.moe_ffn, a_in_e, a)  # the pairs' activations (streamed)
            out["experts"] = K.grouped_gemm_seconds(touched * expert_bytes(expert_cfg, prec), 2.0 * pairs * w_e, m_e,
                                                    2 * s.moe_ffn, bw, f_e, device.key, scenario, kern, ek,
                                                    eng.fused_moe, touched,
                                                    dict(eng.grouped_bw_ratio).get(ek, 1.0),
                                                    io / stream)["seconds"]
            out["touched"] = touched
        return out

    blocks = {kind: block(*kind) for kind in kinds}  # (MoE, linear attention) -> its terms
    t_dense = sum(c * blocks[kind]["dense"] for kind, c in kinds.items())
    t_experts = sum(c * blocks[kind]["experts"] for kind, c in kinds.items())
    t_elem = sum(c * blocks[kind]["elementwise"] for kind, c in kinds.items())  # norms, rotary, gated activation
    moe_blk = next((b for (moe, _), b in blocks.items() if moe), None)
    # decode attention (KV traffic and arithmetic overlapped), prefill attention compute-bound
    kv_tok = kv_token_bytes_rank(cfg, layout, prec)
    kv_att, kv_idx = kv_split_bytes_rank(cfg, layout, prec)  # a sparse layer's indexer reads its keys everywhere
    seen = cfg if cfg.local_kind in eng.local_reads else cfg.attending_all()  # what the engine's decode reads
    kv_len = p.L + p.q
    # a kernel with one thread block per query head reads a GQA layer's K and V once per query head it serves, the
    # repeats' DRAM share (the rest served from L2) from engines.yaml gqa_decode_kv_reads; materialised, the repeats
    # are copies (transformers' repeat_kv) that a kernel of their own writes first
    rep = s.heads / s.kv_heads if not cfg.is_mla else 1.0
    group = 1.0 + (rep - 1.0) * eng.kv_repeat_share
    cache = Br * n * kv_read_bytes_per_seq_layer(seen, kv_att, kv_idx, kv_len, p.q)  # a windowed layer: its window;
    kv_bytes = cache * group + Br * (n - n_lin) * kv_tok * p.q  # a sparse one: the index_topk rows its queries select
    # copies beside the attention kernel, at the streaming rate: torch.cat rewrites the cache (read it, write it one
    # token longer; engines.yaml kv_cache_update concat), repeat_kv reads each KV head and writes its copies
    kv_copy = (2.0 * cache * eng.kv_concat
               + (1.0 + rep) * cache * eng.kv_repeat_share * (eng.kv_repeat_copies and rep > 1.0)) / stream
    v_heads = block_cfg.linear_v_heads  # this rank's Gated DeltaNet heads: their states read and written back
    kv_bytes += 2 * Br * n_lin * linear_state_rank_bytes(cfg, layout, prec)
    d_qk, d_v = (cfg.kv_lora_rank + cfg.qk_rope_dim, cfg.kv_lora_rank) if cfg.is_mla else (cfg.head_dim, cfg.head_dim)
    attended = seen.attended_pairs(p.L, p.q)
    attn_flops = 2 * (d_qk + d_v) * s.heads * n * Br * attended
    f_idx = device.peak_flops("fp8") if native_rate(device, "fp8") else fa  # the indexer's fp8 logits
    attn_flops += indexer_flops(cfg, n, Br, p.L, p.q) * fa / f_idx  # (as attention-rate FLOPs)
    attn_flops += n_lin * Br * p.q * linear_flops_per_token(cfg, p.q, v_heads)  # Gated DeltaNet recurrences
    calls = n * (2 if cfg.is_sparse else 1)  # a sparse layer: the indexer's logits kernel and the sparse attention
    t_attn = K.attention_seconds(kv_bytes, attn_flops, Br, p.L, bw, fa, scenario, kern, calls,
                                 eng.attention_bw_fraction)["seconds"]
    pre_r = math.ceil(p.prefill / split)
    if pre_r:
        peak = K.prefill_attention_fraction(scenario, kern, device.key)
        attended_pre = seen.attended_positions(p.prefill_context)  # a prompt token's keys (sparse: index_topk at most)
        pf = (mla_prefill_flops(cfg, s.heads, n, pre_r, attended_pre) if cfg.is_mla  # MHA over up-projected latents
              else 2 * (d_qk + d_v) * s.heads * n * pre_r * attended_pre)
        pf += indexer_flops(cfg, n, pre_r, p.prefill_context, 1) * fa / f_idx  # each prompt token scores its context
        pf += n_lin * pre_r * linear_flops_per_token(cfg, pre_r, v_heads)  # the chunked Gated DeltaNet (assumption:
        t_attn += pf / (fa * peak)  # at the prompt attention's share of the tensor rate)
        t_attn += (n - n_lin) * kv_tok * pre_r / stream  # its cache writes
    # LM head (logits of the decode positions; a prefill chunk's last token is one more row each)
    head_M = Br * p.q if by_tokens else Ng  # vLLM V1 computes the logits on the real rows (compute_logits)
    hk = _fmt_kind(prec.lm_head, device) if not cfg.tie_embeddings else "dense"
    head_cfg = cfg.scaled(vocab=draft_vocab, tie_embeddings=False) if head == "eagle3" else cfg
    t_head = gemm(head_M, local_shapes(head_cfg, layout).vocab_head, cfg.d, rank_head_bytes(head_cfg, layout, prec), hk,
                  0 if head_cfg.tie_embeddings else _dequant_ops(prec.lm_head, device), a)["seconds"]
    if is_head:  # the fc over [embedding; hidden] (MTP's eh_proj, EAGLE's fc: 2d -> d; EAGLE-3's over three hidden
        fc_in = 3 if head == "eagle3" else 2  # states, 3d -> d), in the activation dtype
        t_head += gemm(Nr, cfg.d, fc_in * cfg.d, fc_in * cfg.d * cfg.d * a, "dense", 0, a)["seconds"]
    if head == "eagle3":  # its q/k/v read [embedding; feature] (2d): the second d of their input
        qkv = (s.heads + 2 * s.kv_heads) * cfg.head_dim
        t_head += gemm(Nr, qkv, cfg.d, qkv * cfg.d * a, "dense", 0, a)["seconds"]
    host_issue = host_issue_seconds(eng, setting, n, n_moe, (moe_blk or {}).get("touched", 0.0), priors, scenario)
    t_launch = launch_seconds(eng, setting, scenario, priors, n, n_moe, device.key, kern,
                              device_only=bool(host_issue))
    rc = rank_forward_cost(cfg, layout, prec.label, max(Nr * split, 1), 1, 0, reduces=eng.block_reduces(cfg))
    comm, calls = 0.0, []
    for c in rc.collectives:
        if is_head and c.kind == "send_recv":
            continue
        link = collective_link(c.kind, layout, device, setting, priors)
        pl = priors["interconnects"][link]
        lat = eng.allreduce_latency_s.get(link) if c.kind == "all_reduce" else None
        lat = K.pick(pl["latency_us"], scenario, f"priors.interconnects.{link}.latency_us") * 1e-6 if lat is None else lat
        busbw = dict(eng.allreduce_busbw_Bps).get(link) if c.kind == "all_reduce" else None  # the engine's own
        if busbw is None:  # else the link's
            busbw = K.pick(pl["busbw_GBps"], scenario, f"priors.interconnects.{link}.busbw_GBps") * 1e9
        count = c.count if not is_head else max(1, round(c.count * n / max(sum(stage_kinds(cfg, layout).values()), 1)))
        bus = c.size_bytes * bus_factor(c.kind, max(layout.tp, 2))
        comm += count * (lat + bus / busbw)
        calls.append((c.kind, link, count, bus, lat + bus / busbw))
    terms = dict(dense=t_dense, experts=t_experts, elementwise=t_elem, attention=t_attn, kv_copy=kv_copy, lm_head=t_head,
                 per_layer=t_launch,
                 step_overhead=(0.0 if is_head else
                                eng.step_overhead_s + eng.step_overhead_per_seq_s * (p.B + (p.prefill > 0))),
                 per_seq=0.0 if is_head else K.step_seconds_per_seq(scenario, kern, device.key) * (Br + (pre_r > 0)),
                 comm=comm)
    if host_issue:
        # eager host issue: the longer of the issue and the layers' GPU work beside it (the device's own launch gaps,
        # t_launch, in that work; the experts apart, the loop's syncs serialise them; the LM head after the last
        # issue), then the expert loop's own issue time
        issue, loop = host_issue
        beside = sum(v for k, v in terms.items() if k not in ("experts", "step_overhead", "lm_head", "per_layer"))
        terms["per_layer"] = max(issue - beside, t_launch) + loop
    host = dict(eng.prefill_host_s_per_layer).get("mla") if cfg.is_mla else None
    if host is not None and p.prefill and not is_head:  # an eager prompt step: the longer of its GPU and host times
        terms["prefill_host"] = max(0.0, n * host - sum(terms.values()))
    return dict(seconds=sum(terms.values()), terms=terms,
                experts_touched=(moe_blk or {}).get("touched", 0.0),
                collectives=tuple(calls))  # (kind, link, calls, bus bytes of one, seconds of one) of the comm term


def mla_prefill_flops(cfg: ModelConfig, heads: int, layers: int, tokens: int, attended: float) -> float:
    """FLOPs of `tokens` prompt tokens through `layers` MLA layers of `heads` heads (one rank), each attending
    `attended` positions on average, as vLLM computes a prefill (attention/backends/mla/common.py: "the compute
    friendly approach for 'prefill'", "the data-movement friendly approach for 'decode'"): the cached latents
    up-projected to per-head keys and values (kv_c @ W_UK, W_UV: kv_lora_rank -> heads x (qk_nope + v)), then
    multi-head attention at the heads' own widths (qk_nope + qk_rope, v_head_dim), not the latent's (kv_lora_rank +
    qk_rope, kv_lora_rank: the absorbed form decode runs, 3.4x the arithmetic per attended pair for DeepSeek-V3).
    The up-projection covers the positions the tokens attend: for one prompt of c tokens after a prefix P, P + c =
    attended + c / 2 (at least the tokens themselves)."""
    d_qk, d_v = cfg.qk_nope_dim + cfg.qk_rope_dim, cfg.v_head_dim
    positions = max(tokens, attended + tokens / 2)
    up = 2 * positions * cfg.kv_lora_rank * heads * (cfg.qk_nope_dim + cfg.v_head_dim)
    return layers * (2 * (d_qk + d_v) * heads * tokens * attended + up)


def interval(fn) -> dict:
    """fn(scenario) -> seconds for each scenario: {optimistic, typical, pessimistic} (s)."""
    return {name: fn(i) for i, name in enumerate(SCENARIOS)}


def band_categories(cfg: ModelConfig, dtype: str, layout: Layout, B: int, spec: bool = False) -> tuple[str, ...]:
    """The categories of a prediction whose measured error band applies (BAND_CATEGORIES): more than one
    sequence at a time, weights or KV not in the activation dtype, tensor parallel, MoE, speculative."""
    prec = parse_precision(dtype)
    cats = dict(batch=B > 1, quantized=not (prec.weights.is_float and prec.experts.is_float and prec.kv.is_float),
                tp=layout.tp > 1,
                moe=cfg.is_moe, speculative=spec)
    return tuple(c for c in BAND_CATEGORIES if cats[c])


def band_for(categories, bands: dict[str, float]) -> float:
    """The log half-width a prediction's interval is widened by: the widest band of its categories, a
    category without its own band (too few calibration points) taking the overall one ('all')."""
    overall = bands.get("all", 0.0)
    return max((bands.get(c, overall) for c in categories), default=overall) if bands else 0.0


def widen(iv: dict, q: float) -> dict:
    """The interval widened by the measured error band q (a log ratio): its faster end × e^q faster, its
    slower end × e^q slower, typical kept (whichever direction the unit runs)."""
    if not q:
        return dict(iv)
    o, p = iv["optimistic"], iv["pessimistic"]
    f = math.exp(q)
    return dict(optimistic=o / f if o <= p else o * f, typical=iv["typical"], pessimistic=p * f if o <= p else p / f)


def span(per_engine: dict[str, dict]) -> dict:
    """One interval over engine profiles: the lowest optimistic, the median typical, the highest pessimistic."""
    vals = list(per_engine.values())
    return dict(optimistic=min(v["optimistic"] for v in vals), typical=statistics.median(v["typical"] for v in vals),
                pessimistic=max(v["pessimistic"] for v in vals))


@dataclass(frozen=True)
class Calibration:
    """What a few measured points of the user's deployment determine (roofline.analysis.calibrate):
    the measured / predicted step-time ratio by batch, relative to the overall factor `WhatIf.scale`
    (the median over each batch's points, interpolated in log B, held beyond the points), and the
    relative interval (low <= 1 <= high) the points leave at their own batches and contexts. Away
    from them the interval widens back to the priors' own, in full `reach_decades` (factors of 10 in
    B or L) outside the points' range: a point at B = 1 says little about B = 256."""
    batches: tuple[float, ...]
    ratios: tuple[float, ...]
    low: float
    high: float
    B_range: tuple[float, float]
    L_range: tuple[float, float]
    reach_decades: float = 1.0

    def factor(self, B: float) -> float:
        return float(np.interp(math.log(max(B, 1)), [math.log(b) for b in self.batches], self.ratios))

    def reach(self, B: float, L: float) -> float:
        """0 inside the points' B and L range, 1 at reach_decades or more outside it."""
        def out(x, lo, hi):
            x, lo, hi = (math.log10(max(v, 1)) for v in (x, lo, hi))
            return max(lo - x, x - hi, 0.0)
        return min(1.0, max(out(B, *self.B_range), out(L, *self.L_range)) / self.reach_decades)

    def interval(self, typical: float, prior: dict, B: float, L: float) -> dict:
        """The points' relative interval at (B, L), blended (geometrically) toward the priors' own."""
        w = self.reach(B, L)
        lo = self.low ** (1 - w) * (prior["optimistic"] / prior["typical"]) ** w
        hi = self.high ** (1 - w) * (prior["pessimistic"] / prior["typical"]) ** w
        return dict(optimistic=typical * lo, typical=typical, pessimistic=typical * hi)


@dataclass(frozen=True)
class WhatIf:
    cfg: ModelConfig
    device: Datasheet
    dtype: str
    layout: Layout = Layout()
    setting: Setting = Setting()
    scale: float = 1.0  # a calibration's overall factor on every step time (roofline.analysis.calibrate)
    calibration: Calibration | None = None  # calibrated: its ratio by batch and the interval its points leave

    def __post_init__(self) -> None:
        self.layout.check(self.cfg)
        parse_precision(self.dtype)
        object.__setattr__(self, "_passes", {})  # pass_detail's memo: one what-if prices a pass once
        object.__setattr__(self, "_profiles", {})  # _eng's memo: engines.profile builds its Engine anew at each call

    def _eng(self, name: str, scenario: int):
        key = (name, scenario)
        if key not in self._profiles:
            self._profiles[key] = engines_mod.profile(name, scenario, self.setting.engines_path())
        return self._profiles[key]

    def _kern(self) -> dict:
        return K.load_kernels(self.setting.kernels_path())

    def pass_detail(self, p: Pass, scenario: int, engine: str, head: str = "",
                    draft_vocab: int = EAGLE3_DRAFT_VOCAB) -> dict:
        """pass_seconds of this what-if's model, layout, precision, device and setting (not its calibration:
        that scales the result), computed once per (pass, scenario, engine, draft head): a speedup table or a finite
        run asks for the same pass many times (read the dict, do not change it)."""
        key = (p, scenario, engine, head, draft_vocab if head == "eagle3" else 0)
        if key not in self._passes:
            self._passes[key] = pass_seconds(self.cfg, self.layout, self.dtype, p, self.device,
                                             self._eng(engine, scenario), scenario, self._kern(), load_priors(),
                                             self.setting, head, draft_vocab)
        return self._passes[key]

    def forward(self, p: Pass, scenario: int, engine: str) -> float:
        """One forward through every pipeline stage (pp stages run one after the other for a token)."""
        return self._scale(p.B) * self.layout.pp * self.pass_detail(p, scenario, engine)["seconds"]

    def _scale(self, B: int) -> float:
        return self.scale * (self.calibration.factor(B) if self.calibration else 1.0)

    def target(self, q: int, B: int, L: int, scenario: int, engine: str | None = None) -> float:
        return self.forward(Pass(B, q, L), scenario, engine or self.setting.engine_names()[0])

    def mtp(self, q: int, B: int, L: int, scenario: int, engine: str | None = None) -> float:
        return self.draft_head("mtp", q, B, L, scenario, engine)

    def draft_head(self, head: str, q: int, B: int, L: int, scenario: int, engine: str | None = None,
                   draft_vocab: int = EAGLE3_DRAFT_VOCAB) -> float:
        """One pass of a draft head (`mtp`: the model's MTP module, which it must have; `eagle`, `eagle3`) over q
        tokens of B sequences at context L."""
        if head == "mtp" and self.cfg.mtp_layers < 1:
            raise ConfigError(f"drafter=mtp: model {self.cfg.name!r} has no MTP module (mtp_layers=0)")
        eng = engine or self.setting.engine_names()[0]
        return self._scale(B) * self.pass_detail(Pass(B, q, L), scenario, eng, head, draft_vocab)["seconds"]

    def max_running(self, engine: str, tokens_per_seq: int, mean_tokens: int | None = None,
                    spec: "SpecDecode | None" = None) -> int | None:
        """The most sequences of `tokens_per_seq` tokens whose KV fits the engine's pool on every rank
        (engines.yaml kv_pool: a share of the device memory for weights + KV, or of what the weights leave
        free for KV). An engine that states no pool (LMDeploy, llama.cpp, gpt-fast, HF eager: a cache that grows
        with its sequences, or no pool read) is bounded by the memory itself, HEADROOM of it for weights + KV
        (`memory_check`'s rule for it), at the sequences' mean size (`mean_tokens`, else tokens_per_seq: their
        caches grow together, the last steps' overflow left out). None where the device has no memory size; 0
        where the weights leave no room for one sequence (the layout does not fit: `serve` then runs one at a
        time, and the card says so). With speculative decoding (`spec`) its drafter is held too, as
        `memory_check` holds it: the MTP module's or an EAGLE head's weights and KV, or a draft model's, replicated on
        every rank."""
        eng = self._eng(engine, 1)
        mem = self.device.usable_mem_bytes()
        if not mem:
            return None
        split, own = self.layout.batch_split, eng.kv_pool_fraction is not None
        draft = spec.draft if spec is not None else None
        w, kv = held_per_rank(self.cfg, self.layout, self.dtype, split, tokens_per_seq if own else
                              (mean_tokens or tokens_per_seq), spec is not None and spec.drafter == "mtp",
                              pool_rule(self.cfg, eng), draft.cfg if draft else None, draft.dtype if draft else None,
                              pool_rule(draft.cfg, eng) if draft else "window",
                              spec.drafter if spec is not None and spec.drafter in EAGLE_HEADS else "",
                              spec.draft_vocab if spec is not None else EAGLE3_DRAFT_VOCAB, not eng.embedding_on_host)
        room = kv_pool_bytes(eng, mem, w) if own else HEADROOM * mem - w
        return max(0, int(room // kv) * split) if kv > 0 else None

    def band(self, B: int, spec: bool = False) -> float:
        """The measured error band (log half-width) of a prediction of B sequences (docs/planning.md)."""
        return band_for(band_categories(self.cfg, self.dtype, self.layout, B, spec), self.setting.band_table())

    def over_engines(self, fn, at: tuple[float, float] | None = None, spec: bool = False) -> dict:
        """fn(scenario, engine) -> seconds, as one interval (the engine's, or spanning the profiles), widened
        by the measured error band of its categories (B of `at`; `spec`: a speculative round).
        Calibrated: the typical value rescaled, the interval what the points leave at `at` = (B, L),
        widening back to that (banded) interval away from them."""
        prior = widen(span({e: interval(lambda s: fn(s, e)) for e in self.setting.engine_names()}),
                      self.band(at[0] if at is not None else 1, spec))
        if self.calibration is None:
            return prior
        t = statistics.median(fn(1, e) for e in self.setting.engine_names())
        B, L = at if at is not None else (math.inf, math.inf)  # unknown shape: the priors' interval
        return self.calibration.interval(t, prior, B, L)

    def itl(self, B: int, L: int) -> dict:
        """Inter-token latency of plain decode (s), as an interval."""
        return self.over_engines(lambda s, e: self.target(1, B, L, s, e), (B, L))

    def step_terms(self, B: int, L: int, engine: str, scenario: int = 1) -> dict[str, float]:
        """Where a plain decode step's time goes (s), by term of `pass_seconds` (dense GEMMs, routed experts,
        elementwise kernels, attention, the KV cache copies of an engine that makes them, LM head, launch floors, the
        engine's host time, the device's cost per sequence, collectives), for one engine at one scenario (typical by
        default), scaled as `forward` scales the pass (pipeline stages, a calibration): they sum to
        `target(1, B, L, scenario, engine)`."""
        f = self._scale(B) * self.layout.pp
        return {k: f * v for k, v in self.pass_detail(Pass(B, 1, L), scenario, engine)["terms"].items()}

    def round_seconds(self, k: int, B: int, L: int, scenario: int, engine: str | None = None, drafter: str = "mtp",
                      draft: "WhatIf | None" = None, prefill: int = 0, prefill_context: float = 0.0,
                      own_scenario: int | None = None, draft_vocab: int = EAGLE3_DRAFT_VOCAB, width: int = 1,
                      verify_tokens: int | None = None) -> float:
        """One speculative round: verify k+1 positions of B sequences (with `prefill` prompt tokens of new
        requests chunked into the same pass), the round's overhead (priors.yaml spec_round_overhead_us) and
        k chained drafts, the first re-reading the k+1 verified positions (as roofline.analysis.predict
        prices it; an engine that measures its round's own time and its draft passes' beyond their GPU time,
        engines.yaml spec_round_us / spec_draft_pass_us, in place of priors.yaml spec_round_overhead_us for a round
        with a drafter's forward passes, and an n-gram round's too where the profile says so, `rounds: all`): the MTP
        module (`mtp`), an EAGLE head (`eagle`, `eagle3`: chained as MTP is, the first pass over
        the k+1 verified positions, as vLLM's EagleProposer and SGLang's EAGLE worker run it; `draft_vocab`: EAGLE-3's
        LM head rows), a draft model replicated on every rank (`draft_model`, its
        WhatIf), or n-gram lookup (`ngram`: the host's scan of each sequence's tokens between GPU steps, priors.yaml
        ngram_lookup_ns_per_token x the rank's sequences x their context). own_scenario: the scenario
        of the priors only a round carries (its overhead and its drafts), where it differs from the
        verification pass's (a speedup's interval, `spec_speedup`). A draft tree (`width` > 1, SGLang's EAGLE topk,
        as its EAGLE worker runs one: the head over the accepted positions, then a pass of the top `width` tokens of
        each sequence for every further step) drafts `width` tokens a sequence in each pass after the first, and the
        round verifies `verify_tokens` a sequence (its num_draft_tokens; None: k + 1, a chain)."""
        eng = engine or self.setting.engine_names()[0]
        own = scenario if own_scenario is None else own_scenario
        check_tree(k, width, verify_tokens, drafter)
        r = self.forward(Pass(B, verify_tokens or k + 1, L, prefill, prefill_context), scenario, eng)
        prof = self._eng(eng, own)  # the engine's own round and draft-pass times, where engines.yaml measures them
        own_round = drafter != "ngram" or prof.spec_round_ngram  # vLLM's: drafted rounds; SGLang's: all (rounds:)
        r += (prof.spec_round_s if prof.spec_round_s is not None and own_round else
              K.pick(load_priors()["spec_round_overhead_us"], own, "priors.spec_round_overhead_us") * 1e-6)
        passes = k * prof.spec_draft_pass_s  # a drafter's forward passes (not n-gram's lookup)
        if drafter in HEAD_DRAFTERS:
            return r + passes + sum(self.draft_head(drafter, k + 1 if i == 1 else width, B, L + i - 1, own, eng,
                                                    draft_vocab) for i in range(1, k + 1))
        Br = math.ceil(B / self.layout.batch_split)  # the sequences one rank drafts for
        if drafter == "draft_model":
            if draft is None:
                raise ConfigError("drafter=draft_model: no draft model given")
            return r + passes + sum(draft.target(k + 1 if i == 1 else 1, Br, L + i - 1, own, eng)
                                    for i in range(1, k + 1))
        if drafter == "ngram":
            ns = K.pick(load_priors()["ngram_lookup_ns_per_token"], own, "priors.ngram_lookup_ns_per_token")
            return r + ns * 1e-9 * Br * L
        raise ConfigError(f"drafter={drafter!r}: allowed {WHATIF_DRAFTERS}")

    def spec_speedup(self, alphas: tuple[float, float, float], k: int, B: int, L: int, drafter: str = "mtp",
                     draft: "WhatIf | None" = None, draft_vocab: int = EAGLE3_DRAFT_VOCAB, width: int = 1,
                     verify_tokens: int | None = None) -> dict:
        """tau · T(1) / R for an i.i.d. acceptance alpha per scenario (optimistic alpha first), R the round of
        `drafter` (round_seconds: the MTP module, a draft model's WhatIf `draft`, or n-gram lookup);
        k = 0 is plain decode (1.0 for any model).

        A ratio is not monotone in the priors its numerator and denominator share (kernel efficiencies,
        launch floors, the engine's step time: all-optimistic shrinks T(1) and R together), so its interval
        is not the diagonal of the scenarios: the inputs only a round carries (the acceptance, the round
        overhead, the drafts' passes: their kernel priors priced on their own) take their own end, and the
        priors T(1) and the verification share the scenario (of three) that moves the ratio furthest that
        way; typical is every prior typical. The interval is then widened by the measured error band of its
        categories (`band`, speculative among them)."""
        from roofline.model.speculation import tau_iid
        if k == 0:
            return dict.fromkeys(SCENARIOS, 1.0)

        def ratio(i, j, e):  # i: the round's own priors' scenario, j: the shared priors'
            return tau_iid(alphas[i], k) * self.target(1, B, L, j, e) / self.round_seconds(
                k, B, L, j, e, drafter, draft, own_scenario=i, draft_vocab=draft_vocab, width=width,
                verify_tokens=verify_tokens)
        s = {e: dict(optimistic=max(ratio(0, j, e) for j in range(3)), typical=ratio(1, 1, e),
                     pessimistic=min(ratio(2, j, e) for j in range(3)))
             for e in self.setting.engine_names()}
        prior = dict(optimistic=max(v["optimistic"] for v in s.values()),
                     typical=statistics.median(v["typical"] for v in s.values()),
                     pessimistic=min(v["pessimistic"] for v in s.values()))
        return widen(prior, self.band(B, spec=True))

    def draft_what_if(self, draft: ModelConfig) -> "WhatIf":
        """A draft model's what-if beside this target: its preset on the same device, precision, engine and
        calibration scale, replicated on every rank (one device each: vLLM runs it at tp = 1 of the target's)."""
        return WhatIf(draft, self.device, self.dtype, Layout(), self.setting, self.scale)

    def experts_touched(self, B: int, q: int = 1) -> float:
        return experts_touched_busiest_rank(self.cfg, B * q, self.layout.ep) if self.cfg.is_moe else 0.0


class Ramp(NamedTuple):
    """A fixed-length wave's ramp (serve): R prefill steps; the step `half` that completes the median request's prompt;
    the ramp steps it decodes in after that (`in_ramp`) or waits in without decoding (`paused`, prefill_first);
    `means`: (sequences decoding, their context, prompt tokens) of an average ramp step over steps 1..half, over its
    ramp steps after its first token, and over the whole ramp."""
    R: int
    half: int
    in_ramp: int
    paused: int
    means: tuple


def random_dataset_lengths(input_len: int, output_len: int, range_ratio: float = 1.0,
                           field: str = "range_ratio") -> tuple[int, int, bool]:
    """(input, output, staggered) that `serve` prices a random dataset's run at. `range_ratio` r < 1 (vLLM's and
    SGLang's bench_serving --random-range-ratio as they drew lengths in 2025: each request's lengths uniform integers
    in [int(r·L), L]): the mean lengths, L·(1 + r)/2, with staggered requests (they finish one by one and their
    replacements' prompts ride in the running decode steps); 1: the stated lengths, fixed. `field` names the key in
    the error."""
    r = range_ratio
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r <= 1.0:
        raise ConfigError(f"{field}={r!r}: allowed a number in (0, 1]")
    if r == 1.0:
        return input_len, output_len, False
    return max(1, round(input_len * (1 + r) / 2)), max(1, round(output_len * (1 + r) / 2)), True


V0_LONG_CONTEXT = 32768  # vLLM V0's _set_default_args_v0: use_long_context = max_model_len > 32768


def v0_chunked_prefill(cfg: ModelConfig, device: Datasheet, spec=None) -> bool:
    """Whether vLLM V0 runs `cfg` with chunked prefill by default (engines.yaml chunked_prefill v0_default: its
    _set_default_args_v0): off for an MLA model, on for a context beyond 32K tokens on CUDA (not ROCm) without sliding
    windows or speculation, else off. A run that sets --enable-chunked-prefill gives its own step_batching."""
    return (not cfg.is_mla and cfg.max_context > V0_LONG_CONTEXT and device.vendor == "nvidia"
            and cfg.local_kind != "sliding" and spec is None)


def deployment_wide(w: WhatIf, e: str, v: int | None) -> int | None:
    """A cap of engine `e` (on running sequences, on a step's prompt tokens) for the whole deployment of `w`: a rank's
    times its attention-DP ranks where each schedules its own batch (engines.yaml dp_attention_limits: per_rank), else
    as it is (the engine divides it among its ranks)."""
    return v * w.layout.batch_split if v is not None and w._eng(e, 1).dp_limits == "per_rank" else v


def engine_default(w: WhatIf, e: str, tiers: str, client: str = "server") -> int | None:
    """Engine `e`'s default setting `tiers` (an Engine field read from engines.yaml device tiers: prefill_chunk_tiers,
    max_running_tiers, spec_max_running_tiers) for `w`'s device and the client, deployment-wide (deployment_wide);
    None where the engine states none."""
    tier = engines_mod.tier_value(getattr(w._eng(e, 1), tiers), w.device.usable_mem_bytes(), w.device.key, client)
    return deployment_wide(w, e, tier)


def sequence_cap(w: WhatIf, e: str, spec: bool = False, max_running: int | None = None,
                 client: str = "server") -> int | None:
    """The most sequences engine `e` keeps running on `w`'s deployment by its caps alone (its KV pool apart:
    WhatIf.max_running): the run's own cap `max_running` (--max-num-seqs, --max-running-requests, max_batch_size)
    where given, else the engine's defaults for the device and client (engines.yaml max_running_seqs; with
    speculative decoding `spec` also spec_max_running_seqs, SGLang's 48), each read deployment-wide
    (deployment_wide); None: no cap."""
    if max_running:
        return deployment_wide(w, e, max_running)
    own = [engine_default(w, e, t, client) for t in ("max_running_tiers",) + (("spec_max_running_tiers",) * spec)]
    return min((c for c in own if c is not None), default=None)


def planned_cap(w: WhatIf, spec: bool = False, max_running: int | None = None) -> int | None:
    """The most sequences a plan may give one replica of `w` (capacity's batches, an HTTP server's deployment):
    the named engine's sequence_cap, with no engine named the largest of the spanned profiles' (None where one sets
    none: some engine runs any batch)."""
    caps = [sequence_cap(w, e, spec, max_running) for e in w.setting.engine_names()]
    return None if any(c is None for c in caps) else max(caps)


def serve(w: WhatIf, input_len: int, output_len: int, concurrency: int, num_prompts: int | None = None,
          chunk_tokens: int | None = None, staggered: bool = False, spec: SpecDecode | None = None,
          static_batch: bool = False, client: str = "server", step_batching: str | None = None,
          max_running: int | None = None) -> dict:
    """A finite benchmark run as `vllm bench serve --max-concurrency C --num-prompts N` measures it
    (every request ready at t = 0): TTFT, ITL median and p90, end-to-end latency, output tok/s and
    tok/s per GPU, each an interval. Prompts are prefilled in chunks of `chunk_tokens` (chunked
    prefill, compute-bound; None: each engine's default for the device and the `client`, the run reaching
    it through its HTTP server or its offline entry point, engines.yaml prefill_chunk_tokens; vLLM V0 without
    chunked prefill, whole prompts up to the model's context, engines.yaml chunked_prefill; else
    priors.yaml chunked_prefill_tokens); C sequences decode at mean context input + output/2.

    How a prompt chunk shares a step with the decodes is the engine's (engines.yaml step_batching): `shared` (vLLM
    V1, TensorRT-LLM) one step whose token budget counts both, the chunk beside b decodes the budget less b (1 + k
    tokens each with k drafts); `prefill_first` (SGLang, vLLM V0 without chunked prefill, and any static batch) the
    prompts in steps of their own, before the decodes; `beside` (the others) the chunk whole beside the decodes.
    `step_batching` (one of those) replaces every engine's: a run configured otherwise than its engine's default
    (vLLM V0 with chunked prefill on: `shared`).

    Fixed lengths (staggered=False, what a random dataset of fixed input / output lengths and a static
    batch run): the C requests of a wave finish together, so every wave is a ramp of R = C·input/chunk
    prefill steps (whole chunks but the last, which takes what is left), which carry the decodes of the prompts
    already prefilled and not yet done (step j: min(C, (j − 1)·chunk/input) sequences less those that finished their
    output, at about `input` cached tokens, priced at their mean over the steps in question; a shared budget's chunk
    less their mean over the wave; `prefill_first`: none, the first prompts wait for the last), then plain
    decode steps. The median request (the ceil(C/2)-th prompt) waits the ceil(ceil(C/2)·input/chunk) ramp steps that
    complete its prompt for its first token (TTFT: about R/2 for many requests, all R for one), decodes in the ramp
    steps left (a short output ends inside the ramp) and the rest in plain steps; a wave lasts R ramp steps +
    (output − 1) plain ones.
    Staggered lengths (staggered=True): after the first wave, requests finish one by one and their
    replacements' prompts ride in the running decode steps (`prefill_first`: in steps of their own beside them),
    C·input·tau/output·(N − C)/N prompt tokens per step on average. A decode step that carries prompts holds those
    that arrived since the step before (C·tau/output a step), at least one whole prompt (a longer one: a budget's
    chunk of it) and at most the budget, so the share of the steps that carry one is the tokens over that; a
    request's TTFT is that step, and the ITL median (p90) the mixed step when at least half (a tenth) of the steps
    carry a prompt (`prefill_first`: prompt steps of min(budget, C·input) tokens; steady_chunk says why). Where the
    prompts need more steps than the decodes ((N − C)·input/chunk > N·output/(C·tau): prefill-bound), the run
    lasts the prompts' steps, each carrying a chunk beside the sequences decoding at the time (C x its decode steps /
    its prompt steps: the slots wait for their prompts most of the time), and a new request's first token waits for the
    C·input/chunk − output/tau chunks queued ahead of it (Little's law: the client keeps C requests in flight).

    Speculative decoding (`spec`): every decode step is a round (WhatIf.round_seconds: verify k+1
    positions, k drafts, the round overhead) that emits tau tokens per sequence on average, so a request
    needs (output − 1)/tau rounds after its first token and a ramp step decodes tau tokens of each
    running request. ITL median and p90 are then the gap between two rounds (tokens arrive tau at a
    time), the mean ITL (TPOT) that gap over tau. Every step's interval is widened by the measured
    error band of the run's categories (`WhatIf.band` at B = concurrency); calibrated (`w.calibration`),
    the plain decode steps take instead the interval the points leave at B = C and the run's mean context
    (`Calibration.interval`), while the steps that carry prompt chunks keep the banded priors'.

    The engine's KV pool (`WhatIf.max_running`, engines.yaml kv_pool) and its default cap on running
    sequences (engines.yaml max_running_seqs, vLLM's max_num_seqs; with `spec` its own cap where it sets one,
    spec_max_running_seqs: SGLang's 48) bound the sequences it keeps running: C = min(concurrency, the cap, the
    sequences whose KV at input + output tokens fits); `max_running`, the run's own cap (--max-num-seqs,
    --max-running-requests, max_batch_size), replaces the engine's default ones. Under attention data
    parallelism an engine whose ranks each schedule their own batch (engines.yaml dp_attention_limits: per_rank,
    TensorRT-LLM, vLLM) runs its default cap and prefill chunk on every rank, the deployment that many times
    them; one that divides them among its ranks (whole, SGLang) runs them once. A capped run
    goes in waves of C (fixed lengths: the last wave the N - (waves - 1)·C requests the full ones leave, its ramp and
    steps at that batch); the requests beyond them wait in the engine's queue, and the median request's TTFT
    and end-to-end latency include the waves before it. `running` is that C (per engine, the span).
    static_batch=True: a benchmark that allocates the whole batch's KV itself (TensorRT-LLM's
    gptSessionBenchmark static batching) runs every sequence at once: no pool cap."""
    for name, v, lo in (("input_len", input_len, 1), ("output_len", output_len, 1), ("concurrency", concurrency, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"{name}={v!r}: allowed integers >= {lo}")
    engines_mod.check_client(client)
    N = num_prompts or concurrency
    prior_chunk = int(load_priors()["chunked_prefill_tokens"]["value"])

    profiles = {e: w._eng(e, 1) for e in w.setting.engine_names()}  # each engine's profile, read once for the run
    v0 = {e for e, eng in profiles.items() if eng.chunked_prefill_v0}  # vLLM V0: chunked prefill by its default rule,
    v0_chunked = v0_chunked_prefill(w.cfg, w.device, spec)  # one answer for the model, device and drafts

    def engine_chunk(e) -> int | None:  # V0 without chunked prefill: whole prompts up to the model's context in a step
        if e in v0 and not v0_chunked:  # (max_num_batched_tokens = max(max_model_len, 2048))
            return max(w.cfg.max_context, prior_chunk)
        return engine_default(w, e, "prefill_chunk_tiers", client)

    chunks = {e: chunk_tokens or engine_chunk(e) or prior_chunk for e in w.setting.engine_names()}
    I, O = input_len, output_len
    L = I + O // 2
    tau = spec.tau() if spec is not None else 1.0

    # an engine whose decode attends over the whole static cache it allocated (gpt-fast: prompt + output, and a round's
    # drafts, rounded up to a multiple of 8) reads and multiplies that length at every step, masked or not
    alloc = 8 * math.ceil((I + O + (spec.k + 1 if spec is not None else 0)) / 8)

    allocated = {e for e, eng in profiles.items() if eng.kv_reads_allocated}

    def step(B, Lc, pre, s, e):  # one decode step (a round with spec) of B sequences at context Lc + `pre` prompt tokens
        if Lc and e in allocated:
            Lc = alloc
        if spec is None:
            return w.forward(Pass(B, 1, Lc, pre, I / 2), s, e)
        return w.round_seconds(spec.k, B, Lc, s, e, spec.drafter, spec.draft, pre, I / 2, draft_vocab=spec.draft_vocab,
                               width=spec.width, verify_tokens=spec.verify_tokens)

    # the engine's KV pool and its own caps: the sequences it keeps running (the rest queue); one figure per engine
    # (with speculative decoding an engine's own cap where it sets one: SGLang's 48 unless --max-running-requests)
    def cap(e) -> int | None:  # the KV pool's, and the run's own cap (read as its engine reads it) or else the engine's
        own = (w.max_running(e, I + O, L, spec), sequence_cap(w, e, spec is not None, max_running, client))
        return None if static_batch else min((c for c in own if c is not None), default=None)
    caps = {e: cap(e) for e in w.setting.engine_names()}

    q = w.band(concurrency, spec is not None)  # the measured error band of the run's categories

    def running(e):
        return concurrency if caps[e] is None else min(concurrency, max(caps[e], 1))

    # how each engine's steps hold a prompt chunk (engines.yaml step_batching); a static batch prefills all its prompts
    # before its first decode step
    engines_mod.run_scheduling({"step_batching": step_batching}, "")  # a caller's own batching, checked by name
    batchings = {e: "prefill_first" if static_batch else step_batching or (
        ("shared" if v0_chunked else "prefill_first") if e in v0 else eng.step_batching)
        for e, eng in profiles.items()}

    def budget_chunk(e, b) -> float:
        """Prompt tokens a step carrying b decodes prefills: the engine's budget, less one token per decode (1 + k
        with k drafts) where one budget holds both (`shared`), floored at an eighth of it (a budget the decodes
        nearly fill: vLLM keeps it >= max_num_seqs, so only a run's own smaller setting reaches the floor)."""
        budget = chunks[e]
        if batchings[e] != "shared":
            return float(budget)
        per_decode = (spec.verify_tokens or spec.k + 1) if spec is not None else 1
        return max(budget - b * per_decode, budget / 8)

    def steady_chunk(e, C) -> float:
        """Prompt tokens a decode step of a staggered run's steady state carries where it carries any: the prompts
        that arrived since the step before (C·tau/O requests finish a step and are replaced, I tokens each), at least
        one prompt (a longer one: a budget's chunk of it), at most the budget (prefill-bound: every step a full
        chunk). An engine that runs prompts in steps of their own (`prefill_first`) keeps them batched, min(budget,
        C·I) tokens a step (as its mixed step was priced before; its share of the steps now counts those tokens, not a
        whole budget's): priced one prompt a step, SGLang's DeepSeek-R1 calibration rows (InferenceX,
        1024 / 1024, 4-64 requests) come out up to 20% slow on TPOT and 48% fast on TTFT at once, so the eager
        prefill host floor a prompt step pays there (engines.yaml eager_prefill_host_us_per_layer, read from a 2025
        PR) is not what those 2026 releases pay; not settled, not changed."""
        budget = budget_chunk(e, C)
        if batchings[e] == "prefill_first":
            return min(budget, C * I)
        return min(budget, max(min(I, budget), C * tau * I / O))

    def ramp(e, C=None) -> Ramp:
        """A wave's ramp: R steps that each prefill `chunk` prompt tokens (chunk / I prompts a step) beside the decodes
        of the prompts already prefilled; the step `half` that completes the median request's prompt; the ramp steps
        it decodes in after it (`in_ramp`); the (sequences decoding, their context, prompt tokens) of an average ramp
        step (every step a whole chunk but the wave's last, which takes what is left of the C prompts) over
        steps 1..half (the median request's TTFT), half+1..half+in_ramp (its tokens in the ramp) and 1..R (the wave);
        the ramp steps the median request waits without decoding (`paused`, priced as the second average: steps
        half+1..R).
        Step j carries the prompts completed before it that have not yet decoded their n = ceil((O - 1) / tau)
        steps, min(C, (j - 1) p) - min(C, (j - 1 - n) p) for p = chunk / I prompts a step, at about I cached tokens;
        fewer than one on average prices one sequence at context 0 (the prompt's own first decode). A `shared`
        budget's chunk is the budget less the ramp's mean decodes (`budget_chunk`, from a first pass at the whole
        budget: an approximation of a chunk that shrinks as the ramp fills); `prefill_first` runs the ramp's prompts
        alone (no decodes beside them), and the median request waits the R - half steps after its first token.
        C: the wave's sequences (the engine's running ones unless given: a fixed-length run's last, partial wave)."""
        C = running(e) if C is None else C
        n_dec = math.ceil((O - 1) / tau)

        def shape(chunk, decoding=True):
            R, half = math.ceil(C * I / chunk), math.ceil(math.ceil(C / 2) * I / chunk)
            in_ramp = min(R - half, n_dec) if decoding else 0
            p = chunk / I

            def mean(j0, j1):  # steps j0+1 .. j1: (decoding sequences, their context, prompt tokens) of an average one
                pre = (min(j1 * chunk, C * I) - min(j0 * chunk, C * I)) / (j1 - j0) if j1 > j0 else chunk
                if not decoding:
                    return 1, 0.0, pre
                b = (sum(min(C, p * (j - 1)) - min(C, p * max(0, j - 1 - n_dec)) for j in range(j0 + 1, j1 + 1))
                     / (j1 - j0) if j1 > j0 else 0.0)
                return (max(1, round(b)), float(I), pre) if b >= 1 else (1, 0.0, pre)
            paused = 0 if decoding else R - half
            after_first = mean(half, half + in_ramp) if decoding else mean(half, R)  # its ramp steps after its prompt
            return Ramp(R, half, in_ramp, paused, (mean(0, half), after_first, mean(0, R)))

        if batchings[e] == "prefill_first":
            return shape(float(chunks[e]), decoding=False)
        first = shape(float(chunks[e]))
        if batchings[e] != "shared":
            return first
        b, ctx, _ = first.means[2]  # the wave's mean ramp step
        b_mean = b if ctx else 0  # (one sequence at context 0 stands for none decoding)
        return shape(budget_chunk(e, b_mean))

    def steps(e, rp, C=None) -> list[tuple[float, ...]]:
        """Per scenario, the run's step times: plain decode of the C running sequences, the same carrying a prompt
        chunk (`prefill_first`: the chunk's own step, then the decode step), and the three average ramp steps of
        `ramp` (`rp`: a prompt chunk + the decodes of the prompts already prefilled); each at its band-widened end (the
        typical untouched), the plain decode step at a calibration's interval where points of the deployment determine
        it (Calibration.interval at B = C, L). C: as `ramp`'s."""
        C = running(e) if C is None else C
        mixed = steady_chunk(e, C) if staggered else min(budget_chunk(e, C), C * I)  # a decode step's prompt tokens
        # a prefill-bound staggered run's step: a chunk beside the decodes its slots have at once, their N·O/tau
        # decode steps spread over its prompts' steps (where it is not prefill-bound, or the lengths are fixed: all C,
        # the mixed step's own pass)
        refill = refill_steps(e, C) if staggered else 0.0
        busy = min(C, max(1, round(C * staggered_steps(C) / refill))) if refill else C
        kinds = [(C, L, 0), (C, L, mixed)] + list(rp.means) + [(busy, L, mixed)]

        def price(s, b, ctx, pre):
            if pre and batchings[e] == "prefill_first" and ctx:  # the prompts' step alone, then the decodes'
                return step(1, 0, pre, s, e) + step(b, ctx, 0, s, e)
            return step(b, ctx, pre, s, e)
        raw = [tuple(price(s, b, ctx, pre) for b, ctx, pre in kinds) for s in range(3)]
        ivs = [widen(interval(lambda s, i=i: raw[s][i]), q) for i in range(len(kinds))]
        if w.calibration is not None:
            ivs[0] = w.calibration.interval(ivs[0]["typical"], ivs[0], C, L)
        return [tuple(iv[name] for iv in ivs) for name in SCENARIOS]

    def staggered_steps(C) -> float:
        """The decode steps of N requests, C at a time, replaced one by one: N / C of a slot's requests each (not a
        whole number of waves: a run of N = 6 C + 1 is not seven waves long)."""
        return N / C * O / tau

    def refill_steps(e, C) -> float:
        """The steps the refills' prompts need, one chunk a step beside the C decodes."""
        return max(N - C, 0) * I / budget_chunk(e, C)

    def wave_seconds(rp, at_s) -> float:  # a fixed-length wave: its ramp steps, then its plain decode steps
        return rp.R * at_s[4] + (O - 1) / tau * at_s[0]

    def per(s, e, at, rp, tail=None):
        """One scenario's figures of the run; `tail` = (ramp, steps) of a fixed-length run's last, partial wave (the
        N - (waves - 1)·C requests the full waves leave, priced at their own batch), else None."""
        C, budget = running(e), chunks[e]
        chunk = budget_chunk(e, C)  # a decode step's prompt tokens beside the C decodes
        alone = batchings[e] == "prefill_first"
        waves = math.ceil(N / C)
        R, half, in_ramp, paused = rp.R, rp.half, rp.in_ramp, rp.paused
        refill = refill_steps(e, C)  # steps the refills' prompts need, one chunk a step
        carrying = max(N - C, 0) * I / steady_chunk(e, C) if staggered else 0.0  # steps carrying them, as they arrive
        frac = min(1.0, carrying / (N * O / (C * tau)))  # decode steps (rounds) carrying a prompt
        plain, mixed, first, late, whole, busy = at[s]  # ramp steps: to the median's first token, after it, the wave's
        queued = (math.ceil(concurrency / 2) - 1) // C  # waves the median request of a capped run waits in the queue
        if staggered and waves > 1:
            slot_steps = staggered_steps(C)
            if not alone and refill > slot_steps:  # prefill-bound: each step a chunk beside the decodes there are
                mixed = busy
            mean = (1 - frac) * plain + frac * mixed  # per step (round)
            # prefill-bound (the prompts need more steps than the decodes): every step carries a chunk, and a new
            # request waits for the C·I/chunk - O/tau prompt chunks queued ahead of it (Little's law)
            wait = max(math.ceil(I / chunk), C * I / chunk - O / tau)
            ttft = wait * (whole if alone else mixed)  # prefill_first: its prompt's steps alone (`whole`)
            e2e = ttft + (O - 1) / tau * mean
            itl50, itl90 = (mixed if frac >= 0.5 else plain), (mixed if frac > 0.1 else plain)
            total = R * whole + (slot_steps * plain + refill * whole if alone  # prompts' steps and decodes' apart
                                 else max(slot_steps, refill) * mean)
            mean_itl = mean / tau
            wave = e2e  # one request's stay: what a queued one waits per wave ahead of it
        else:
            wave = wave_seconds(rp, at[s])
            after = max(O - 1 - in_ramp * tau, 0.0) / tau  # its steps after the ramp
            mean_itl = ((paused + in_ramp) * late + after * plain) / max(O - 1, 1)  # prefill_first: in_ramp 0, paused
            ttft = half * first
            e2e = ttft + (paused + in_ramp) * late + after * plain  # a short output ends inside the ramp
            itl50 = late if in_ramp >= (in_ramp + after) / 2 else plain
            itl90 = late if in_ramp > 0.1 * (in_ramp + after) else plain
            # the last wave runs its own, smaller batch: its ramp and steps, not the full wave's
            total = waves * wave if tail is None else (waves - 1) * wave + wave_seconds(tail[0], tail[1][s])
        return dict(ttft_s=ttft + queued * wave, itl_s=itl50, itl_p90_s=itl90, itl_mean_s=mean_itl,
                    e2e_s=e2e + queued * wave, output_tok_s=N * O / total, running=float(C),
                    prefill_chunk_tokens=float(budget))

    out = {}
    for e in w.setting.engine_names():
        rp = ramp(e)  # once per engine: its means sum over the ramp's steps
        at = steps(e, rp)
        C = running(e)
        last = N - (math.ceil(N / C) - 1) * C  # a fixed-length run's last wave: what the full waves leave
        tail = None
        if not staggered and N > C and last < C:
            rl = ramp(e, last)
            tail = (rl, steps(e, rl, last))
        rows = [per(s, e, at, rp, tail) for s in range(3)]
        out[e] = {k: interval(lambda s: rows[s][k]) for k in rows[0]}
    return span_run(out, w.layout.devices)


def span_run(per_engine: dict[str, dict], devices: int) -> dict:
    """A priced run's metrics over engine profiles ({engine: {metric: interval}}), each spanned (`span`), output
    tokens/s with its optimistic end the largest (faster is higher), and tokens/s per GPU from it."""
    res = {}
    for k in next(iter(per_engine.values())):
        res[k] = span({e: v[k] for e, v in per_engine.items()})
        if k == "output_tok_s":
            res[k] = dict(optimistic=max(v[k]["optimistic"] for v in per_engine.values()), typical=res[k]["typical"],
                          pessimistic=min(v[k]["pessimistic"] for v in per_engine.values()))
    res["tok_s_per_gpu"] = {k: v / devices for k, v in res["output_tok_s"].items()}
    return res


def meets_targets(run: dict, itl_target_ms: float, ttft_target_ms: float | None = None) -> tuple[bool, bool]:
    """(meets the ITL target, meets the TTFT target) of a `sustained` run at its typical priors: its mean inter-token
    latency (TPOT) and its median TTFT (no TTFT target: met). What both capacity plans ask of a batch."""
    return (run["itl_mean_s"]["typical"] * 1e3 <= itl_target_ms,
            ttft_target_ms is None or run["ttft_s"]["typical"] * 1e3 <= ttft_target_ms)


SUSTAINED_REQUESTS_PER_SLOT = 100  # a sustained service's requests per running slot: its first wave's share < 1%


def sustained(w: WhatIf, B: int, context: int, output: int, spec: SpecDecode | None = None,
              max_running: int | None = None) -> dict:
    """A replica serving requests of `context` prompt and `output` generated tokens, B at a time, without end: a
    `serve` run of staggered lengths and many requests (SUSTAINED_REQUESTS_PER_SLOT a slot), each finished request's
    successor prefilled in the running steps (chunked, compute-bound) as the engine batches them. What a capacity
    plan prices: its mean inter-token latency (TPOT, `itl_mean_s`: the decode steps and the steps that carry a prompt
    chunk), ITL median, TTFT and output tokens/s per device, each an interval; the prompts' prefill takes its share
    of the replica's time (decode-only B / ITL over-counts a prompt-heavy workload: 2048 + 256 tokens on a
    Llama-3.1-70B TP4 replica at B = 64, 2.5x). A prompt of 0 tokens is priced as 1."""
    return serve(w, max(context, 1), output, B, SUSTAINED_REQUESTS_PER_SLOT * B, staggered=True, spec=spec,
                 max_running=max_running)


def _rate_queue(N: int, rate: float, slots: int, stay: float) -> tuple[float, float]:
    """(the median request's wait for a running slot, the run's duration) of N requests arriving every 1 / rate
    seconds into `slots` slots, each staying `stay` seconds once admitted: request j is admitted at its arrival or when
    the request `slots` ahead of it leaves, whichever is later (first come, first served); the run ends when the last
    one leaves."""
    done = [0.0] * N
    waits = []
    for j in range(N):
        arrival = j / rate
        start = max(arrival, done[j - slots]) if j >= slots else arrival
        done[j] = start + stay
        waits.append(start - arrival)
    return statistics.median(waits), max(done)


BENCH_SERVE_NUM_PROMPTS = 1000  # vllm bench serve's and sglang.bench_serving's default --num-prompts


def serve_at_rate(w: WhatIf, input_len: int, output_len: int, rate: float, num_prompts: int | None = None,
                  max_concurrency: int | None = None, spec: SpecDecode | None = None, client: str = "server",
                  chunk_tokens: int | None = None, step_batching: str | None = None,
                  max_running: int | None = None) -> dict:
    """A finite run whose `num_prompts` requests (None: bench serve's default 1000) arrive at `rate` a second
    (`vllm bench serve --request-rate R`, a Poisson process; `--max-concurrency` = `max_concurrency`, None: no client
    cap) rather than all at t = 0 (`serve`).
    Priced by its mean (fluid) behaviour on `serve`'s staggered steady state (requests finish one by one and their
    successors' prompts ride in the running steps), per scenario:

    - the requests in flight, C, follow Little's law, C = rate x E2E(C), E2E(C) the end-to-end latency of `serve` at C
      running requests: the smallest whole C at which rate x E2E(C) <= C (at least 1: a request alone when they
      arrive slower than one finishes);
    - where even the most the engine keeps running (its KV pool and caps, `serve`'s `running`, or the client's cap)
      cannot keep up (rate x E2E(C_max) > C_max) the run saturates at C = C_max and the requests queue;
    - request j arrives at j / rate and is admitted at that time or when the request C ahead of it is done,
      whichever is later, and stays E2E(C) (`_rate_queue`): the median request's wait for a slot is added to its
      TTFT and end-to-end latency (0 below saturation) where it waits in the engine's queue; where the client's
      `max_concurrency` is the binding cap the request waits in the client, before its clock starts (bench_serve
      times a request from when it sends it), so its TTFT does not hold the wait;
    - the run lasts until its last request is done: output tokens/s = N x output / that (below saturation about
      rate x output: the arrivals bound it; saturated, the requests at the run's end stay E2E(C) though the batch thins
      out behind them: a little slow).

    Not priced: the Poisson process's spread about its mean (a busy moment runs more requests than C, a quiet one
    fewer: with ITL nearly flat in the batch at small B the mean is a fair price, not near saturation) and the
    first requests' empty engine (a run of few prompts at a low rate). Returns `serve`'s intervals and `in_flight`
    (C) and `queue_wait_s` (the median request's wait for a running slot, in the engine's queue or the client's).
    Priced engine by engine (each its own cap and steps), then spanned as `serve` spans them."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
        raise ConfigError(f"request_rate={rate!r}: allowed a number of requests a second > 0 (every request at once: "
                          "price it without a rate)")
    num_prompts = num_prompts or BENCH_SERVE_NUM_PROMPTS
    for name, v in (("num_prompts", num_prompts), ("max_concurrency", max_concurrency)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ConfigError(f"{name}={v!r}: allowed integers >= 1")
    if client == "offline":
        raise ConfigError(f"request_rate={rate!r} with client='offline': an offline entry point takes every request at "
                          "once; a rate is a server's client")
    per = {}
    for e in w.setting.engine_names():
        one = w if w.setting.engine == e else dataclasses.replace(w, setting=dataclasses.replace(w.setting, engine=e))
        per[e] = _serve_at_rate_one(one, input_len, output_len, rate, num_prompts, max_concurrency, spec, client,
                                    chunk_tokens, step_batching, max_running)
    return span_run(per, w.layout.devices)


def _serve_at_rate_one(w: WhatIf, input_len: int, output_len: int, rate: float, num_prompts: int,
                       max_concurrency: int | None, spec: SpecDecode | None, client: str, chunk_tokens: int | None,
                       step_batching: str | None, max_running: int | None) -> dict:
    """serve_at_rate for the one engine `w` prices (its setting names one), its arguments checked."""
    N, O = num_prompts, output_len
    runs: dict[int, dict] = {}

    def at(C: int) -> dict:  # the staggered steady state at C requests in flight (serve's, many requests a slot)
        if C not in runs:
            runs[C] = serve(w, input_len, output_len, C, SUSTAINED_REQUESTS_PER_SLOT * C, chunk_tokens=chunk_tokens,
                            staggered=True, spec=spec, client=client, step_batching=step_batching,
                            max_running=max_running)
        return runs[C]

    probe = at(max_concurrency or N)  # the most the engine keeps running of what the client sends
    rows = {}
    for s in SCENARIOS:
        engine_max = max(1, int(probe["running"][s]))
        c_max = engine_max if max_concurrency is None else min(engine_max, max_concurrency)
        client_queue = max_concurrency is not None and max_concurrency <= engine_max  # the client holds them back
        e2e = lambda C: at(C)["e2e_s"][s]  # noqa: E731
        saturated = rate * e2e(c_max) > c_max
        if saturated:
            C = c_max
        else:  # the smallest C with rate x E2E(C) <= C (E2E grows with C; bisection over whole requests)
            lo, hi = 1, c_max
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if rate * e2e(mid) <= mid else (mid + 1, hi)
            C = lo
        r = at(C)
        wait, total = _rate_queue(N, rate, C, r["e2e_s"][s])
        seen = 0.0 if client_queue else wait  # a request's clock starts when the client sends it
        rows[s] = dict(ttft_s=r["ttft_s"][s] + seen, itl_s=r["itl_s"][s], itl_p90_s=r["itl_p90_s"][s],
                       itl_mean_s=r["itl_mean_s"][s], e2e_s=r["e2e_s"][s] + seen, output_tok_s=N * O / total,
                       running=float(C), prefill_chunk_tokens=r["prefill_chunk_tokens"][s], in_flight=float(C),
                       queue_wait_s=wait)
    return {key: {s: rows[s][key] for s in SCENARIOS} for key in rows["typical"]}


def pool_rule(cfg: ModelConfig, eng=None):
    """What an engine's KV pool holds for the model's windowed layers (engines.yaml local_attention.pool: window, full
    or a fraction; not stated: full); 'window' for a model without such layers or without an engine named."""
    return dict(eng.local_pool).get(cfg.local_kind, "full") if cfg.local_kind and eng is not None else "window"


def kv_pool_bytes(eng, mem_bytes: float, weight_bytes: float) -> float:
    """The bytes an engine's paged KV pool gets on one device (engines.yaml kv_pool): its share of the memory
    for weights + KV less the weights (of: total), or its share of what the weights leave free (of: free)."""
    if eng.kv_pool_of == "total":
        return eng.kv_pool_fraction * mem_bytes - weight_bytes
    return eng.kv_pool_fraction * max(mem_bytes - weight_bytes, 0.0)


def held_per_rank(cfg: ModelConfig, layout: Layout, dtype: str, batch: int, tokens_per_seq: int,
                  with_mtp: bool = False, rule: str = "window", draft: ModelConfig | None = None,
                  draft_dtype: str | None = None, draft_rule: str = "window", eagle: str = "",
                  draft_vocab: int = EAGLE3_DRAFT_VOCAB, embedding_held: bool = True) -> tuple[float, float]:
    """(weight bytes, KV bytes) one rank holds for `batch` sequences of `tokens_per_seq`: the target's (its MTP
    module's with_mtp, an EAGLE head's with `eagle`, its windowed layers by the pool's `rule`, its embedding table
    unless the engine keeps it in host memory, `embedding_held` False) and a draft model's (in `draft_dtype`, else
    the target's), replicated on every rank with the rank's share of the batch (vLLM runs it at tp = 1 of the
    target's tp). One rule for `memory_check` and `WhatIf.max_running`."""
    w, kv = memory_per_rank(cfg, layout, dtype, batch, tokens_per_seq, with_mtp, rule, eagle, draft_vocab,
                            embedding_held)
    if draft is not None:
        dw, dkv = memory_per_rank(draft, Layout(), draft_dtype or dtype, math.ceil(batch / layout.batch_split),
                                  tokens_per_seq, pool_rule=draft_rule, embedding_held=embedding_held)
        w, kv = w + dw, kv + dkv
    return w, kv


def memory_check(cfg: ModelConfig, device: Datasheet, dtype: str, layout: Layout, batch: int, tokens_per_seq: int,
                 with_mtp: bool = False, draft: ModelConfig | None = None, headroom: float = HEADROOM,
                 mem_bytes: float | None = None, setting: Setting | None = None, eagle: str = "",
                 draft_vocab: int = EAGLE3_DRAFT_VOCAB) -> dict:
    """Per-device bytes of the plan (weights + KV; the MTP module's, an EAGLE head's and a draft model's weights and
    KV included when they draft) and whether they fit. The memory is `mem_bytes` (a user's) or the device's
    as the driver reports it (`Datasheet.usable_mem_bytes`). With a setting, the rule is that of the KV pool
    of its engine (engines.yaml kv_pool, as `WhatIf.max_running` and `serve` cap a run): the KV must fit what
    the pool leaves after the weights; no engine named, every profile's pool (a plan that one engine's pool
    refuses does not fit); an engine that states no pool, and no setting, headroom x the memory."""
    mem_bytes = mem_bytes or device.usable_mem_bytes()
    if not mem_bytes:
        raise ConfigError(f"device={device.key!r}: no datasheet memory size (give memory_gb)")

    @lru_cache(maxsize=None)
    def held_by(rule: str, draft_rule: str, embedding_held: bool) -> tuple[float, float]:  # (weights, KV) per rank
        return held_per_rank(cfg, layout, dtype, batch, tokens_per_seq, with_mtp, rule, draft, dtype, draft_rule,
                             eagle, draft_vocab, embedding_held)

    def held(eng=None) -> tuple[float, float]:  # as `eng` holds them: windowed layers by its pool, the embedding table
        return held_by(pool_rule(cfg, eng), pool_rule(draft, eng) if draft is not None else "window",
                       eng is None or not eng.embedding_on_host)

    named = engines_mod.profile(setting.engine, 1, setting.engines_path()) if setting is not None and setting.engine else None
    w, kv = held(named)
    rules = {}
    for name in (setting.engine_names() if setting is not None else []):
        eng = engines_mod.profile(name, 1, setting.engines_path())
        if eng.kv_pool_fraction is not None:
            of = "the memory" if eng.kv_pool_of == "total" else "what the weights leave free"
            w_e, kv_e = held(eng)
            rules[f"{name}'s KV pool, {eng.kv_pool_fraction:g} of {of}"] = kv_e <= kv_pool_bytes(eng, mem_bytes, w_e)
    if not rules or (setting is not None and setting.engine is None and len(rules) < len(setting.engine_names())):
        rules[f"{headroom:g} of the memory"] = w + kv <= headroom * mem_bytes
    rule = ("every engine profile's KV pool" if setting is not None and setting.engine is None
            else next(iter(rules)))
    if named is not None and named.embedding_on_host and not cfg.tie_embeddings:
        rule += f"; {named.name} keeps the embedding table in host memory"
    return dict(weights_GB=w / 1e9, kv_GB=kv / 1e9, mem_per_device_GB=(w + kv) / 1e9,
                device_mem_GB=mem_bytes / 1e9, fits=all(rules.values()), memory_rule=rule)


def unfit_note(layout_label: str, mem: dict, at: str = "") -> str:
    """What a what-if says when it prices a layout that `memory_check` refuses (`mem`; `at`: where, e.g.
    " even at B = 1, L = 1024"): priced all the same (a step's time does not depend on it), said."""
    return (f"{layout_label} does not fit{at}: {mem['weights_GB']:.1f} GB of weights + {mem['kv_GB']:.2f} GB of KV per "
            f"GPU of {mem['device_mem_GB']:.1f} GB ({mem['memory_rule']}); give more devices (tp=) or a smaller format "
            "(weights=)")


def smallest_layout(cfg: ModelConfig, device: Datasheet, dtype: str, batch: int, tokens_per_seq: int,
                    with_mtp: bool = False, max_devices: int = 64, headroom: float = HEADROOM,
                    setting: Setting | None = None) -> Layout | None:
    """The layout with the fewest devices whose per-rank weights + KV fit (`memory_check`: the setting's
    engine pool, else headroom × device memory; tp up to a node's 8, then pipeline stages); None when
    nothing up to max_devices fits."""
    for lay in candidate_layouts(cfg, max_devices):
        if memory_check(cfg, device, dtype, lay, batch, tokens_per_seq, with_mtp, headroom=headroom,
                        setting=setting)["fits"]:
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


def capacity(cfg: ModelConfig, device: Datasheet, dtype: str, context: int, output: int, itl_target_ms: float,
             target_tok_s: float, price_per_device_hour: float | None = None, alpha: float | None = None,
             k: int = 1, setting: Setting = Setting(), batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
             max_devices: int = 64, layouts: list[Layout] | None = None, scale: float = 1.0,
             calibration: Calibration | None = None, mem_bytes: float | None = None,
             drafter: str = "mtp", max_running: int | None = None,
             ttft_target_ms: float | None = None) -> list[dict]:
    """For every layout (default: every candidate): the largest batch of `batches` whose mean inter-token latency
    meets the ITL target (typical priors, with the interval) in a sustained service (`sustained`: the requests'
    prompts prefilled in the running steps, their time in the TPOT and the throughput; the ITL median and TTFT beside
    them; and its median TTFT within `ttft_target_ms` where given) that fits the device and the engine's cap on
    running sequences (planned_cap: `max_running`, the deployment's own --max-num-seqs, else the engine's defaults,
    SGLang's 48 with speculation; its `seq_cap`; a cap inside the batches' range is planned as a batch too), tokens/s
    per replica,
    devices for the target and the price per million tokens. alpha: also plan with speculation, k drafts of the
    preset's MTP module (drafter=mtp, a preset with one) or an EAGLE head (eagle | eagle3), its weights and KV in the
    memory check. A layout that fits at no batch is a row that says so. mem_bytes: the memory of one device (a
    user's memory_gb; None: the driver-reported size, as memory_check reads it)."""
    rows = []
    for lay in layouts or candidate_layouts(cfg, max_devices):
        w = WhatIf(cfg, device, dtype, lay, setting, scale, calibration)
        drafts = alpha is not None and (drafter in EAGLE_HEADS or (drafter == "mtp" and cfg.mtp_layers > 0))
        for spec in ([False, True] if drafts else [False]):
            best, fits_any, cap, capped = None, False, planned_cap(w, spec, max_running), False
            for B in sorted(set(batches) | ({cap} if cap and cap < max(batches) else set())):  # the cap: planned too
                if B % lay.batch_split:
                    continue
                if cap is not None and B > cap:  # the engine keeps no more running: the rest queue
                    capped = True
                    continue
                mem = memory_check(cfg, device, dtype, lay, B, context + output, spec and drafter == "mtp",
                                   mem_bytes=mem_bytes, setting=setting,
                                   eagle=drafter if spec and drafter in EAGLE_HEADS else "")
                if not mem["fits"]:
                    break
                fits_any = True
                run = sustained(w, B, context, output, SpecDecode(k, (alpha,), drafter) if spec else None, max_running)
                if all(meets_targets(run, itl_target_ms, ttft_target_ms)):
                    best = (B, run, mem)
            if best is None:
                within = f" within the engine's cap of {cap} running sequences" if capped else ""
                rows.append(dict(layout=lay.label(), devices_per_replica=lay.devices, speculative=spec, batch=None,
                                 seq_cap=cap, note=f"does not fit the device at any batch{within}" if not fits_any
                                 else f"no batch{within} meets the ITL target"
                                 + (" and the TTFT target" if ttft_target_ms is not None else "")))
                continue
            B, run, mem = best
            per_tok, tok_s = run["itl_mean_s"], run["output_tok_s"]  # generated tokens/s of one replica
            devices = {name: math.ceil(target_tok_s / v) * lay.devices for name, v in tok_s.items()}
            row = dict(layout=lay.label(), devices_per_replica=lay.devices, speculative=spec, batch=B, seq_cap=cap,
                       itl_ms=per_tok["typical"] * 1e3, itl_ms_optimistic=per_tok["optimistic"] * 1e3,
                       itl_ms_pessimistic=per_tok["pessimistic"] * 1e3, itl_median_ms=run["itl_s"]["typical"] * 1e3,
                       ttft_ms=run["ttft_s"]["typical"] * 1e3, tok_s_per_replica=tok_s["typical"],
                       tok_s_per_replica_optimistic=tok_s["optimistic"],
                       tok_s_per_replica_pessimistic=tok_s["pessimistic"],
                       replicas=devices["typical"] // lay.devices, devices=devices["typical"],
                       devices_optimistic=devices["optimistic"], devices_pessimistic=devices["pessimistic"],
                       mem_per_device_GB=mem["mem_per_device_GB"],
                       energy_J_per_token="n/a (what-if device: no NVML energy counter read)")
            if price_per_device_hour is not None:
                row["usd_per_million_tokens"] = price_per_device_hour * lay.devices / (tok_s["typical"] * 3600) * 1e6
            rows.append(row)
    return rows


def speedup_table(cfg: ModelConfig, device: Datasheet, dtype: str, layout: Layout, alphas, ks, Bs, Ls,
                  setting: Setting = Setting(), scale: float = 1.0, calibration: Calibration | None = None,
                  drafter: str = "mtp", draft: ModelConfig | None = None,
                  draft_vocab: int = EAGLE3_DRAFT_VOCAB) -> list[dict]:
    """Speculative speedup of `drafter` (mtp: the preset's MTP module; eagle / eagle3: an EAGLE head over the
    target's hidden states, EAGLE-3's LM head `draft_vocab` rows; draft_model: `draft`, replicated on
    every rank as vLLM runs it; ngram: lookup on the host) and plain ITL per (alpha, k, B, L), each an
    interval; k = 0 is plain decode and needs no drafter (a model without an MTP module is priced at k = 0
    only with drafter=mtp): one row per (B, L), its alpha NaN (no draft is accepted or rejected)."""
    if drafter not in WHATIF_DRAFTERS:
        raise ConfigError(f"drafter={drafter!r}: allowed {WHATIF_DRAFTERS}")
    check_draft_vocab(draft_vocab)
    if drafter == "mtp" and cfg.mtp_layers < 1 and any(k for k in ks):
        raise ConfigError(f"k={list(ks)}: model {cfg.name!r} has no MTP module (mtp_layers=0); allowed k=[0] "
                          "(plain decode), or another drafter (drafter=ngram | draft_model)")
    if (drafter == "draft_model") != (draft is not None):
        raise ConfigError("draft_model: drafter=draft_model needs draft_model=<preset> (the draft model's preset "
                          "name), and another drafter none")
    w = WhatIf(cfg, device, dtype, layout, setting, scale, calibration)
    dw = w.draft_what_if(draft) if draft is not None else None
    rows = []
    for L in Ls:
        for B in Bs:
            itl = w.itl(B, L)
            for a, k in [(math.nan, 0)] * (0 in ks) + [(a, k) for a in alphas for k in ks if k]:
                s = w.spec_speedup((a, a, a), k, B, L, drafter, dw, draft_vocab)
                rows.append(dict(layout=layout.label(), dtype=parse_precision(dtype).label, drafter=drafter,
                                 alpha=a, k=k, B=B,
                                 L=L, S=s["typical"], S_low=min(s.values()), S_high=max(s.values()),
                                 itl_ms=itl["typical"] * 1e3, itl_ms_low=itl["optimistic"] * 1e3,
                                 itl_ms_high=itl["pessimistic"] * 1e3,
                                 experts_touched=w.experts_touched(B)))
    return rows
