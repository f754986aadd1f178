"""How a model is laid out over devices, as data: tensor, expert and pipeline parallelism.

A layout uses tp · pp devices: pp pipeline stages, each a group of tp ranks.

- tp: attention heads and FFN columns split over the tp ranks of a stage (Megatron column-
  then row-parallel linears, one all-reduce after attention and one after the FFN). KV heads
  are split too, or replicated when kv_heads < tp (each rank keeps the KV head its query
  heads read, as vLLM and SGLang do); MLA's latent cache has no heads and is replicated.
  The LM head is split over the vocabulary (its logits all-gathered) when tp divides it.
- ep: the routed experts split over ep of the tp ranks (ep divides tp); the remaining tp/ep
  factor splits each expert's width. Router and shared experts follow tp.
- dp_attention (SGLang's --enable-dp-attention): attention, dense FFNs and the LM head are
  replicated and each rank runs its own share of the batch; only the routed experts are split
  (ep = tp), and tokens travel to the rank of their expert and back by all-to-all.
- pp: consecutive layers per stage (accounting only: weights and cache per stage, one
  point-to-point send of the activations per stage boundary).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from roofline.io.fields import ConfigError
from roofline.model.config import ModelConfig


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp_attention: bool = False

    def __post_init__(self) -> None:
        for f in ("tp", "ep", "pp"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"layout.{f}={v!r}: must be a positive integer")
        if not isinstance(self.dp_attention, bool):
            raise ConfigError(f"layout.dp_attention={self.dp_attention!r}: must be true or false")
        if self.tp % self.ep:
            raise ConfigError(f"layout.ep={self.ep}: must divide tp={self.tp} (experts split over ep of the tp ranks)")
        if self.dp_attention and self.ep != self.tp:
            raise ConfigError(f"layout.dp_attention=true needs ep == tp (got ep={self.ep}, tp={self.tp}): "
                              "attention is replicated, so only the experts can be split")

    @property
    def devices(self) -> int:
        return self.tp * self.pp

    @property
    def expert_tp(self) -> int:
        """Ranks one expert's width is split over."""
        return self.tp // self.ep

    @property
    def attention_tp(self) -> int:
        return 1 if self.dp_attention else self.tp

    @property
    def batch_split(self) -> int:
        """Ranks the batch is divided over inside a stage (dp_attention: all of them)."""
        return self.tp if self.dp_attention else 1

    def as_row(self) -> dict:
        return dict(tp=self.tp, ep=self.ep, pp=self.pp, dp_attention=self.dp_attention, devices=self.devices)

    def label(self) -> str:
        parts = [f"tp{self.tp}"] + ([f"ep{self.ep}"] if self.ep > 1 else []) + (["dpattn"] if self.dp_attention else [])
        return "-".join(parts + ([f"pp{self.pp}"] if self.pp > 1 else []))

    # ---- against a model and a world --------------------------------------------------------
    def check(self, cfg: ModelConfig, world: int | None = None) -> None:
        """ConfigError naming the field when the layout cannot shard `cfg` on `world` devices."""
        if world is not None and self.tp > world:
            raise ConfigError(f"layout.tp={self.tp}: larger than the world ({world} ranks)")
        if world is not None and self.devices > world:
            raise ConfigError(f"layout.pp={self.pp}: tp*pp={self.devices} ranks exceed the world ({world} ranks)")
        if self.pp > cfg.layers:
            raise ConfigError(f"layout.pp={self.pp}: more stages than model.layers={cfg.layers}")
        if self.ep > 1 and not cfg.is_moe:
            raise ConfigError(f"layout.ep={self.ep}: model {cfg.name!r} has no experts (dense); allowed ep=1")
        if self.dp_attention and not cfg.is_moe:
            raise ConfigError(f"layout.dp_attention=true: model {cfg.name!r} has no experts to split")
        t = self.attention_tp
        if cfg.heads % t:
            raise ConfigError(f"layout.tp={self.tp}: must divide model.heads={cfg.heads}")
        if not cfg.is_mla and t > 1 and (cfg.kv_heads % t if cfg.kv_heads >= t else t % cfg.kv_heads):
            raise ConfigError(f"layout.tp={self.tp}: must divide model.kv_heads={cfg.kv_heads} or be a multiple "
                              "of it (KV heads split, or replicated when kv_heads < tp)")
        if cfg.full_attention_interval and (cfg.linear_k_heads % t or cfg.linear_v_heads % t):
            raise ConfigError(f"layout.tp={self.tp}: must divide the Gated DeltaNet heads (linear_k_heads="
                              f"{cfg.linear_k_heads}, linear_v_heads={cfg.linear_v_heads})")
        if cfg.has_dense_layers and cfg.ffn % t:
            raise ConfigError(f"layout.tp={self.tp}: must divide model.ffn={cfg.ffn}")
        if cfg.is_moe:
            if cfg.experts % self.ep:
                raise ConfigError(f"layout.ep={self.ep}: must divide model.experts={cfg.experts}")
            if cfg.moe_ffn % self.expert_tp:
                raise ConfigError(f"layout.tp={self.tp}: tp/ep={self.expert_tp} must divide model.moe_ffn={cfg.moe_ffn}")


