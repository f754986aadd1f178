"""Serving-engine profiles as data (roofline/data/engines.yaml, chosen by `engine=`).

A profile says what an engine adds to the kernels of a step and how it runs them: its per-step
host and scheduler time not hidden behind the GPU, whether it replays CUDA graphs (the per-layer
launch floor of roofline/data/priors.yaml, graph or eager), and its all-reduce latency per
interconnect. Each value is a triple (optimistic, typical, pessimistic) with a source and the
engine version it was read for. No engine named: the what-if runs every profile and its
interval spans them (roofline.parallel.whatif).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from roofline.io.fields import ConfigError
from roofline.parallel.kernels import pick

ENGINES_PATH = Path(__file__).resolve().parents[1] / "data" / "engines.yaml"
ENGINE_NAMES = ("vllm", "sglang", "trtllm", "lmdeploy", "llama.cpp", "gpt-fast", "hf-eager")


@lru_cache(maxsize=4)
def load_engines(path: str = str(ENGINES_PATH)) -> dict:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"engines={path!r}: no such file (the engine profiles)")
    doc = yaml.safe_load(p.read_text()) or {}
    return doc.get("engines", doc)


@dataclass(frozen=True)
class Engine:
    """One engine profile at one scenario index (0 optimistic, 1 typical, 2 pessimistic)."""
    name: str
    graphs: bool
    step_overhead_s: float  # per forward: host + scheduler time the GPU waits for
    per_layer_s: float | None  # per decoder block launch floor; None: priors.yaml's graph / eager floor
    allreduce_latency_s: dict  # interconnect key -> seconds of one small all-reduce
    bw_scale: float = 1.0  # the engine's kernels' share of the kernel priors' bandwidth (1: as kernels.yaml)


def names(path: str = str(ENGINES_PATH)) -> list[str]:
    return sorted(load_engines(path))


def profile(name: str, scenario: int, path: str = str(ENGINES_PATH)) -> Engine:
    engines = load_engines(path)
    if name not in engines:
        raise ConfigError(f"engine={name!r}: allowed {sorted(engines)}")
    e = engines[name]
    f = f"engines.{name}"
    try:
        ar = {link: pick(v["latency_us"] if isinstance(v, dict) and "latency_us" in v else v, scenario,
                         f"{f}.allreduce.{link}") * 1e-6
              for link, v in (e.get("allreduce") or {}).items() if link not in ("implementation", "source", "version")}
        per_layer = e.get("per_layer_us")
        return Engine(name=name, graphs=bool(e["cuda_graphs"]),
                      step_overhead_s=pick(e["step_overhead_us"], scenario, f"{f}.step_overhead_us") * 1e-6,
                      per_layer_s=None if per_layer is None else pick(per_layer, scenario, f"{f}.per_layer_us") * 1e-6,
                      allreduce_latency_s=ar,
                      bw_scale=pick(e["bw_scale"], scenario, f"{f}.bw_scale") if "bw_scale" in e else 1.0)
    except KeyError as err:
        raise ConfigError(f"{f}: missing key {err.args[0]!r}") from None
