"""Checks of what predict and capacity take in: a fit.json re-checked on load, the requests'
grids, and the speedups a prediction may not claim.

The fit's quality gate (roofline.analysis.quality.fit_problems) runs when fit.json is written;
a file can change afterwards (edited, truncated, another tool's). `check_fit` re-checks the
structure and the physics a prediction rests on every time a fit is loaded: every coefficient
a finite number >= 0 (the fit is non-negative least squares: a negative bandwidth or FLOP term
is not a fit this code wrote), a knee >= 0, a step time > 0 at one token. `speedup_problems`
flags rows whose speedup S exceeds k + 1, which no drafter can reach (k drafted tokens and the
verified one per step): the fitted T(k+1) is then below T(1), a fit not to be believed.
"""

from __future__ import annotations

import math
from numbers import Real

from roofline.io.fields import ConfigError, check_grid, check_int

GROUP_KEY_FIELDS = ("model", "dtype", "mode", "kind")
MIN_COEFS, MAX_COEFS = 5, 7  # t0, weights, kv, matmul, attention [, per_layer, comm]


def _number(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(float(v))


def check_fit(fit, where: str) -> dict:
    """`fit` (a loaded fit.json) or ConfigError naming `where` and the first field that is wrong."""
    if not isinstance(fit, dict):
        raise ConfigError(f"{where}: a fit.json holds a JSON object, this one a {type(fit).__name__}")
    groups = fit.get("groups")
    if not isinstance(groups, list) or not groups:
        raise ConfigError(f"{where}: no fitted groups (field 'groups' is {groups!r:.60}); refit with roofline.cli.fit")
    if not isinstance(fit.get("provenance"), dict) or "device_name" not in fit["provenance"]:
        raise ConfigError(f"{where}: field 'provenance.device_name' is missing; refit with roofline.cli.fit")
    for i, g in enumerate(groups):
        at = f"{where}: groups[{i}]"
        if not isinstance(g, dict) or not isinstance(g.get("key"), dict):
            raise ConfigError(f"{at}: not a fitted group (no 'key')")
        missing = [k for k in GROUP_KEY_FIELDS if not isinstance(g["key"].get(k), str)]
        if missing:
            raise ConfigError(f"{at}.key: field(s) {missing} missing")
        coefs = g.get("coefs")
        if not isinstance(coefs, list) or not MIN_COEFS <= len(coefs) <= MAX_COEFS:
            raise ConfigError(f"{at}.coefs: {coefs!r:.80}; allowed a list of {MIN_COEFS}..{MAX_COEFS} numbers")
        bad = [(j, c) for j, c in enumerate(coefs) if not _number(c) or c < 0]
        if bad:
            j, c = bad[0]
            raise ConfigError(f"{at}.coefs[{j}]={c!r}: allowed a finite number >= 0 (a negative or missing term "
                              "means a bandwidth or FLOP rate below zero: not a fit roofline.cli.fit writes)")
        if sum(coefs[:5]) <= 0:
            raise ConfigError(f"{at}.coefs: all zero (a step would take no time)")
        knee = g.get("knee_tokens", 0.0)
        if not _number(knee) or knee < 0:
            raise ConfigError(f"{at}.knee_tokens={knee!r}: allowed a finite number >= 0")
        n = g.get("n_points")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 0):
            raise ConfigError(f"{at}.n_points={n!r}: allowed an integer >= 0")
        if not isinstance(g.get("problems", []), list):
            raise ConfigError(f"{at}.problems: allowed a list of strings")
    return fit


def unconverged(fit: dict) -> list[str]:
    """The fit's own warnings that make its numbers doubtful (points that did not converge, too few)."""
    return [f"{'/'.join(g['key'][k] for k in GROUP_KEY_FIELDS)}: {p}" for g in fit.get("groups", [])
            for p in g.get("problems", []) if "did not converge" in p or p.startswith("too few points")]


def speedup_problems(t) -> tuple[object, list[str]]:
    """(the table with `impossible` marked, warnings) for rows whose S exceeds k + 1."""
    if not {"S", "k"} <= set(getattr(t, "columns", ())):
        return t, []
    t = t.copy()
    t["impossible"] = t["S"].astype(float) > t["k"].astype(float) + 1 + 1e-9
    bad = t[t["impossible"]]
    if bad.empty:
        return t, []
    worst = bad.loc[(bad["S"] / (bad["k"] + 1)).idxmax()]
    where = ", ".join(f"{c}={worst[c]:g}" for c in ("alpha", "k", "B", "L") if c in worst)
    return t, [f"{len(bad)} of {len(t)} predictions have a speedup S above k + 1, which no drafter reaches "
               f"(worst S={worst['S']:.3g} at {where}): the fitted T(k+1) is below T(1), the fit is not to be "
               "believed there; refit on converged points (a quiet machine, timer=default)"]


