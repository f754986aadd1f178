"""Speculative-decoding speedup arithmetic: tau, round time, S, k*, the prediction table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from roofline.model.speculation import (
    StepCosts,
    best_k,
    leviathan_speedup,
    no_cost,
    predict_table,
    round_time,
    simulate_tau,
    speedup,
    survival,
    tau,
    tau_iid,
    throughput,
)


_SEEDS = iter(range(1000, 2000))


def _fresh_rng() -> tuple[np.random.Generator, int]:
    """A new generator per call from a fixed sequence of seeds: fresh inputs, same every run."""
    seed = next(_SEEDS)
    return np.random.default_rng(seed), seed


def _accepted_std(alphas) -> float:
    """Exact standard deviation of the accepted count N = sum_i 1[N >= i] per round.

    E[N^2] = sum_{i,j} P(N >= max(i, j)) = sum_m (2m - 1) s_m.
    """
    s = np.cumprod(alphas)
    m = np.arange(1, len(s) + 1)
    return math.sqrt(float(((2 * m - 1) * s).sum() - s.sum() ** 2))


def _flat(t1: float = 1e-2) -> StepCosts:
    """Leviathan's world: verifying any number of tokens costs one decode step."""
    return StepCosts(target=lambda q, B, L: t1, draft=no_cost, overhead=no_cost)


def _ridge(t_mem: float = 1e-2, ridge_tokens: int = 8) -> StepCosts:
    """Flat while B*q <= ridge_tokens (memory-bound), then linear in B*q (compute-bound):
    at B = 1, flat to q = 8 and linear after, like bf16 linear layers on this CPU."""
    return StepCosts(target=lambda q, B, L: t_mem * max(1.0, B * q / ridge_tokens),
                     draft=no_cost, overhead=no_cost)


@pytest.mark.parametrize("alpha,k", [(0.3, 1), (0.6, 3), (0.8, 5), (0.9, 8), (1.0, 4)])
def test_tau_iid_matches_monte_carlo_within_four_standard_errors(alpha, k):
    rng, seed = _fresh_rng()
    rounds = 200_000
    measured = simulate_tau([alpha] * k, rounds, rng)
    se = _accepted_std([alpha] * k) / math.sqrt(rounds)
    assert abs(measured - tau_iid(alpha, k)) <= 4 * se + 1e-12, f"seed {seed}"


def test_per_position_tau_matches_monte_carlo_within_four_standard_errors():
    rng, seed = _fresh_rng()
    alphas = [0.92, 0.8, 0.71, 0.55, 0.4]
    rounds = 250_000
    measured = simulate_tau(alphas, rounds, rng)
    se = _accepted_std(alphas) / math.sqrt(rounds)
    assert abs(measured - tau(alphas)) <= 4 * se, f"seed {seed}"


def test_survival_is_the_running_product_of_conditional_acceptances():
    np.testing.assert_allclose(survival([0.9, 0.8, 0.5]), [0.9, 0.72, 0.36], rtol=1e-15)
    assert tau([0.9, 0.8, 0.5]) == pytest.approx(1 + 0.9 + 0.72 + 0.36, rel=1e-15)


@pytest.mark.parametrize("alpha", [0.0, 0.05, 0.5, 0.77, 0.999, 1.0])
@pytest.mark.parametrize("k", [0, 1, 2, 7, 16])
def test_iid_and_per_position_forms_agree_for_constant_alpha(alpha, k):
    assert tau_iid(alpha, k) == pytest.approx(tau([alpha] * k), rel=1e-12)


def test_tau_iid_is_continuous_at_alpha_one():
    assert tau_iid(1 - 1e-12, 7) == pytest.approx(8.0, rel=1e-10)


# Leviathan, Kalman, Matias 2023, "Fast Inference from Transformers via Speculative
# Decoding" (arXiv 2211.17192 v2), Table 1: "The total number of arithmetic operations and
# the inference speed vs the baseline, for various values of gamma and alpha, assuming
# c = c_hat = 0". Columns: alpha, gamma, Operations, Speed (as printed, two decimals).
# Speed = (1 - a^(g+1))/(1 - a) (Theorem 3.8 at c = 0);
# Operations = (1 - a)(g + 1)/(1 - a^(g+1)) (Theorem 3.11 at c_hat = 0) = (g + 1)/tau.
LEVIATHAN_TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


@pytest.mark.parametrize("alpha,gamma,operations,speed", LEVIATHAN_TABLE_1)
def test_reproduces_leviathan_table_1_speed_at_zero_draft_cost(alpha, gamma, operations, speed):
    costs = _flat()
    assert round(speedup(alpha, gamma, 1, 0, costs), 2) == speed
    assert round(leviathan_speedup(alpha, gamma, 0.0), 2) == speed


