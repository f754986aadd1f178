"""The compact decoder sharded over the ranks of a torch.distributed group (gloo or NCCL).

`shard(model, layout, rank)` turns a full `roofline.model.decoder.Transformer` (every rank
builds the same one from the same seed) into this rank's part, in place:

- attention (tp): the query heads [rank·h/tp, (rank+1)·h/tp) and the KV heads they read
  (split, or the one replicated head when kv_heads < tp) in a column-parallel QKV, a
  row-parallel output projection, then an all-reduce (a QK-norm over all heads: its sums of squares
  all-reduced first, TPQKNorm). MLA: q_a / kv_a and the latent cache
  are replicated, q_b, kv_b and the output projection split by heads; a sparse-attention indexer and its
  key cache replicated.
- dense FFN (tp): w1/w3 column-parallel, w2 row-parallel, then an all-reduce.
- MoE, tp attention: the router runs everywhere; this rank holds E/ep experts, each cut to
  moe_ffn/(tp/ep) columns, and its slice of the shared experts; every rank sees every token,
  runs its experts on the tokens routed to them, and one all-reduce sums the partial outputs.
- MoE, dp_attention: each rank holds its own sequences; tokens are sent to the rank of each
  of their k experts by all-to-all (counts, ids, rows), computed there and sent back.
- LM head (tp, vocab divisible): this rank's vocabulary rows, logits all-gathered.

No transport of our own: every exchange is a torch.distributed collective.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from roofline.io.fields import ConfigError
from roofline.model.decoder import GQAttention, MLAttention, MoE, SwiGLU, Transformer
from roofline.parallel.layout import Layout, kv_head_of_rank, local_shapes


def _all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def _rows(w: torch.Tensor, parts: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([w[a:b] for a, b in parts], 0).clone()


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)


class AllReduceOut(nn.Module):
    """A row-parallel module: the local partial output, summed over the group."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        return _all_reduce(self.inner(*args))


def _gqa(full: GQAttention, layout: Layout, rank: int, max_batch: int, max_context: int) -> GQAttention:
    cfg = full.cfg
    s = local_shapes(cfg, layout)
    dh, h, hkv = cfg.head_dim, cfg.heads, cfg.kv_heads
    local = GQAttention(cfg.scaled(heads=s.heads, kv_heads=s.kv_heads), max_batch, max_context)
    kv = kv_head_of_rank(cfg, layout.tp, rank)
    q_rows = [(rank * s.heads * dh, (rank + 1) * s.heads * dh)]
    k_rows = [(h * dh + i * dh, h * dh + (i + 1) * dh) for i in kv]
    v_rows = [((h + hkv) * dh + i * dh, (h + hkv) * dh + (i + 1) * dh) for i in kv]
    local.wqkv.weight = _param(_rows(full.wqkv.weight, q_rows + k_rows + v_rows))
    if full.wqkv.bias is not None:
        local.wqkv.bias = _param(_rows(full.wqkv.bias, q_rows + k_rows + v_rows))
    local.wo.weight = _param(full.wo.weight[:, q_rows[0][0]:q_rows[0][1]])
    if cfg.qk_norm and cfg.qk_norm_type == "per_layer":  # this rank's slices of the whole-projection norms
        k_cols = [(i * dh, (i + 1) * dh) for i in kv]
        del local.q_norm, local.k_norm
        local.qk_norm_tp = TPQKNorm(full.q_norm.weight[q_rows[0][0]:q_rows[0][1]], _rows(full.k_norm.weight, k_cols),
                                 cfg.norm_eps, layout.tp)
    elif cfg.qk_norm:
        local.q_norm.load_state_dict(full.q_norm.state_dict())
        local.k_norm.load_state_dict(full.k_norm.state_dict())
    return local


