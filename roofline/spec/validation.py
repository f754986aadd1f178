"""Validation: does a real speculative decoder run at the speed the cost model predicts?

One run, on one model and device:
1. a sweep of the target's forward (q = 1..k_max+1) and MTP step (q = 1 and k+1) over the
   batches and the contexts the decoder will see, and a cost-model fit of it;
2. a calibration of the per-round overhead O(k, B) (time outside drafting and verifying) and
   of plain decoding's per-step overhead, on prompts that are not the ones evaluated;
3. for each (α, k, B): plain greedy decoding and speculative decoding with the oracle drafter
   (the real compute of the MTP module), interleaved `reps` times; the measured speedup is
   the ratio of median steady-state tokens/s (rounds where the whole batch generates: a static
   batch's straggler tail is not what B·τ/R describes); plus the real drafters (MTP, n-gram) at each (k, B). In
   float32 every speculative output must equal plain greedy (else the run stops); in half
   precision the first divergence from it is recorded instead.

The oracle delivers the requested per-position α in any precision (it learns the target's
pick each round from a shadow of the verification, outside the timed region; see
roofline.spec.drafters.OracleDrafter), so the prediction takes the REQUESTED α, as a user's
would. Predicted speedup (docs/design.md §2), at the mid-generation context L = prompt + max_new/2:
  S = τ · (T(1) + O(0, B)) / (T(k+1) + T_mtp(k+1) + (k−1)·T_mtp(1) + O(k, B))
where the MTP drafter's round is one catch-up pass over the k+1 verified positions (which
yields draft 1) and k−1 chained single steps. Step times come from the run's own fit: the
measured table inside the measured range, the physical fit outside (roofline.analysis.steptable).
`S_pred` uses τ(α, k) of the requested α for the oracle rows and τ of the measured
per-position profile for the real drafters (MTP, n-gram: no α is requested);
`S_pred_profile` uses the measured per-position profile for every row and `S_pred_tau` the
measured τ (diagnostics: their errors are the cost model's alone).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from roofline.analysis import quality
from roofline.io import files
from roofline.model.dtypes import torch_dtype
from roofline.io.fields import ConfigError, check_grid, check_int, internal, option
from roofline.model.config import ModelConfig
from roofline.spec.drafters import MTPDrafter, NgramDrafter, OracleDrafter
from roofline.model.decoder import build_model
from roofline.report import sections
from roofline.model.speculation import StepCosts, round_time, tau, tau_iid
from roofline.spec.engine import DecodeSettings, SpecEngine
from roofline.measure import memory
from roofline.measure.sweep import SweepRequest, run_sweep
from roofline.measure.timer import TimerSettings


@dataclass(frozen=True)
class SpecValidationRequest:
    """The oracle validation: plain vs speculative decoding of a preset, against the cost model
    fitted by a calibration sweep in the same run (roofline/conf/specdec.yaml)."""

    model: ModelConfig = internal(why="the `model` group's preset")
    alphas: tuple[float, ...] = option((0.5, 0.7, 0.9), "oracle drafter acceptance (independent per position)")
    ks: tuple[int, ...] = option((1, 2, 4), "drafts per round")
    Bs: tuple[int, ...] = option((1, 4), "batch sizes")
    prompt_len: int = option(64, "tokens of each (random) prompt")
    max_new: int = option(48, "tokens generated per sequence")
    reps: int = option(3, "plain/speculative pairs per point, interleaved")
    real_drafters: tuple[str, ...] = option(("mtp", "ngram"), "mtp | ngram: real drafters run beside the oracle "
                                                              "on the preset's random weights (a check of the "
                                                              "engine, not of acceptance)")
    dtype: str = option("bfloat16", "float32 | bfloat16 | float16")
    device: str = internal("cpu", "the torch device of the `device` group's entry")
    seed: int = option(0, "seed of the weights, prompts, oracle and sampling")
    timer: TimerSettings = option(help="the calibration sweep's timer (roofline/conf/timer/): fewer reps than a "
                                       "sweep's default", factory=lambda: TimerSettings(max_reps=30, budget_s=0.5))

    def __post_init__(self) -> None:
        if self.model.mtp_layers < 1:
            raise ConfigError(f"model={self.model.name!r}: the validation drafts with the MTP module; "
                              "pick a preset with mtp_layers >= 1")
        if not all(isinstance(a, (int, float)) and not isinstance(a, bool) and 0 <= a <= 1 for a in self.alphas):
            raise ConfigError(f"alphas={list(self.alphas)}: allowed values in [0, 1]")
        check_grid("ks", self.ks, 1)  # `ks=[]` and `ks=[1.5]` were a min() error and a TypeError traceback
        check_grid("Bs", self.Bs, 1)
        check_int("reps", self.reps, 1)
        check_int("max_new", self.max_new, 2)
        check_int("prompt_len", self.prompt_len, 1)
        bad = set(self.real_drafters) - {"mtp", "ngram"}
        if bad:
            raise ConfigError(f"real_drafters={sorted(bad)}: allowed ['mtp', 'ngram']")

    @property
    def context_mid(self) -> int:
        return self.prompt_len + self.max_new // 2

    @property
    def max_context(self) -> int:
        """Cache positions the run can touch: a finished sequence overshoots max_new by up to k,
        and while the rest of the batch goes on its rows are still verified (k+1 positions) and
        drafted (the MTP chain reaches its last accepted position + k): prompt + max_new + 3k."""
        return self.prompt_len + self.max_new + 3 * max(self.ks) + 1


def calibration_sweep(req: SpecValidationRequest, run_dir: Path, progress: bool = False) -> dict:
    k_max = max(req.ks)
    sweep = SweepRequest(model=req.model, q=tuple(range(1, k_max + 2)), B=req.Bs,
                      L=(req.prompt_len, req.context_mid, req.prompt_len + req.max_new),
                      dtypes=(req.dtype,), timer=req.timer, device=req.device,
                      mtp_q=tuple(sorted({1, *(k + 1 for k in req.ks)})), seed=req.seed)
    run_sweep(sweep, run_dir, progress=progress)
    return sections.fit_and_save(run_dir)[0]


def _prompts(req: SpecValidationRequest, B: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, req.model.vocab, (req.prompt_len,), generator=g).tolist() for _ in range(B)]


def _first_divergence(out: list[list[int]], reference: list[list[int]]) -> int:
    """First generated index where any sequence left the plain greedy reference (-1: none).
    In half precision the k+1-token verification and the 1-token decode round differently,
    so a near-tie can flip the argmax: exactness is a float32 property (tests). The oracle's
    acceptance does not depend on it (it drafts from the verification's own computation)."""
    firsts = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), -1) for o, r in zip(out, reference)]
    hits = [f for f in firsts if f >= 0]
    return min(hits) if hits else -1


