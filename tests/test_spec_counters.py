"""Acceptance counters: one definition, the same answers from the engine and a vLLM dump."""

import math

import pytest

from roofline.model.decoder import build_model
from roofline.model.presets import get_preset
from roofline.spec.counters import AcceptanceCounters
from roofline.spec.drafters import MTPDrafter
from roofline.spec.engine import DecodeSettings, SpecEngine
from roofline.spec.vllm_metrics import parse_spec_decode

IDLE_DUMP = "\n".join([
    'vllm:spec_decode_num_drafts_total{model_name="m"} 0',
    'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 0',
    'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 0',
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 0',
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 0',
])


def _engine_with_no_rounds() -> AcceptanceCounters:
    """max_new=1: prefill emits the only token, so no round drafts anything."""
    cfg = get_preset("tiny")
    t = build_model(cfg, max_batch=2, max_context=32, seed=0)
    _, m = SpecEngine(t, MTPDrafter(t)).generate([[1, 2, 3], [4, 5]], DecodeSettings(max_new=1, k=2))
    return m.counters


@pytest.mark.parametrize("source", ["constructed", "vllm_dump", "engine"])
def test_zero_drafts_give_nan_rates_everywhere(source):
    c = {"constructed": lambda: AcceptanceCounters(accepted_per_pos=(0, 0)),
         "vllm_dump": lambda: parse_spec_decode(IDLE_DUMP),
         "engine": _engine_with_no_rounds}[source]()
    assert c == AcceptanceCounters(0, 0, 0, (0, 0))
    assert math.isnan(c.acceptance_rate())  # vLLM: NaN draft acceptance rate without draft tokens
    assert math.isnan(c.mean_acceptance_length())
    assert all(math.isnan(a) for a in c.per_position_alpha())
    assert all(math.isnan(r) for r in c.per_position_rate())


def test_hand_counted_rates():
    # 10 sequence-rounds of k=3: 30 drafted, position 0 accepted 8 times, 1: 4, 2: 1 -> 13 accepted
    c = AcceptanceCounters(drafts=10, draft_tokens=30, accepted_tokens=13, accepted_per_pos=(8, 4, 1))
    assert c.acceptance_rate() == pytest.approx(13 / 30, rel=1e-15)
    assert c.mean_acceptance_length() == pytest.approx(2.3, rel=1e-15)
    assert c.per_position_alpha() == pytest.approx((0.8, 0.5, 0.25), rel=1e-15)
    assert c.per_position_rate() == pytest.approx((0.8, 0.4, 0.1), rel=1e-15)


def test_counters_add_position_by_position():
    a = AcceptanceCounters(4, 8, 5, (3, 2))
    b = AcceptanceCounters(2, 6, 1, (1, 0, 0))
    assert a + b == AcceptanceCounters(6, 14, 6, (4, 2, 0))
    assert (a + b).vllm_names() == dict(num_drafts=6, num_draft_tokens=14, num_accepted_tokens=6,
                                        num_accepted_tokens_per_pos=[4, 2, 0])


def test_per_position_methods_need_per_position_counters():
    with pytest.raises(ValueError, match="per_pos"):
        AcceptanceCounters(10, 30, 12, ()).per_position_alpha()
