"""Validation with real drafters on a trained checkpoint: prediction that is not a tautology.

roofline.spec.validation checks the engine against the cost model with an oracle that accepts
with a requested i.i.d. α, and predicts from step times measured in the same run at the same
points. Here nothing the prediction uses was measured on the points it predicts:

- acceptance: the per-position conditional α_1..α_k of each real drafter (the checkpoint's MTP
  module, a draft model, n-gram lookup), measured on prompt set A (held-out files of the corpus)
  at the same k, greedy or sampled as the run; the engine's measured points run on prompt set B
  (other files). (The profile at max(ks) cut to k, err_kmax beside it, is not the same: where a
  round starts depends on k, and acceptance is correlated along a sequence.)
- step times: a table of the engine's parts (the target's forward at q = 1..max(ks)+1, its MTP
  module's step, the draft model's step; roofline.spec.round_parts), timed in turns at two
  contexts L that bracket the engine's mid-generation context without containing it, a straight
  line in L between them; and the host work of a plain step and of a round (the engine's
  bookkeeping, sampling and acceptance; n-gram's lookup, which the round's parts call free),
  calibrated on prompt set A as a multiple of the same run's target forwards and priced in the
  table's time units.

Predicted speedup per (drafter, k, B): S = τ(α_1..α_k) · T1 / R(k, B, L_mid) with
L_mid = mean prompt length of set B + max_new / 2. Beside it two baselines: the i.i.d. formula
(τ_iid(ᾱ, k) with ᾱ the acceptance rate on set A, same step costs) and Leviathan et al.'s
S = τ_iid(ᾱ, k) / (k·c + 1), c = T_draft(1) / T_target(1) from the table (0 for n-gram).
Measured speedup: S = τ · T1 / R as the engine ran it on set B: τ from its counters (every draft of
every sequence), T1 and R the seconds per plain step and per speculative round while the whole
batch generates; plain and speculative run in turns batch by batch (the order flips every rep),
the median over `reps` of each rep's ratio, so a drift of the machine's speed lands on both sides
of every ratio. Beside it S_window, the static batch's own tokens/s ratio over those rounds: at
B > 1 it ends when the first sequence is done and so leans on the fastest ones (continuous
batching would keep the slow ones' slots busy at their own acceptance). err = err_tau ∘ err_round:
acceptance carried from set A (τ_pred / τ_meas − 1) and the round's cost in plain steps
((R/T1)_pred / (R/T1)_meas − 1).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from roofline.checkpoints.loader import load_checkpoint
from roofline.checkpoints.prompts import encode_conversations
from roofline.io import files
from roofline.io.fields import ConfigError, check_int, internal, option
from roofline.measure import provenance
from roofline.measure.timer import TimerSettings, set_threads
from roofline.model.speculation import StepCosts, round_time, tau, tau_iid
from roofline.spec import round_parts
from roofline.spec.counters import AcceptanceCounters
from roofline.spec.drafters import DraftModelDrafter
from roofline.spec.engine import DecodeSettings, SpecEngine
from roofline.spec.real_acceptance import DRAFTERS, make_drafter


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
    timer: TimerSettings = internal(why="the command's timer key: each visit of one of the round's parts (its "
                                        "warm-up, then min_reps reps)",
                                    factory=lambda: TimerSettings(max_reps=30, budget_s=0.5))
    parts_rounds: int = option(20, "with prompts_eval: rounds of timing the round's parts (every part timed once per round, "
                                   "in a fresh random order)")
    threads: int = option(1, "with prompts_eval: torch threads for the whole validation (the round's parts and the "
                             "engine alike); 0 leaves torch's default")

    def __post_init__(self) -> None:
        bad = set(self.drafters) - set(DRAFTERS)
        if bad:
            raise ConfigError(f"drafters={sorted(bad)}: allowed {list(DRAFTERS)}")
        if min(self.ks) < 1 or min(self.Bs) < 1 or self.reps < 1 or self.max_new < 4:
            raise ConfigError("ks, Bs, reps >= 1 and max_new >= 4")
        if self.n_prompts % max(self.Bs):
            raise ConfigError(f"n_prompts={self.n_prompts}: must be a multiple of max(Bs)={max(self.Bs)}")
        check_int("parts_rounds", self.parts_rounds, 1)
        cores = os.cpu_count() or 1  # more threads than cores time the scheduler, not the engine
        check_int("threads", self.threads, 0, cores, f"0 (torch's default) to {cores} (this machine's cores)")


def _settings(req: RealValidationRequest, k: int = 0) -> DecodeSettings:
    return DecodeSettings(max_new=req.max_new, k=k, temperature=req.temperature, seed=req.seed)


def _batches(prompts: list[list[int]], B: int) -> list[list[list[int]]]:
    return [prompts[i:i + B] for i in range(0, len(prompts), B)]


class _Tally:
    """What runs of the engine add up to: outputs, counters, steady tokens, seconds and rounds, and
    the seconds of drafting, of the target's forwards and outside both."""

    def __init__(self, k: int):
        self.out, self.counters = [], AcceptanceCounters(accepted_per_pos=(0,) * k)
        self.tokens, self.seconds, self.overhead_s, self.draft_s = 0, 0.0, 0.0, 0.0
        self.steady_rounds, self.verify_s = 0, 0.0

    def add(self, out, m) -> None:
        self.out += out
        self.counters += m.counters
        self.tokens, self.seconds = self.tokens + m.steady_tokens, self.seconds + m.steady_s
        self.overhead_s, self.draft_s = self.overhead_s + m.overhead_s, self.draft_s + m.draft_s
        self.steady_rounds, self.verify_s = self.steady_rounds + m.steady_rounds, self.verify_s + m.verify_s

    @property
    def host_per_forward(self) -> float:
        """Seconds outside drafting and the target's forwards, per second of the target's forwards."""
        return self.overhead_s / self.verify_s

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds if self.seconds else float("nan")

    @property
    def round_s(self) -> float:
        return self.seconds / self.steady_rounds if self.steady_rounds else float("nan")


