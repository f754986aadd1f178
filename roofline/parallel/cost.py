"""Per-rank accounting of a sharded forward: what ONE rank holds, reads, computes and exchanges.

It describes `roofline.parallel.sharded` exactly (the tests hold the parameter and cache
bytes to the instantiated shards) and reduces to `roofline.model.accounting` at tp = ep = 1.

Collectives are listed as nccl-tests sizes them (`roofline.parallel.collectives`): all-reduce
the buffer, all-gather the gathered output, all-to-all the bytes one rank sends in all.
TP: one all-reduce of B·q·d activations after attention and one after the FFN, per layer; an
all-gather of the B·q·V logits when the LM head is split. dp_attention + EP, per MoE layer:
the rows each token sends to its k experts' ranks and back (B_r·q·k·d each way; (n−1)/n of it
crosses the links), the expert ids, and the counts exchanged first. pp: one send of B·q·d
activations per stage boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from roofline.model.accounting import ForwardCost, _check_shape, attention_matmul_params, attention_params
from roofline.model.accounting import (block_params, block_weight_bytes, expert_bytes, head_bytes,
                                       kv_bytes_per_token)
from roofline.model.dtypes import dtype_bytes
from roofline.model.formats import parse_precision
from roofline.model.config import ModelConfig
from roofline.parallel.layout import Layout, experts_touched_per_rank, local_shapes

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
ID_BYTES = 8  # int64 expert ids and counts


def _local_attention_cfg(cfg: ModelConfig, layout: Layout) -> ModelConfig:
    s = local_shapes(cfg, layout)
    return cfg.scaled(heads=s.heads, kv_heads=s.kv_heads)


def _stage_layers(cfg: ModelConfig, layout: Layout) -> tuple[int, int]:
    """(blocks, MoE blocks) of the largest stage (the first stage when they are equal)."""
    n = math.ceil(cfg.layers / layout.pp)
    return n, sum(cfg.layer_is_moe(i) for i in range(n))


def block_params_rank(cfg: ModelConfig, layout: Layout, moe: bool) -> int:
    s = local_shapes(cfg, layout)
    p = 2 * cfg.d + attention_params(_local_attention_cfg(cfg, layout))
    if not moe:
        return p + 3 * cfg.d * s.ffn
    router = cfg.d * cfg.experts + (cfg.experts if cfg.router_scoring == "sigmoid" else 0)
    return p + router + s.experts * 3 * cfg.d * s.moe_ffn + 3 * cfg.d * s.shared_ffn


def params_per_rank(cfg: ModelConfig, layout: Layout, with_mtp: bool = False) -> int:
    """Parameters one rank holds: embedding (replicated), its stage's blocks, final norm, its
    LM-head rows (+ MTP modules: eh_proj and norms replicated, the block sharded like the others)."""
    s = local_shapes(cfg, layout)
    n, n_moe = _stage_layers(cfg, layout)
    p = cfg.vocab * cfg.d + cfg.d + (0 if cfg.tie_embeddings else s.vocab_head * cfg.d)
    p += (n - n_moe) * block_params_rank(cfg, layout, False) + n_moe * block_params_rank(cfg, layout, True)
    if with_mtp:
        p += cfg.mtp_layers * (3 * cfg.d + 2 * cfg.d * cfg.d + block_params_rank(cfg, layout, cfg.is_moe))
    return p


def kv_elems_per_token_rank(cfg: ModelConfig, layout: Layout) -> int:
    """Cache elements one token adds in one layer on one rank (heads split or replicated; MLA latent replicated)."""
    if cfg.is_mla:
        return cfg.kv_lora_rank + cfg.qk_rope_dim
    return 2 * local_shapes(cfg, layout).kv_heads * cfg.head_dim


def memory_per_rank(cfg: ModelConfig, layout: Layout, dtype: str, batch: int, tokens_per_seq: int,
                    with_mtp: bool = False) -> tuple[float, float]:
    """(weight bytes, KV-cache bytes) resident on one rank for `batch` sequences of `tokens_per_seq`.
    `dtype` may be a precision label (roofline.model.formats): see `_quantized_rank_weights`."""
    prec = parse_precision(dtype)
    b = prec.act_bytes
    n, _ = _stage_layers(cfg, layout)
    blocks = n + (cfg.mtp_layers if with_mtp else 0)
    seqs = math.ceil(batch / layout.batch_split)
    kv = seqs * blocks * kv_elems_per_token_rank(cfg, layout) * tokens_per_seq * b
    if prec.is_plain:
        return float(params_per_rank(cfg, layout, with_mtp) * b), float(kv)
    kv *= kv_bytes_per_token(cfg, prec) / kv_bytes_per_token(cfg, prec.activations)  # the KV format's bytes
    return _quantized_rank_weights(cfg, layout, prec, with_mtp), float(kv)


def _quantized_rank_weights(cfg: ModelConfig, layout: Layout, prec, with_mtp: bool) -> float:
    """A rank's weights in a quantized precision: embedding, norms and eh_proj in the activation
    dtype; each block's shard at that block's mean bytes per parameter in the format (scales and
    zero points included, as roofline.model.accounting charges the whole block); the head rows
    at the head format's. Exact where a split cuts every matrix of a block alike (dense tensor
    parallelism, up to scale groups a cut divides); where it does not (expert parallelism keeps
    attention whole), off by the share of float tensors (norms, router, MLA's kv_b) in the block."""
    a, s = prec.act_bytes, local_shapes(cfg, layout)
    n, n_moe = _stage_layers(cfg, layout)

    def per_param(moe: bool) -> float:
        full = block_weight_bytes(cfg, moe, prec) + (cfg.experts * expert_bytes(cfg, prec) if moe else 0)
        return full / block_params(cfg, moe)

    w = (cfg.vocab * cfg.d + cfg.d) * a
    w += 0 if cfg.tie_embeddings else s.vocab_head * head_bytes(cfg, prec) / cfg.vocab
    w += (n - n_moe) * block_params_rank(cfg, layout, False) * per_param(False)
    w += n_moe * block_params_rank(cfg, layout, True) * per_param(True)
    if with_mtp:
        w += cfg.mtp_layers * ((3 * cfg.d + 2 * cfg.d * cfg.d) * a + block_params_rank(cfg, layout, cfg.is_moe)
                               * per_param(cfg.is_moe))
    return float(w)


@dataclass(frozen=True)
class Collective:
    kind: str
    size_bytes: float  # as nccl-tests sizes it
    count: int  # calls per forward


@dataclass(frozen=True)
class RankCost:
    """One rank's share of one forward (fields named as in roofline.model.accounting.ForwardCost)."""
    B: int
    q: int
    L: int
    kv_len: int
    tokens: int
    blocks: int  # decoder blocks this rank runs (the per-layer fixed cost counts these)
    moe_blocks: int  # of which MoE blocks
    weight_bytes: float
    expert_bytes: float
    experts_touched: float  # per MoE layer, on this rank
    kv_read_bytes: int
    kv_write_bytes: int
    embed_bytes: int
    flops_matmul: float
    flops_attention: int
    collectives: tuple[Collective, ...] = field(default=())
    mask_bytes: int = 0  # an attention mask the forward built and read (as ForwardCost.mask_bytes)

    bytes_total = ForwardCost.bytes_total  # the same definitions as one device's
    flops = ForwardCost.flops

    def comm_bytes(self, kind: str | None = None) -> float:
        return float(sum(c.size_bytes * c.count for c in self.collectives if kind in (None, c.kind)))

    def as_row(self) -> dict:
        row = {k: getattr(self, k) for k in ("B", "q", "L", "kv_len", "tokens", "blocks", "moe_blocks", "weight_bytes",
                                             "expert_bytes", "experts_touched", "kv_read_bytes", "kv_write_bytes",
                                             "embed_bytes", "flops_matmul", "flops_attention")}
        row.update(bytes_total=self.bytes_total, flops=self.flops, intensity=self.flops / self.bytes_total,
                   comm_bytes=self.comm_bytes(), comm_calls=sum(c.count for c in self.collectives),
                   collectives=";".join(f"{c.kind}:{c.size_bytes:.0f}x{c.count}" for c in self.collectives))
        return row


def parse_collectives(text: str) -> tuple[Collective, ...]:
    """The inverse of the `collectives` column of a row."""
    out = []
    for part in filter(None, str(text or "").split(";")):
        kind, rest = part.split(":")
        size, count = rest.split("x")
        out.append(Collective(kind, float(size), int(count)))
    return tuple(out)


def _blocks_cost(cfg, layout, n, n_moe, B, q, L, kv_len, b, moe_impl, touched):
    s = local_shapes(cfg, layout)
    Br = math.ceil(B / layout.batch_split)
    Nr, N = Br * q, B * q  # tokens through attention on this rank; tokens routed overall
    lac = _local_attention_cfg(cfg, layout)
    if touched is None:
        touched = float(s.experts) if moe_impl == "dense" else experts_touched_per_rank(cfg, N, layout.ep)
    expert_w = 3 * cfg.d * s.moe_ffn
    router = cfg.d * cfg.experts + (cfg.experts if cfg.router_scoring == "sigmoid" else 0)
    fixed = n * (2 * cfg.d + attention_params(lac)) + (n - n_moe) * 3 * cfg.d * s.ffn
    fixed += n_moe * (router + 3 * cfg.d * s.shared_ffn)
    expert_b = n_moe * touched * expert_w * b
    routed_pairs = N * cfg.experts_per_token / layout.ep if moe_impl == "touched" else N * s.experts
    per_token = n * attention_matmul_params(lac) + (n - n_moe) * 3 * cfg.d * s.ffn
    per_token += n_moe * (cfg.d * cfg.experts + 3 * cfg.d * s.shared_ffn)
    flops_mm = 2 * (Nr * per_token + n_moe * routed_pairs * expert_w)
    d_qk, d_v = (cfg.kv_lora_rank + cfg.qk_rope_dim, cfg.kv_lora_rank) if cfg.is_mla else (cfg.head_dim, cfg.head_dim)
    attended = q * L + q * (q + 1) // 2
    kv = kv_elems_per_token_rank(cfg, layout)
    coll = []
    if layout.attention_tp > 1:
        coll.append(Collective("all_reduce", Nr * cfg.d * b, 2 * n))
    elif layout.dp_attention and layout.ep > 1 and n_moe:
        pairs = Nr * cfg.experts_per_token
        coll += [Collective("all_to_all", layout.ep * ID_BYTES, n_moe), Collective("all_to_all", pairs * ID_BYTES, n_moe),
                 Collective("all_to_all", pairs * cfg.d * b, 2 * n_moe)]
    return dict(weight_bytes=fixed * b + expert_b, expert_bytes=expert_b, experts_touched=touched,
                kv_read_bytes=Br * n * kv * kv_len * b, kv_write_bytes=Br * n * kv * q * b,
                flops_matmul=flops_mm, flops_attention=2 * (d_qk + d_v) * s.heads * n * Br * attended,
                collectives=coll, Nr=Nr, head_rows=s.vocab_head)


def _with_head(c: dict, cfg: ModelConfig, layout: Layout, b: int) -> dict:
    rows, Nr = c.pop("head_rows"), c.pop("Nr")
    c["weight_bytes"] += (cfg.d + rows * cfg.d) * b  # final norm + this rank's LM-head rows
    c["flops_matmul"] += 2 * Nr * rows * cfg.d
    c["embed_bytes"] = Nr * cfg.d * b
    if rows < cfg.vocab:
        c["collectives"].append(Collective("all_gather", Nr * cfg.vocab * b, 1))
    c["collectives"] = tuple(c["collectives"])
    return c


def rank_forward_cost(cfg: ModelConfig, layout: Layout, dtype, B: int, q: int, L: int, kv_len: int | None = None,
                      moe_impl: str = "touched", touched: float | None = None) -> RankCost:
    """One rank's share of `Transformer.forward` (the largest pipeline stage, charged with the
    embedding gather and the LM head; pp > 1 adds the stage's send of its activations)."""
    _check_shape(cfg, B, q, L)
    b = dtype_bytes(dtype)
    kv_len = L + q if kv_len is None else kv_len
    n, n_moe = _stage_layers(cfg, layout)
    c = _with_head(_blocks_cost(cfg, layout, n, n_moe, B, q, L, kv_len, b, moe_impl, touched), cfg, layout, b)
    if layout.pp > 1:  # this stage's send of its activations to the next one
        c["collectives"] += (Collective("send_recv", B * q * cfg.d * b, 1),)
    return RankCost(B=B, q=q, L=L, kv_len=kv_len, tokens=B * q, blocks=n, moe_blocks=n_moe, **c)


def rank_mtp_cost(cfg: ModelConfig, layout: Layout, dtype, B: int, q: int, L: int, kv_len: int | None = None,
                  moe_impl: str = "touched", touched: float | None = None) -> RankCost:
    """One rank's share of one `Transformer.mtp_forward` (one block, eh_proj replicated, the head)."""
    if cfg.mtp_layers < 1:
        raise ValueError(f"model {cfg.name!r} has no MTP module (mtp_layers=0)")
    _check_shape(cfg, B, q, L)
    b = dtype_bytes(dtype)
    kv_len = L + q if kv_len is None else kv_len
    c = _with_head(_blocks_cost(cfg, layout, 1, int(cfg.is_moe), B, q, L, kv_len, b, moe_impl, touched), cfg, layout, b)
    Br = math.ceil(B / layout.batch_split)
    c["weight_bytes"] += (2 * cfg.d + 2 * cfg.d * cfg.d) * b
    c["flops_matmul"] += 2 * 2 * cfg.d * cfg.d * Br * q
    return RankCost(B=B, q=q, L=L, kv_len=kv_len, tokens=B * q, blocks=1, moe_blocks=int(cfg.is_moe), **c)
