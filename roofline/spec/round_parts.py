"""Step times of a speculative engine's parts, timed in turns: the table a prediction reads.

The real-drafter validation (roofline.spec.real_validation) predicts a round as
R = T(k+1) + sum_i T_draft,i + O from step times measured apart from the engine, at contexts
that bracket the engine's mid-generation context without containing it. On a model of a
million parameters a step is a few milliseconds of per-op dispatch, and a shared CPU's speed
drifts by 20% over seconds; timed point after point (as a sweep does), such a table says
T(5) < T(1) at one context and T(2) = 1.4 T(1) at the next, and the speedup predicted from it
is off by as much as the effect. Here every part is one callable and they are all timed in
turns (roofline.measure.timer.time_interleaved), so the drift cancels in their ratios.

The parts, each as the engine calls it, on the checkpoint's own loaded modules:
- ("forward", q, B, L): the target over q new tokens per sequence at context L (plain decode
  is q = 1, verification of k drafts q = k+1);
- ("mtp", q, B, L): the target's MTP module over q positions, and its pick of a token from the
  last one (argmax, or a sample when sampling), as MTPDrafter runs it (its catch-up pass is
  q = k+1, its chained steps q = 1);
- ("draft_model", q, B, L): the draft model's forward and its pick (catch-up q = 2, then 1).
T at the engine's context comes from a straight line in L between the two bracketing contexts
(a step's context-dependent work, KV reads and attention, is linear in L).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import torch

from roofline.io.fields import ConfigError
from roofline.measure.timer import TimerSettings, time_interleaved
from roofline.model.decoder import Transformer
from roofline.model.speculation import StepCosts, drafting, no_cost
from roofline.spec.verify import pick


def _call(kind: str, model: Transformer, q: int, B: int, L: int, temperature: float, seed: int):
    gen = torch.Generator().manual_seed(seed)
    dev = model.embed.weight.device
    tokens = torch.randint(0, model.cfg.vocab, (B, q), generator=gen).to(dev)
    start = torch.full((B,), L, dtype=torch.long, device=dev)
    if kind == "forward":
        return lambda: model(tokens, start)
    if kind == "mtp":
        hidden = torch.randn(B, q, model.cfg.d, generator=gen).to(dev, model.embed.weight.dtype)
        return lambda: pick(model.mtp_forward(hidden, tokens, start)[0][:, -1], temperature, 1.0, gen)
    return lambda: pick(model(tokens, start)[:, -1], temperature, 1.0, gen)


def measure(target: Transformer, draft_model: Transformer | None, ks: tuple[int, ...], Bs: tuple[int, ...],
            Ls: tuple[int, ...], timer: TimerSettings, rounds: int, temperature: float = 0.0, seed: int = 0,
            device: str = "cpu") -> pd.DataFrame:
    """One row per part (kind, q, B, L) with its pooled statistics (seconds): the target at
    q = 1..max(ks)+1, its MTP module (if it has one) at q = 1 and every k+1, the draft model (if
    given) at q = 1, 2; every B of Bs and L of Ls, all timed in turns."""
    parts = [("forward", q) for q in range(1, max(ks) + 2)]
    if target.mtp:
        parts += [("mtp", q) for q in sorted({1, *(k + 1 for k in ks)})]
    if draft_model is not None:
        parts += [("draft_model", 1), ("draft_model", 2)]
    for L in Ls:
        for model in filter(None, (target, draft_model)):
            if L + max(ks) + 1 > model.max_context:
                raise ConfigError(f"round parts: L={L} + q={max(ks) + 1} exceed the cache (max_context="
                                  f"{model.max_context})")
    fns = {}
    for (kind, q), B, L in itertools.product(parts, Bs, Ls):
        model = draft_model if kind == "draft_model" else target
        fns[kind, q, B, L] = _call(kind, model, q, B, L, temperature, seed)
    with torch.inference_mode():
        stats = time_interleaved(fns, timer, rounds, device, seed)
    return pd.DataFrame([dict(kind=kind, q=q, B=B, L=L, median_s=s.median_s, p10_s=s.p10_s, p90_s=s.p90_s,
                              ci_rel=s.ci_rel, n=s.n) for (kind, q, B, L), s in stats.items()])


def seconds_of(table: pd.DataFrame, kind: str):
    """(q, B, L) -> seconds of one part: the median at the table's contexts, a straight line in L
    between (and beyond) them; a (q, B) the table did not time is refused by name."""
    part = table[table["kind"] == kind]
    lines = {}
    for (q, B), g in part.groupby(["q", "B"]):
        g = g.sort_values("L")
        lines[int(q), int(B)] = (g["L"].to_numpy(float), g["median_s"].to_numpy(float))

    def seconds(q: int, B: int, L: int) -> float:
        if (q, B) not in lines:
            raise ConfigError(f"round parts: no {kind} step at q={q}, B={B} (timed: {sorted(lines)})")
        Ls, t = lines[q, B]
        if len(Ls) == 1:
            return float(t[0])
        slope = (t[-1] - t[0]) / (Ls[-1] - Ls[0])
        return float(t[0] + slope * (L - Ls[0]))

    return seconds


def step_costs(table: pd.DataFrame, drafter: str, overhead=no_cost) -> StepCosts:
    """StepCosts for roofline.model.speculation from a measured table: the target's forward, the
    drafter's steps as the engine runs them, and the given per-round overhead(k, B)."""
    step = seconds_of(table, drafter) if drafter != "ngram" else None
    return StepCosts(target=seconds_of(table, "forward"), draft=drafting(drafter, step), overhead=overhead)


def spread(table: pd.DataFrame) -> float:
    """Median relative half-width of the parts' 95% CIs: how well the table pins its medians."""
    return float(np.median(table["ci_rel"]))