def _median_tps(runs) -> float:
    return statistics.median(m.steady_tokens_per_s for m in runs)


def oracle_factory(target, alpha: float, vocab: int, seed: int):
    """rep -> a fresh oracle (with the MTP module's real compute) whose coin flips are its own:
    each rep is an independent sample of the requested α, so acceptance_check may pool them."""
    return lambda rep: OracleDrafter(target, alpha, vocab, inner=MTPDrafter(target), seed=seed + 7919 * rep)


def acceptance_check(runs, alpha: float | None) -> dict:
    """Per-position conditional acceptance pooled over runs (accepted at i / reached i) and,
    for a requested α, the largest |α̂_i − α| in binomial standard errors sqrt(α(1−α)/n_i).
    The runs must be independent draws (run_validation seeds each rep's oracle apart): the
    same coin flips replayed r times would shrink the standard error by sqrt(r) falsely."""
    per_pos = [m.counters.accepted_per_pos for m in runs]
    k = max(len(a) for a in per_pos)
    acc = [sum(a[i] for a in per_pos if len(a) > i) for i in range(k)]
    reached = [sum(m.counters.drafts for m in runs)] + acc[:-1]
    prof = [a / n if n else float("nan") for a, n in zip(acc, reached)]
    z = float("nan")
    if alpha is not None and 0 < alpha < 1:
        z = max(abs(a - alpha) / (alpha * (1 - alpha) / n) ** 0.5 for a, n in zip(prof, reached) if n)
    return dict(alpha_profile=prof, reached=reached, max_z=z)


