"""Held-out layout validation on synthetic runs whose times follow a known cost model."""

import json

import numpy as np
import pytest

from roofline.io.fields import ConfigError
from roofline.model.presets import get_preset
from roofline.parallel.collectives import SCHEMA, seconds
from roofline.parallel.cost import parse_collectives, rank_forward_cost, rank_mtp_cost
from roofline.parallel.layout import Layout
from roofline.commands.layout_validation import held_out
from tests.helpers import write_run

COMM = dict(all_reduce=dict(latency_us=50.0, algbw_GBps=2.0), all_gather=dict(latency_us=60.0, algbw_GBps=2.0),
            broadcast=dict(latency_us=40.0, algbw_GBps=5.0))
T0, BW, PER_BLOCK = 2e-4, 10e9, 3e-4


def _run(path, cfg, layout, fingerprint, rng):
    rows = []
    for kind, fn in (("forward", rank_forward_cost), ("mtp", rank_mtp_cost)):
        for q in (1, 2, 4):
            for B in (1, 4):
                c = fn(cfg, layout, "bfloat16", B, q, 64)
                row = c.as_row()
                t = T0 + (c.bytes_total / BW) + c.blocks * PER_BLOCK + seconds(parse_collectives(row["collectives"]), COMM)
                row.update(kind=kind, status="ok", layers_run=cfg.layers, layers_full=cfg.layers, tp=layout.tp,
                           ep=layout.ep, fingerprint=fingerprint, t_median_s=t * (1 + 0.002 * rng.standard_normal()))
                rows.append(row)
    return write_run(path, rows, jsonl=False)


@pytest.fixture()
def runs(tmp_path):
    rng = np.random.default_rng(0)
    base = get_preset("cpu-demo")
    train = [_run(tmp_path / f"tp1-l{n}", base.scaled(layers=n), Layout(), f"a{n}", rng) for n in (2, 4, 8)]
    test = [_run(tmp_path / f"tp2-l{n}", base.scaled(layers=n), Layout(tp=2), f"b{n}", rng) for n in (4, 8)]
    coll = tmp_path / "collectives.json"
    coll.write_text(json.dumps(dict(schema=SCHEMA, fit=COMM)))
    return train, test, coll


def test_fit_on_one_rank_predicts_two_ranks(runs):
    train, test, coll = runs
    table, summary = held_out(train, test, coll)
    assert summary["n_test"] == len(table) == 24
    assert summary["median_abs_error_pct"] < 2.0
    assert summary["params"]["per_block_us"] == pytest.approx(PER_BLOCK * 1e6, rel=0.2)
    assert (table["comm_pred_s"] > 0).all()


def test_test_runs_must_be_unseen(runs):
    train, _, coll = runs
    with pytest.raises(ConfigError, match="share run fingerprints"):
        held_out(train, train[:1], coll)
