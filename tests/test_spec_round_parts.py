"""Timing in turns (roofline.measure.timer.time_interleaved) and the table of a speculative round's
parts built on it (roofline.spec.round_parts): what is timed, how often, and how a prediction
reads the table."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from roofline.io.fields import ConfigError
from roofline.measure.timer import TimerSettings, TimingResult, time_interleaved
from roofline.model.decoder import Transformer
from roofline.model.presets import get_preset
from roofline.model.speculation import round_time
from roofline.spec import round_parts

QUICK = TimerSettings(warmup=1, min_reps=3, max_reps=50, rel_ci=0.5, budget_s=1.0)


class DriftingMachine:
    """A scripted timer for time_interleaved: each callable has a fixed cost in work units and
    the machine's speed drifts: every rep takes cost x (1 + drift x reps so far)."""

    def __init__(self, costs: dict, drift: float):
        self.costs, self.drift, self.reps, self.visits = costs, drift, 0, []

    def __call__(self, fn, settings, device):
        key = fn()
        self.visits.append((key, settings.max_reps))
        samples = []
        for _ in range(settings.max_reps):
            samples.append(self.costs[key] * (1 + self.drift * self.reps))
            self.reps += 1
        return TimingResult(median_s=0, p10_s=0, p90_s=0, mean_s=0, min_s=0, cv=0, n=len(samples), ci_rel=0,
                            total_s=0, stopped_by="max_reps", clock="scripted", mode="eager", l2="warm",
                            flush_bytes=0, threads=1, samples_s=tuple(samples))


def test_every_round_times_every_callable_once_with_a_fixed_count_of_reps():
    machine = DriftingMachine({"a": 1.0, "b": 2.0, "c": 3.0}, drift=0.0)
    stats = time_interleaved({k: (lambda k=k: k) for k in "abc"}, QUICK, rounds=4, timer=machine)
    assert [s.n for s in stats.values()] == [4 * QUICK.min_reps] * 3
    rounds = [[key for key, _ in machine.visits[i:i + 3]] for i in range(0, 12, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # a fresh order each round
    assert {reps for _, reps in machine.visits} == {QUICK.min_reps}
    assert stats["b"].median_s == pytest.approx(2.0)


def test_a_drifting_machine_keeps_the_ratios_timed_in_turns_and_not_one_after_another():
    costs = {"t1": 1.0, "t5": 1.1}  # T(5) = 1.1 T(1)
    turns = time_interleaved({k: (lambda k=k: k) for k in costs}, QUICK, rounds=30,
                             timer=DriftingMachine(costs, drift=0.01))
    assert turns["t5"].median_s / turns["t1"].median_s == pytest.approx(1.1, rel=0.05)
    # the same machine, the two callables timed one after the other (as a sweep times points)
    m = DriftingMachine(costs, drift=0.01)
    first = time_interleaved({"t5": lambda: "t5"}, QUICK, rounds=30, timer=m)
    then = time_interleaved({"t1": lambda: "t1"}, QUICK, rounds=30, timer=m)
    assert first["t5"].median_s / then["t1"].median_s < 1.0  # the drift alone says T(5) < T(1)


def test_rounds_below_one_are_refused_by_name():
    with pytest.raises(ConfigError, match="rounds=0"):
        time_interleaved({"a": lambda: None}, QUICK, rounds=0)


def _table(rows):
    return pd.DataFrame([dict(kind=k, q=q, B=B, L=L, median_s=t, p10_s=t, p90_s=t, ci_rel=0.01, n=10)
                         for k, q, B, L, t in rows])


def test_a_part_at_a_context_between_the_timed_ones_is_on_their_straight_line():
    t = _table([("forward", 1, 1, 100, 1.0), ("forward", 1, 1, 300, 2.0)])
    sec = round_parts.seconds_of(t, "forward")
    assert sec(1, 1, 200) == pytest.approx(1.5) and sec(1, 1, 100) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="no forward step at q=2, B=1"):
        sec(2, 1, 200)


def test_the_drafters_steps_are_priced_as_the_engine_runs_them():
    rows = [("forward", q, 1, L, 1.0 + 0.1 * q) for q in range(1, 4) for L in (10, 20)]
    rows += [("mtp", q, 1, L, 0.01 * q + 0.001 * L) for q in (1, 3) for L in (10, 20)]
    rows += [("draft_model", q, 1, L, 0.5 * q) for q in (1, 2) for L in (10, 20)]
    t = _table(rows)
    mtp = round_parts.step_costs(t, "mtp")
    # round of k=2 at L=15: verify T(3), MTP catch-up over 3 positions, then one chained step at L+1
    assert round_time(2, 1, 15, mtp) == pytest.approx(1.3 + (0.03 + 0.015) + (0.01 + 0.016))
    dm = round_parts.step_costs(t, "draft_model")
    assert round_time(2, 1, 15, dm) == pytest.approx(1.3 + 1.0 + 0.5)  # two-token catch-up, then one step
    assert round_time(2, 1, 15, round_parts.step_costs(t, "ngram")) == pytest.approx(1.3)


def test_measure_times_every_part_of_a_real_model_in_turns():
    cfg = get_preset("tiny")
    torch.manual_seed(0)
    target = Transformer(cfg, max_batch=2, max_context=64).eval()
    table = round_parts.measure(target, target, ks=(1, 2), Bs=(1, 2), Ls=(8, 32), timer=QUICK, rounds=2)
    kinds = {k: sorted(set(g["q"])) for k, g in table.groupby("kind")}
    assert kinds == {"forward": [1, 2, 3], "mtp": [1, 2, 3], "draft_model": [1, 2]}  # tiny has an MTP module
    assert (table["n"] == 2 * QUICK.min_reps).all() and (table["median_s"] > 0).all()
    with pytest.raises(ConfigError, match="exceed the cache"):
        round_parts.measure(target, None, ks=(4,), Bs=(1,), Ls=(62,), timer=QUICK, rounds=1)


@pytest.mark.parametrize("field, value, message", [("parts_rounds", 0, "parts_rounds=0"),
                                                    ("threads", 10**4, "threads=10000: allowed 0")])
def test_the_validations_timing_keys_are_checked_by_name(field, value, message):
    from roofline.spec.real_validation import RealValidationRequest
    with pytest.raises(ConfigError, match=message):
        RealValidationRequest(checkpoint="t", draft_checkpoint="d", prompts_a="a", prompts_b="b", **{field: value})