def _run_set(target, drafter_of, prompts, B: int, s: DecodeSettings) -> _Tally:
    """Every batch of `prompts` through the engine."""
    t = _Tally(s.k)
    for batch in _batches(prompts, B):
        t.add(*SpecEngine(target, drafter_of() if s.k else None).generate(batch, s))
    return t


def _run_pair(target, drafter_of, prompts, B: int, plain_s: DecodeSettings, spec_s: DecodeSettings,
              spec_first: bool) -> tuple[_Tally, _Tally]:
    """Plain and speculative decoding of every batch, in turns batch by batch."""
    plain, spec = _Tally(0), _Tally(spec_s.k)
    for batch in _batches(prompts, B):
        runs = [(spec, drafter_of, spec_s), (plain, None, plain_s)]
        for tally, maker, s in runs if spec_first else runs[::-1]:
            tally.add(*SpecEngine(target, maker() if maker else None).generate(batch, s))
    return plain, spec


def _write_table(table: pd.DataFrame, req: RealValidationRequest, Ls, L_mid: int, run_dir: Path) -> None:
    files.write_csv_atomic(table, run_dir / "round_parts.csv")
    meta = dict(what="step times of the engine's parts, timed in turns (roofline.spec.round_parts)", Ls=list(Ls),
                L_mid=L_mid, rounds=req.parts_rounds, timer=asdict(req.timer), temperature=req.temperature,
                dtype=req.dtype, threads=torch.get_num_threads(), median_ci_rel=round_parts.spread(table),
                provenance=provenance.collect(req.device))
    files.write_json_atomic(run_dir / "round_parts.json", meta)


def run_real_validation(req: RealValidationRequest, run_dir: Path, log=print) -> pd.DataFrame:
    run_dir.mkdir(parents=True, exist_ok=True)
    with set_threads(req.threads):
        return _validate(req, run_dir, log)


