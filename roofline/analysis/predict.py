"""Speculative-decoding predictions from fitted step times: glue between roofline.analysis.costmodel
(T(q, B, L) of the target, the drafter's step) and roofline.model.speculation (tau, R, S, k*).

Where each cost comes from:
- target(q, B, L): the fitted forward step of the target preset;
- draft(i, k, B, L): as roofline.spec.engine runs the drafters. MTP: the first draft of a round is
  one MTP pass over the k+1 verified positions (its catch-up), the others chained single
  steps; a draft model: a two-token catch-up forward, then single steps; n-gram: 0 (`no_cost`);
- overhead(k, B): per-round sampling/bookkeeping/host sync: measured by the engine when an
  overhead.json of roofline.spec.validation is given (`overhead_source="measured"`), else a
  constant share of the fitted per-forward overhead t0, and every row says which
  (`overhead_source="fit_t0"`).
A preset that was not measured is predicted by applying the fitted device parameters to its
accounting (`source="device-fit-transfer"`): such rows are extrapolations by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from roofline.analysis import costmodel, fitcheck, quality

from roofline.model import speculation
from roofline.io.fields import ConfigError
from roofline.model.config import ModelConfig
from roofline.model.speculation import WHATIF_DRAFTERS, StepCosts



@dataclass(frozen=True)
class DraftCost:
    """Which drafter a prediction prices, and where its step costs come from (the engine's
    drafters themselves are roofline.spec.drafters)."""

    kind: str = "mtp"  # mtp | draft_model | ngram; eagle | eagle3 (the what-if's: a fit's step_costs refuses them)
    model: ModelConfig | None = None  # the draft preset when kind == "draft_model"
    fit: dict | None = None  # the draft model's own fit (default: the target's device fit)

    def __post_init__(self) -> None:
        if self.kind not in WHATIF_DRAFTERS:
            raise ConfigError(f"drafter={self.kind!r}: allowed {WHATIF_DRAFTERS}")
        if self.kind == "draft_model" and self.model is None:
            raise ConfigError("drafter=draft_model needs draft_model (a preset name)")


@dataclass(frozen=True)
class Costs:
    steps: StepCosts
    source: str  # fit | device-fit-transfer
    overhead_source: str
    overhead_s: float
    domain: dict = field(default_factory=dict)
    target_model: object = None  # the target's costmodel.StepModel (says "table" or "fit" per step)


def step_costs(fit: dict, dtype: str, drafter: DraftCost, target: ModelConfig | None = None,
               mode: str | None = None, overhead_share: float = 1.0, overhead: dict | None = None) -> Costs:
    """StepCosts for roofline.model.speculation from a target fit (and optionally a draft fit)."""
    speculation.refuse_eagle_without_whatif(drafter.kind)
    target = target or costmodel.fitted_model(fit)
    forward = costmodel.step_model(fit, "forward", dtype, mode, target)
    group = costmodel.find_group(fit, "forward", dtype, mode)
    tgt = forward.seconds
    if drafter.kind == "mtp":
        if target.mtp_layers < 1:
            raise ConfigError(f"drafter=mtp: model {target.name!r} has no MTP module (mtp_layers=0)")
        draft = speculation.drafting("mtp", costmodel.step_model(fit, "mtp", dtype, mode, target).seconds)
    elif drafter.kind == "draft_model":
        dm = costmodel.step_model(drafter.fit or fit, "forward", dtype, mode, drafter.model)
        draft = speculation.drafting("draft_model", dm.seconds)
    else:
        draft = speculation.drafting("ngram")
    overhead_s = overhead_share * group["coefs"][0]
    per_round, source = (lambda k, B: overhead_s), "fit_t0"
    if overhead is not None:  # measured by the speculative engine (roofline.spec.validation overhead.json)
        c0, c1, c2 = fitcheck.check_overhead(overhead)
        per_round, source = (lambda k, B: max(0.0, c0 + c1 * k + c2 * B)), "measured"
    return Costs(StepCosts(target=tgt, draft=draft, overhead=per_round),
                 source=forward.fit_source, overhead_source=source, overhead_s=overhead_s,
                 domain={a: tuple(group["domain"][a]) for a in ("q", "B", "L")}, target_model=forward)


def table(fit: dict, alphas, ks, Bs, Ls, dtype: str, drafter: DraftCost, target: ModelConfig | None = None,
          mode: str | None = None, overhead_share: float = 1.0, overhead: dict | None = None) -> pd.DataFrame:
    """speculation.predict_table over (alpha or profile, k, B, L), labelled with where the costs came from."""
    target = target or costmodel.fitted_model(fit)
    c = step_costs(fit, dtype, drafter, target, mode, overhead_share, overhead)
    t = speculation.predict_table(alphas, ks, Bs, Ls, c.steps, measured_domain=c.domain)
    why = ["; ".join(quality.extrapolation(fit, target.name, dtype, k + 1, B, L))
           for k, B, L in zip(t["k"], t["B"], t["L"])]
    t["extrapolation"] = why
    t["extrapolated"] = t["extrapolated"].astype(bool) | (t["extrapolation"] != "") | (c.source != "fit")
    return t.assign(model=target.name, dtype=dtype, drafter=drafter.kind if drafter.kind != "draft_model"
                    else f"draft_model:{drafter.model.name}", source=c.source, overhead_source=c.overhead_source,
                    overhead_s=c.overhead_s, device_name=fit["provenance"]["device_name"])


def breakeven_batch(alpha: float, L: int, Bs, steps: StepCosts, k_max: int = 8) -> float:
    """Largest B of the grid at which the best k still gives S > 1; NaN if none does."""
    wins = [b for b in Bs if speculation.best_k(alpha, b, L, steps, k_max)[0] > 0]
    return float(max(wins)) if wins else np.nan