@pytest.mark.parametrize("alpha,gamma,operations,speed", LEVIATHAN_TABLE_1)
def test_reproduces_leviathan_table_1_operations_from_tau(alpha, gamma, operations, speed):
    assert round((gamma + 1) / tau_iid(alpha, gamma), 2) == operations


# Same paper, Appendix A.3, Table 4: "Expected improvement factor (Exp) vs. empirically
# measured improvement factor (Emp)", T5-XXL target. Columns: alpha, gamma, c, Exp.
# c is printed to two decimals and Exp to one, so each row is reproduced when some c within
# +-0.005 of the printed value gives an Exp that rounds to the printed one.
LEVIATHAN_TABLE_4 = [
    (0.75, 7, 0.02, 3.2), (0.80, 7, 0.04, 3.3), (0.82, 7, 0.11, 2.5),
    (0.62, 7, 0.02, 2.3), (0.68, 5, 0.04, 2.4), (0.71, 3, 0.11, 2.0),
    (0.65, 5, 0.02, 2.4), (0.73, 5, 0.04, 2.6), (0.74, 3, 0.11, 2.0),
    (0.53, 5, 0.02, 1.9), (0.55, 3, 0.04, 1.8), (0.56, 3, 0.11, 1.6),
]


@pytest.mark.parametrize("alpha,gamma,c,expected", LEVIATHAN_TABLE_4)
def test_reproduces_leviathan_table_4_expected_improvement(alpha, gamma, c, expected):
    high = leviathan_speedup(alpha, gamma, c - 0.005)
    low = leviathan_speedup(alpha, gamma, c + 0.005)
    assert low <= expected + 0.05 and high >= expected - 0.05


def test_reproduces_leviathan_bigram_example():
    # Section 3.6: a bigram drafter (c = 0), alpha ~ 0.2, gamma = 3 -> "1.25X".
    assert round(leviathan_speedup(0.2, 3, 0.0), 2) == 1.25


@pytest.mark.parametrize("alpha", [0.2, 0.6, 0.85, 1.0])
@pytest.mark.parametrize("gamma", [1, 3, 7])
@pytest.mark.parametrize("c", [0.0, 0.02, 0.3])
def test_speedup_reduces_to_leviathan_when_verify_is_free_and_drafts_cost_c(alpha, gamma, c):
    t1 = 3e-3
    costs = StepCosts(target=lambda q, B, L: t1, draft=lambda i, k, B, L: c * t1,
                      overhead=no_cost)
    assert speedup(alpha, gamma, 1, 512, costs) == pytest.approx(
        leviathan_speedup(alpha, gamma, c), rel=1e-12)


def test_no_speculation_gives_speedup_exactly_one_whatever_the_costs():
    costs = StepCosts(target=lambda q, B, L: 1e-3 * q, draft=lambda i, k, B, L: 5e-4,
                      overhead=lambda k, B: 1e-4)
    assert speedup(0.9, 0, 8, 1024, costs) == 1.0
    assert speedup([0.9, 0.8], 0, 8, 1024, costs) == 1.0
    assert round_time(0, 8, 1024, costs) == 1e-3


def test_round_time_sums_verify_every_draft_position_and_overhead():
    costs = StepCosts(target=lambda q, B, L: 1.0 * q + B + L,
                      draft=lambda i, k, B, L: 10.0 * i,
                      overhead=lambda k, B: 100.0 * k + B)
    # T(4,2,5) = 11, drafts 10+20+30 = 60, O(3,2) = 302
    assert round_time(3, 2, 5, costs) == 11 + 60 + 302


def test_overhead_lowers_the_speedup():
    base = _flat()
    with_overhead = StepCosts(target=base.target, draft=no_cost,
                              overhead=lambda k, B: 2e-3)
    assert speedup(0.8, 4, 1, 0, with_overhead) < speedup(0.8, 4, 1, 0, base)


def test_throughput_is_batch_times_tokens_per_round_over_round_time():
    costs = _ridge()
    B, k, alpha = 4, 3, 0.7
    expected = B * tau_iid(alpha, k) / round_time(k, B, 0, costs)
    assert throughput(alpha, k, B, 0, costs) == pytest.approx(expected, rel=1e-15)


def test_growing_verify_cost_lowers_speedup_past_the_flat_region():
    flat, ridge = _flat(), _ridge()
    for k in range(1, 8):  # q = k+1 <= 8: the ridge model is still flat at B = 1
        assert speedup(0.8, k, 1, 0, ridge) == speedup(0.8, k, 1, 0, flat)
    for k in range(8, 13):
        assert speedup(0.8, k, 1, 0, ridge) < speedup(0.8, k, 1, 0, flat)


