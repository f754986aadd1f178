"""Validation with real drafters on a trained checkpoint: prediction that is not a tautology.

roofline.spec.validation checks the engine against the cost model with an oracle that accepts
with a requested i.i.d. α, and predicts from step times measured in the same run at the same
points. Here nothing the prediction uses was measured on the points it predicts:

- acceptance: the per-position conditional α_1..α_k of each real drafter (the checkpoint's MTP
  module, a draft model, n-gram lookup), measured on prompt set A (held-out files of the corpus),
  greedy, at k = max(ks); the engine's measured points run on prompt set B (other files);
- step times: a sweep of the target (and of the draft model) at contexts L that bracket the
  engine's mid-generation context without containing it, fitted by the cost model
  (roofline.analysis.costmodel via roofline.analysis.predict.step_costs), and the per-round
  overhead O(k, B) (and n-gram's lookup time, which the cost model calls free) calibrated on
  prompt set A.

Predicted speedup per (drafter, k, B): S = τ(α_1..α_k) · T1 / R(k, B, L_mid) with
L_mid = mean prompt length of set B + max_new / 2. Beside it two baselines: the i.i.d. formula
(τ_iid(ᾱ, k) with ᾱ the acceptance rate on set A, same step costs) and Leviathan et al.'s
S = τ_iid(ᾱ, k) / (k·c + 1), c = T_draft(1) / T_target(1) from the fit (0 for n-gram).
Measured speedup: steady-state tokens/s of speculative over plain decoding on set B, every
batch of the set, interleaved `reps` times (the ratio of the medians over reps).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from roofline.analysis.predict import DraftCost, step_costs
from roofline.checkpoints.loader import checkpoint_config, load_checkpoint
from roofline.checkpoints.prompts import encode_conversations
from roofline.io.fields import ConfigError, internal, option
from roofline.measure.sweep import SweepRequest, run_sweep
from roofline.measure.timer import TimerSettings
from roofline.report import sections
from roofline.spec.counters import AcceptanceCounters
from roofline.spec.drafters import DraftModelDrafter
from roofline.spec.engine import DecodeSettings, SpecEngine
from roofline.spec.real_acceptance import DRAFTERS, make_drafter
from roofline.model.speculation import StepCosts, round_time, tau, tau_iid


@dataclass(frozen=True)
class RealValidationRequest:
    """Real drafters against the prediction: acceptance per position measured on one prompt set,
    the engine's points on another (roofline/conf/specdec.yaml with checkpoint= and prompts_eval=)."""

    checkpoint: str = internal(why="the command's checkpoint key")
    draft_checkpoint: str = internal(why="the command's draft_checkpoint key")
    prompts_a: str = internal(why="the command's prompts key: acceptance for the prediction, and the overhead "
                                  "calibration")
    prompts_b: str = internal(why="the command's prompts_eval key: the engine's measured points")
    drafters: tuple[str, ...] = option(DRAFTERS, "with prompts_eval: the drafters validated, each at every (k, B) "
                                                 "of ks x Bs")
    ks: tuple[int, ...] = internal((1, 2, 3, 4), "the command's ks key")
    Bs: tuple[int, ...] = internal((1, 4), "the command's Bs key")
    max_new: int = internal(48, "the command's max_new key")
    n_prompts: int = option(8, "with prompts_eval: conversations of each set used (a multiple of max(Bs))")
    reps: int = internal(3, "the command's reps key")
    dtype: str = internal("float32", "the command's dtype key")
    temperature: float = option(0.0, "real drafters: 0 greedy (float32 outputs must equal plain decoding), "
                                     "> 0 sampled")
    device: str = internal("cpu", "the torch device of the `device` group's entry")
    seed: int = internal(0, "the command's seed key")
    timer: TimerSettings = internal(why="the command's timer key (the step-time sweeps)",
                                    factory=lambda: TimerSettings(max_reps=30, budget_s=0.5))
    # the step-time sweeps' busy-machine check (roofline.measure.noise): on by default; a points-light
    # sweep on a loaded machine can lose too many points to it for a fit, so a logic test turns it off
    noise_check: bool = internal(True, "a logic test turns it off")

    def __post_init__(self) -> None:
        bad = set(self.drafters) - set(DRAFTERS)
        if bad:
            raise ConfigError(f"drafters={sorted(bad)}: allowed {list(DRAFTERS)}")
        if min(self.ks) < 1 or min(self.Bs) < 1 or self.reps < 1 or self.max_new < 4:
            raise ConfigError("ks, Bs, reps >= 1 and max_new >= 4")
        if self.n_prompts % max(self.Bs):
            raise ConfigError(f"n_prompts={self.n_prompts}: must be a multiple of max(Bs)={max(self.Bs)}")


def _settings(req: RealValidationRequest, k: int = 0) -> DecodeSettings:
    return DecodeSettings(max_new=req.max_new, k=k, temperature=req.temperature, seed=req.seed)


