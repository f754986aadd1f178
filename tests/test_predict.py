"""Speculative predictions glue fitted step times to roofline.model.speculation, labelled by source."""

import dataclasses
import pytest

from roofline.analysis import costmodel
from roofline.model import speculation
from roofline.analysis.predict import DraftCost, step_costs, table
from roofline.model.presets import get_preset

T0 = 1e-3


def hand_fit(bw: float = 20e9, f: float = 0.5e12, knee: float = 8.0) -> dict:
    """A fit.json document for the tiny preset with known device parameters."""
    group = lambda kind: dict(key=dict(device_name="synthetic", model="tiny", dtype="bfloat16", mode="eager",  # noqa: E731
                                       kind=kind), coefs=[T0, 1 / bw, 1 / bw, 1 / f, 1 / f], knee_tokens=knee,
                              band=dict(p10=0.95, p90=1.05), domain=dict(q=[1, 32], B=[1, 4], L=[16, 64]))
    return dict(schema=costmodel.FIT_SCHEMA, provenance=dict(device_name="synthetic"),
                model_spec=dataclasses.asdict(get_preset("tiny")), groups=[group("forward"), group("mtp")])


def test_step_costs_use_the_fitted_forward_and_mtp_steps():
    fit = hand_fit()
    c = step_costs(fit, "bfloat16", DraftCost("mtp"))
    assert c.steps.target(3, 2, 16) == costmodel.predict(fit, "forward", "bfloat16", 3, 2, 16)
    # the first draft of a round of k=3 is the MTP catch-up over 4 positions, then single steps
    assert c.steps.draft(1, 3, 2, 16) == costmodel.predict(fit, "mtp", "bfloat16", 4, 2, 16)
    assert c.steps.draft(2, 3, 2, 16) == costmodel.predict(fit, "mtp", "bfloat16", 1, 2, 17)
    assert c.steps.overhead(4, 2) == pytest.approx(T0) and c.overhead_source == "fit_t0"
    assert c.source == "fit"


def test_ngram_drafter_costs_nothing_and_matches_speculative_arithmetic():
    fit = hand_fit()
    t = table(fit, [0.8], [0, 2], [1], [16], "bfloat16", DraftCost("ngram"))
    row = t[t["k"] == 2].iloc[0]
    c = step_costs(fit, "bfloat16", DraftCost("ngram"))
    expect = speculation.tau_iid(0.8, 2) * c.steps.target(1, 1, 16) / (c.steps.target(3, 1, 16) + T0)
    assert row["S"] == pytest.approx(expect, rel=1e-12)
    assert not row["extrapolated"]


def test_unmeasured_preset_is_a_labelled_device_fit_transfer():
    t = table(hand_fit(), [0.6, 0.9], [0, 1, 2], [1, 64], [1024], "bfloat16", DraftCost("mtp"),
              target=get_preset("deepseek-v3"))
    assert set(t["source"]) == {"device-fit-transfer"} and t["extrapolated"].all()
    best = t[(t["k"] == t["k_star"]) & (t["alpha"] == 0.9) & (t["B"] == 1)].iloc[0]
    assert best["k_star"] >= 1 and best["S"] > 1.0  # weight-bound at B=1: verification is nearly free


def test_speculation_loses_when_the_pass_is_compute_bound():
    fit = hand_fit(bw=1e15, f=1e9, knee=0)  # every token costs its FLOPs: T(k+1) = (k+1) T(1)
    t = table(fit, [0.7], [0, 1, 2, 4], [4], [16], "bfloat16", DraftCost("ngram"))
    assert (t["k_star"] == 0).all()
