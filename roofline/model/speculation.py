"""Speculative-decoding speedup from acceptance and measured step times.

A round drafts k tokens, verifies them in one target forward over q = k+1 tokens per
sequence, keeps the longest accepted prefix and adds one target token (the correction,
or the bonus when all k survive). With conditional acceptance alpha_j at position j,
position i survives with s_i = prod_{j<=i} alpha_j, and a round yields on average

    tau(k) = 1 + sum_{i=1..k} s_i             (i.i.d.: (1 - a^(k+1)) / (1 - a))

tokens. It costs R(k,B,L) = T(k+1,B,L) + sum_i T_draft,i(B,L) + O(k,B), against T(1,B,L)
per token for plain decode, so S = tau * T(1) / R. Leviathan et al. 2023 assume
T(k+1) = T(1), a draft cost of c*T(1) per token and O = 0: cheap verification is exactly
what holds at small batch (weight reads dominate) and fails once B*(k+1) tokens pass the
roofline ridge. Here T comes from measurements or a fitted cost model, never that
assumption; this module only does the arithmetic, whatever produced the step times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Callable, Mapping, Sequence, Union

import numpy as np
import pandas as pd

from roofline.io.fields import ConfigError

AlphaOrProfile = Union[float, Sequence[float]]

# the drafters a speculative round can use: one list for the cost model, the planner and the engine
DRAFTERS = ("mtp", "draft_model", "ngram")
# EAGLE heads (a one-layer dense decoder over the target's hidden states, arXiv 2401.15077 / 2503.01840): priced by the
# what-if only (roofline.parallel.whatif; the fitted cost model has measured no head of theirs). eagle: the EAGLE-1/2
# head (an fc over [embedding; the target's last hidden state], the target's LM head); eagle3: the EAGLE-3 head (an fc
# fusing three of the target's hidden states, q/k/v over [embedding; that feature], its own LM head over a draft
# vocabulary)
EAGLE_HEADS = ("eagle", "eagle3")
WHATIF_DRAFTERS = DRAFTERS + EAGLE_HEADS
# the drafters that are heads over the target (priced on its own ranks, chained, a draft tree possible)
HEAD_DRAFTERS = ("mtp",) + EAGLE_HEADS
# the draft vocabulary of an EAGLE-3 head unless told (draft_vocab_size of the released heads, e.g.
# yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: 32000 rows mapped to the target's vocabulary by its d2t table)
EAGLE3_DRAFT_VOCAB = 32000


def refuse_eagle_without_whatif(kind: str) -> None:
    """An EAGLE head is priced by the what-if only (device= without fit=): a one-line error for a fit's path."""
    if kind in EAGLE_HEADS:
        raise ConfigError(f"drafter={kind}: priced by the what-if only (device= without fit=): a fit has measured no "
                          "EAGLE head")

TABLE_COLUMNS = ("alpha", "k", "B", "L", "tau", "R_s", "T1_s", "S", "throughput_tok_s",
                 "k_star", "extrapolated")


def _check_alpha(alpha: float, name: str = "alpha") -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"{name} must be a real number in [0, 1], got {alpha!r}")
    return float(alpha)


def _check_alphas(alphas: Sequence[float], name: str = "alphas") -> np.ndarray:
    a = np.asarray(alphas, dtype=float)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of per-position acceptances, "
                         f"got shape {a.shape}")
    if not np.all((a >= 0.0) & (a <= 1.0)):  # NaN fails too
        raise ConfigError(f"{name} must lie in [0, 1], got {a.tolist()}")
    return a