def _batches(prompts: list[list[int]], B: int) -> list[list[list[int]]]:
    return [prompts[i:i + B] for i in range(0, len(prompts), B)]


def _run_set(target, drafter_of, prompts, B: int, s: DecodeSettings):
    """Every batch of `prompts` through the engine: outputs, summed counters, steady tokens and seconds, rounds."""
    outs, c, tok, sec, rounds, over, draft = [], AcceptanceCounters(accepted_per_pos=(0,) * s.k), 0, 0.0, 0, 0.0, 0.0
    for batch in _batches(prompts, B):
        out, m = SpecEngine(target, drafter_of() if s.k else None).generate(batch, s)
        outs += out
        c += m.counters
        tok, sec, rounds = tok + m.steady_tokens, sec + m.steady_s, rounds + m.rounds
        over, draft = over + m.overhead_s, draft + m.draft_s
    return dict(out=outs, counters=c, tps=tok / sec if sec else float("nan"), rounds=rounds, overhead_s=over,
                draft_s=draft)


def _sweep_fit(cfg, req: RealValidationRequest, Ls: tuple[int, ...], run_dir: Path, mtp: bool) -> dict:
    q = tuple(range(1, max(req.ks) + 2))
    sweep = SweepRequest(model=cfg, q=q, B=req.Bs, L=Ls, dtypes=(req.dtype,), timer=req.timer, device=req.device,
                      mtp_q=tuple(sorted({1, *(k + 1 for k in req.ks)})) if mtp else (1,), seed=req.seed)
    run_sweep(sweep, run_dir, progress=False, **({} if req.noise_check else dict(noise=None)))
    return sections.fit_and_save(run_dir)[0]


