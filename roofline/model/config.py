"""Model shapes as data: one frozen dataclass, filled from a preset YAML or a dict.

A preset is the published config.json of a model, renamed into the few fields a decoder
needs. Field names follow the physics notation of docs/design.md: d (hidden), layers, heads,
kv_heads, head_dim, ffn, vocab. MoE and MLA fields are zero/None for dense GQA models.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

from roofline.io.fields import ConfigError, check_number, from_dict
from roofline.model.dtypes import MODEL_DTYPES

ATTENTION_KINDS = ("gqa", "mla")
ROPE_SCALING_KINDS = ("none", "llama3", "yarn", "linear")
ROUTER_SCORING = ("softmax", "sigmoid")
QK_NORM_TYPES = ("per_head", "per_layer")


def kind_counts(kinds: dict[tuple[bool, bool], int]) -> tuple[int, int, int]:
    """(blocks, MoE blocks, Gated DeltaNet blocks) of a {(MoE, linear attention): count} (ModelConfig.layer_kinds)."""
    return (sum(kinds.values()), sum(c for (moe, _), c in kinds.items() if moe),
            sum(c for (_, lin), c in kinds.items() if lin))


@dataclass(frozen=True)
class RopeScaling:
    kind: str = "none"
    factor: float = 1.0
    original_max_position: int = 0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # yarn (DeepSeek-V3)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0


@dataclass(frozen=True)
class ModelConfig:
    name: str
    vocab: int
    d: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense FFN width (also the dense layers of an MoE model)
    max_context: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    rope_interleave: bool = False  # pairs (2i, 2i+1) instead of halves (i, i + d/2)
    partial_rotary: float = 1.0  # fraction of head_dim that is rotated (GLM: 0.5)
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    # where the QK-norm's RMS is taken: each head's q and k (Qwen3, GLM-4.5: per_head), or all heads' q and all
    # heads' k at once, one weight per element (MiniMax-M2's qk_norm_type per_layer)
    qk_norm_type: str = "per_head"
    attention: str = "gqa"
    # MLA (DeepSeek-V3); used when attention == "mla"
    q_lora_rank: int = 0  # 0: plain q projection
    kv_lora_rank: int = 0
    qk_nope_dim: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5; MLA only): a lightning indexer of index_heads heads of
    # index_head_dim (its own query from the q_lora latent, one cached key per token) scores every cached token;
    # each query attends only the index_topk best. 0: dense attention
    index_topk: int = 0
    index_heads: int = 0
    index_head_dim: int = 0
    index_rope_interleave: bool = False  # the indexer's RoPE pairs (DeepSeek-V3.2: halves; GLM-5: pairs)
    # hybrid linear attention (Qwen3-Next, Qwen3.5): every full_attention_interval-th layer (1-based) attends with
    # full attention, the others are Gated DeltaNet layers: linear attention whose memory is a recurrent state per
    # sequence (linear_v_heads x linear_k_dim x linear_v_dim, in linear_state_dtype) and the last
    # linear_conv_kernel - 1 inputs of a causal conv over its q, k, v; 0: every layer attends in full
    full_attention_interval: int = 0
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv_kernel: int = 0
    linear_state_dtype: str = ""  # "": the activations'; Qwen3.5's config: float32 (mamba_ssm_dtype)
    attn_output_gate: bool = False  # full attention's output times sigmoid(a gate q_proj also emits): q_proj 2x wide
    shared_expert_gate: bool = False  # the shared expert's output times sigmoid of a [d -> 1] projection
    # MoE; experts == 0 means dense
    experts: int = 0
    experts_per_token: int = 0
    moe_ffn: int = 0
    shared_experts: int = 0
    first_dense_layers: int = 0  # leading layers with a dense FFN (first_k_dense_replace)
    moe_every: int = 1  # beyond those, every moe_every-th layer (1-based) is MoE, the rest dense (Llama 4's interleave_moe_layer_step)
    router_scoring: str = "softmax"
    norm_topk: bool = True
    routed_scale: float = 1.0
    # group-limited routing (DeepSeek-V3 n_group / topk_group): experts split into router_groups
    # groups; a token picks its experts only from the router_topk_groups best groups
    router_groups: int = 1
    router_topk_groups: int = 1
    # MTP (DeepSeek-V3 / GLM-4.5): num_nextn_predict_layers
    mtp_layers: int = 0
    # sliding-window attention (gpt-oss, Gemma): a windowed layer attends (and an engine caches) only the
    # last `sliding_window` tokens; every `global_every`-th layer (1-based: layers global_every - 1,
    # 2 global_every - 1, ...) attends the whole context; global_every 0 with a window: every layer windowed
    sliding_window: int = 0
    global_every: int = 0
    # chunked local attention (Llama 4's attention_chunk_size): a windowed layer attends only the tokens of the
    # current chunk of `attention_chunk` positions (the cache holds those); the layers global_every picks attend all
    attention_chunk: int = 0
    # the dense FFN: a SwiGLU (gate, up, down: ffn_gated) or a two-matrix MLP (up, activation, down: GPT-J,
    # GPT-NeoX, Falcon, StarCoder); a parallel block (GPT-J, GPT-NeoX, Falcon) runs attention and the FFN on the same
    # block input and adds both to the residual, each through its own norm (Falcon-40B / 180B, GPT-NeoX; GPT-J and
    # Falcon-7B share one: d parameters a layer fewer than the decoder holds)
    ffn_gated: bool = True
    parallel_block: bool = False
    # the Hugging Face architecture the shapes were read from ('' unknown): engines key their model code's choices
    # by it (engines.yaml parallel_block_reduces)
    architecture: str = ""
    # the weight format the model is released in (roofline.model.formats name; "" = its float dtype),
    # chosen by `weights=native`; native_experts: its routed experts' own format where the release
    # quantizes only those (gpt-oss: mxfp4 experts, bf16 attention)
    native_weights: str = ""
    native_experts: str = ""
    # provenance of the shapes and the authors' published totals (for the card)
    source: str = ""
    published_params_total: float = 0.0
    published_params_active: float = 0.0
    published_note: str = ""

    def __post_init__(self) -> None:
        self.validate()

    # ---- derived shapes -------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.attention == "mla"

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices of a dense FFN: gate, up and down (SwiGLU) or up and down (a two-matrix MLP)."""
        return 3 if self.ffn_gated else 2

    @property
    def is_sparse(self) -> bool:
        """DeepSeek Sparse Attention: each query attends the index_topk keys its indexer scores best."""
        return self.index_topk > 0

    def layer_is_moe(self, i: int) -> bool:
        return self.is_moe and i >= self.first_dense_layers and (i + 1) % self.moe_every == 0

    def layer_is_linear(self, i: int) -> bool:
        """Layer i is a Gated DeltaNet (linear attention) layer of a hybrid model."""
        return self.full_attention_interval > 0 and (i + 1) % self.full_attention_interval != 0

    def layer_kinds(self, layers: int | None = None) -> dict[tuple[bool, bool], int]:
        """{(MoE, linear attention): count} over the first `layers` layers of the main stack (all by default), counted
        once per config and length (the what-if asks for it on every pass it prices; the config is frozen)."""
        n = self.layers if layers is None else layers
        memo = self.__dict__.setdefault("_layer_kinds_memo", {})  # beside the fields: not compared, not replaced
        if n not in memo:
            out: dict[tuple[bool, bool], int] = {}
            for i in range(n):
                key = (self.layer_is_moe(i), self.layer_is_linear(i))
                out[key] = out.get(key, 0) + 1
            memo[n] = tuple(out.items())
        return dict(memo[n])

    @property
    def linear_layers(self) -> int:
        """Gated DeltaNet layers of the main stack (0 without hybrid attention): all but every interval-th."""
        k = self.full_attention_interval
        return self.layers - self.layers // k if k else 0

    @property
    def full_share(self) -> float:
        """The share of the main stack's layers that keep a KV cache (all but the linear-attention ones)."""
        return 1.0 - self.linear_layers / self.layers

    @property
    def linear_conv_dim(self) -> int:
        """Channels of a Gated DeltaNet layer's causal conv: its q, k and v."""
        return 2 * self.linear_k_heads * self.linear_k_dim + self.linear_v_heads * self.linear_v_dim

    @cached_property
    def has_dense_layers(self) -> bool:
        """Any layer with a dense FFN (a dense model, leading dense layers, or interleaved ones)."""
        return any(not self.layer_is_moe(i) for i in range(self.layers))

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head that RoPE rotates."""
        if self.is_mla:
            return self.qk_rope_dim
        return int(self.head_dim * self.partial_rotary)

    @property
    def kv_elems_per_token_layer(self) -> int:
        """Cache elements one token adds in one layer: K and V for GQA, latent + RoPE key for MLA (+ the
        indexer's key with sparse attention)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_dim + self.index_head_dim
        return 2 * self.kv_heads * self.head_dim

    def attended_positions(self, L: float, q: int = 1) -> float:
        """Cached positions whose keys and values a step of q queries over L positions reads for its attention
        (the layers' mean): every held one (kv_positions), or with sparse attention the index_topk each query
        selects, at most q·index_topk distinct (exact for a decode step, q = 1; the indexer reads the index keys
        of all L)."""
        return min(L, q * self.index_topk) if self.is_sparse else self.kv_positions(L)

    def indexer_pairs(self, L: float, q: int) -> float:
        """(query, key) pairs the indexer scores in one layer for q new tokens after L cached ones (causal: every
        key up to each query); 0 without sparse attention."""
        return q * L + q * (q + 1) / 2 if self.is_sparse else 0.0

    @property
    def local_span(self) -> int:
        """The most tokens a windowed layer attends: its sliding window or its attention chunk (0: none)."""
        return self.sliding_window or self.attention_chunk

    @property
    def local_kind(self) -> str | None:
        """'sliding' (a sliding window), 'chunked' (an attention chunk) or None (every layer attends all)."""
        return "sliding" if self.sliding_window else "chunked" if self.attention_chunk else None

    def attending_all(self) -> "ModelConfig":
        """This model as an engine runs it when it reads (or holds) every cached token of its windowed layers."""
        return self.scaled(sliding_window=0, attention_chunk=0, global_every=0) if self.local_kind else self

    @property
    def windowed_layers(self) -> int:
        """Layers of the main stack that attend a sliding window or a chunk (0 without one)."""
        if not self.local_span:
            return 0
        return self.layers - (self.layers // self.global_every if self.global_every else 0)

    @property
    def windowed_share(self) -> float:
        """The share of the main stack's layers that attend a window or a chunk (0 without one)."""
        return self.windowed_layers / self.layers

    def _local_keys(self, n: float) -> float:
        """Keys the n-th token (1-based) attends in a windowed layer: min(n, window), or its place in its chunk."""
        if self.sliding_window:
            return min(n, self.sliding_window)
        return (n - 1) % self.attention_chunk + 1 if n >= 1 else n

    def _local_pairs(self, n: float) -> float:
        """Sum over tokens 1..n of `_local_keys` (n whole or not: a mean length)."""
        if self.sliding_window:
            w = self.sliding_window
            return n * (n + 1) / 2 if n <= w else w * (w + 1) / 2 + (n - w) * w
        c = self.attention_chunk
        full, r = divmod(n, c)
        return full * c * (c + 1) / 2 + r * (r + 1) / 2

    def kv_positions(self, L: float) -> float:
        """Cached positions a layer holds and a decode step reads for a sequence of L tokens, as the mean
        over the main stack's layers: L for a full-attention layer, min(L, window) for a sliding-window one,
        the positions of the current chunk for a chunked one, none for a linear-attention one."""
        share = self.windowed_share
        if self.full_attention_interval:  # linear-attention layers hold no positions (a state per sequence instead)
            return self.full_share * L
        return L if not share or L <= 0 else (1.0 - share) * L + share * self._local_keys(L)

    def pool_positions(self, L: float, rule="window") -> float:
        """Positions an engine's KV pool holds per layer (the layers' mean) for a sequence of L tokens, by its rule for
        windowed layers (engines.yaml local_attention.pool): the window or chunk (window), every token (full), or a
        fraction of the tokens (SGLang's swa_full_tokens_ratio)."""
        if not self.local_kind or rule == "window":
            return self.kv_positions(L)
        share = self.windowed_share
        return L if rule == "full" else (1.0 - share) * L + share * float(rule) * L

    def attended_pairs(self, L: float, q: int) -> float:
        """(query, key) pairs q new tokens after L cached ones attend in one layer (causal), as the mean
        over the layers: q·L + q(q+1)/2 for full attention; for a windowed one, the sum over the new tokens
        of the keys each sees (min(L + i, window), or its place in its chunk); with sparse attention the same
        sum with min(L + i, index_topk) (the indexer's own pairs: indexer_pairs)."""
        if self.is_sparse:  # each query attends min(its keys, index_topk): a window of index_topk in count
            k = self.index_topk
            capped = lambda n: n * (n + 1) / 2 if n <= k else k * (k + 1) / 2 + (n - k) * k  # noqa: E731
            return capped(L + q) - capped(L)
        full = q * L + q * (q + 1) / 2
        share = self.windowed_share
        if self.full_attention_interval:  # linear-attention layers attend no pairs (their recurrence: linear_flops)
            return self.full_share * full
        if not share:
            return full
        return (1.0 - share) * full + share * (self._local_pairs(L + q) - self._local_pairs(L))

    # ---- construction ---------------------------------------------------------------
    def validate(self) -> None:
        positive = ["vocab", "d", "layers", "heads", "kv_heads", "head_dim", "max_context"]
        for f in positive:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:  # `hidden_size: true` is not d=1
                raise ConfigError(f"model.{f}={v!r}: must be a positive integer")
        nonneg = ["ffn", "q_lora_rank", "kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim",
                  "experts", "experts_per_token", "moe_ffn", "shared_experts", "first_dense_layers",
                  "mtp_layers", "sliding_window", "global_every", "attention_chunk", "index_topk", "index_heads",
                  "index_head_dim", "full_attention_interval", "linear_k_heads", "linear_v_heads", "linear_k_dim",
                  "linear_v_dim", "linear_conv_kernel"]
        for f in nonneg:
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"model.{f}={v!r}: must be a non-negative integer")
        for f in ("rope_theta", "norm_eps", "routed_scale"):  # NaN, inf, 0 or a bool: no model has it
            check_number(f"model.{f}", getattr(self, f), 0.0, lo_open=True)
        if self.qk_norm_type not in QK_NORM_TYPES:
            raise ConfigError(f"model.qk_norm_type={self.qk_norm_type!r}: allowed {QK_NORM_TYPES}")
        if self.qk_norm_type != "per_head" and (not self.qk_norm or self.is_mla):
            raise ConfigError(f"model.qk_norm_type={self.qk_norm_type!r}: needs qk_norm on a GQA model")
        if self.attention not in ATTENTION_KINDS:
            raise ConfigError(f"model.attention={self.attention!r}: allowed {ATTENTION_KINDS}")
        if self.router_scoring not in ROUTER_SCORING:
            raise ConfigError(f"model.router_scoring={self.router_scoring!r}: allowed {ROUTER_SCORING}")
        if self.rope_scaling.kind not in ROPE_SCALING_KINDS:
            raise ConfigError(f"model.rope_scaling.kind={self.rope_scaling.kind!r}: allowed {ROPE_SCALING_KINDS}")
        if self.heads % self.kv_heads:
            raise ConfigError(f"model.kv_heads={self.kv_heads}: must divide heads={self.heads}")
        if not 0.0 < self.partial_rotary <= 1.0:
            raise ConfigError(f"model.partial_rotary={self.partial_rotary}: must be in (0, 1]")
        if self.rotary_dim % 2:
            raise ConfigError(f"model.partial_rotary: rotary dim {self.rotary_dim} must be even")
        if self.is_mla and min(self.kv_lora_rank, self.qk_nope_dim, self.qk_rope_dim, self.v_head_dim) < 1:
            raise ConfigError("model.attention='mla' needs kv_lora_rank, qk_nope_dim, qk_rope_dim, v_head_dim >= 1")
        if self.is_sparse or self.index_heads or self.index_head_dim:
            if not (self.is_mla and self.q_lora_rank):
                raise ConfigError("model.index_topk: sparse attention is modelled for MLA with a q_lora_rank (its indexer "
                                  "reads the q latent)")
            if min(self.index_topk, self.index_heads) < 1 or self.index_head_dim < self.qk_rope_dim:
                raise ConfigError(f"model.index_topk={self.index_topk}, index_heads={self.index_heads}, index_head_dim="
                                  f"{self.index_head_dim}: sparse attention needs all three, index_head_dim >= "
                                  f"qk_rope_dim={self.qk_rope_dim} (the indexer rotates its first qk_rope_dim dims)")
            if self.local_span:
                raise ConfigError("model.index_topk with a sliding window or attention chunk: not modelled together")
        if self.full_attention_interval:
            if min(self.linear_k_heads, self.linear_v_heads, self.linear_k_dim, self.linear_v_dim,
                   self.linear_conv_kernel) < 1 or self.linear_v_heads % self.linear_k_heads:
                raise ConfigError("model.full_attention_interval: Gated DeltaNet layers need linear_k_heads, "
                                  "linear_v_heads (a multiple of linear_k_heads), linear_k_dim, linear_v_dim, "
                                  "linear_conv_kernel >= 1")
            if self.is_mla or self.local_span or self.is_sparse or self.mtp_layers:
                raise ConfigError("model.full_attention_interval with MLA, local or sparse attention or MTP modules: "
                                  "not modelled together")
        if self.linear_state_dtype not in ("",) + MODEL_DTYPES:
            raise ConfigError(f"model.linear_state_dtype={self.linear_state_dtype!r}: allowed '' (the activations') or "
                              f"{MODEL_DTYPES}")
        if self.shared_expert_gate and not self.shared_experts:
            raise ConfigError("model.shared_expert_gate: needs shared_experts >= 1")
        if self.is_moe:
            if not 1 <= self.experts_per_token <= self.experts:
                raise ConfigError(f"model.experts_per_token={self.experts_per_token}: must be in 1..experts={self.experts}")
            if self.moe_ffn < 1:
                raise ConfigError("model.moe_ffn must be >= 1 when experts > 0")
        for f in ("router_groups", "router_topk_groups"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"model.{f}={v!r}: must be a positive integer")
        if self.router_groups > 1:
            if not self.is_moe or self.experts % self.router_groups or self.experts // self.router_groups < 2:
                raise ConfigError(f"model.router_groups={self.router_groups}: must divide experts={self.experts} "
                                  "into groups of >= 2 (a group is ranked by its top-2 scores)")
        if self.router_topk_groups < self.router_groups and self.router_scoring != "sigmoid":
            raise ConfigError(f"model.router_topk_groups={self.router_topk_groups} < router_groups={self.router_groups}: "
                              "group-limited routing is modelled for router_scoring='sigmoid' only")
        if self.router_topk_groups > self.router_groups:
            raise ConfigError(f"model.router_topk_groups={self.router_topk_groups}: must be in "
                              f"1..router_groups={self.router_groups}")
        if self.first_dense_layers > self.layers:
            raise ConfigError(f"model.first_dense_layers={self.first_dense_layers}: must be <= layers={self.layers}")
        if self.sliding_window and self.attention_chunk:
            raise ConfigError("model.sliding_window and model.attention_chunk: a model has one kind of local attention")
        if self.global_every and not self.local_span:
            raise ConfigError(f"model.global_every={self.global_every}: needs a sliding_window or an attention_chunk")
        if isinstance(self.moe_every, bool) or not isinstance(self.moe_every, int) or self.moe_every < 1:
            raise ConfigError(f"model.moe_every={self.moe_every!r}: must be a positive integer")
        if (not self.ffn_gated or self.parallel_block) and (self.is_moe or self.is_mla or self.full_attention_interval
                                                             or self.mtp_layers):
            raise ConfigError("model.ffn_gated=false / parallel_block: modelled for dense GQA models (GPT-J, GPT-NeoX, "
                              "Falcon, StarCoder), not with MoE, MLA, linear attention or MTP modules")
        if self.has_dense_layers and self.ffn < 1:
            raise ConfigError("model.ffn must be >= 1 for dense layers")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "ModelConfig":
        rs = raw.get("rope_scaling")
        if rs is None:
            rs = RopeScaling()
        elif isinstance(rs, Mapping):
            rs = from_dict(RopeScaling, rs, "model.rope_scaling")
        return from_dict(cls, raw, "model", rope_scaling=rs)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def scaled(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (scaled-down test models, layer slices)."""
        return dataclasses.replace(self, **changes)