def _check_int(value: int, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def survival(alphas: Sequence[float]) -> np.ndarray:
    """s_i = prod_{j<=i} alpha_j: probability that drafted position i is kept."""
    return np.cumprod(_check_alphas(alphas))


def tau(alphas: Sequence[float]) -> float:
    """Expected tokens per round, 1 + sum_i s_i, for k = len(alphas) drafts."""
    return 1.0 + float(survival(alphas).sum())


def tau_iid(alpha: float, k: int) -> float:
    """(1 - alpha^(k+1)) / (1 - alpha), Leviathan et al. 2023 eq. 1; k+1 at alpha = 1."""
    alpha, k = _check_alpha(alpha), _check_int(k, "k", 0)
    if alpha == 1.0:
        return float(k + 1)
    if alpha == 0.0:
        return 1.0
    # expm1/log1p keep the closed form accurate as alpha -> 1.
    return math.expm1((k + 1) * math.log1p(alpha - 1.0)) / (alpha - 1.0)


def _profile(alpha_or_profile: AlphaOrProfile, k: int) -> np.ndarray:
    """The first k conditional acceptances: alpha repeated, or a measured profile's head."""
    if isinstance(alpha_or_profile, Real):
        return np.full(k, _check_alpha(alpha_or_profile))
    profile = _check_alphas(alpha_or_profile, "alphas")
    if k > len(profile):
        raise ConfigError(f"k={k} exceeds the per-position profile (len {len(profile)}): "
                         "acceptance beyond the measured positions is unknown")
    return profile[:k]


def _max_k(alpha_or_profile: AlphaOrProfile, k_max: int) -> int:
    if isinstance(alpha_or_profile, Real):
        return k_max
    return min(k_max, len(_check_alphas(alpha_or_profile, "alphas")))


def no_cost(*_: int) -> float:
    """A draft or overhead term that is really free (n-gram lookup): 0 seconds, said explicitly."""
    return 0.0


def drafting(kind: str, step: Callable[[int, int, int], float] | None = None) -> Callable[[int, int, int, int], float]:
    """draft(i, k, B, L) as roofline.spec.drafters runs each drafter, from `step(q, B, L)`, the
    drafter's own forward over q tokens per sequence. MTP: the first draft of a round is one pass
    of the module over the k+1 verified positions (its catch-up), the others chained single
    steps; a draft model: a two-token catch-up forward, then single steps; n-gram: no_cost."""
    if kind not in DRAFTERS:
        raise ConfigError(f"drafter={kind!r}: allowed {DRAFTERS}")
    if kind == "ngram":
        return no_cost
    first = (lambda k: k + 1) if kind == "mtp" else (lambda k: 2)  # noqa: E731
    return lambda i, k, B, L: step(first(k) if i == 1 else 1, B, L + i - 1)


@dataclass(frozen=True)
class StepCosts:
    """Seconds per step, from measurements or a fitted cost model.

    target(q, B, L): one target forward over q new tokens for each of B sequences with L
    tokens already cached. draft(i, k, B, L): drafting the i-th token (i = 1..k) of a round
    of k (an MTP head, a small model; 0 for n-gram lookup) — k is given because the first
    draft of a round is where a drafter catches up on what the last verification accepted
    (an MTP module re-reads the k+1 verified positions). overhead(k, B): per-round sampling,
    acceptance bookkeeping and host syncs beyond what plain decode already pays.
    All three are required: a zero cost is a claim, so it is written as `no_cost`.
    """

    target: Callable[[int, int, int], float]
    draft: Callable[[int, int, int, int], float]
    overhead: Callable[[int, int], float]


def _seconds(value: float, what: str) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{what} must be a finite, non-negative number of seconds, got {value}")
    return value


def _check_shape(B: int, L: int) -> tuple[int, int]:
    return _check_int(B, "B", 1), _check_int(L, "L", 0)


def plain_step_time(B: int, L: int, costs: StepCosts) -> float:
    """T(1, B, L): the plain-decode baseline every speedup is measured against."""
    B, L = _check_shape(B, L)
    t1 = _seconds(costs.target(1, B, L), f"target(1, {B}, {L})")
    if t1 == 0.0:
        raise ValueError(f"target(1, {B}, {L}) must be > 0 seconds")
    return t1


def round_time(k: int, B: int, L: int, costs: StepCosts) -> float:
    """R(k,B,L) = T(k+1,B,L) + sum_{i=1..k} T_draft,i(B,L) + O(k,B); k = 0 is plain decode, T(1)."""
    k = _check_int(k, "k", 0)
    B, L = _check_shape(B, L)
    if k == 0:
        return plain_step_time(B, L, costs)
    verify = _seconds(costs.target(k + 1, B, L), f"target({k + 1}, {B}, {L})")
    drafting = sum(_seconds(costs.draft(i, k, B, L), f"draft({i}, {k}, {B}, {L})")
                   for i in range(1, k + 1))
    overhead = _seconds(costs.overhead(k, B), f"overhead({k}, {B})")
    return verify + drafting + overhead


def _round(alpha_or_profile: AlphaOrProfile, k: int, B: int, L: int,
           costs: StepCosts) -> tuple[float, float, float]:
    """(tau, R, T1) of one configuration."""
    k = _check_int(k, "k", 0)
    tokens = tau(_profile(alpha_or_profile, k))
    return tokens, round_time(k, B, L, costs), plain_step_time(B, L, costs)


def speedup(alpha_or_profile: AlphaOrProfile, k: int, B: int, L: int, costs: StepCosts) -> float:
    """S = tau(k) * T(1,B,L) / R(k,B,L); exactly 1 at k = 0."""
    tokens, r, t1 = _round(alpha_or_profile, k, B, L, costs)
    return tokens * t1 / r


def throughput(alpha_or_profile: AlphaOrProfile, k: int, B: int, L: int,
               costs: StepCosts) -> float:
    """Generated tokens per second over the whole batch: B * tau / R."""
    tokens, r, _ = _round(alpha_or_profile, k, B, L, costs)
    return B * tokens / r


def best_k(alpha_or_profile: AlphaOrProfile, B: int, L: int, costs: StepCosts,
           k_max: int = 8) -> tuple[int, float]:
    """(k*, S*) over k = 0..k_max; k = 0 (no speculation) wins when speculation loses.

    A per-position profile caps k at its length. Ties go to the smaller k.
    """
    k_max = _check_int(k_max, "k_max", 0)
    best = (0, 1.0)
    for k in range(1, _max_k(alpha_or_profile, k_max) + 1):
        s = speedup(alpha_or_profile, k, B, L, costs)
        if s > best[1]:
            best = (k, s)
    return best


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """(1 - alpha^(gamma+1)) / ((1 - alpha)(gamma*c + 1)): Leviathan et al. 2023, Theorem 3.8.

    The expected walltime improvement when verifying gamma+1 tokens costs one target step
    and each draft costs c target steps.
    """
    if isinstance(c, bool) or not isinstance(c, Real) or not c >= 0.0 or not math.isfinite(c):
        raise ValueError(f"c must be a finite number >= 0, got {c!r}")
    gamma = _check_int(gamma, "gamma", 0)
    return tau_iid(alpha, gamma) / (gamma * c + 1.0)


def simulate_tau(alphas: Sequence[float], rounds: int, rng: np.random.Generator) -> float:
    """Monte-Carlo mean tokens per round: position i is accepted with probability alpha_i
    if all earlier positions were; each round adds one correction or bonus token."""
    a = _check_alphas(alphas)
    rounds = _check_int(rounds, "rounds", 1)
    chunk = max(1, 2**22 // max(1, len(a)))
    accepted = 0
    for start in range(0, rounds, chunk):
        n = min(chunk, rounds - start)
        hits = rng.random((n, len(a))) < a
        accepted += int(np.cumprod(hits, axis=1).sum())
    return 1.0 + accepted / rounds


def _outside(domain: Mapping[str, tuple[float, float]], **point: int) -> bool:
    return any(not lo <= point[axis] <= hi for axis, (lo, hi) in domain.items())


def _check_domain(domain: Mapping[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
    unknown = set(domain) - {"q", "B", "L"}
    if unknown:
        raise ValueError(f"measured_domain keys must be among q, B, L, got {sorted(unknown)}")
    checked = {}
    for axis, bounds in domain.items():
        lo, hi = bounds
        if not lo <= hi:
            raise ValueError(f"measured_domain[{axis!r}] must be (min, max) with min <= max, "
                             f"got {bounds!r}")
        checked[axis] = (lo, hi)
    return checked


def _labelled(alphas_or_profiles) -> list[tuple[object, AlphaOrProfile]]:
    if isinstance(alphas_or_profiles, Mapping):
        return list(alphas_or_profiles.items())
    items = []
    for entry in alphas_or_profiles:
        if isinstance(entry, Real):
            items.append((float(entry), entry))
        else:
            profile = _check_alphas(entry, "alphas")
            items.append(("(" + ", ".join(f"{a:g}" for a in profile) + ")", profile))
    return items


def predict_table(alphas_or_profiles, ks: Sequence[int], Bs: Sequence[int],
                  Ls: Sequence[int], costs: StepCosts,
                  measured_domain: Mapping[str, tuple[float, float]] | None = None
                  ) -> pd.DataFrame:
    """One row per (alpha or profile, k, B, L) with tau, R, T(1), S and throughput.

    `alphas_or_profiles`: i.i.d. alphas, per-position profiles, or a mapping label -> either;
    the `alpha` column holds the alpha, the mapping key, or the profile written out.
    Rows with k beyond a profile's length are left out (those positions were not measured).
    `k_star` is the k of largest S among the listed ks for that (alpha, B, L).
    `extrapolated` says whether (q = k+1, B, L) falls outside `measured_domain`
    ({"q": (min, max), "B": ..., "L": ...}); NA when no domain is given.
    """
    ks = [_check_int(k, "k", 0) for k in ks]
    domain = None if measured_domain is None else _check_domain(measured_domain)
    rows = []
    for label, source in _labelled(alphas_or_profiles):
        for B in Bs:
            for L in Ls:
                group = []
                for k in ks:
                    if k > _max_k(source, k):
                        continue
                    tokens, r, t1 = _round(source, k, B, L, costs)
                    group.append({
                        "alpha": label, "k": k, "B": int(B), "L": int(L), "tau": tokens,
                        "R_s": r, "T1_s": t1, "S": tokens * t1 / r,
                        "throughput_tok_s": B * tokens / r,
                        "extrapolated": pd.NA if domain is None
                        else _outside(domain, q=k + 1, B=B, L=L),
                    })
                if group:
                    k_star = max(group, key=lambda row: (row["S"], -row["k"]))["k"]
                    for row in group:
                        row["k_star"] = k_star
                rows.extend(group)
    table = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    return table.astype({"k": int, "B": int, "L": int, "k_star": int,
                         "extrapolated": "boolean"})
