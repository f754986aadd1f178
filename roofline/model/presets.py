"""The preset registry: every YAML file in roofline/conf/model/ is a model preset.

The same files are Hydra's `model` config group, so a user adds a preset by writing one
YAML file there (or in a folder named by ROOFLINE_PRESETS, os.pathsep-separated), and both
the library and the command line see it. The library reads the YAML itself; it never
imports Hydra.
"""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from pathlib import Path

from roofline.io.fields import ConfigError
from roofline.io.files import REPO_ROOT  # noqa: F401 (the tests find the checkout through it)
from roofline.io.yamltext import load_yaml
from roofline.model.config import ModelConfig

PRESET_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"


def preset_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("ROOFLINE_PRESETS", "").split(os.pathsep) if p]
    return [PRESET_DIR, *extra]


def _preset_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for folder in preset_dirs():
        for f in sorted(folder.glob("*.yaml")):
            files[f.stem] = f
    return files


def list_presets() -> list[str]:
    return sorted(_preset_files())


@lru_cache(maxsize=None)
def _load(path: Path) -> ModelConfig:
    raw = load_yaml(path.read_text())
    if not isinstance(raw, dict):
        raise ConfigError(f"preset file {path.name}: expected a mapping of model fields")
    raw = {k: v for k, v in raw.items() if not k.startswith("_")}
    raw.setdefault("name", path.stem)
    return ModelConfig.from_dict(raw)


def get_preset(name: str) -> ModelConfig:
    files = _preset_files()
    if name not in files:
        raise ConfigError(f"model={name!r}: unknown preset; allowed {sorted(files)}")
    return _load(files[name])


def scaled_down(cfg: ModelConfig, *, d: int = 64, layers: int = 3, vocab: int = 256,
                max_context: int = 128) -> ModelConfig:
    """A miniature of `cfg` with every feature flag kept (MLA, sparse attention, MoE, shared experts, MTP,
    QK-norm, biases, partial/interleaved RoPE and its scaling kind): for tests and CPU references."""
    heads = 4
    kv_heads = heads if cfg.kv_heads == cfg.heads else (1 if cfg.kv_heads == 1 else 2)
    ch = dict(name=f"{cfg.name}-mini", vocab=vocab, d=d, layers=min(cfg.layers, layers), heads=heads,
              kv_heads=kv_heads, head_dim=16, ffn=96, max_context=max_context,
              first_dense_layers=min(cfg.first_dense_layers, 1))
    if cfg.rope_scaling.kind != "none":
        ch["rope_scaling"] = dataclasses.replace(cfg.rope_scaling, original_max_position=max_context // 4)
    if cfg.is_moe:
        ch.update(experts=8, experts_per_token=min(cfg.experts_per_token, 2), moe_ffn=32)
        if cfg.router_topk_groups < cfg.router_groups:  # keep group-limited routing: 2 groups of 4, 1 kept
            ch.update(router_groups=2, router_topk_groups=1)
        elif cfg.router_groups > 1:
            ch.update(router_groups=1, router_topk_groups=1)
    if cfg.is_mla:
        ch.update(q_lora_rank=32 if cfg.q_lora_rank else 0, kv_lora_rank=32, qk_nope_dim=16,
                  qk_rope_dim=8, v_head_dim=16, head_dim=24, kv_heads=heads)
    if cfg.is_sparse:  # an indexer that selects: fewer keys than a test's contexts
        ch.update(index_topk=8, index_heads=2, index_head_dim=16)
    if cfg.full_attention_interval:  # 3 Gated DeltaNet layers and one full-attention layer
        ch.update(layers=min(cfg.layers, 4), full_attention_interval=min(cfg.full_attention_interval, 4),
                  linear_k_heads=2, linear_v_heads=4, linear_k_dim=16, linear_v_dim=8)
    return cfg.scaled(**ch)
