"""What-if step times from datasheet rows + priors, the anchors table, the card's smallest layout."""

import pytest
import yaml

from roofline.measure.devices import get_spec
from roofline.model.card import CardRequest, card_record
from roofline.model.presets import get_preset
from roofline.parallel import anchors
from roofline.parallel.cost import memory_per_rank, rank_forward_cost
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import SCENARIOS, Setting, WhatIf, capacity, load_priors, smallest_layout, step_seconds


def test_every_prior_is_a_sourced_triple():
    p = load_priors()
    triples = [p["efficiency"]["memory_bw"], p["efficiency"]["flops"], p["launch_floor_us_per_layer"]["eager"],
               p["launch_floor_us_per_layer"]["graph"], p["moe_floor_us_per_layer"], p["spec_round_overhead_us"]]
    for t in triples:
        assert len(t["values"]) == 3 and len(t["source"]) > 40
    for link in p["interconnects"].values():
        assert len(link["latency_us"]) == 3 and len(link["busbw_GBps"]) == 3 and len(link["source"]) > 40
        assert link["latency_us"][0] <= link["latency_us"][1] <= link["latency_us"][2]
        assert link["busbw_GBps"][0] >= link["busbw_GBps"][1] >= link["busbw_GBps"][2]


def test_step_time_interval_is_ordered_and_has_every_term():
    cfg = get_preset("llama-3.1-70b")
    w = WhatIf(cfg, get_spec("h100_sxm"), "bfloat16", Layout(tp=4))
    itl = w.itl(8, 2048)
    assert itl["optimistic"] < itl["typical"] < itl["pessimistic"]
    c = rank_forward_cost(cfg, Layout(tp=4), "bfloat16", 8, 1, 2048)
    terms = step_seconds(c, get_spec("h100_sxm"), "bfloat16", Layout(tp=4), Setting(), 1)["terms"]
    assert all(v > 0 for k, v in terms.items() if k != "attention") and terms["comm"] > 0


def test_eager_pays_more_per_layer_than_graphs():
    cfg = get_preset("llama-3.1-8b")
    g = WhatIf(cfg, get_spec("h100_sxm"), "bfloat16", Layout(tp=2), Setting(graphs=True)).target(1, 1, 100, 1)
    e = WhatIf(cfg, get_spec("h100_sxm"), "bfloat16", Layout(tp=2), Setting(graphs=False)).target(1, 1, 100, 1)
    assert e > g


def test_one_layer_mtp_draft_pays_one_layer_floor_not_the_models():
    cfg = get_preset("deepseek-v3")
    w = WhatIf(cfg, get_spec("h200_sxm"), "bfloat16", Layout(tp=8))
    assert w.mtp(1, 1, 100, 1) < w.target(1, 1, 100, 1) / 10


def test_dsv3_mtp_speedup_falls_from_batch_1_to_32():
    t = anchors.trend("sglang-dsv3-mtp-b1", (1, 32))
    assert (t.loc[t["B"] == 1, "typical"].iloc[0] > t.loc[t["B"] == 32, "typical"].iloc[0])


def test_anchors_have_sources_and_predictions():
    t = anchors.table()
    assert len(t) >= 8 and t["source"].str.startswith("http").all()
    assert (t["low"] <= t["predicted"]).all() and (t["predicted"] <= t["high"]).all()
    assert set(t["metric"]) == {"tok_s_per_user", "spec_speedup"}


def test_anchor_with_unknown_model_is_rejected(tmp_path):
    doc = yaml.safe_load(anchors.ANCHORS_PATH.read_text())
    doc["anchors"][0]["model"] = "nope"
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="model='nope'"):
        anchors.load(tmp_path / "a.yaml")


def test_smallest_layout_fits_and_one_fewer_device_does_not():
    cfg, dev = get_preset("llama-3.1-70b"), get_spec("h100_sxm")
    lay = smallest_layout(cfg, dev, "bfloat16", 16, 4096)
    assert lay is not None and lay.devices > 1
    assert sum(memory_per_rank(cfg, lay, "bfloat16", 16, 4096)) <= 0.9 * dev.mem_bytes
    smaller = Layout(tp=lay.tp // 2)
    assert sum(memory_per_rank(cfg, smaller, "bfloat16", 16, 4096)) > 0.9 * dev.mem_bytes


def test_card_shows_per_gpu_memory_and_smallest_layout():
    rec = card_record(CardRequest(model=get_preset("llama-3.1-70b"), device=get_spec("h100_sxm"), batch=1, context=0))
    assert rec["smallest_layout"] == "tp2" and rec["per_gpu_weights_GB"] < 0.9 * rec["device_mem_GB"]


def test_capacity_prices_a_million_tokens_and_plans_speculation():
    rows = capacity(get_preset("llama-3.1-70b"), get_spec("h100_sxm"), "bfloat16", 1024, 256, 50.0, 5000.0,
                    price_per_device_hour=2.0)
    assert rows and all(r["itl_ms"] <= 50.0 for r in rows)
    r = rows[0]
    assert r["usd_per_million_tokens"] == pytest.approx(2.0 * r["devices_per_replica"] / (r["tok_s_per_replica"] * 3600) * 1e6)
    spec = capacity(get_preset("deepseek-v3"), get_spec("h200_sxm"), "bfloat16", 1024, 256, 200.0, 1000.0, alpha=0.85)
    assert {r["speculative"] for r in spec} == {False, True}
    assert set(SCENARIOS) == {"optimistic", "typical", "pessimistic"}


def test_speedup_table_gives_intervals_and_k0_is_plain_decode():
    from roofline.parallel.whatif import speedup_table
    rows = speedup_table(get_preset("deepseek-v3"), get_spec("h200_sxm"), "bfloat16", Layout(tp=8), [0.8], [0, 1],
                         [1], [512])
    assert rows[0]["S"] == 1.0 and rows[1]["S_low"] <= rows[1]["S"] <= rows[1]["S_high"]
    with pytest.raises(ValueError, match="no MTP module"):
        speedup_table(get_preset("llama-3.1-8b"), get_spec("h200_sxm"), "bfloat16", Layout(tp=2), [0.8], [1], [1], [8])


@pytest.mark.slow
def test_anchors_entry_point_prints_table_and_median_error():
    import json
    import subprocess
    import sys
    from pathlib import Path
    r = subprocess.run([sys.executable, "-m", "experiments.anchors"], cwd=Path(__file__).parents[1],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["anchors"] >= 8 and summary["median_abs_error_pct"] >= 0
