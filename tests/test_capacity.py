"""Capacity arithmetic on hand-checked cases (the entry point: tests/test_cli.py)."""

import pytest

from roofline.analysis import capacity
from roofline.measure import memory
from roofline.model.presets import get_preset
from roofline.measure.devices import get_spec


def test_max_batch_by_memory_hand_checked(monkeypatch):
    # weights 16 GB, KV 128 kB/token, 80 GB device, 2048 tokens per sequence:
    # (80e9 - 16e9) / (128e3 * 2048) = 244.1 -> 244 sequences
    monkeypatch.setattr(memory, "resident_bytes",
                        lambda cfg, dtype, b, tps, mtp: memory.Resident(16e9, 128e3 * tps * b))
    assert memory.max_batch(None, "bfloat16", 80e9, 2048, False) == 244


def test_itl_target_bounds_the_batch_on_a_datasheet_what_if():
    cfg = get_preset("llama-3.1-8b")
    fit = capacity.datasheet_fit(get_spec("h200_sxm"), cfg, "bfloat16", bw_eff=1.0, f_eff=1.0, t0_s=0.0)
    work = capacity.Workload(context=1024, output=256, itl_target_ms=4.0, target_tok_s=1000.0)
    table, summary = capacity.plan(fit, cfg, "bfloat16", work, 141e9, [1, 8, 64, 256], None, extrapolated=True)
    # B=1 decode reads 16.06 GB of weights less the 1.05 GB embedding table (gathered, not read),
    # plus 1152 cached tokens x 128 KiB of KV, at 4.8 TB/s: 3.16 ms, under 4 ms
    expect_s = (16.06e9 - 128256 * 4096 * 2 + 1152 * 131072) / 4.8e12
    assert table.loc[table["B"] == 1, "itl_ms"].iloc[0] == pytest.approx(expect_s * 1e3, rel=0.01)
    assert summary["plain"]["max_batch_meeting_itl_in_grid"] == 8 and summary["extrapolated"]
    assert summary["plain"]["devices_for_target"] == 1


def test_model_that_does_not_fit_one_device_says_so():
    cfg = get_preset("deepseek-v3")
    fit = capacity.datasheet_fit(get_spec("h200_sxm"), cfg, "bfloat16")
    _, summary = capacity.plan(fit, cfg, "bfloat16", capacity.Workload(), 141e9, [1], None, extrapolated=True)
    assert summary["fits_one_device"] is False and "tensor parallelism is not modelled" in summary["note"]
