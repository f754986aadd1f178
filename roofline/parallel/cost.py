"""Per-rank accounting of a sharded forward: what ONE rank holds, reads, computes and exchanges.

It describes `roofline.parallel.sharded` exactly (the tests hold the parameter and cache
bytes to the instantiated shards) and reduces to `roofline.model.accounting` at tp = ep = 1.

Collectives are listed as nccl-tests sizes them (`roofline.parallel.collectives`): all-reduce
the buffer, all-gather the gathered output, all-to-all the bytes one rank sends in all.
TP: one all-reduce of B·q·d activations after attention and one after the FFN, per layer (one for both where an
engine sums a parallel block's two partial outputs first: `reduces`; and, for a
QK-norm over all heads, MiniMax-M2's per_layer, one of the q and k sums of squares, 2 fp32 a token); an
all-gather of the B·q·V logits when the LM head is split. dp_attention + EP, per MoE layer:
the rows each token sends to its k experts' ranks and back (B_r·q·k·d each way; (n−1)/n of it
crosses the links), the expert ids, and the counts exchanged first. pp: one send of B·q·d
activations per stage boundary.

MoE with ep > 1: every MoE layer ends in a collective, so the step waits, layer by layer, for
the rank that drew the most experts; the expert bytes are that busiest rank's
(`experts_touched_busiest_rank` in expectation; the sharded sweep records the measured
per-layer maximum over the ranks).

Precision (a label of roofline.model.formats): each rank's shard of every matrix costs its
format's exact bytes with the scales counted on the shard's own shape (`_rank_cfgs` hands the
shard's shapes to the single-device byte functions), the KV cache its format's bytes, and the
activations (collectives, embedding rows) the activation dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from roofline.model.accounting import ForwardCost, _check_shape, attention_matmul_params
from roofline.model.accounting import (add_mtp_own_cost, block_weight_bytes, embedding_bytes, expert_bytes, head_bytes,
                                       mtp_args)
from roofline.model.accounting import (indexer_flops, kv_cache_tensors_per_layer, kv_read_bytes_per_seq_layer,
                                       kv_split_token_bytes, linear_flops_per_token, linear_state_layer_bytes,
                                       mixer_params)
from roofline.model.formats import Precision, parse_precision
from roofline.model.config import ModelConfig, kind_counts
from roofline.model.speculation import EAGLE3_DRAFT_VOCAB
from roofline.parallel.layout import Layout, experts_touched_busiest_rank, local_shapes

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
ID_BYTES = 8  # int64 expert ids and counts


@lru_cache(maxsize=256)  # frozen inputs; a what-if asks for the same shard thousands of times
def _local_attention_cfg(cfg: ModelConfig, layout: Layout) -> ModelConfig:
    s = local_shapes(cfg, layout)
    t = layout.attention_tp  # a Gated DeltaNet's heads split like attention's
    return cfg.scaled(heads=s.heads, kv_heads=s.kv_heads, **_linear_heads(cfg, t))


def _linear_heads(cfg: ModelConfig, t: int) -> dict:
    """A rank's Gated DeltaNet heads (k and v heads split over the attention's tp; {} without such layers)."""
    if not cfg.full_attention_interval:
        return {}
    return dict(linear_k_heads=cfg.linear_k_heads // t, linear_v_heads=cfg.linear_v_heads // t)


def stage_kinds(cfg: ModelConfig, layout: Layout) -> dict[tuple[bool, bool], int]:
    """{(MoE, linear attention): blocks} of the largest stage (the first stage when they are equal)."""
    return cfg.layer_kinds(math.ceil(cfg.layers / layout.pp))


def block_params_rank(cfg: ModelConfig, layout: Layout, moe: bool, linear: bool = False) -> int:
    s = local_shapes(cfg, layout)
    p = 2 * cfg.d + mixer_params(_local_attention_cfg(cfg, layout), linear)
    if not moe:
        return p + cfg.ffn_matrices * cfg.d * s.ffn
    router = cfg.d * cfg.experts + (cfg.experts if cfg.router_scoring == "sigmoid" else 0)
    gate = cfg.d if cfg.shared_expert_gate else 0  # replicated
    return p + router + s.experts * 3 * cfg.d * s.moe_ffn + 3 * cfg.d * s.shared_ffn + gate


def params_per_rank(cfg: ModelConfig, layout: Layout, with_mtp: bool = False) -> int:
    """Parameters one rank holds: embedding (replicated), its stage's blocks, final norm, its
    LM-head rows (+ MTP modules: eh_proj and norms replicated, the block sharded like the others)."""
    s = local_shapes(cfg, layout)
    p = cfg.vocab * cfg.d + cfg.d + (0 if cfg.tie_embeddings else s.vocab_head * cfg.d)
    p += sum(n * block_params_rank(cfg, layout, moe, lin) for (moe, lin), n in stage_kinds(cfg, layout).items())
    if with_mtp:
        p += cfg.mtp_layers * (3 * cfg.d + 2 * cfg.d * cfg.d + block_params_rank(cfg, layout, cfg.is_moe))
    return p


def kv_elems_per_token_rank(cfg: ModelConfig, layout: Layout) -> int:
    """Cache elements one token adds in one layer on one rank (heads split or replicated; MLA latent replicated, and
    a sparse-attention indexer's key)."""
    if cfg.is_mla:
        return cfg.kv_elems_per_token_layer
    return 2 * local_shapes(cfg, layout).kv_heads * cfg.head_dim


@lru_cache(maxsize=256)  # as _local_attention_cfg
def _rank_cfgs(cfg: ModelConfig, layout: Layout) -> tuple[ModelConfig, ModelConfig]:
    """(block, expert) configs whose single-device accounting is one rank's shard: the local
    heads and dense-FFN columns, the shared experts' slice as one shared expert (router whole),
    and the width of each held routed expert. The per-matrix byte functions of
    roofline.model.accounting then price the shard in any format, scales counted on the
    shard's own shape (as an engine quantises or loads each rank's slice)."""
    s = local_shapes(cfg, layout)
    shared = dict(moe_ffn=s.shared_ffn, shared_experts=1) if cfg.shared_experts else {}
    block = cfg.scaled(heads=s.heads, kv_heads=s.kv_heads, ffn=s.ffn, **shared,
                       **_linear_heads(cfg, layout.attention_tp))
    return block, cfg.scaled(moe_ffn=s.moe_ffn) if cfg.is_moe else cfg


def rank_block_bytes(cfg: ModelConfig, layout: Layout, moe: bool, prec: Precision,
                     linear: bool = False) -> tuple[float, float]:
    """(bytes of one block's shard without its routed experts, bytes of one held routed expert)
    in precision `prec` (`linear`: a Gated DeltaNet block)."""
    block, expert = _rank_cfgs(cfg, layout)
    return float(block_weight_bytes(block, moe, prec, linear)), float(expert_bytes(expert, prec) if moe else 0)


@lru_cache(maxsize=256)  # frozen inputs (as _rank_cfgs): every priced pass asks for it, and each ask built a config
def rank_head_bytes(cfg: ModelConfig, layout: Layout, prec: Precision) -> float:
    """This rank's LM-head rows in the head's format (the embedding rows when tied)."""
    return float(head_bytes(cfg.scaled(vocab=local_shapes(cfg, layout).vocab_head), prec))


def kv_token_bytes_rank(cfg: ModelConfig, layout: Layout, prec: Precision) -> int:
    """Cache bytes one token adds to one layer on one rank, in the KV format (per-token scales
    per cached KV head included; MLA's latent is one head, a sparse indexer's keys one more)."""
    return sum(kv_split_bytes_rank(cfg, layout, prec))


def linear_state_rank_bytes(cfg: ModelConfig, layout: Layout, prec: Precision) -> int:
    """Bytes one sequence holds in one Gated DeltaNet layer on one rank (its share of the heads; 0 without)."""
    if not cfg.full_attention_interval:
        return 0
    return linear_state_layer_bytes(cfg, prec.act_bytes, cfg.linear_v_heads // layout.attention_tp)


def kv_split_bytes_rank(cfg: ModelConfig, layout: Layout, prec: Precision) -> tuple[int, int]:
    """(attended, indexed) cache bytes of one token in one layer on one rank: what attention reads of a position it
    attends, and a sparse-attention indexer's key, read at every position (0 without; accounting.kv_split_token_bytes;
    MLA's cache is replicated over the ranks)."""
    if cfg.is_mla:
        return kv_split_token_bytes(cfg, prec)
    heads = 2 * local_shapes(cfg, layout).kv_heads
    return prec.kv.kv_token_bytes(kv_elems_per_token_rank(cfg, layout), heads, prec.act_bytes), 0


def eagle_layer_cfg(cfg: ModelConfig) -> ModelConfig:
    """The config whose dense block an EAGLE head's layer is: the target's, its FFN the target's dense width; a target
    with no dense FFN (every layer MoE: gpt-oss, MiniMax) gets the width of the experts a token runs (experts_per_token
    x moe_ffn, + the shared ones'): assumption, the heads' own configs not read (a released head's intermediate_size
    is its own)."""
    if cfg.ffn >= 1:
        return cfg
    return cfg.scaled(ffn=(cfg.experts_per_token + cfg.shared_experts) * cfg.moe_ffn)


def eagle_head_bytes(cfg: ModelConfig, layout: Layout, dtype: str, head: str, draft_vocab: int) -> float:
    """Weight bytes one rank holds for an EAGLE head (`eagle` | `eagle3`, as whatif.pass_seconds prices it): one dense
    decoder layer of the target's shard in the activation dtype, its fc (2d or, EAGLE-3, 3d -> d, replicated), EAGLE-3's
    wider q/k/v input and its own LM head of `draft_vocab` rows (EAGLE-1 shares the target's)."""
    prec = parse_precision(dtype)
    plain = Precision(prec.activations)
    a, s = plain.act_bytes, local_shapes(cfg, layout)
    fixed, _ = rank_block_bytes(eagle_layer_cfg(cfg), layout, False, plain)
    w = fixed + (3 if head == "eagle3" else 2) * cfg.d * cfg.d * a
    if head == "eagle3":
        w += (s.heads + 2 * s.kv_heads) * cfg.head_dim * cfg.d * a
        w += rank_head_bytes(cfg.scaled(vocab=draft_vocab, tie_embeddings=False), layout, plain)
    return float(w)


def memory_per_rank(cfg: ModelConfig, layout: Layout, dtype: str, batch: int, tokens_per_seq: int,
                    with_mtp: bool = False, pool_rule="window", eagle: str = "",
                    draft_vocab: int = EAGLE3_DRAFT_VOCAB, embedding_held: bool = True) -> tuple[float, float]:
    """(weight bytes, KV-cache bytes) resident on one rank for `batch` sequences of `tokens_per_seq`.
    `dtype` may be a precision label (roofline.model.formats): each shard in its format, scales
    and zero points included; norms and MTP's eh_proj in the activation dtype, the embedding table in its format
    (accounting.embedding_format), or not at all where the engine keeps it in host memory (`embedding_held` False:
    engines.yaml input_embedding host; a tied table is then held once, as the LM head). pool_rule: what the
    engine's pool holds for windowed layers (ModelConfig.pool_positions). An EAGLE head (`eagle`: its kind,
    `draft_vocab` EAGLE-3's LM head rows) adds its weights (eagle_head_bytes) and one layer's cache of every token."""
    prec = parse_precision(dtype)
    a, s = prec.act_bytes, local_shapes(cfg, layout)
    kinds = stage_kinds(cfg, layout)
    n, _, n_lin = kind_counts(kinds)
    blocks = n + (cfg.mtp_layers if with_mtp else 0) + (1 if eagle else 0)
    seqs = math.ceil(batch / layout.batch_split)
    # (per-layer KV scales: bytes, left out); a windowed layer as the engine's pool holds it (window, full, a share);
    # a Gated DeltaNet layer its state, whatever the length
    kv = seqs * blocks * kv_token_bytes_rank(cfg, layout, prec) * cfg.pool_positions(tokens_per_seq, pool_rule)
    kv += seqs * n_lin * linear_state_rank_bytes(cfg, layout, prec)

    def block(moe: bool, linear: bool = False) -> float:
        fixed, one = rank_block_bytes(cfg, layout, moe, prec, linear)
        return fixed + s.experts * one

    table = embedding_bytes(cfg, prec) if embedding_held or cfg.tie_embeddings else 0
    w = table + cfg.d * a + (0 if cfg.tie_embeddings else rank_head_bytes(cfg, layout, prec))
    w += sum(n * block(moe, lin) for (moe, lin), n in kinds.items())
    if with_mtp:
        w += cfg.mtp_layers * ((3 * cfg.d + 2 * cfg.d * cfg.d) * a + block(cfg.is_moe))
    if eagle:
        w += eagle_head_bytes(cfg, layout, dtype, eagle, draft_vocab)
    return float(w), float(kv)


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
    experts_touched: float  # per MoE layer, on the layer's busiest rank (what the step waits for)
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


def _blocks_cost(cfg, layout, kinds, B, q, L, kv_len, prec: Precision, moe_impl, touched, reduces: int = 2):
    n, n_moe, n_lin = kind_counts(kinds)
    s = local_shapes(cfg, layout)
    b = prec.act_bytes  # activations: collectives, embedding rows
    Br = math.ceil(B / layout.batch_split)
    Nr, N = Br * q, B * q  # tokens through attention on this rank; tokens routed overall
    lac = _local_attention_cfg(cfg, layout)
    if touched is None:
        # the step waits for each layer's busiest rank (its collective ends the layer)
        touched = float(s.experts) if moe_impl == "dense" else experts_touched_busiest_rank(cfg, N, layout.ep)
    expert_w = 3 * cfg.d * s.moe_ffn
    block_b = sum(c * rank_block_bytes(cfg, layout, moe, prec, lin)[0] for (moe, lin), c in kinds.items())
    one_expert = rank_block_bytes(cfg, layout, True, prec)[1] if n_moe else 0.0
    expert_b = n_moe * touched * one_expert
    routed_pairs = N * cfg.experts_per_token / layout.ep if moe_impl == "touched" else N * s.experts
    per_token = sum(c * attention_matmul_params(lac, lin) for (_, lin), c in kinds.items())
    per_token += (n - n_moe) * cfg.ffn_matrices * cfg.d * s.ffn
    per_token += n_moe * (cfg.d * cfg.experts + 3 * cfg.d * s.shared_ffn + (cfg.d if cfg.shared_expert_gate else 0))
    flops_mm = 2 * (Nr * per_token + n_moe * routed_pairs * expert_w)
    d_qk, d_v = (cfg.kv_lora_rank + cfg.qk_rope_dim, cfg.kv_lora_rank) if cfg.is_mla else (cfg.head_dim, cfg.head_dim)
    attended = cfg.attended_pairs(L, q)  # a windowed layer attends at most its window; a sparse one index_topk
    kv = kv_token_bytes_rank(cfg, layout, prec)
    kv_att, kv_idx = kv_split_bytes_rank(cfg, layout, prec)  # a sparse layer reads its index keys at every position
    kv_fixed = (n - n_lin) * prec.kv.kv_layer_fixed_bytes(b, tensors=kv_cache_tensors_per_layer(cfg))  # MLA: one
    state = Br * n_lin * linear_state_rank_bytes(cfg, layout, prec)  # Gated DeltaNet: read and written back
    coll = []
    if layout.attention_tp > 1:
        coll.append(Collective("all_reduce", Nr * cfg.d * b, reduces * n))
        if cfg.qk_norm and cfg.qk_norm_type == "per_layer":  # the q and k sums of squares over all heads (fp32)
            coll.append(Collective("all_reduce", Nr * 2 * 4, n))
    elif layout.dp_attention and layout.ep > 1 and n_moe:
        pairs = Nr * cfg.experts_per_token
        coll += [Collective("all_to_all", layout.ep * ID_BYTES, n_moe), Collective("all_to_all", pairs * ID_BYTES, n_moe),
                 Collective("all_to_all", pairs * cfg.d * b, 2 * n_moe)]
    return dict(weight_bytes=block_b + expert_b, expert_bytes=expert_b,
                experts_touched=touched,
                kv_read_bytes=Br * n * kv_read_bytes_per_seq_layer(cfg, kv_att, kv_idx, kv_len, q) + kv_fixed + state,
                kv_write_bytes=Br * (n - n_lin) * kv * q + state, flops_matmul=flops_mm,
                flops_attention=(2 * (d_qk + d_v) * s.heads * attended * n * Br
                                 + indexer_flops(cfg, n, Br, L, q)  # the indexer's heads replicated on every rank
                                 + n_lin * Nr * linear_flops_per_token(cfg, q, lac.linear_v_heads)),
                collectives=coll, Nr=Nr,
                head_rows=s.vocab_head)


def _with_head(c: dict, cfg: ModelConfig, layout: Layout, prec: Precision) -> dict:
    rows, Nr = c.pop("head_rows"), c.pop("Nr")
    b = prec.act_bytes
    c["weight_bytes"] += cfg.d * b + rank_head_bytes(cfg, layout, prec)  # final norm + this rank's LM-head rows
    c["flops_matmul"] += 2 * Nr * rows * cfg.d
    c["embed_bytes"] = embedding_bytes(cfg, prec, Nr)
    if rows < cfg.vocab:
        c["collectives"].append(Collective("all_gather", Nr * cfg.vocab * b, 1))
    c["collectives"] = tuple(c["collectives"])
    return c


def rank_forward_cost(cfg: ModelConfig, layout: Layout, dtype, B: int, q: int, L: int, kv_len: int | None = None,
                      moe_impl: str = "touched", touched: float | None = None, reduces: int = 2) -> RankCost:
    """One rank's share of `Transformer.forward` (the largest pipeline stage, charged with the
    embedding gather and the LM head; pp > 1 adds the stage's send of its activations).
    `dtype` may be a precision label: weights, head and KV in their formats (scales included).
    `reduces`: all-reduces of a block's activations under tp (2: attention's and the FFN's, as the sharded forward
    runs them; 1: an engine that sums a parallel block's two partial outputs before one, parallel_block_reduces)."""
    _check_shape(cfg, B, q, L)
    prec = parse_precision(dtype)
    kv_len = L + q if kv_len is None else kv_len
    kinds = stage_kinds(cfg, layout)
    n, n_moe, _ = kind_counts(kinds)
    c = _with_head(_blocks_cost(cfg, layout, kinds, B, q, L, kv_len, prec, moe_impl, touched, reduces),
                   cfg, layout, prec)
    if layout.pp > 1:  # this stage's send of its activations to the next one
        c["collectives"] += (Collective("send_recv", B * q * cfg.d * prec.act_bytes, 1),)
    return RankCost(B=B, q=q, L=L, kv_len=kv_len, tokens=B * q, blocks=n, moe_blocks=n_moe, **c)


def rank_mtp_cost(cfg: ModelConfig, layout: Layout, dtype, B: int, q: int, L: int, kv_len: int | None = None,
                  moe_impl: str = "touched", touched: float | None = None) -> RankCost:
    """One rank's share of one `Transformer.mtp_forward` (one block, eh_proj replicated, the head)."""
    prec, kv_len = mtp_args(cfg, dtype, B, q, L, kv_len)
    c = _with_head(_blocks_cost(cfg, layout, {(cfg.is_moe, False): 1}, B, q, L, kv_len, prec, moe_impl, touched),
                   cfg, layout, prec)
    c = add_mtp_own_cost(c, cfg, prec.act_bytes, math.ceil(B / layout.batch_split) * q)
    return RankCost(B=B, q=q, L=L, kv_len=kv_len, tokens=B * q, blocks=1, moe_blocks=int(cfg.is_moe), **c)
