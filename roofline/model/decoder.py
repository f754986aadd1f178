"""A compact decoder that runs the real shapes of today's inference models.

One call, `Transformer.forward(tokens[B, q], start_pos[B])`, serves decode (q = 1),
speculative verification (q = k + 1) and chunked prefill: each sequence writes its q new
keys/values into a static cache at its OWN positions start_pos[b] .. start_pos[b] + q - 1
and attends to cache positions <= its own query position, so ragged batches are exact.

The cache is allocated once for (max batch, max context) — the gpt-fast design that makes
CUDA-graph capture possible. Attention reads only cache[:B, :kv_len], with kv_len =
max(start_pos) + q unless the caller fixes it (CUDA graphs need a static kv_len); the byte
model in `roofline.model.accounting` charges exactly that slice. A quantized KV format holds
the cache as fp8 or int8 codes with their scales (`roofline.model.kvcache`).

MLA (DeepSeek-V3) caches what the real model caches: the normalised KV latent (kv_lora_rank)
and the shared RoPE key (qk_rope_dim), side by side in one buffer, and attends in the
"absorbed" form serving engines use for decode: W_UK folds into the query and W_UV into
the output, so the latent is never decompressed per cached token.

MoE layers run only the experts the batch's tokens routed to ("touched", the weights a
kernel must read: a loop over the experts the host found), or the same experts with no host
sync ("grouped": the token-expert pairs sorted by expert on the device and one grouped GEMM per
projection over the experts' token groups, `grouped_mm`, as serving engines' fused MoE kernels
do; static shapes, so it captures in a CUDA graph where the grouped kernel runs on the device
without reading its offsets back: `grouped_capturable`), or every expert ("dense", kept to
price rows that ran it); `last_touched` records the count per forward so the byte model can be
checked against what really ran. Quantized
experts run one packed linear per expert (`roofline.model.quant.PackedExperts`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from roofline.model import kvcache
from roofline.model.config import ModelConfig
from roofline.model.dtypes import torch_dtype
from roofline.model.rope import apply_rope, rope_table, yarn_softmax_scale
from roofline.io.fields import ConfigError

MOE_IMPLS = ("touched", "dense", "grouped")


def grouped_capturable(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether the grouped MoE path runs without a host sync on `device` in `dtype`, so that it
    captures in a CUDA graph: torch's grouped GEMM has its CUTLASS kernel for bf16 on sm90/sm100
    (Hopper, Blackwell) and elsewhere falls back to a loop that reads the group offsets back."""
    device = torch.device(device)
    if device.type != "cuda" or dtype != torch.bfloat16 or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device)[0] in (9, 10)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of x [M, K] grouped by offs (int32 group ends) times w [G, K, N]: group g's rows
    x[offs[g-1]:offs[g]] @ w[g]; a group with no rows reads nothing of its w[g]."""
    return torch._grouped_mm(x, w, offs=offs)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x^2) + eps) * weight in float32, rounded to x's dtype once: torch's fused
        # rms_norm computes exactly that (bit-equal to the three-op form, checked in
        # tests/test_decoder_ops.py) in one op where the composite form dispatches seven
        # (a decode step on the 2-vCPU EPYC spends ~14 ms in such dispatches: docs/cpu.md)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, d: int, width: int):
        super().__init__()
        self.w1 = nn.Linear(d, width, bias=False)  # gate
        self.w3 = nn.Linear(d, width, bias=False)  # up
        self.w2 = nn.Linear(width, d, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GeluMLP(nn.Module):
    """A two-matrix FFN (GPT-J, GPT-NeoX, Falcon, StarCoder): down(gelu(up(x))), tanh GELU (GPT-J's gelu_new;
    Falcon's exact GELU costs the same). The released models' linear biases (GPT-J's MLP, GPT-NeoX's) are not held:
    d + F parameters a layer, under 0.1% of its weights."""

    def __init__(self, d: int, width: int):
        super().__init__()
        self.w1 = nn.Linear(d, width, bias=False)  # up
        self.w2 = nn.Linear(width, d, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


def dense_ffn(cfg: ModelConfig) -> nn.Module:
    """The dense FFN the config names: a SwiGLU or a two-matrix MLP (ModelConfig.ffn_gated)."""
    return (SwiGLU if cfg.ffn_gated else GeluMLP)(cfg.d, cfg.ffn)


def _causal_mask(start_pos: torch.Tensor, q: int, kv_len: int) -> torch.Tensor:
    """[B, 1, q, kv_len] bool: key j is visible to query i of sequence b iff j <= start_pos[b] + i."""
    qpos = start_pos[:, None] + torch.arange(q, device=start_pos.device)
    keys = torch.arange(kv_len, device=start_pos.device)
    return (keys[None, None, :] <= qpos[:, :, None])[:, None]


def attention_mask(start_pos: torch.Tensor | int, q: int, kv_len: int, device: torch.device):
    """What attention is given, built once per forward and shared by every layer.

    Ragged positions (start_pos a tensor [B]): a boolean mask [B, 1, q, kv_len]. Uniform
    positions (start_pos an int s, every sequence at s, kv_len = s + q) need none on a GPU: a
    decode step (q = 1) sees every key it reads, so no mask at all; q > 1 is the causal pattern
    aligned to the bottom-right corner, which flash attention applies from two lengths
    (torch.nn.attention.bias.causal_lower_right, never materialised). A boolean mask would
    push torch's dispatcher off Flash (it refuses masks) onto memory-efficient attention, which
    has no grouped KV heads, or onto the math path, which reads every KV head once per query
    head. On the CPU torch's fused kernel takes a mask without changing kernel, so q > 1 gets
    one small [1, 1, q, kv_len] boolean mask (its bytes are counted: `mask_bytes`).
    """
    if isinstance(start_pos, torch.Tensor):
        return _causal_mask(start_pos, q, kv_len)
    if q == 1:
        return None
    if device.type == "cpu":
        return _causal_mask(torch.tensor([start_pos], device=device), q, kv_len)
    from torch.nn.attention.bias import causal_lower_right
    return causal_lower_right(q, kv_len)


def mask_bytes(mask, attention_layers: int) -> int:
    """DRAM bytes of a mask: written once, read once by each attention layer (0 for no mask
    and for a causal flag that is never materialised)."""
    if not isinstance(mask, torch.Tensor) or type(mask) is not torch.Tensor:
        return 0
    return mask.numel() * mask.element_size() * (1 + attention_layers)


FLASH_MAX_HEAD_DIM = 256  # the widest head torch's flash attention takes


def expand_shared_kv(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One shared KV head [B, 1, L, d] as `heads` heads, without a copy (stride 0 on the head dim)."""
    B, _, L, _ = k.shape
    return k.expand(B, heads, L, k.shape[-1]), v.expand(B, heads, L, v.shape[-1])


CPU_DECODE_ATTENTION = ("grouped", "sdpa")  # the two CPU decode (q = 1) paths of `attend`


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float | None = None,
           cpu_decode: str = "grouped"):
    """Attention of q [B, h, q, d_k] over k [B, h_kv, L, d_k], v [B, h_kv, L, d_v] (head i reads
    KV head i // (h / h_kv)) under `mask`: None (every key visible), a causal_lower_right bias,
    or a boolean tensor [B or 1, 1, q, L] (see `attention_mask`).

    A CPU decode step (q = 1) has two paths, `cpu_decode`: "grouped", one grouped matmul per KV
    head (the g query heads of a KV head as g rows; same bytes, same FLOPs), or "sdpa", torch's
    scaled_dot_product_attention. Which is faster depends on the CPU and the torch build: on one
    machine (torch 2.x, 2-vCPU EPYC) SDPA ran the single query 3-4x slower than two queries (2.8
    vs 0.8 ms per layer at B=4, L=1024, 16/4 heads, bf16), a kernel switch that would masquerade
    as "verification is cheaper than decode"; on a 2-vCPU AMX Xeon (torch 2.13) SDPA's single
    query is 2-3x faster than the grouped matmul (58 vs 186 us at B=1, L=129). So the sweep
    times both on the model's shapes and sets the faster (roofline.measure.forward.
    choose_cpu_decode_attention); the default is the grouped path.
    """
    B, h, nq, dk = q.shape
    hkv = k.shape[1]
    if q.device.type == "cuda" and hkv == 1 < h and max(dk, v.shape[-1]) > FLASH_MAX_HEAD_DIM:
        # MLA's absorbed attention (DeepSeek-V3: q/k 576, v 512 wide, one shared latent head) is
        # too wide for flash, and enable_gqa keeps torch's other fused kernels out, so it would
        # take the math path. The shared head expanded to every query head (a view, stride 0:
        # no copy) leaves memory-efficient attention open to the dispatcher; where it still
        # picks math, the sweep's row says math_fallback and is no memory measurement.
        k, v = expand_shared_kv(k, v, h)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if cpu_decode not in CPU_DECODE_ATTENTION:
        raise ValueError(f"cpu_decode={cpu_decode!r}: allowed {CPU_DECODE_ATTENTION}")
    if q.device.type != "cpu" or nq != 1 or cpu_decode == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=hkv != h)
    g = h // hkv
    scores = q.reshape(B, hkv, g, dk) @ k.transpose(-1, -2)
    scores = (scores if scores.dtype == torch.float32 else scores.float()) * (scale or dk ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # mask [B, 1, 1, L] broadcasts over (h_kv, g)
    p = scores.softmax(-1)
    return ((p if p.dtype == v.dtype else p.to(v.dtype)) @ v).reshape(B, h, 1, v.shape[-1])


_MASK_FROM_POSITIONS = object()  # callers that pass no mask get the one start_pos implies


class GQAttention(nn.Module):
    CACHE_NAMES, POS_DIM = ("k_cache", "v_cache"), 2  # [batch, kv head, position, head_dim]
    kv_format = None  # a quantized cache's format (roofline.model.kvcache)
    cpu_decode = "grouped"  # attend's CPU decode path (set_cpu_decode_attention)

    def __init__(self, cfg: ModelConfig, max_batch: int, max_context: int):
        super().__init__()
        self.cfg = cfg
        h, hkv, dh = cfg.heads, cfg.kv_heads, cfg.head_dim
        gate = h if cfg.attn_output_gate else 0  # q_proj's per-head gate rows (Qwen3.5: [query, gate] a head)
        self.wqkv = nn.Linear(cfg.d, (h + gate + 2 * hkv) * dh, bias=cfg.qkv_bias)
        self.wo = nn.Linear(h * dh, cfg.d, bias=False)
        if cfg.qk_norm:
            whole = cfg.qk_norm_type == "per_layer"  # one RMS over all heads (MiniMax-M2), else each head's
            self.q_norm = RMSNorm(h * dh if whole else dh, cfg.norm_eps)
            self.k_norm = RMSNorm(hkv * dh if whole else dh, cfg.norm_eps)
        shape = (max_batch, hkv, max_context, dh)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x, cos, sin, start_pos, pos, kv_len, mask=_MASK_FROM_POSITIONS):
        cfg = self.cfg
        B, q, _ = x.shape
        h, hkv, dh = cfg.heads, cfg.kv_heads, cfg.head_dim
        qkv = self.wqkv(x)
        gated = cfg.attn_output_gate
        xq, xk, xv = qkv.split([h * dh * (2 if gated else 1), hkv * dh, hkv * dh], dim=-1)
        gate = None
        if gated:  # each head's rows: its query, then its gate
            xq, gate = xq.view(B, q, h, 2 * dh).chunk(2, dim=-1)
            gate = gate.reshape(B, q, h * dh)
        xq, xk, xv = xq.reshape(B, q, h, dh), xk.view(B, q, hkv, dh), xv.view(B, q, hkv, dh)
        if cfg.qk_norm:
            xq, xk = self.norm_qk(xq, xk)
        xq = apply_rope(xq, cos, sin, cfg.rope_interleave)
        xk = apply_rope(xk, cos, sin, cfg.rope_interleave)
        k = kvcache.update(self, "k_cache", pos, xk, B, kv_len)
        v = kvcache.update(self, "v_cache", pos, xv, B, kv_len)
        if mask is _MASK_FROM_POSITIONS:
            mask = attention_mask(start_pos, q, kv_len, x.device)
        o = attend(xq.transpose(1, 2), k, v, mask, cpu_decode=self.cpu_decode).transpose(1, 2).reshape(B, q, h * dh)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        return self.wo(o)

    def norm_qk(self, xq: torch.Tensor, xk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """QK-norm of xq [B, q, h, dh] and xk [B, q, h_kv, dh]: each head's vector (per_head), or every head's at
        once (per_layer). A rank of a sharded model that holds some of the heads runs its `qk_norm_tp` submodule
        instead (roofline.parallel.sharded.TPQKNorm: the RMS over all heads, one all-reduce)."""
        tp = self._modules.get("qk_norm_tp")
        if tp is not None:
            return tp(xq, xk)
        if self.cfg.qk_norm_type == "per_layer":
            B, q = xq.shape[:2]
            return self.q_norm(xq.reshape(B, q, -1)).view_as(xq), self.k_norm(xk.reshape(B, q, -1)).view_as(xk)
        return self.q_norm(xq), self.k_norm(xk)


class MLAttention(nn.Module):
    CACHE_NAMES, POS_DIM = ("kv_cache",), 1  # [batch, position, kv_lora_rank + qk_rope_dim]
    kv_format = None
    cpu_decode = "grouped"  # attend's CPU decode path (set_cpu_decode_attention)

    def __init__(self, cfg: ModelConfig, max_batch: int, max_context: int):
        super().__init__()
        self.cfg = cfg
        h, r = cfg.heads, cfg.kv_lora_rank
        qk = cfg.qk_nope_dim + cfg.qk_rope_dim
        if cfg.q_lora_rank:
            self.q_a = nn.Linear(cfg.d, cfg.q_lora_rank, bias=False)
            self.q_a_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.q_b = nn.Linear(cfg.q_lora_rank, h * qk, bias=False)
        else:
            self.q_proj = nn.Linear(cfg.d, h * qk, bias=False)
        self.kv_a = nn.Linear(cfg.d, r + cfg.qk_rope_dim, bias=False)
        self.kv_a_norm = RMSNorm(r, cfg.norm_eps)
        self.kv_b = nn.Linear(r, h * (cfg.qk_nope_dim + cfg.v_head_dim), bias=False)
        self.wo = nn.Linear(h * cfg.v_head_dim, cfg.d, bias=False)
        self.scale = yarn_softmax_scale(cfg.rope_scaling) / math.sqrt(qk)
        self.register_buffer("kv_cache", torch.zeros(max_batch, max_context, r + cfg.qk_rope_dim), persistent=False)
        if cfg.is_sparse:  # DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2 / GLM-5 `indexer.*`)
            hi, di = cfg.index_heads, cfg.index_head_dim
            self.idx_wq_b = nn.Linear(cfg.q_lora_rank, hi * di, bias=False)
            self.idx_wk = nn.Linear(cfg.d, di, bias=False)
            self.idx_k_norm = nn.LayerNorm(di, eps=1e-6)
            self.idx_weights = nn.Linear(cfg.d, hi, bias=False)
            self.register_buffer("index_cache", torch.zeros(max_batch, max_context, di), persistent=False)
            self.CACHE_NAMES = ("kv_cache", "index_cache")

    def forward(self, x, cos, sin, start_pos, pos, kv_len, mask=_MASK_FROM_POSITIONS):
        cfg = self.cfg
        B, q, _ = x.shape
        h, r, nope, rope_d, vd = cfg.heads, cfg.kv_lora_rank, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        q_lat = self.q_a_norm(self.q_a(x)) if cfg.q_lora_rank else None
        xq = self.q_b(q_lat) if cfg.q_lora_rank else self.q_proj(x)
        xq = xq.view(B, q, h, nope + rope_d)
        q_nope, q_pe = xq.split([nope, rope_d], dim=-1)
        q_pe = apply_rope(q_pe, cos, sin, cfg.rope_interleave)
        latent, k_pe = self.kv_a(x).split([r, rope_d], dim=-1)
        k_pe = apply_rope(k_pe[:, :, None, :], cos, sin, cfg.rope_interleave)[:, :, 0]
        latents = kvcache.update(self, "kv_cache", pos, torch.cat((self.kv_a_norm(latent), k_pe), dim=-1), B, kv_len)
        w = self.kv_b.weight.view(h, nope + vd, r)
        w_uk, w_uv = w[:, :nope], w[:, nope:]
        q_abs = torch.einsum("bqhn,hnr->bhqr", q_nope, w_uk)
        query = torch.cat((q_abs, q_pe.transpose(1, 2)), dim=-1)  # [B, h, q, r + rope]
        if cfg.is_sparse:
            o_lat = self._sparse(x, q_lat, query, latents, cos, sin, start_pos, pos, kv_len)
        else:
            cache = latents[:, None]  # one latent "head" shared by all heads
            if mask is _MASK_FROM_POSITIONS:
                mask = attention_mask(start_pos, q, kv_len, x.device)
            o_lat = attend(query, cache, cache[..., :r], mask, self.scale, cpu_decode=self.cpu_decode)
        o = torch.einsum("bhqr,hvr->bqhv", o_lat, w_uv)
        return self.wo(o.reshape(B, q, h * vd))

    def _sparse(self, x, q_lat, query, latents, cos, sin, start_pos, pos, kv_len):
        """DeepSeek Sparse Attention (DeepSeek-V3.2 §2.1): the lightning indexer scores every visible cached
        token t for query s, I[s, t] = sum_j w[s, j] · ReLU(q_j[s] · k[t]) (its own small heads j, one cached key
        per token, w from the hidden state), and each query attends only the index_topk best, gathered from the
        latent cache: the latent rows it reads are those (accounting: attended_positions), the index keys all.
        Engines compute the scores in fp8 after a Hadamard rotation of q and k (orthogonal: the same products);
        this runs them in float32, as transformers' reference does. Returns [B, h, q, r]."""
        cfg = self.cfg
        B, q, _ = x.shape
        hi, di, r = cfg.index_heads, cfg.index_head_dim, cfg.kv_lora_rank
        iq = apply_rope(self.idx_wq_b(q_lat).view(B, q, hi, di), cos, sin, cfg.index_rope_interleave)
        ik = apply_rope(self.idx_k_norm(self.idx_wk(x))[:, :, None], cos, sin, cfg.index_rope_interleave)[:, :, 0]
        keys = kvcache.update(self, "index_cache", pos, ik, B, kv_len)  # [B, kv_len, di]
        scores = torch.relu(torch.einsum("bqjd,btd->bqjt", iq.float(), keys.float())) * di ** -0.5
        w = self.idx_weights(x).float() * hi ** -0.5
        index = torch.einsum("bqj,bqjt->bqt", w, scores)  # [B, q, kv_len]
        sp = start_pos if isinstance(start_pos, torch.Tensor) else torch.full((B,), start_pos, device=x.device)
        visible = _causal_mask(sp, q, kv_len)[:, 0]  # [B, q, kv_len]
        k = min(cfg.index_topk, kv_len)
        # the k best, ties (ReLU's zeros) to the earlier position: a stable sort, so a query selects the same keys
        # whatever the slice's width (a decode step or a longer ragged slice)
        top = index.masked_fill(~visible, float("-inf")).sort(dim=-1, descending=True, stable=True).indices[..., :k]
        chosen = visible.gather(-1, top)  # fewer visible keys than k: the rest are padding
        rows = latents.gather(1, top.reshape(B, q * k, 1).expand(-1, -1, latents.shape[-1])).view(B, q, k, -1)
        s = torch.einsum("bhqc,bqkc->bhqk", query.float(), rows.float()) * self.scale
        p = s.masked_fill(~chosen[:, None], float("-inf")).softmax(-1)
        return torch.einsum("bhqk,bqkr->bhqr", p.to(rows.dtype), rows[..., :r])


class GatedRMSNorm(nn.Module):
    """RMSNorm of x times silu(gate) (a Gated DeltaNet's output norm): x / rms(x) * w in x's dtype, then times
    silu(gate) in float32 (transformers' Qwen3NextRMSNormGated)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (y * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """A Gated DeltaNet layer (linear attention; Qwen3-Next's and Qwen3.5's `linear_attn`). Its memory is not a
    cache of positions but, per sequence, the last kernel - 1 inputs of a causal depthwise conv over q, k, v
    (`conv_cache`) and a recurrent state S [v_heads, dk, dv] (`state_cache`, in linear_state_dtype). Each token:
    q, k, v from the conv (SiLU), q and k L2-normalised (q also by sqrt(dk)), beta = sigmoid(b), a decay
    g = -exp(A_log) softplus(a + dt_bias); S <- S e^g; S <- S + k (beta (v - S^T k))^T; out = S^T q; then the
    gated RMSNorm with z and out_proj. Projections in a canonical order: in_proj_qkvz rows [q; k; v; z] (all heads
    of each), in_proj_ba rows [b; a] (the loader maps a checkpoint's own layout onto it). A sequence called at
    position 0 starts from a zero state; later calls continue it, so each position must be fed once, in order."""
    CACHE_NAMES = ()  # no positions: its state is not read by position (roofline.model.kvcache leaves it)

    def __init__(self, cfg: ModelConfig, max_batch: int, max_context: int):
        super().__init__()
        self.cfg = cfg
        nk, nv, dk, dv = cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim
        conv = cfg.linear_conv_dim
        self.in_proj_qkvz = nn.Linear(cfg.d, 2 * nk * dk + 2 * nv * dv, bias=False)
        self.in_proj_ba = nn.Linear(cfg.d, 2 * nv, bias=False)
        self.conv1d = nn.Conv1d(conv, conv, cfg.linear_conv_kernel, groups=conv, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(nv))
        self.A_log = nn.Parameter(torch.zeros(nv))
        self.norm = GatedRMSNorm(dv, cfg.norm_eps)
        self.out_proj = nn.Linear(nv * dv, cfg.d, bias=False)
        self.register_buffer("conv_cache", torch.zeros(max_batch, conv, cfg.linear_conv_kernel - 1), persistent=False)
        self.register_buffer("state_cache", torch.zeros(max_batch, nv, dk, dv), persistent=False)

    def state_dtype(self, act: torch.dtype) -> torch.dtype:
        return torch_dtype(self.cfg.linear_state_dtype) if self.cfg.linear_state_dtype else act

    def forward(self, x, cos, sin, start_pos, pos, kv_len, mask=None):
        cfg = self.cfg
        B, q, _ = x.shape
        nk, nv, dk, dv = cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim
        fresh = (start_pos == 0) if isinstance(start_pos, torch.Tensor) else torch.full((B,), start_pos == 0,
                                                                                         device=x.device)
        keep = (~fresh).to(self.state_cache.dtype)
        conv_state = self.conv_cache[:B] * keep[:, None, None].to(self.conv_cache.dtype)
        state = self.state_cache[:B].float() * keep[:, None, None, None].float()
        qkvz = self.in_proj_qkvz(x)
        mixed, z = qkvz.split([2 * nk * dk + nv * dv, nv * dv], dim=-1)
        b, a = self.in_proj_ba(x).split([nv, nv], dim=-1)
        seq = torch.cat((conv_state.to(mixed.dtype), mixed.transpose(1, 2)), dim=-1)  # [B, conv, k - 1 + q]
        if cfg.linear_conv_kernel > 1:  # the last kernel - 1 inputs, for the next call
            self.conv_cache[:B] = seq[..., seq.shape[-1] - (cfg.linear_conv_kernel - 1):].to(self.conv_cache.dtype)
        mixed = F.silu(F.conv1d(seq, self.conv1d.weight, groups=seq.shape[1])).transpose(1, 2)  # [B, q, conv]
        qh, kh, vh = mixed.split([nk * dk, nk * dk, nv * dv], dim=-1)
        rep = nv // nk
        qh = qh.reshape(B, q, nk, dk).float().repeat_interleave(rep, dim=2)
        kh = kh.reshape(B, q, nk, dk).float().repeat_interleave(rep, dim=2)
        vh = vh.reshape(B, q, nv, dv).float()
        qh = qh * torch.rsqrt((qh * qh).sum(-1, keepdim=True) + 1e-6) / dk ** 0.5
        kh = kh * torch.rsqrt((kh * kh).sum(-1, keepdim=True) + 1e-6)
        beta = torch.sigmoid(b.float())
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        out = torch.empty(B, q, nv, dv, device=x.device)
        for t in range(q):  # the recurrence, a token at a time
            state = state * g[:, t].exp()[..., None, None]
            mem = (state * kh[:, t, :, :, None]).sum(-2)  # S^T k: [B, nv, dv]
            state = state + kh[:, t, :, :, None] * ((vh[:, t] - mem) * beta[:, t, :, None])[:, :, None, :]
            out[:, t] = (state * qh[:, t, :, :, None]).sum(-2)
        self.state_cache[:B] = state.to(self.state_cache.dtype)
        o = self.norm(out.to(x.dtype), z.reshape(B, q, nv, dv))
        return self.out_proj(o.reshape(B, q, nv * dv))


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """Every attention module of `model` (main stack and MTP modules)."""
    return [m for m in model.modules() if isinstance(m, (GQAttention, MLAttention))]


def set_cpu_decode_attention(model: nn.Module, impl: str) -> int:
    """Every attention module of `model` takes `impl` (CPU_DECODE_ATTENTION) for a CPU decode
    step; the number of modules set."""
    if impl not in CPU_DECODE_ATTENTION:
        raise ValueError(f"cpu decode attention {impl!r}: allowed {CPU_DECODE_ATTENTION}")
    mods = attention_modules(model)
    for m in mods:
        m.cpu_decode = impl
    return len(mods)


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig, impl: str):
        super().__init__()
        self.cfg, self.impl = cfg, impl
        E, f, d = cfg.experts, cfg.moe_ffn, cfg.d
        self.gate = nn.Linear(d, E, bias=False)
        if cfg.router_scoring == "sigmoid":
            self.score_bias = nn.Parameter(torch.zeros(E))  # e_score_correction_bias: selection only
        self.w1 = nn.Parameter(torch.empty(E, f, d))
        self.w3 = nn.Parameter(torch.empty(E, f, d))
        self.w2 = nn.Parameter(torch.empty(E, d, f))
        self.shared = SwiGLU(d, f * cfg.shared_experts) if cfg.shared_experts else None
        if cfg.shared_expert_gate:  # the shared expert's output times sigmoid of [d -> 1] (Qwen2-MoE .. Qwen3.5)
            self.shared_gate = nn.Linear(d, 1, bias=False)
        self._touched: int | torch.Tensor = 0  # an int, or the grouped path's per-expert counts

    @property
    def last_touched(self) -> int:
        """Experts the last forward ran (the grouped path's count is read on demand, outside any
        captured graph)."""
        t = self._touched
        return int((t > 0).sum()) if isinstance(t, torch.Tensor) else t

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        logits = self.gate(x).float()
        if cfg.router_scoring == "softmax":
            scores = logits.softmax(-1)
            w, idx = scores.topk(cfg.experts_per_token, dim=-1)
        else:
            scores = logits.sigmoid()
            choice = scores + self.score_bias.float()
            if cfg.router_topk_groups < cfg.router_groups:
                # group-limited (DeepSeek-V3, as transformers): rank groups by the sum of their
                # top-2 biased scores, keep the best router_topk_groups, pick experts only there
                grouped = choice.view(-1, cfg.router_groups, cfg.experts // cfg.router_groups)
                best = grouped.topk(2, dim=-1).values.sum(-1).topk(cfg.router_topk_groups, dim=-1).indices
                keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)
                choice = grouped.masked_fill(~keep[..., None], float("-inf")).view_as(choice)
            idx = choice.topk(cfg.experts_per_token, dim=-1).indices
            w = scores.gather(-1, idx)
        if cfg.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        return w * cfg.routed_scale, idx

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU of routed expert e on tokens x [n, d]. Float experts are slices of the stacked
        parameters; quantized ones (roofline.model.quant) run their own packed linear per expert."""
        if isinstance(self.w1, torch.Tensor):
            return (F.silu(x @ self.w1[e].T) * (x @ self.w3[e].T)) @ self.w2[e].T
        return self.w2.linear(e, F.silu(self.w1.linear(e, x)) * self.w3.linear(e, x))

    def _grouped(self, x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> None:
        """The routed experts' SwiGLU with no host sync: the N·k token-expert pairs sorted by
        expert, three grouped GEMMs over the experts' token groups (an expert no token routed to
        is an empty group: its weights are not read), the weighted rows added into `out` per token."""
        if not isinstance(self.w1, torch.Tensor):
            raise ValueError("moe_impl='grouped' runs float experts; quantized experts run 'touched'")
        E, k = self.cfg.experts, idx.shape[1]
        pairs = idx.reshape(-1)
        order = pairs.argsort(stable=True)
        counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
            0, pairs, torch.ones_like(pairs, dtype=torch.int32))
        self._touched = counts
        offs = counts.cumsum(0, dtype=torch.int32)
        tok = order // k
        xs = x[tok]
        h = F.silu(grouped_mm(xs, self.w1.transpose(1, 2), offs)) * grouped_mm(xs, self.w3.transpose(1, 2), offs)
        y = grouped_mm(h, self.w2.transpose(1, 2), offs)
        out.index_add_(0, tok, y.float() * w.reshape(-1)[order, None])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        w, idx = self.route(x)
        out = torch.zeros_like(x, dtype=torch.float32)
        if self.impl == "dense":
            dense_w = torch.zeros(x.shape[0], self.cfg.experts, device=x.device).scatter_(1, idx, w)
            if isinstance(self.w1, torch.Tensor):
                h = F.silu(torch.einsum("nd,efd->nef", x, self.w1)) * torch.einsum("nd,efd->nef", x, self.w3)
                y = torch.einsum("nef,edf->ned", h, self.w2)
                out += (y.float() * dense_w[:, :, None]).sum(1)
            else:  # quantized experts: each expert's own kernel on every token
                for e in range(self.cfg.experts):
                    out += self.expert(e, x).float() * dense_w[:, e, None]
            self._touched = self.cfg.experts
        elif self.impl == "grouped":
            self._grouped(x, w, idx, out)
        else:
            experts = idx.unique().tolist()
            self._touched = len(experts)
            for e in experts:
                tok, slot = (idx == e).nonzero(as_tuple=True)
                out.index_add_(0, tok, self.expert(e, x[tok]).float() * w[tok, slot, None])
        out = out.to(x.dtype)
        if self.shared is not None:
            shared = self.shared(x)
            if self.cfg.shared_expert_gate:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out.view(shape)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, moe: bool, max_batch: int, max_context: int, moe_impl: str,
                 linear: bool = False):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d, cfg.norm_eps)
        attn = GatedDeltaNet if linear else MLAttention if cfg.is_mla else GQAttention
        self.attn = attn(cfg, max_batch, max_context)
        self.ffn_norm = RMSNorm(cfg.d, cfg.norm_eps)
        self.ffn = MoE(cfg, moe_impl) if moe else dense_ffn(cfg)
        self.parallel = cfg.parallel_block

    def forward(self, x, cos, sin, start_pos, pos, kv_len, mask=_MASK_FROM_POSITIONS):
        a = self.attn(self.attn_norm(x), cos, sin, start_pos, pos, kv_len, mask)
        if self.parallel:  # attention and the FFN on the same input, both added to the residual
            return x + a + self.ffn(self.ffn_norm(x))
        x = x + a
        return x + self.ffn(self.ffn_norm(x))


