"""The preset registry: every YAML file in conf/model/ is a model preset.

The same files are Hydra's `model` config group, so a user adds a preset by writing one
YAML file there (or in a folder named by ROOFLINE_PRESETS, os.pathsep-separated), and both
the library and the experiments see it. The library reads the YAML itself; it never
imports Hydra.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import yaml

from roofline.config import ConfigError, ModelConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
PRESET_DIR = REPO_ROOT / "conf" / "model"


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
    raw = yaml.safe_load(path.read_text())
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