def run_real_validation(req: RealValidationRequest, run_dir: Path, log=print) -> pd.DataFrame:
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(req.seed)
    tcfg, dcfg = checkpoint_config(req.checkpoint), checkpoint_config(req.draft_checkpoint)
    pa = encode_conversations(req.checkpoint, req.prompts_a, field="prompts_a")[:req.n_prompts]
    pb = encode_conversations(req.checkpoint, req.prompts_b, field="prompts_b")[:req.n_prompts]
    if len(pa) < req.n_prompts or len(pb) < req.n_prompts:
        raise ConfigError(f"prompts: {len(pa)} (set a) and {len(pb)} (set b) conversations; need n_prompts="
                          f"{req.n_prompts} in each")
    k_max = max(req.ks)
    longest = max(len(p) for p in pa + pb) + req.max_new + 3 * k_max + 2
    kw = dict(dtype=req.dtype, device=req.device, max_batch=max(req.Bs), max_context=longest)
    target = load_checkpoint(req.checkpoint, **kw)
    draft_model = load_checkpoint(req.draft_checkpoint, **kw) if "draft_model" in req.drafters else None

    def drafter_of(name):  # one draft model for the run: its cache is reset at each prefill
        if name == "draft_model":
            return lambda: DraftModelDrafter(draft_model, target.cfg.vocab)
        return lambda: make_drafter(name, target)

    makers = {d: drafter_of(d) for d in req.drafters}
    L_mid = round(statistics.mean(len(p) for p in pb) + req.max_new / 2)
    lo = min(len(p) for p in pa + pb)
    Ls = tuple(sorted({max(1, lo // 2), longest - k_max - 2}))  # brackets L_mid, never equal to it
    if L_mid in Ls:
        raise ConfigError(f"sweep contexts {Ls} contain the engine's L_mid={L_mid}: not a disjoint sweep")
    log(f"[1/4] sweep + fit of the target at L={list(Ls)} (the engine's L_mid={L_mid} is not swept)")
    fit = _sweep_fit(tcfg, req, Ls, run_dir / "sweep_target", mtp=tcfg.mtp_layers > 0)
    draft_fit = _sweep_fit(dcfg, req, Ls, run_dir / "sweep_draft", mtp=False) if "draft_model" in req.drafters else None

    log(f"[2/4] acceptance per position on prompt set A (temperature {req.temperature}, k = max(ks)); "
        "overhead calibration on set A")
    with torch.inference_mode():
        plain_a = {B: _run_set(target, None, pa, B, _settings(req)) for B in req.Bs}
        profile, rate, calib = {}, {}, {}
        for d in req.drafters:
            c = AcceptanceCounters(accepted_per_pos=(0,) * k_max)
            for B in req.Bs:
                for k in req.ks:
                    r = _run_set(target, makers[d], pa, B, _settings(req, k))
                    free_draft = r["draft_s"] if d == "ngram" else 0.0  # the cost model prices n-gram at 0
                    calib[d, k, B] = (r["overhead_s"] + free_draft) / r["rounds"]
                    if k == k_max:
                        c += r["counters"]
            profile[d] = [a if a == a else 0.0 for a in c.per_position_alpha()]
            rate[d] = c.acceptance_rate()
            log(f"  {d}: alpha per position {' '.join(f'{a:.3f}' for a in profile[d])}, rate {rate[d]:.3f}")
        o_plain = {B: plain_a[B]["overhead_s"] / plain_a[B]["rounds"] for B in req.Bs}

    log(f"[3/4] plain vs speculative on prompt set B, x{req.reps} interleaved")
    rows = []
    with torch.inference_mode():
        for B in req.Bs:
            reference = _run_set(target, None, pb, B, _settings(req))["out"]
            for d in req.drafters:
                costs = _costs(fit, draft_fit, req, tcfg, dcfg, d)
                for k in req.ks:
                    plain, spec_runs = [], []
                    for _ in range(req.reps):
                        p = _run_set(target, None, pb, B, _settings(req))
                        s = _run_set(target, makers[d], pb, B, _settings(req, k))
                        exact = req.dtype == "float32" and req.temperature == 0
                        if exact and (s["out"] != reference or p["out"] != reference):
                            raise RuntimeError(f"{d}, k={k}, B={B}: speculative output differs from plain greedy")
                        plain.append(p)
                        spec_runs.append(s)
                    rows.append(_row(d, k, B, L_mid, plain, spec_runs, profile[d], rate[d], costs,
                                     o_plain[B], calib[d, k, B]))
                    r = rows[-1]
                    log(f"  {d:11s} k={k} B={B}: S measured {r['S_meas']:.3f}, predicted {r['S_pred']:.3f} "
                        f"({r['err']:+.1%}); iid {r['err_iid']:+.1%}, Leviathan {r['err_leviathan']:+.1%}")
    table = pd.DataFrame(rows)
    table.to_csv(run_dir / "real_specdec.csv", index=False)
    return table


def _costs(fit, draft_fit, req: RealValidationRequest, tcfg, dcfg, drafter: str):
    dc = DraftCost(drafter, model=dcfg if drafter == "draft_model" else None, fit=draft_fit)
    return step_costs(fit, req.dtype, dc, tcfg).steps


def _row(d, k, B, L, plain, spec_runs, profile, rate, base: StepCosts, o_plain, o_spec) -> dict:
    costs = StepCosts(target=lambda q, B_, L_: base.target(q, B_, L_) + o_plain, draft=base.draft,
                      overhead=lambda k_, B_: max(0.0, o_spec - o_plain))
    R, t1 = round_time(k, B, L, costs), costs.target(1, B, L)
    tau_prof, tau_i = tau(profile[:k]), tau_iid(rate, k)
    c = base.draft(1, 1, B, L) / base.target(1, B, L) if d != "ngram" else 0.0
    tps_p = statistics.median(r["tps"] for r in plain)
    tps_s = statistics.median(r["tps"] for r in spec_runs)
    S = tps_s / tps_p
    meas = spec_runs[-1]["counters"]
    pred, iid, lev = tau_prof * t1 / R, tau_i * t1 / R, tau_i / (k * c + 1)
    return dict(drafter=d, k=k, B=B, L_mid=L, alpha_a=" ".join(f"{a:.3f}" for a in profile[:k]), rate_a=rate,
                tau_pred=tau_prof, tau_meas_b=meas.mean_acceptance_length(),
                alpha_b=" ".join(f"{a:.3f}" for a in meas.per_position_alpha()),
                T1_pred_s=t1, R_pred_s=R, O_spec_s=o_spec, O_plain_s=o_plain, c_draft=c,
                tps_plain=tps_p, tps_spec=tps_s, S_meas=S, S_pred=pred, err=pred / S - 1,
                S_iid=iid, err_iid=iid / S - 1, S_leviathan=lev, err_leviathan=lev / S - 1)


def summarize(table: pd.DataFrame) -> tuple[str, dict]:
    """Console table and |error| statistics (fractions of the measured speedup) per drafter and overall."""
    cols = ["drafter", "k", "B", "alpha_a", "tau_pred", "tau_meas_b", "S_meas", "S_pred", "err", "err_iid",
            "err_leviathan"]
    stats = {}
    for name, part in [("all", table)] + list(table.groupby("drafter")):
        stats[name] = {e: dict(median_abs=float(part[e].abs().median()), max_abs=float(part[e].abs().max()))
                       for e in ("err", "err_iid", "err_leviathan")}
    text = table[cols].round(3).to_string(index=False) + "\n" + "\n".join(
        f"{n}: |err| median {s['err']['median_abs']:.1%} max {s['err']['max_abs']:.1%}; iid median "
        f"{s['err_iid']['median_abs']:.1%} max {s['err_iid']['max_abs']:.1%}; Leviathan median "
        f"{s['err_leviathan']['median_abs']:.1%} max {s['err_leviathan']['max_abs']:.1%}" for n, s in stats.items())
    return text, dict(points=len(table), errors=stats)