@dataclass(frozen=True)
class LocalShapes:
    """What one rank of a stage holds."""
    heads: int
    kv_heads: int  # GQA: KV heads in this rank's cache (replicated ones included)
    ffn: int  # dense FFN width
    experts: int  # routed experts held
    moe_ffn: int  # width of each held expert
    shared_ffn: int  # shared-expert width (all shared experts together)
    vocab_head: int  # LM-head rows
    layers: int  # decoder blocks of the largest stage


def local_shapes(cfg: ModelConfig, layout: Layout) -> LocalShapes:
    layout.check(cfg)
    t = layout.attention_tp
    kv = cfg.kv_heads // t if cfg.kv_heads >= t else 1
    return LocalShapes(heads=cfg.heads // t, kv_heads=cfg.heads // t if cfg.is_mla else kv,
                       ffn=cfg.ffn // t, experts=cfg.experts // layout.ep,
                       moe_ffn=cfg.moe_ffn // layout.expert_tp if cfg.is_moe else 0,
                       shared_ffn=cfg.moe_ffn * cfg.shared_experts // t,
                       vocab_head=cfg.vocab // t if cfg.vocab % t == 0 else cfg.vocab,
                       layers=math.ceil(cfg.layers / layout.pp))


def kv_head_of_rank(cfg: ModelConfig, tp: int, rank: int) -> list[int]:
    """The KV heads rank `rank` of a tp group caches (one replicated head when kv_heads < tp)."""
    if cfg.kv_heads >= tp:
        n = cfg.kv_heads // tp
        return list(range(rank * n, (rank + 1) * n))
    group = cfg.heads // cfg.kv_heads  # query heads per KV head
    return [rank * (cfg.heads // tp) // group]


def experts_touched_per_rank(cfg: ModelConfig, tokens: int, ep: int) -> float:
    """Expected distinct experts one EP rank runs for `tokens` routed tokens (uniform routing):
    it holds E/ep experts, each touched with probability 1 − (1 − k/E)^tokens. For speculative
    verification tokens = B·(k+1) (every sequence's k drafts and its bonus position)."""
    if not cfg.is_moe:
        return 0.0
    E, k = cfg.experts, cfg.experts_per_token
    return E / ep * (1.0 - (1.0 - k / E) ** tokens)


def experts_touched_busiest_rank(cfg: ModelConfig, tokens: int, ep: int) -> float:
    """Expected distinct experts the BUSIEST of the ep ranks runs in one MoE layer (uniform routing).

    Every MoE layer ends in a collective (the all-reduce, or the combine all-to-all), so each
    layer waits for its slowest rank: the step reads, per layer, the expert weights of the rank
    that drew the most experts, not the ranks' mean. With each expert touched independently
    with probability p = 1 − (1 − k/E)^tokens, one rank's count is Binomial(E/ep, p) and
    E[max of ep] = Σ_{x≥1} (1 − F(x−1)^ep). One token on EP8 (DeepSeek-V3: 32 experts per rank,
    k = 8): the mean is 1 expert per rank, the busiest rank runs 2.54. Independence across
    experts is an approximation (a token's k experts are distinct); a Monte Carlo of distinct
    draws agrees within 2% (tests/test_parallel_layout.py)."""
    mean = experts_touched_per_rank(cfg, tokens, ep)
    n = cfg.experts // ep if cfg.is_moe else 0
    p = mean / n if n else 0.0
    if ep == 1 or p <= 0.0 or p >= 1.0:
        return mean
    cdf, expected = 0.0, 0.0
    for x in range(n):  # expected = Σ_{x=1}^{n} P(max ≥ x) = Σ (1 − F(x−1)^ep)
        cdf += math.comb(n, x) * p ** x * (1.0 - p) ** (n - x)
        expected += 1.0 - min(cdf, 1.0) ** ep
    return expected