class MTPModule(nn.Module):
    """DeepSeek-V3 §2.2 multi-token prediction module (also GLM-4.5's).

    h' = eh_proj([enorm(emb(t_{i+1})); hnorm(h_i)]) -> one decoder block -> norm -> shared LM
    head. The concatenation order (embedding first) is the one of the released weights as
    vLLM and SGLang load them. Embedding and LM head are the main model's (shared).
    """

    def __init__(self, cfg: ModelConfig, max_batch: int, max_context: int, moe_impl: str):
        super().__init__()
        self.enorm = RMSNorm(cfg.d, cfg.norm_eps)
        self.hnorm = RMSNorm(cfg.d, cfg.norm_eps)
        self.eh_proj = nn.Linear(2 * cfg.d, cfg.d, bias=False)
        self.block = Block(cfg, cfg.is_moe, max_batch, max_context, moe_impl)
        self.norm = RMSNorm(cfg.d, cfg.norm_eps)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, max_batch: int, max_context: int, moe_impl: str = "touched"):
        super().__init__()
        if moe_impl not in MOE_IMPLS:
            raise ValueError(f"moe_impl={moe_impl!r}: allowed {MOE_IMPLS}")
        if not 1 <= max_context <= cfg.max_context:
            raise ConfigError(f"max_context={max_context}: must be in 1..{cfg.max_context} (model.max_context)")
        if max_batch < 1:
            raise ConfigError(f"max_batch={max_batch}: must be >= 1")
        if cfg.local_span and max_context > cfg.local_span:
            kind = "a sliding window" if cfg.sliding_window else "chunks"
            raise ConfigError(f"max_context={max_context}: {cfg.name!r} attends {kind} of {cfg.local_span} tokens in some "
                              "layers, which this decoder does not run (it attends every cached token): it runs the model "
                              "up to that span, the what-if prices it at any context")
        self.cfg, self.max_batch, self.max_context = cfg, max_batch, max_context
        self.embed = nn.Embedding(cfg.vocab, cfg.d)
        self.layers = nn.ModuleList(
            Block(cfg, cfg.layer_is_moe(i), max_batch, max_context, moe_impl, cfg.layer_is_linear(i))
            for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.d, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d, cfg.vocab, bias=False)
        self.mtp = nn.ModuleList(MTPModule(cfg, max_batch, max_context, moe_impl) for _ in range(cfg.mtp_layers))
        self.last_mask_bytes = 0  # the attention mask the last forward built (accounting: mask_bytes)
        cos, sin = rope_table(cfg, max_context)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    # ---- pieces shared by the main stack and the MTP modules -----------------------------
    def head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.embed.weight) if self.lm_head is None else self.lm_head(x)

    def _positions(self, tokens, start_pos, kv_len):
        """Cache positions, RoPE rows, kv_len and the attention mask of one call (see forward)."""
        B, q = tokens.shape
        if B > self.max_batch:
            raise ValueError(f"batch {B} exceeds the cache's max_batch={self.max_batch}")
        if not isinstance(start_pos, torch.Tensor):  # an int (traced as a symbolic int by torch.compile)
            if start_pos < 0:
                raise ValueError(f"start_pos={start_pos}: must be >= 0")
            if kv_len not in (None, start_pos + q):
                raise ValueError(f"kv_len={kv_len}: with a uniform start_pos={start_pos} attention reads "
                                 f"exactly start_pos + q = {start_pos + q} positions (pass a tensor start_pos "
                                 "to read a longer, masked slice)")
            kv_len = start_pos + q
            pos = slice(start_pos, start_pos + q)
            cos, sin = self.rope_cos[pos][None], self.rope_sin[pos][None]
        else:
            pos = start_pos[:, None] + torch.arange(q, device=tokens.device)
            if kv_len is None:
                kv_len = int(start_pos.max()) + q
        if kv_len > self.max_context:
            raise ValueError(f"kv_len={kv_len} exceeds the cache's max_context={self.max_context}")
        if not isinstance(pos, slice):
            cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        mask = attention_mask(start_pos, q, kv_len, tokens.device)
        return pos, cos, sin, kv_len, mask

    def forward(self, tokens: torch.Tensor, start_pos: torch.Tensor | int, kv_len: int | None = None,
                return_hidden: bool = False):
        """Logits [B, q, V] for q new tokens per sequence at positions start_pos[b] + 0..q-1.

        start_pos: a LongTensor [B] (ragged: each sequence at its own position, attention under
        a boolean mask), or an int when every sequence is at the same position (the sweep's
        case): cache writes are one slice and attention needs no mask (`attention_mask`).
        kv_len: cache positions attention reads (>= max(start_pos) + q); fixed by callers that
        capture CUDA graphs with a tensor start_pos; with an int start_pos it is start_pos + q.
        return_hidden: also return the last hidden states after the final norm (what vLLM hands
        DeepSeek-V3's MTP module as the target's hidden state), which an MTP module consumes.
        """
        pos, cos, sin, kv_len, mask = self._positions(tokens, start_pos, kv_len)
        self.last_mask_bytes = mask_bytes(mask, len(self.layers) - self.cfg.linear_layers)  # Gated DeltaNet: none
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, start_pos, pos, kv_len, mask)
        h = self.norm(x)
        logits = self.head(h)
        return (logits, h) if return_hidden else logits

    def mtp_forward(self, hidden: torch.Tensor, next_tokens: torch.Tensor, start_pos: torch.Tensor | int,
                    depth: int = 0, kv_len: int | None = None):
        """MTP module `depth` over q positions: hidden [B, q, d] of the previous depth at
        positions start_pos + 0..q-1 and the tokens one step ahead -> (logits, hidden)."""
        m = self.mtp[depth]
        pos, cos, sin, kv_len, mask = self._positions(next_tokens, start_pos, kv_len)
        self.last_mask_bytes = mask_bytes(mask, 1)
        x = m.eh_proj(torch.cat((m.enorm(self.embed(next_tokens)), m.hnorm(hidden)), dim=-1))
        x = m.block(x, cos, sin, start_pos, pos, kv_len, mask)
        return self.head(m.norm(x)), x

    def last_touched_per_layer(self, kind: str = "forward") -> list[int]:
        """Experts each MoE layer ran in the last call: `kind` forward, the main stack; mtp, the MTP
        module's block. Any MoE implementation counts (one with `last_touched`, e.g. a rank's
        shard in roofline.parallel.sharded)."""
        blocks = [m.block for m in self.mtp] if kind == "mtp" else list(self.layers)
        return [b.ffn.last_touched for b in blocks if hasattr(b.ffn, "last_touched")]

    def last_experts_touched(self, kind: str = "forward") -> float | None:
        """Mean experts per MoE layer that the last call of `kind` ran (None for dense models)."""
        counts = self.last_touched_per_layer(kind)
        return sum(counts) / len(counts) if counts else None

    def kv_cache_tensors(self) -> list[torch.Tensor]:
        """Every cache buffer (main stack and MTP modules)."""
        return [b for n, b in self.named_buffers() if "cache" in n]

    def reset_cache(self) -> None:
        for b in self.kv_cache_tensors():
            b.zero_()
        kvcache.forget_scales(self)


