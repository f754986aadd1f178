"""Capacity arithmetic on hand-checked cases (the entry point: tests/test_cli.py)."""

import pytest

from roofline.analysis import capacity
from roofline.measure import memory
from roofline.model.presets import get_preset
from roofline.measure.devices import get_datasheet


def test_max_batch_by_memory_hand_checked(monkeypatch):
    # weights 16 GB, KV 128 kB/token, 80 GB device, 2048 tokens per sequence:
    # (80e9 - 16e9) / (128e3 * 2048) = 244.1 -> 244 sequences
    monkeypatch.setattr(memory, "resident_bytes",
                        lambda cfg, dtype, b, tps, mtp: memory.Resident(16e9, 128e3 * tps * b))
    assert memory.max_batch(None, "bfloat16", 80e9, 2048, False) == 244


def test_itl_target_bounds_the_batch_on_a_datasheet_what_if(whatif_fixture_data):
    req = capacity.CapacityRequest(model=get_preset("llama-3.1-8b"), device="h200_sxm", engine="vllm",
                                   work=capacity.Workload(1024, 256, 12.0, 1000.0), B=(1, 8, 64, 256))
    table, summary = capacity.plan_whatif(req)
    assert (table["itl_ms"].diff().dropna() > 0).all()  # ITL grows with the batch
    best = summary["plain"]["best_batch"]
    assert best == int(table[table["itl_ms"] <= 12.0]["B"].max()) and summary["extrapolated"]
    assert (table["itl_ms_optimistic"] <= table["itl_ms"]).all() and (table["itl_ms"] <= table["itl_ms_pessimistic"]).all()


def test_model_that_does_not_fit_one_device_says_so(whatif_fixture_data):
    req = capacity.CapacityRequest(model=get_preset("deepseek-v3"), device="h200_sxm", B=(1,))
    _, summary = capacity.plan_whatif(req)
    assert summary["fits_device"] is False and "does not fit" in summary["note"]
