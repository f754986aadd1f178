"""The validation experiment runs end to end and its prediction follows docs/design.md §2."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from roofline.io.fields import ConfigError
from roofline.model.presets import REPO_ROOT, get_preset
from roofline.spec.validation import SpecValidationRequest, predicted_speedup


def test_prediction_is_tau_times_plain_step_over_round_time(monkeypatch):
    import types

    import roofline.analysis.predict as pr
    from roofline.model.speculation import StepCosts, no_cost
    T = {1: 10.0, 3: 12.0}

    def fake_costs(fit, dtype, drafter, target):
        draft = (lambda i, k, B, L: 2.0 if i == 1 else 1.0) if drafter.kind == "mtp" else no_cost
        return types.SimpleNamespace(steps=StepCosts(target=lambda q, B, L: T[q], draft=draft, overhead=no_cost))

    monkeypatch.setattr(pr, "step_costs", fake_costs)
    req = SpecValidationRequest(model=get_preset("tiny"))
    p = predicted_speedup({}, req, k=2, B=1, tau=2.5, o_plain=1.0, o_spec=3.0)
    # R = (T(3) + o_plain) + T_mtp(3) + (k-1) T_mtp(1) + (o_spec - o_plain) = 13 + 2 + 1 + 2
    assert p["R_pred_s"] == 18.0
    assert p["S_pred"] == pytest.approx(2.5 * (10 + 1) / 18)
    assert predicted_speedup({}, req, 2, 1, 2.5, 1.0, 3.0, drafter="ngram")["R_pred_s"] == 15.0


def test_a_preset_without_mtp_is_refused():
    with pytest.raises(ConfigError, match="mtp_layers"):
        SpecValidationRequest(model=get_preset("llama-3.1-8b"))


@pytest.mark.slow
def test_entry_point_runs_on_tiny(tmp_path):
    cmd = [sys.executable, "-m", "roofline.cli.specdec", "model=tiny", "alphas=[0.8]", "ks=[2]", "Bs=[2]", "reps=1",
           "max_new=10", "prompt_len=6", "real_drafters=[ngram]", "timer.min_reps=3", "timer.budget_s=0.05",
           f"out_dir={tmp_path}"]
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    t = pd.read_csv(tmp_path / "specdec.csv")
    assert summary["points"] == len(t) == 2
    assert {"S_meas", "S_pred", "tau_meas", "err", "S_pred_tau", "S_pred_profile", "alpha_max_z"} <= set(t.columns)
    oracle = t[t["drafter"].str.startswith("oracle")].iloc[0]
    # S from the requested alpha: its tau(0.8, 2) = 2.44 enters the prediction, not the measured tau
    assert oracle["S_pred"] == pytest.approx(oracle["S_pred_tau"] * 2.44 / oracle["tau_meas"], rel=1e-9)
    assert (tmp_path / "report_specdec.md").exists() and (tmp_path / "figures" / "specdec_pred_vs_meas.png").exists()


def test_each_rep_of_the_oracle_draws_its_own_coin_flips():
    """Reps pooled by acceptance_check must be independent samples of α: the same seed replayed
    per rep would repeat the same hits and overstate the z-score by sqrt(reps)."""
    import torch
    from roofline.model.decoder import build_model
    from roofline.model.presets import get_preset
    from roofline.spec.engine import DecodeSettings, SpecEngine
    from roofline.spec.validation import oracle_factory
    cfg = get_preset("tiny")
    target = build_model(cfg, max_batch=1, max_context=64, dtype=torch.float32, device="cpu", seed=0)
    make = oracle_factory(target, 0.5, cfg.vocab, seed=3)

    def hits(rep):
        _, m = SpecEngine(target, make(rep)).generate([[1, 2, 3]], DecodeSettings(max_new=24, k=2))
        return m.counters.accepted_per_pos, m.counters.drafts
    assert hits(0) == hits(0)  # a rep is reproducible
    assert len({hits(rep) for rep in range(4)}) > 1  # and the reps are not one sample replayed


@pytest.mark.parametrize("kw, says", [
    (dict(ks=()), r"^ks=\[\]: the grid has no points"),          # was "min() arg is an empty sequence"
    (dict(ks=(1.5,)), r"^ks=\[1\.5\]: allowed integers"),       # was a TypeError traceback
    (dict(ks=(True,)), r"^ks=\[True\]: allowed integers"),
    (dict(Bs=(0,)), r"^Bs=\[0\]: allowed integers"),
    (dict(reps=0), r"^reps=0: allowed integers >= 1"),
    (dict(alphas=("x",)), r"^alphas=\['x'\]: allowed values in \[0, 1\]"),
])
def test_L4_a_bad_specdec_grid_is_one_line_naming_the_field(kw, says):
    with pytest.raises(ConfigError, match=says):
        SpecValidationRequest(model=get_preset("tiny"), **kw)
