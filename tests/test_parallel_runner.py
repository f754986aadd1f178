"""The sweep across 2 gloo ranks: rows with rank 0's share and the layout; resume; bad specs."""

import pytest

from roofline.io.results import load_run
from roofline.measure.sweep import SweepRequest, run_sweep
from roofline.parallel.runner import run_parallel_sweep
from roofline.measure.timer import TimerSettings
from roofline.io.fields import ConfigError
from roofline.model.presets import get_preset, scaled_down
from roofline.parallel.cost import parse_collectives, rank_forward_cost
from roofline.parallel.layout import Layout

FAST = TimerSettings(warmup=1, min_reps=3, max_reps=3, budget_s=0.1)


@pytest.mark.slow
def test_tp2_ep2_sweep_writes_per_rank_rows_and_resumes(tmp_path):
    cfg = scaled_down(get_preset("mixtral-8x7b"))
    req = SweepRequest(model=cfg, q=(1, 3), B=(2,), L=(8,), parallel=Layout(tp=2, ep=2), timer=FAST)
    first = run_parallel_sweep(req, tmp_path, progress=False)
    assert (first["ok"], first["failed"]) == (2, 0)
    df = load_run(tmp_path).sort_values("q")
    assert set(df["tp"]) == {2} and set(df["ep"]) == {2}
    r = df.iloc[1]
    want = rank_forward_cost(cfg, Layout(tp=2, ep=2), "bfloat16", 2, 3, 8, touched=r["experts_touched"])
    assert r["weight_bytes"] == pytest.approx(want.weight_bytes)
    kinds = {c.kind for c in parse_collectives(r["collectives"])}
    assert kinds == {"all_reduce", "all_gather", "broadcast"}
    # every rank's experts are gathered; the priced count (each layer's busiest rank) is at least
    # every rank's own mean and at most the experts one rank holds
    for _, row in df.iterrows():
        ranks = [float(x) for x in row["experts_touched_ranks"].split(";")]
        assert len(ranks) == 2 and all(0 <= x <= cfg.experts // 2 for x in ranks)
        assert max(ranks) - 0.01 <= row["experts_touched"] <= cfg.experts // 2
    again = run_parallel_sweep(req, tmp_path, progress=False)
    assert (again["measured_now"], again["resumed"]) == (0, 2)


@pytest.mark.parametrize("kw, field", [(dict(modes=("graph",), device="cuda"), "modes"), (dict(layers=1), "layers"),
                                       (dict(B=(3,), parallel=Layout(tp=2, ep=2, dp_attention=True)), "B=")])
def test_distributed_sweep_rejects_what_it_cannot_run(kw, field):
    cfg = scaled_down(get_preset("mixtral-8x7b"), layers=2)
    base = dict(model=cfg, q=(1,), B=(2,), L=(8,), parallel=Layout(tp=2, ep=2))
    with pytest.raises(ConfigError, match=field):
        SweepRequest(**{**base, **kw})


def test_layout_is_part_of_the_fingerprint():
    cfg = get_preset("tiny")
    one = SweepRequest(model=cfg, q=(1,), B=(1,), L=(8,))
    assert one.identity()["parallel"] == dict(tp=1, ep=1, pp=1, dp_attention=False)
    assert one.fingerprint() != SweepRequest(model=cfg, q=(1,), B=(1,), L=(8,), parallel=Layout(tp=2)).fingerprint()