class TPQKNorm(nn.Module):
    """A per-layer QK-norm (MiniMax-M2) on a rank that holds some of the heads: the sums of squares of its q and k
    slices all-reduced in one collective (vLLM's MiniMaxText01RMSNormTP.forward_qk), then each slice scaled by the
    RMS over all heads and its own weights. KV heads replicated over ranks (kv_heads < tp) are summed once per copy
    and divided by tp x the local width: every head has the same number of copies, so the mean is exact."""

    def __init__(self, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, parts: int):
        super().__init__()
        self.q_weight, self.k_weight = _param(q_weight), _param(k_weight)
        self.eps, self.parts = eps, parts

    def forward(self, xq: torch.Tensor, xk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, q = xq.shape[:2]
        fq, fk = xq.reshape(B, q, -1).float(), xk.reshape(B, q, -1).float()
        ss = _all_reduce(torch.stack((fq.pow(2).sum(-1), fk.pow(2).sum(-1)), -1).contiguous())
        out = []
        for x, f, w, i in ((xq, fq, self.q_weight, 0), (xk, fk, self.k_weight, 1)):
            ms = ss[..., i:i + 1] / (self.parts * f.shape[-1])
            out.append((f * torch.rsqrt(ms + self.eps) * w.float()).to(x.dtype).view_as(x))
        return out[0], out[1]


def _mla(full: MLAttention, layout: Layout, rank: int, max_batch: int, max_context: int) -> MLAttention:
    cfg = full.cfg
    hl = local_shapes(cfg, layout).heads
    local = MLAttention(cfg.scaled(heads=hl, kv_heads=hl), max_batch, max_context)
    qk, vo = cfg.qk_nope_dim + cfg.qk_rope_dim, cfg.qk_nope_dim + cfg.v_head_dim
    if cfg.q_lora_rank:
        local.q_a.load_state_dict(full.q_a.state_dict())
        local.q_a_norm.load_state_dict(full.q_a_norm.state_dict())
        local.q_b.weight = _param(full.q_b.weight[rank * hl * qk:(rank + 1) * hl * qk])
    else:
        local.q_proj.weight = _param(full.q_proj.weight[rank * hl * qk:(rank + 1) * hl * qk])
    local.kv_a.load_state_dict(full.kv_a.state_dict())
    local.kv_a_norm.load_state_dict(full.kv_a_norm.state_dict())
    local.kv_b.weight = _param(full.kv_b.weight[rank * hl * vo:(rank + 1) * hl * vo])
    v = cfg.v_head_dim
    local.wo.weight = _param(full.wo.weight[:, rank * hl * v:(rank + 1) * hl * v])
    if cfg.is_sparse:  # the indexer replicated, as vLLM and SGLang hold it (ReplicatedLinear: 'no tensor parallel')
        for name in ("idx_wq_b", "idx_wk", "idx_k_norm", "idx_weights"):
            getattr(local, name).load_state_dict(getattr(full, name).state_dict())
    return local


def _dense_ffn(full: nn.Module, parts: int, part: int) -> nn.Module:
    """This rank's columns of a SwiGLU or a two-matrix MLP: up (and gate) column-parallel, down row-parallel."""
    width = full.w1.weight.shape[0] // parts
    local = type(full)(full.w1.weight.shape[1], width)
    sl = slice(part * width, (part + 1) * width)
    local.w1.weight = _param(full.w1.weight[sl])
    if isinstance(full, SwiGLU):
        local.w3.weight = _param(full.w3.weight[sl])
    local.w2.weight = _param(full.w2.weight[:, sl])
    return local


class ShardedMoE(nn.Module):
    """This rank's experts (and shared-expert slice) with the full router.

    tp attention: every rank holds every token; partial outputs are all-reduced.
    dp_attention: each rank holds its own tokens; (token, expert) pairs are exchanged by
    all-to-all with the rank owning the expert, and the results come back the same way.
    """

    route = MoE.route

    def __init__(self, full: MoE, layout: Layout, rank: int):
        super().__init__()
        cfg = full.cfg
        s = local_shapes(cfg, layout)
        self.cfg, self.impl, self.layout = cfg, full.impl, layout
        self.per_rank = s.experts
        self.first = (rank // layout.expert_tp) * s.experts  # the first expert this rank holds
        part, f = rank % layout.expert_tp, s.moe_ffn
        e = slice(self.first, self.first + s.experts)
        self.gate = full.gate
        if cfg.router_scoring == "sigmoid":
            self.score_bias = full.score_bias
        self.w1 = _param(full.w1[e, part * f:(part + 1) * f])
        self.w3 = _param(full.w3[e, part * f:(part + 1) * f])
        self.w2 = _param(full.w2[e, :, part * f:(part + 1) * f])
        shared_parts = 1 if layout.dp_attention else layout.tp
        self.shared = None if full.shared is None else _dense_ffn(full.shared, shared_parts, rank % shared_parts)
        self.last_touched = 0

    def _experts(self, x: torch.Tensor, local_idx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """sum over pairs (row, local expert) of weight · expert(x[row]) into a float32 [rows, d]."""
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        if self.impl == "dense":
            experts = list(range(self.per_rank))
        else:
            experts = local_idx.unique().tolist()
        self.last_touched = len(experts)
        for e in experts:
            sel = (local_idx == e).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            xe = x[sel]
            ye = (F.silu(xe @ self.w1[e].T) * (xe @ self.w3[e].T)) @ self.w2[e].T
            out.index_add_(0, sel, ye.float() * weight[sel, None])
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        w, idx = self.route(x)
        if self.layout.dp_attention:
            out = self._exchange(x, w, idx)
        else:
            mine = (idx >= self.first) & (idx < self.first + self.per_rank)
            tok, slot = mine.nonzero(as_tuple=True)
            pairs = self._experts(x[tok], idx[tok, slot] - self.first, w[tok, slot])
            out = torch.zeros(x.shape, dtype=torch.float32, device=x.device).index_add_(0, tok, pairs)
        out = out.to(x.dtype)
        if self.shared is not None:
            out = out + self.shared(x)
        if not self.layout.dp_attention:
            out = _all_reduce(out)
        return out.view(shape)

    def _exchange(self, x, w, idx) -> torch.Tensor:
        n, k = idx.shape
        dest = (idx // self.per_rank).flatten()
        order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=self.layout.ep)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        ins, outs = send_counts.tolist(), recv_counts.tolist()
        ids = idx.flatten()[order].contiguous()
        rows = x.repeat_interleave(k, 0)[order].contiguous()
        got_ids = torch.empty(sum(outs), dtype=ids.dtype, device=x.device)
        got_rows = torch.empty(sum(outs), x.shape[1], dtype=x.dtype, device=x.device)
        dist.all_to_all_single(got_ids, ids, outs, ins)
        dist.all_to_all_single(got_rows, rows, outs, ins)
        one = torch.ones(got_ids.shape[0], device=x.device)
        y = self._experts(got_rows, got_ids - self.first, one).to(x.dtype)  # each pair on its own row
        back = torch.empty_like(rows)
        dist.all_to_all_single(back, y, ins, outs)
        pair_out = torch.empty_like(back)
        pair_out[order] = back
        weighted = pair_out.float().view(n, k, -1) * w[:, :, None]
        return weighted.sum(1)


class GatheredHead(nn.Module):
    """Vocabulary-parallel LM head: this rank's rows, logits all-gathered along the vocabulary."""

    def __init__(self, full: nn.Linear, parts: int, part: int):
        super().__init__()
        rows = full.weight.shape[0] // parts
        self.weight = _param(full.weight[part * rows:(part + 1) * rows])
        self.parts = parts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = F.linear(x, self.weight)
        flat = local.reshape(-1, local.shape[-1]).contiguous()
        out = torch.empty(self.parts * flat.shape[0], flat.shape[1], dtype=flat.dtype, device=flat.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, flat)
        out = out.view(self.parts, flat.shape[0], flat.shape[1]).permute(1, 0, 2)
        return out.reshape(*local.shape[:-1], self.parts * flat.shape[1])


def _shard_block(block, layout: Layout, rank: int, max_batch: int, max_context: int) -> None:
    attn = block.attn
    if not layout.dp_attention and layout.tp > 1:
        make = _mla if isinstance(attn, MLAttention) else _gqa
        block.attn = AllReduceOut(make(attn, layout, rank, max_batch, max_context))
    if isinstance(block.ffn, MoE):
        block.ffn = ShardedMoE(block.ffn, layout, rank)
    elif not layout.dp_attention and layout.tp > 1:
        block.ffn = AllReduceOut(_dense_ffn(block.ffn, layout.tp, rank))


def shard(model: Transformer, layout: Layout, rank: int) -> Transformer:
    """This rank's part of `model` (modified in place and returned); see the module docstring."""
    cfg = model.cfg
    layout.check(cfg, world=layout.tp)
    if cfg.full_attention_interval:
        raise ConfigError(f"model {cfg.name!r}: Gated DeltaNet layers are not sharded here (the what-if prices them "
                          "split over tp)")
    if layout.pp != 1:
        raise ConfigError(f"layout.pp={layout.pp}: the sharded forward runs one stage (pp=1); pp is accounting only")
    if not 0 <= rank < layout.tp:
        raise ConfigError(f"rank={rank}: must be in 0..tp-1={layout.tp - 1}")
    with torch.device(model.embed.weight.device):
        for block in list(model.layers) + [m.block for m in model.mtp]:
            _shard_block(block, layout, rank, model.max_batch, model.max_context)
        s = local_shapes(cfg, layout)
        if model.lm_head is not None and s.vocab_head < cfg.vocab:
            model.lm_head = GatheredHead(model.lm_head, layout.tp, rank)
    model.to(model.embed.weight.dtype)
    model.rope_cos.data, model.rope_sin.data = model.rope_cos.float(), model.rope_sin.float()
    model.layout = layout
    return model.eval().requires_grad_(False)


def busiest_rank_touched(per_rank: list[list[int]]) -> float | None:
    """Mean over MoE layers of the largest count any rank ran in that layer: each layer ends in
    a collective, so the step waits for each layer's busiest rank."""
    if not per_rank or not per_rank[0]:
        return None
    return sum(max(layer) for layer in zip(*per_rank)) / len(per_rank[0])


def parity(rank: int, world: int, device: str, cfg, layout: Layout, B: int, prompt: int, q: int,
           seed: int = 0, dtype: torch.dtype = torch.float32) -> dict | None:
    """Run on every rank (roofline.parallel.launch.run): the sharded model and the full one
    prefill the same `prompt` tokens and then take one step of q tokens. Rank 0 returns the
    largest |logit difference| (dp_attention: each rank runs B/tp sequences, gathered), each
    rank's parameter and cache bytes, and the experts each rank ran in its MoE layers."""
    from roofline.model.decoder import build_model

    ctx = prompt + q
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, cfg.vocab, (B, ctx), generator=gen).to(device)
    full = build_model(cfg, max_batch=B, max_context=ctx, dtype=dtype, device=device, seed=seed)
    start = torch.zeros(B, dtype=torch.long, device=device)
    full(tokens[:, :prompt], start)
    ref = full(tokens[:, prompt:], start + prompt)
    del full
    per = B // layout.batch_split
    mine = slice(rank * per, (rank + 1) * per) if layout.dp_attention else slice(0, B)
    part = shard(build_model(cfg, max_batch=per, max_context=ctx, dtype=dtype, device=device, seed=seed), layout, rank)
    part(tokens[mine, :prompt], start[mine])
    out = part(tokens[mine, prompt:], start[mine] + prompt)
    gathered = [None] * world
    dist.all_gather_object(gathered, dict(
        logits=out.cpu(), touched=part.last_experts_touched(),
        param_bytes=sum(p.numel() * p.element_size() for p in part.parameters()),
        kv_bytes=sum(t.numel() * t.element_size() for t in part.kv_cache_tensors())))
    if rank != 0:
        return None
    logits = torch.cat([g["logits"] for g in gathered]) if layout.dp_attention else gathered[0]["logits"]
    return dict(max_abs_err=float((logits - ref.cpu()).abs().max()), ref_max_abs=float(ref.abs().max()),
                param_bytes=[g["param_bytes"] for g in gathered], kv_bytes=[g["kv_bytes"] for g in gathered],
                touched=[g["touched"] for g in gathered],
                replicas_agree=all(torch.equal(g["logits"], gathered[0]["logits"]) for g in gathered)
                if not layout.dp_attention else None)


def parity_all(rank: int, world: int, device: str, cases: list[tuple]) -> list[dict] | None:
    """`parity` for several (cfg, layout, B, prompt, q) cases in one process group."""
    out = [parity(rank, world, device, *case) for case in cases]
    return out if rank == 0 else None