LOGIT_STD = 4.0


def init_weights(model: Transformer, seed: int, std: float = 0.02) -> None:
    """Deterministic random weights: N(0, std) matrices, unit norms, zero biases.

    The LM head (the embedding when tied) gets std LOGIT_STD/sqrt(d): after the final RMSNorm
    the logits then spread like a trained model's (std ~4) instead of ~0.6, so the top-1 token
    is usually clear of the runner-up by more than half-precision rounding and greedy decoding
    in bf16 is decided by the model, not by which kernel computed it.

    Values are drawn in float32, one parameter at a time, and rounded into the parameter's own
    dtype: the same numbers whatever the target dtype, and never more than one float32
    parameter alive at once (the largest, the embedding or LM head, is the peak overhead).
    """
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    head = "embed.weight" if model.lm_head is None else "lm_head.weight"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("_norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                draw = p if p.dtype == torch.float32 else torch.empty(p.shape, device=p.device)
                draw.normal_(0.0, LOGIT_STD / model.cfg.d ** 0.5 if name == head else std, generator=g)
                if draw is not p:
                    p.copy_(draw)
                    del draw


def keep_state_dtypes(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """After `model.to(dtype)`: each Gated DeltaNet's recurrent state back in its own dtype (Qwen3.5's config:
    float32, whatever the weights')."""
    for m in model.modules():
        if isinstance(m, GatedDeltaNet):
            m.state_cache = m.state_cache.to(m.state_dtype(dtype))
    return model


def build_model(cfg: ModelConfig, *, max_batch: int, max_context: int, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", seed: int = 0, moe_impl: str = "touched",
                precision=None) -> Transformer:
    """The model in `dtype` on `device` (weights and cache), random-initialised deterministically.

    Built on the meta device and materialised straight into `dtype`: an 8B model in bf16 peaks
    at its 16 GB plus one float32 parameter, not at a float32 copy of everything. RoPE tables
    are computed in float32 on `device` (never rounded through `dtype`). device="meta" returns
    the model unmaterialised (shapes and dtypes only, no memory): for planning what fits.
    precision (a roofline.model.formats label or Precision): quantise the linears its weight and
    LM-head formats name, round-to-nearest from these weights, into packed linears.
    """
    with torch.device("meta"):
        model = Transformer(cfg, max_batch, max_context, moe_impl)
    model = keep_state_dtypes(model.to(dtype=dtype), dtype)
    if torch.device(device).type != "meta":
        model = model.to_empty(device=device)
        model.reset_cache()
        init_weights(model, seed)
    cos, sin = rope_table(cfg, max_context, device)
    model.rope_cos, model.rope_sin = cos, sin
    if precision is not None and torch.device(device).type != "meta":
        from roofline.model.quant import quantize_model
        quantize_model(model, precision, device)
    return model.eval().requires_grad_(False)