def check_predict_grid(alphas, k, B, L, plot_B: int, plot_L: int, vllm_metrics=None) -> None:
    """predict's grid: alphas in [0, 1] (empty only when vLLM counters give them), k >= 0, B >= 1, L >= 0."""
    if alphas or not vllm_metrics:
        check_grid("alphas", alphas, 0.0, 1.0, integer=False)
    check_grid("k", k, 0)
    check_grid("B", B, 1)
    check_grid("L", L, 0)
    check_grid("plot_B", plot_B, 1)
    check_grid("plot_L", plot_L, 0)


def check_context(plot_L: int, k_max: int, max_context: int, model: str) -> None:
    """The plotted context plus the longest verify step must fit the target's context."""
    if plot_L + k_max + 1 > max_context:
        raise ConfigError(f"plot_L={plot_L}: plot_L + k + 1 = {plot_L + k_max + 1} exceeds the max_context "
                          f"{max_context} of {model}; allowed plot_L <= {max_context - k_max - 1}")


def check_drafter(drafter, draft_model) -> None:
    """draft_model names the draft model of drafter=draft_model only (given with another drafter it would be ignored)."""
    if draft_model and drafter != "draft_model":
        raise ConfigError(f"draft_model={draft_model!r} is given with drafter={drafter!r}: it prices only "
                          "drafter=draft_model; drop draft_model or set drafter=draft_model")


def _positive(c: dict, name: str, allow_zero: bool = False, optional: bool = True) -> None:
    v = c.get(name)
    if v is None and optional:
        return
    if not _number(v) or v < 0 or (v == 0 and not allow_zero):
        raise ConfigError(f"{name}={v!r}: allowed a number {'>=' if allow_zero else '>'} 0")


def check_capacity_config(c: dict) -> None:
    """capacity's plain config: every number a number in its range, speculation's alpha and k
    checked even when speculative=false (a value out of range is a mistake either way), and no
    option that the chosen drafter would ignore."""
    _positive(c, "memory_gb")
    _positive(c, "price_per_device_hour", allow_zero=True)
    alpha, k = c.get("alpha"), c.get("k")
    if not _number(alpha) or not 0 <= alpha < 1:
        raise ConfigError(f"alpha={alpha!r}: allowed an acceptance rate in [0, 1)")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k={k!r}: allowed integers >= 1")
    check_drafter(c.get("drafter"), c.get("draft_model"))
    check_tokens_fit(c)


def check_tokens_fit(c: dict) -> None:
    """A sequence's tokens (context + output, plus the k drafts a speculative round verifies) fit
    the model's context window; the message names the options, not the priced L + q."""
    ctx, out, k = c.get("context"), c.get("output"), c.get("k")
    window = (c.get("model") or {}).get("max_context") if isinstance(c.get("model"), dict) else None
    for name, v, lo in (("context", ctx, 0), ("output", out, 1)):
        check_int(name, v, lo)
    if not isinstance(window, int):
        return
    drafts = k if c.get("speculative") and isinstance(k, int) else 0
    if ctx + out + drafts > window:
        spec = f" + k={k}" if drafts else ""
        raise ConfigError(f"context={ctx} + output={out}{spec} = {ctx + out + drafts} tokens: more than the "
                          f"model's context window (max_context={window})")
    if isinstance(k, int) and k > window:
        raise ConfigError(f"k={k}: more draft tokens than the model's context window (max_context={window})")


def unusable_groups(fit: dict, kinds) -> list[dict]:
    """The fitted groups too thin to use, among those of `kinds` a plan prices (an MTP group with
    few points does not stop a plain-decode plan)."""
    from roofline.analysis import quality
    return [g for g in fit["groups"] if g["key"]["kind"] in kinds and not quality.usable(g)]


def check_fit_settings(s) -> None:
    """The fit command's settings (roofline.analysis.costmodel.FitSettings), each field named."""
    for name, lo in (("folds", 2), ("seed", 0), ("q_split", 1)):
        v = getattr(s, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"{name}={v!r}: allowed integers >= {lo}")
    band = s.band
    if not isinstance(band, (list, tuple)) or len(band) != 2 or not all(_number(b) for b in band) \
            or not 0 <= band[0] < band[1] <= 1:
        raise ConfigError(f"band={list(band) if isinstance(band, (list, tuple)) else band!r}: allowed [lo, hi] "
                          "quantiles with 0 <= lo < hi <= 1")


def check_overhead(doc, where: str = "overhead") -> tuple[float, float, float]:
    """The (c0, c1, c2) of an overhead.json (roofline.spec.validation's O(k, B) = c0 + c1*k + c2*B
    seconds per round), or ConfigError naming `where` and what is wrong."""
    coef = doc.get("coef") if isinstance(doc, dict) else None
    if not isinstance(coef, list) or len(coef) != 3 or not all(_number(c) for c in coef):
        raise ConfigError(f"{where}: not an overhead.json of the speculative validation (needs 'coef': three "
                          f"finite numbers c0, c1, c2 of O(k, B) = c0 + c1*k + c2*B seconds; got {str(coef)[:60]})")
    return tuple(float(c) for c in coef)
