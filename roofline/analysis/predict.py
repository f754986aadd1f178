"""Speculative-decoding predictions from fitted step times: glue between roofline.analysis.costmodel
(T(q, B, L) of the target, the drafter's step) and roofline.spec.theory (tau, R, S, k*).

Where each cost comes from:
- target(q, B, L): the fitted forward step of the target preset;
- draft(i, k, B, L): as roofline.spec.engine runs the drafters. MTP: the first draft of a round is
  one MTP pass over the k+1 verified positions (its catch-up), the others chained single
  steps; a draft model: a two-token catch-up forward, then single steps; n-gram: 0 (`no_cost`);
- overhead(k, B): per-round sampling/bookkeeping/host sync. No measurement of it exists yet,
  so it is a constant share of the fitted per-forward overhead t0, and every row says so
  (`overhead_source="fit_t0"`); the speculative engine will measure it.
A preset that was not measured is predicted by applying the fitted device parameters to its
accounting (`source="device-fit-transfer"`): such rows are extrapolations by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from roofline.analysis import costmodel

from roofline.spec import theory as speculative
from roofline.model.config import ConfigError, ModelConfig
from roofline.spec.theory import StepCosts, no_cost

DRAFTERS = ("mtp", "model", "ngram")


@dataclass(frozen=True)
class Drafter:
    kind: str = "mtp"  # mtp | model | ngram
    model: ModelConfig | None = None  # the draft preset when kind == "model"
    fit: dict | None = None  # the draft model's own fit (default: the target's device fit)

    def __post_init__(self) -> None:
        if self.kind not in DRAFTERS:
            raise ConfigError(f"drafter={self.kind!r}: allowed {DRAFTERS}")
        if self.kind == "model" and self.model is None:
            raise ConfigError("drafter=model needs draft_model (a preset name)")


@dataclass(frozen=True)
class Costs:
    steps: StepCosts
    source: str  # fit | device-fit-transfer
    overhead_source: str
    overhead_s: float
    domain: dict = field(default_factory=dict)
    target_model: object = None  # the target's costmodel.StepModel (says "table" or "fit" per step)


def step_costs(fit: dict, dtype: str, drafter: Drafter, target: ModelConfig | None = None,
               mode: str | None = None, overhead_share: float = 1.0, overhead: dict | None = None) -> Costs:
    """StepCosts for roofline.spec.theory from a target fit (and optionally a draft fit)."""
    target = target or costmodel.fitted_model(fit)
    forward = costmodel.step_model(fit, "forward", dtype, mode, target)
    group = costmodel.find_group(fit, "forward", dtype, mode)
    tgt = forward.seconds
    if drafter.kind == "mtp":
        if target.mtp_layers < 1:
            raise ConfigError(f"drafter=mtp: model {target.name!r} has no MTP module (mtp_layers=0)")
        mtp = costmodel.step_model(fit, "mtp", dtype, mode, target)
        draft = lambda i, k, B, L: mtp.seconds(k + 1 if i == 1 else 1, B, L + i - 1)  # noqa: E731
    elif drafter.kind == "model":
        dm = costmodel.step_model(drafter.fit or fit, "forward", dtype, mode, drafter.model)
        draft = lambda i, k, B, L: dm.seconds(2 if i == 1 else 1, B, L + i - 1)  # noqa: E731
    else:
        draft = no_cost
    overhead_s = overhead_share * group["coefs"][0]
    per_round, source = (lambda k, B: overhead_s), "fit_t0"
    if overhead is not None:  # measured by the speculative engine (roofline.spec.validation overhead.json)
        c0, c1, c2 = overhead["coef"]
        per_round, source = (lambda k, B: max(0.0, c0 + c1 * k + c2 * B)), "measured"
    return Costs(StepCosts(target=tgt, draft=draft, overhead=per_round),
                 source=forward.fit_source, overhead_source=source, overhead_s=overhead_s,
                 domain={a: tuple(group["domain"][a]) for a in ("q", "B", "L")}, target_model=forward)


def table(fit: dict, alphas, ks, Bs, Ls, dtype: str, drafter: Drafter, target: ModelConfig | None = None,
          mode: str | None = None, overhead_share: float = 1.0, overhead: dict | None = None) -> pd.DataFrame:
    """speculative.predict_table over (alpha or profile, k, B, L), labelled with where the costs came from."""
    target = target or costmodel.fitted_model(fit)
    c = step_costs(fit, dtype, drafter, target, mode, overhead_share, overhead)
    t = speculative.predict_table(alphas, ks, Bs, Ls, c.steps, measured_domain=c.domain)
    if c.source != "fit":
        t["extrapolated"] = True
    return t.assign(model=target.name, dtype=dtype, drafter=drafter.kind if drafter.kind != "model"
                    else f"model:{drafter.model.name}", source=c.source, overhead_source=c.overhead_source,
                    overhead_s=c.overhead_s, device_name=fit["provenance"]["device_name"])


def alphas_from_vllm(text: str, model_name: str | None = None) -> dict:
    """{label: per-position conditional acceptance} from a vLLM /metrics dump."""
    from roofline.spec.vllm_metrics import parse_spec_decode
    profile = parse_spec_decode(text, model_name).per_position_alpha()
    if not all(np.isfinite(profile)):
        raise ConfigError(f"vllm_metrics: per-position acceptance has positions nothing reached: {profile}")
    return {"vllm(" + ", ".join(f"{a:.3f}" for a in profile) + ")": list(profile)}


# ---- pictures -------------------------------------------------------------------------------

def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_all(costs: Costs, Bs, Ls, B: int, L: int, out_dir: Path, title: str, k_max: int = 8) -> list[Path]:
    """S vs alpha (k = 1..k_max) at (B, L); k* map over (B, L) at alpha 0.8; break-even batch vs alpha."""
    plt = _plt()
    out_dir.mkdir(parents=True, exist_ok=True)
    grid = np.linspace(0.05, 0.99, 48)
    paths = []
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for k in range(1, k_max + 1):
        ax.plot(grid, [speculative.speedup(float(a), k, B, L, costs.steps) for a in grid], label=f"k={k}")
    ax.axhline(1.0, color="k", lw=0.7)
    ax.set(xlabel="acceptance alpha (i.i.d.)", ylabel="speedup S = tau T(1) / R", title=f"{title}: B={B}, L={L}")
    ax.legend(fontsize=7, ncol=2)
    paths.append(_save(fig, out_dir / "speedup_vs_alpha.png"))
    kstar = np.array([[speculative.best_k(0.8, b, l, costs.steps, k_max)[0] for b in Bs] for l in Ls])
    fig, ax = plt.subplots(figsize=(6, 4.2))
    im = ax.imshow(kstar, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=k_max)
    ax.set(xticks=range(len(Bs)), xticklabels=Bs, yticks=range(len(Ls)), yticklabels=Ls, xlabel="batch B",
           ylabel="context L", title=f"{title}: k* at alpha=0.8 (0 = do not speculate)")
    for (i, j), v in np.ndenumerate(kstar):
        ax.text(j, i, str(v), ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(im, ax=ax, label="k*")
    paths.append(_save(fig, out_dir / "kstar_map.png"))
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for l in Ls:
        ax.plot(grid, [breakeven_batch(float(a), l, Bs, costs.steps, k_max) for a in grid], label=f"L={l}")
    ax.set(xlabel="acceptance alpha", ylabel="largest batch with S* > 1", yscale="log",
           title=f"{title}: batch above which speculation loses")
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / "breakeven_batch.png"))
    return paths


def breakeven_batch(alpha: float, L: int, Bs, steps: StepCosts, k_max: int = 8) -> float:
    """Largest B of the grid at which the best k still gives S > 1; NaN if none does."""
    wins = [b for b in Bs if speculative.best_k(alpha, b, L, steps, k_max)[0] > 0]
    return float(max(wins)) if wins else np.nan


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path