def _validate(req: RealValidationRequest, run_dir: Path, log) -> pd.DataFrame:
    torch.manual_seed(req.seed)
    pa_all = encode_conversations(req.checkpoint, req.prompts_a, field="prompts_a")
    pa = pa_all[:req.n_prompts]
    pb = encode_conversations(req.checkpoint, req.prompts_b, field="prompts_b")[:req.n_prompts]
    if len(pa) < req.n_prompts or len(pb) < req.n_prompts:
        raise ConfigError(f"prompts: {len(pa)} (set a) and {len(pb)} (set b) conversations; need n_prompts="
                          f"{req.n_prompts} in each")
    k_max = max(req.ks)
    longest = max(len(p) for p in pa_all + pb) + req.max_new + 3 * k_max + 2
    kw = dict(dtype=req.dtype, device=req.device, max_batch=max(req.Bs), max_context=longest)
    target = load_checkpoint(req.checkpoint, **kw)
    draft_model = load_checkpoint(req.draft_checkpoint, **kw) if "draft_model" in req.drafters else None

    def drafter_of(name):  # one draft model for the run: its cache is reset at each prefill
        if name == "draft_model":
            return lambda: DraftModelDrafter(draft_model, target.cfg.vocab)
        return lambda: make_drafter(name, target)

    makers = {d: drafter_of(d) for d in req.drafters}
    L_mid = round(statistics.mean(len(p) for p in pb) + req.max_new / 2)
    lo = min(len(p) for p in pa_all + pb)
    Ls = tuple(sorted({max(1, lo // 2), longest - k_max - 2}))  # brackets L_mid, never equal to it
    if L_mid in Ls:
        raise ConfigError(f"step-table contexts {Ls} contain the engine's L_mid={L_mid}: not a disjoint table")
    log(f"[1/3] the round's parts (the target, its MTP module, the draft model) at L={list(Ls)}, timed in turns "
        f"x{req.parts_rounds} (the engine's L_mid={L_mid} is not timed)")
    table = round_parts.measure(target, draft_model, req.ks, req.Bs, Ls, req.timer, req.parts_rounds, req.temperature,
                               req.seed, req.device)
    _write_table(table, req, Ls, L_mid, run_dir)

    log(f"[2/3] acceptance per position on prompt set A, all {len(pa_all)} conversations, at every k of ks "
        f"(temperature {req.temperature}); overhead calibration on set A")
    with torch.inference_mode():
        plain_a = {B: _run_set(target, None, pa, B, _settings(req)) for B in req.Bs}
        counted, calib = {}, {}
        for d in req.drafters:
            for k in req.ks:
                c = AcceptanceCounters(accepted_per_pos=(0,) * k)
                for B in req.Bs:
                    r = _run_set(target, makers[d], pa_all, B, _settings(req, k))
                    free_draft = r.draft_s if d == "ngram" else 0.0  # the round's parts price n-gram at 0
                    calib[d, k, B] = r.host_per_forward + free_draft / r.verify_s
                    c += r.counters
                counted[d, k] = c
            log(f"  {d}: " + "; ".join(f"k={k} alpha {' '.join(f'{a:.3f}' for a in _profile(counted[d, k]))}"
                                       for k in req.ks))
        o_plain = {B: plain_a[B].host_per_forward for B in req.Bs}

    log(f"[3/3] plain vs speculative on prompt set B, in turns batch by batch, x{req.reps}")
    rows = []
    exact = req.dtype == "float32" and req.temperature == 0
    with torch.inference_mode():
        for B in req.Bs:
            reference = _run_set(target, None, pb, B, _settings(req)).out
            for d in req.drafters:
                base = round_parts.step_costs(table, d)  # the drafter's costs, once for all its k
                c = round_parts.seconds_of(table, d)(1, B, L_mid) / base.target(1, B, L_mid) if d != "ngram" else 0.0
                for k in req.ks:
                    pairs = [_run_pair(target, makers[d], pb, B, _settings(req), _settings(req, k), i % 2 == 1)
                             for i in range(req.reps)]
                    for p, s in pairs:
                        if exact and (s.out != reference or p.out != reference):
                            raise RuntimeError(f"{d}, k={k}, B={B}: speculative output differs from plain greedy")
                    rows.append(_row(d, k, B, L_mid, pairs, counted[d, k], counted[d, k_max], base, c, o_plain[B],
                                     calib[d, k, B]))
                    r = rows[-1]
                    log(f"  {d:11s} k={k} B={B}: S measured {r['S_meas']:.3f}, predicted {r['S_pred']:.3f} "
                        f"({r['err']:+.1%}); iid {r['err_iid']:+.1%}, Leviathan {r['err_leviathan']:+.1%}")
    result = pd.DataFrame(rows)
    result.to_csv(run_dir / "real_specdec.csv", index=False)
    return result


def _profile(counters: AcceptanceCounters) -> list[float]:
    """Conditional acceptance per position (a position no draft reached counts as 0)."""
    return [a if a == a else 0.0 for a in counters.per_position_alpha()]


def _row(d, k, B, L, pairs, at_k: AcceptanceCounters, at_kmax: AcceptanceCounters, base: StepCosts, c: float,
         plain_rel: float, spec_rel: float) -> dict:
    """One validated point from set A's acceptance at this k (and, beside it, the profile at max(ks)
    cut to k); c = T_draft(1) / T(1), one step each (Leviathan's cost ratio). The host work of a
    plain step and of a round (plain_rel, spec_rel: set A's seconds outside drafting and the
    target's forwards, per second of the same run's forwards) is priced in the table's time units:
    times the table's T(1) and T(k+1). The machine's speed drifts between the table's timing and
    the engine's runs, and host work and this model's forward (per-op dispatch) drift together."""
    profile, rate = _profile(at_k), at_k.acceptance_rate()
    o_plain, o_spec = plain_rel * base.target(1, B, L), spec_rel * base.target(k + 1, B, L)
    costs = StepCosts(target=lambda q, B_, L_: base.target(q, B_, L_) + o_plain, draft=base.draft,
                      overhead=lambda k_, B_: max(0.0, o_spec - o_plain))
    R, t1 = round_time(k, B, L, costs), costs.target(1, B, L)
    tau_prof, tau_i, tau_kmax = tau(profile), tau_iid(rate, k), tau(_profile(at_kmax)[:k])
    # S = tau * T(1) / R as measured: tau from the counters (every draft of every sequence), T(1) and R
    # the seconds per step and per round while the whole batch generates. A static batch's own
    # tokens/s over those rounds (S_window) leans on its fastest sequences at B > 1: the window
    # ends when the first one is done, so the slow ones' later rounds, where continuous batching
    # would keep a slot busy at their acceptance, are left out.
    ratios = [s.counters.mean_acceptance_length() * p.round_s / s.round_s for p, s in pairs]
    S = statistics.median(ratios)
    window = statistics.median(s.tps / p.tps for p, s in pairs)
    meas = pairs[-1][1].counters
    pred, iid, lev = tau_prof * t1 / R, tau_i * t1 / R, tau_i / (k * c + 1)
    return dict(drafter=d, k=k, B=B, L_mid=L, alpha_a=" ".join(f"{a:.3f}" for a in profile), rate_a=rate,
                tau_pred=tau_prof, tau_meas_b=meas.mean_acceptance_length(),
                alpha_b=" ".join(f"{a:.3f}" for a in meas.per_position_alpha()),
                T1_pred_s=t1, R_pred_s=R, O_spec_s=o_spec, O_plain_s=o_plain, O_spec_rel=spec_rel,
                O_plain_rel=plain_rel, c_draft=c,
                tps_plain=statistics.median(p.tps for p, _ in pairs),
                tps_spec=statistics.median(s.tps for _, s in pairs), T1_meas_s=statistics.median(p.round_s for p, _ in pairs),
                R_meas_s=statistics.median(s.round_s for _, s in pairs), S_meas=S, S_meas_lo=min(ratios),
                S_meas_hi=max(ratios), S_window=window, S_pred=pred, err=pred / S - 1,
                S_iid=iid, err_iid=iid / S - 1, S_leviathan=lev, err_leviathan=lev / S - 1,
                # the same prediction from set A's profile at max(ks) cut to k: a round's start depends on k
                # (after a rejection, or after a full round), and acceptance is correlated along a sequence
                tau_kmax=tau_kmax, S_kmax=tau_kmax * t1 / R, err_kmax=tau_kmax * t1 / R / S - 1,
                # err's two factors: acceptance carried from set A, and the round's cost in plain steps
                err_tau=tau_prof / meas.mean_acceptance_length() - 1,
                err_round=(R / t1) / (statistics.median(s.round_s / p.round_s for p, s in pairs)) - 1)


def summarize(table: pd.DataFrame) -> tuple[str, dict]:
    """Console table and |error| statistics (fractions of the measured speedup) per drafter and overall."""
    cols = ["drafter", "k", "B", "alpha_a", "tau_pred", "tau_meas_b", "S_meas", "S_pred", "err", "err_iid",
            "err_leviathan", "err_kmax"]
    stats = {}
    for name, part in [("all", table)] + list(table.groupby("drafter")):
        stats[name] = {e: dict(median_abs=float(part[e].abs().median()), max_abs=float(part[e].abs().max()))
                       for e in ("err", "err_iid", "err_leviathan", "err_kmax")}
    text = table[cols].round(3).to_string(index=False) + "\n" + "\n".join(
        f"{n}: |err| median {s['err']['median_abs']:.1%} max {s['err']['max_abs']:.1%}; iid median "
        f"{s['err_iid']['median_abs']:.1%} max {s['err_iid']['max_abs']:.1%}; Leviathan median "
        f"{s['err_leviathan']['median_abs']:.1%} max {s['err_leviathan']['max_abs']:.1%}; profile at max(ks) median "
        f"{s['err_kmax']['median_abs']:.1%} max {s['err_kmax']['max_abs']:.1%}" for n, s in stats.items())
    return text, dict(points=len(table), errors=stats)