def test_best_k_shrinks_as_batch_pushes_verification_past_the_ridge():
    costs = _ridge()
    # B=1: flat to q=8, so k=7 verifies for free (k=8 pays 9/8). B=4: knee at q=2.
    # B=16: already compute-bound at q=1, every extra token costs a full step.
    assert best_k(0.8, 1, 0, costs, k_max=12)[0] == 7
    assert best_k(0.8, 4, 0, costs, k_max=12)[0] == 1
    assert best_k(0.8, 16, 0, costs, k_max=12) == (0, 1.0)
    ks = [best_k(0.8, B, 0, costs, k_max=12)[0] for B in (1, 2, 4, 8, 16, 32)]
    assert ks == sorted(ks, reverse=True)


def test_best_k_returns_the_speedup_of_its_choice():
    costs = _ridge()
    k, s = best_k(0.8, 2, 0, costs)
    assert s == speedup(0.8, k, 2, 0, costs)
    assert all(speedup(0.8, j, 2, 0, costs) <= s for j in range(0, 9))


def test_best_k_never_drafts_beyond_a_per_position_profile():
    profile = [0.95, 0.9, 0.9]
    k, _ = best_k(profile, 1, 0, _flat(), k_max=8)
    assert k == 3


def test_speedup_refuses_k_beyond_a_per_position_profile():
    with pytest.raises(ValueError, match="profile"):
        speedup([0.9, 0.8], 3, 1, 0, _flat())


def test_predict_table_rows_columns_and_k_star():
    costs = _ridge()
    table = predict_table([0.8, [0.9, 0.7]], ks=[0, 1, 2, 3], Bs=[1, 16], Ls=[0, 4096],
                          costs=costs)
    assert list(table.columns) == ["alpha", "k", "B", "L", "tau", "R_s", "T1_s", "S",
                                   "throughput_tok_s", "k_star", "extrapolated"]
    # iid: 4 ks; the 2-position profile has no k = 3 row. Times 2 Bs x 2 Ls.
    assert len(table) == (4 + 3) * 2 * 2
    assert set(table.loc[table["alpha"] == "(0.9, 0.7)", "k"]) == {0, 1, 2}
    row = table[(table["alpha"] == 0.8) & (table["k"] == 3) & (table["B"] == 1)
                & (table["L"] == 0)].iloc[0]
    assert row["S"] == pytest.approx(speedup(0.8, 3, 1, 0, costs), rel=1e-15)
    assert row["k_star"] == 3
    assert (table.loc[table["B"] == 16, "k_star"] == 0).all()
    assert table["extrapolated"].isna().all()


def test_predict_table_flags_points_outside_the_measured_domain():
    table = predict_table({"mtp": 0.8}, ks=[0, 3, 7], Bs=[1, 64], Ls=[128],
                          costs=_ridge(),
                          measured_domain={"q": (1, 4), "B": (1, 32), "L": (0, 8192)})
    flagged = {(r.k, r.B): bool(r.extrapolated) for r in table.itertuples()}
    assert flagged == {(0, 1): False, (3, 1): False, (7, 1): True,
                       (0, 64): True, (3, 64): True, (7, 64): True}
    assert set(table["alpha"]) == {"mtp"}


@pytest.mark.parametrize("call,name", [
    (lambda: tau_iid(1.2, 3), "alpha"),
    (lambda: tau_iid(-0.1, 3), "alpha"),
    (lambda: tau_iid(0.5, -1), "k"),
    (lambda: tau_iid(0.5, 2.5), "k"),
    (lambda: tau([0.5, float("nan")]), "alphas"),
    (lambda: survival([[0.5, 0.4]]), "alphas"),
    (lambda: speedup(0.5, 2, 0, 0, _flat()), "B"),
    (lambda: speedup(0.5, 2, 1, -1, _flat()), "L"),
    (lambda: leviathan_speedup(0.5, 3, -0.1), "c"),
    (lambda: leviathan_speedup(0.5, -3, 0.1), "gamma"),
    (lambda: simulate_tau([0.5], 0, np.random.default_rng(0)), "rounds"),
    (lambda: best_k(0.5, 1, 0, _flat(), k_max=-1), "k_max"),
    (lambda: predict_table([0.5], [1], [1], [0], _flat(), measured_domain={"batch": (1, 2)}),
     "measured_domain"),
])
def test_bad_input_raises_value_error_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call()


@pytest.mark.parametrize("bad", [float("nan"), -1e-3, float("inf")])
def test_step_costs_must_be_finite_non_negative_seconds(bad):
    costs = StepCosts(target=lambda q, B, L: 1e-3 if q == 1 else bad, draft=no_cost,
                      overhead=no_cost)
    with pytest.raises(ValueError, match="target"):
        round_time(2, 1, 0, costs)


def test_zero_plain_decode_time_is_rejected():
    with pytest.raises(ValueError, match="target"):
        speedup(0.5, 1, 1, 0, StepCosts(target=lambda q, B, L: 0.0, draft=no_cost,
                                        overhead=no_cost))