def predicted_speedup(fit: dict, req: SpecValidationRequest, k: int, B: int, tau: float, o_plain: float, o_spec: float,
                      drafter: str = "mtp") -> dict:
    """S from roofline.model.speculation with the fitted steps. Every forward pays the engine's
    per-step host overhead o_plain; a round pays o_spec in all, i.e. o_spec − o_plain beyond
    its verification forward. Drafter "mtp" as roofline.analysis.predict models it; "ngram": free."""
    from roofline.analysis.predict import DraftCost, step_costs
    L, dt = req.context_mid, req.dtype
    c = step_costs(fit, dt, DraftCost(drafter), req.model)
    base = c.steps
    costs = StepCosts(target=lambda q, B_, L_: base.target(q, B_, L_) + o_plain, draft=base.draft,
                      overhead=lambda k_, B_: max(0.0, o_spec - o_plain))
    R, t1 = round_time(k, B, L, costs), costs.target(1, B, L)
    draft = sum(base.draft(i, k, B, L) for i in range(1, k + 1))
    return dict(T1_pred_s=t1, verify_pred_s=costs.target(k + 1, B, L), draft_pred_s=draft, O_spec_s=o_spec,
                O_plain_s=o_plain, R_pred_s=R, S_pred=tau * t1 / R, step_source="/".join(
                    c.target_model.source(q, B, L) for q in (1, k + 1)) if getattr(c, "target_model", None) else "n/a")


def run_validation(req: SpecValidationRequest, run_dir: Path, log=print) -> pd.DataFrame:
    memory.require_fit(req.model, req.dtype, max(req.Bs), req.max_context, req.device,
                       q=max(req.ks) + 1)  # before any folder or model
    run_dir.mkdir(parents=True, exist_ok=True)
    log(f"[1/3] sweep + fit of {req.model.name} ({req.dtype}, {req.device})")
    fit = calibration_sweep(req, run_dir / "sweep")
    target = build_model(req.model, max_batch=max(req.Bs), max_context=req.max_context,
                         dtype=torch_dtype(req.dtype), device=req.device, seed=req.seed)
    rows, overheads = [], []
    for B in req.Bs:
        log(f"[2/3] B={B}: overhead calibration")
        cal = _prompts(req, B, req.seed + 1000)
        plain_cal, m0 = SpecEngine(target).generate(cal, DecodeSettings(max_new=req.max_new // 2))
        o_plain = m0.overhead_s / m0.rounds
        o_spec = {}
        for k in req.ks:
            d = OracleDrafter(target, 0.5, req.model.vocab, inner=MTPDrafter(target), seed=req.seed + 1)
            _, mk = SpecEngine(target, d).generate(cal, DecodeSettings(max_new=req.max_new // 2, k=k))
            o_spec[k] = mk.overhead_s / mk.rounds
            overheads.append(dict(k=k, B=B, O_spec_s=o_spec[k], O_plain_s=o_plain))
        prompts = _prompts(req, B, req.seed)
        reference, _ = SpecEngine(target).generate(prompts, DecodeSettings(max_new=req.max_new))  # + warm-up
        log(f"[3/3] B={B}: plain vs speculative, interleaved x{req.reps}")
        cases = [(f"oracle(mtp) a={a}", a, k, oracle_factory(target, a, req.model.vocab, req.seed + 2))
                 for a in req.alphas for k in req.ks]
        cases += [(name, None, k, (lambda rep: MTPDrafter(target)) if name == "mtp"
                   else (lambda rep: NgramDrafter(req.model.vocab)))
                  for name in req.real_drafters for k in req.ks]
        for label, alpha, k, make in cases:
            plain_runs, spec_runs, diverged = [], [], []
            for rep in range(req.reps):
                out0, m_plain = SpecEngine(target).generate(prompts, DecodeSettings(max_new=req.max_new))
                out1, m_spec = SpecEngine(target, make(rep)).generate(prompts, DecodeSettings(max_new=req.max_new, k=k))
                if req.dtype == "float32" and (out1 != out0 or out0 != reference):
                    raise RuntimeError(f"{label}, k={k}, B={B}: speculative output differs from plain greedy")
                diverged.append(_first_divergence(out1, reference))
                plain_runs.append(m_plain)
                spec_runs.append(m_spec)
            tau_meas = statistics.median(m.counters.mean_acceptance_length() for m in spec_runs)
            acc = acceptance_check(spec_runs, alpha)
            S_meas = _median_tps(spec_runs) / _median_tps(plain_runs)
            kind = "ngram" if label == "ngram" else "mtp"
            profile = [a for a in acc["alpha_profile"] if a == a] or [0.0]
            pred = {kind_: predicted_speedup(fit, req, k, B, t_, o_plain, o_spec[k], kind)
                    for kind_, t_ in (("tau", tau_meas), ("profile", tau((profile + [0.0] * k)[:k])),
                                      ("alpha", tau_iid(alpha, k) if alpha is not None else float("nan")))}
            main = pred["alpha"] if alpha is not None else pred["profile"]
            last = spec_runs[-1]
            rows.append(dict(drafter=label, alpha=alpha, k=k, B=B, L_mid=req.context_mid, tau_meas=tau_meas,
                             tau_alpha=tau_iid(alpha, k) if alpha is not None else float("nan"),
                             alpha_meas=" ".join(f"{a:.3f}" for a in acc["alpha_profile"]),
                             alpha_reached=" ".join(map(str, acc["reached"])), alpha_max_z=acc["max_z"],
                             first_divergence=min([d for d in diverged if d >= 0], default=-1),
                             tps_plain=_median_tps(plain_runs), tps_spec=_median_tps(spec_runs), S_meas=S_meas,
                             **{k_: v for k_, v in main.items() if k_ != "S_pred"}, S_pred=main["S_pred"],
                             err=main["S_pred"] / S_meas - 1, mismatch=quality.mismatch(main["S_pred"], S_meas),
                             S_pred_profile=pred["profile"]["S_pred"], err_profile=pred["profile"]["S_pred"] / S_meas - 1,
                             S_pred_tau=pred["tau"]["S_pred"], err_tau=pred["tau"]["S_pred"] / S_meas - 1,
                             draft_s_round=last.draft_s / last.rounds, verify_s_round=last.verify_s / last.rounds,
                             overhead_s_round=last.overhead_s / last.rounds))
            log(f"  {label:20s} k={k} B={B}: S measured {S_meas:.3f}, predicted {main['S_pred']:.3f} "
                f"(tau {tau_meas:.2f}, alpha measured {rows[-1]['alpha_meas']})"
                + (f"  MISMATCH: more than {quality.GROSS_MISMATCH:g}x apart" if rows[-1]["mismatch"] else ""))
    table = pd.DataFrame(rows)
    table.to_csv(run_dir / "specdec.csv", index=False)
    save_overhead_fit(overheads, run_dir / "overhead.json")
    return table


def save_overhead_fit(points: list[dict], path: Path) -> dict:
    """O(k, B) beyond a plain step, least squares on [1, k, B] over the calibration rounds;
    roofline.analysis.predict takes it (`overhead=`) in place of its t0-share assumption."""
    import numpy as np
    X = np.array([[1.0, p["k"], p["B"]] for p in points])
    y = np.array([p["O_spec_s"] - p["O_plain_s"] for p in points])
    coef = np.linalg.lstsq(X, y, rcond=None)[0].tolist()
    out = dict(form="O(k, B) = c0 + c1*k + c2*B seconds per round, beyond a plain decode step",
               coef=coef, points=points)
    files.write_json_atomic(path, out)
    return out
