"""Reading spec-decode acceptance out of a vLLM /metrics dump."""

from __future__ import annotations


import pytest

from roofline.model.speculation import tau
from roofline.spec.counters import AcceptanceCounters
from roofline.spec.vllm_metrics import (
    SpecDecodeMetricsError,
    diff,
    parse_spec_decode,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _dump(e0: tuple[int, int, int, tuple[int, int, int]],
          e1: tuple[int, int, int, tuple[int, int, int]]) -> str:
    """A vLLM v1 /metrics page, data-parallel over two engines, EAGLE with k = 3.

    Each engine tuple: (drafts, draft_tokens, accepted_tokens, accepted per position).
    """
    (d0, t0, a0, p0), (d1, t1, a1, p1) = e0, e1
    return f"""\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 7.0
vllm:num_requests_running{{engine="1",model_name="{MODEL}"}} 5.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",cache_dtype="auto",note="a \\"quoted\\" }}, brace"}} 1.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} 48211.0
vllm:generation_tokens_created{{engine="0",model_name="{MODEL}"}} 1.7573e+09
vllm:generation_tokens_total{{engine="1",model_name="{MODEL}"}} 30102.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.04",model_name="{MODEL}"}} 310.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 400.0
vllm:time_to_first_token_seconds_count{{engine="0",model_name="{MODEL}"}} 400.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="{MODEL}"}} 21.7
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="{MODEL}"}} {d0}.0
vllm:spec_decode_num_drafts_created{{engine="0",model_name="{MODEL}"}} 1.7573021e+09
vllm:spec_decode_num_drafts_total{{engine="1",model_name="{MODEL}"}} {d1}.0
vllm:spec_decode_num_drafts_created{{engine="1",model_name="{MODEL}"}} 1.7573022e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="{MODEL}"}} {t0}.0
vllm:spec_decode_num_draft_tokens_created{{engine="0",model_name="{MODEL}"}} 1.7573021e+09
vllm:spec_decode_num_draft_tokens_total{{engine="1",model_name="{MODEL}"}} {t1}.0
vllm:spec_decode_num_draft_tokens_created{{engine="1",model_name="{MODEL}"}} 1.7573022e+09
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{MODEL}"}} {a0}.0
vllm:spec_decode_num_accepted_tokens_created{{engine="0",model_name="{MODEL}"}} 1.7573021e+09
vllm:spec_decode_num_accepted_tokens_total{{engine="1",model_name="{MODEL}"}} {a1}.0
vllm:spec_decode_num_accepted_tokens_created{{engine="1",model_name="{MODEL}"}} 1.7573022e+09
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="0"}} {p0[0]}.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="1"}} {p0[1]}.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="{MODEL}",position="2"}} {p0[2]}.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{{engine="0",model_name="{MODEL}",position="0"}} 1.7573021e+09
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",model_name="{MODEL}",position="0"}} {p1[0]}.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",model_name="{MODEL}",position="1"}} {p1[1]}.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",model_name="{MODEL}",position="2"}} {p1[2]}.0 1757302200000
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0",model_name="{MODEL}"}} 0.0
"""


# Engine 0: 1000 rounds of 3 drafts, 1950 accepted = 850 + 640 + 460 by position.
# Engine 1:  600 rounds of 3 drafts, 1110 accepted = 500 + 360 + 250.
AFTER = _dump((1000, 3000, 1950, (850, 640, 460)), (600, 1800, 1110, (500, 360, 250)))
# Before the benchmark: 300 rounds in all, 575 accepted = (170+84) + (128+60) + (92+41).
BEFORE = _dump((200, 600, 390, (170, 128, 92)), (100, 300, 185, (84, 60, 41)))


def test_counters_are_summed_over_engines_ignoring_created_and_unrelated_series():
    c = parse_spec_decode(AFTER)
    assert c == AcceptanceCounters(drafts=1600, draft_tokens=4800, accepted_tokens=3060,
                                   accepted_per_pos=(1350, 1000, 710))
    assert c.num_positions == 3


def test_acceptance_rate_is_accepted_over_drafted_tokens():
    assert parse_spec_decode(AFTER).acceptance_rate() == pytest.approx(3060 / 4800, rel=1e-15)
    assert parse_spec_decode(AFTER).acceptance_rate() == pytest.approx(0.6375, rel=1e-15)


def test_mean_acceptance_length_counts_the_bonus_token():
    # vLLM: 1 + accepted / drafts = 1 + 3060 / 1600
    assert parse_spec_decode(AFTER).mean_acceptance_length() == pytest.approx(2.9125, rel=1e-15)


def test_per_position_rate_is_unconditional():
    assert parse_spec_decode(AFTER).per_position_rate() == pytest.approx(
        (1350 / 1600, 1000 / 1600, 710 / 1600), rel=1e-15)
    assert parse_spec_decode(AFTER).per_position_rate() == pytest.approx(
        (0.84375, 0.625, 0.44375), rel=1e-15)


def test_per_position_alpha_is_conditional_on_the_previous_position():
    assert parse_spec_decode(AFTER).per_position_alpha() == pytest.approx(
        (0.84375, 1000 / 1350, 0.71), rel=1e-15)


def test_measured_acceptance_length_is_tau_of_the_conditional_profile():
    c = parse_spec_decode(AFTER)
    assert c.mean_acceptance_length() == pytest.approx(tau(c.per_position_alpha()), rel=1e-12)


def test_diff_measures_only_the_benchmark_window():
    d = diff(BEFORE, AFTER)
    assert d == AcceptanceCounters(drafts=1300, draft_tokens=3900, accepted_tokens=2485,
                                   accepted_per_pos=(1096, 812, 577))
    assert d.mean_acceptance_length() == pytest.approx(1 + 2485 / 1300, rel=1e-15)


def test_diff_accepts_parsed_counters():
    assert diff(parse_spec_decode(BEFORE), parse_spec_decode(AFTER)) == diff(BEFORE, AFTER)


def test_diff_refuses_counters_that_went_backwards():
    with pytest.raises(SpecDecodeMetricsError, match="backwards"):
        diff(AFTER, BEFORE)


def test_diff_refuses_a_different_number_of_positions():
    k2 = AcceptanceCounters(drafts=2000, draft_tokens=4000, accepted_tokens=2000,
                            accepted_per_pos=(1200, 800))
    with pytest.raises(SpecDecodeMetricsError, match="positions"):
        diff(AFTER, k2)


def test_names_without_total_suffix_are_read():
    text = "\n".join([
        'vllm:spec_decode_num_drafts{model_name="m"} 10',
        'vllm:spec_decode_num_draft_tokens{model_name="m"} 20',
        'vllm:spec_decode_num_accepted_tokens{model_name="m"} 12',
        'vllm:spec_decode_num_accepted_tokens_per_pos{model_name="m",position="0"} 8',
        'vllm:spec_decode_num_accepted_tokens_per_pos{model_name="m",position="1"} 4',
    ])
    assert parse_spec_decode(text) == AcceptanceCounters(10, 20, 12, (8, 4))


def test_a_series_given_with_and_without_suffix_is_not_counted_twice():
    both = AFTER + 'vllm:spec_decode_num_drafts{engine="0",model_name="x"} 1600.0\n'
    assert parse_spec_decode(both).drafts == 1600


def test_model_name_filter_keeps_only_that_model():
    other = AFTER.replace(f'engine="1",model_name="{MODEL}"', 'engine="1",model_name="draft-b"')
    assert parse_spec_decode(other, model_name=MODEL) == AcceptanceCounters(
        1000, 3000, 1950, (850, 640, 460))
    assert parse_spec_decode(other, model_name="draft-b") == AcceptanceCounters(
        600, 1800, 1110, (500, 360, 250))
    assert parse_spec_decode(other).drafts == 1600


def test_unknown_model_name_is_an_error_listing_the_models():
    with pytest.raises(SpecDecodeMetricsError, match="Llama-3.1-8B"):
        parse_spec_decode(AFTER, model_name="nope")


def test_a_dump_without_spec_decode_counters_raises_a_clear_error():
    plain = "\n".join(line for line in AFTER.splitlines() if "spec_decode" not in line)
    with pytest.raises(SpecDecodeMetricsError, match="speculative decoding"):
        parse_spec_decode(plain)


def test_a_dump_missing_one_counter_names_it():
    partial = "\n".join(line for line in AFTER.splitlines()
                        if "num_draft_tokens" not in line)
    with pytest.raises(SpecDecodeMetricsError, match="num_draft_tokens"):
        parse_spec_decode(partial)


def test_a_gap_in_positions_is_an_error():
    gap = AFTER.replace('position="1"', 'position="5"')
    with pytest.raises(SpecDecodeMetricsError, match="positions"):
        parse_spec_decode(gap)


def test_a_malformed_line_names_its_line_number():
    with pytest.raises(SpecDecodeMetricsError, match="line 2"):
        parse_spec_decode('# ok\nvllm:spec_decode_num_drafts_total{engine="0" 5\n')


@pytest.mark.parametrize("engine, says", [
    ((300, 300, 3000, (300, 300, 300)), "more tokens accepted than drafted"),  # N13's accepted 3000 > drafted 300
    ((100, 300, 250, (90, 80, 60)), "sums to 230"),                              # per-position sum != total
    ((100, 300, 200, (60, 80, 60)), "position=1}=80 > position 0's 60"),        # grows with the position
    ((100, 400, 200, (90, 70, 40)), "more draft tokens than rounds of k"),       # 400 > 100 x 3
    ((50, 150, 150, (60, 50, 40)), "more first drafts accepted than drafted"),   # position 0 above drafts
    ((int(1e300), 300, 200, (90, 70, 40)), "above 2**53"),                       # no server drafted 1e300 times
])
def test_counters_no_server_can_produce_are_refused_naming_the_counter(engine, says):
    with pytest.raises(SpecDecodeMetricsError, match=r"vllm:spec_decode|2\*\*53") as e:
        parse_spec_decode(_dump(engine, (0, 0, 0, (0, 0, 0))))
    assert says in str(e.value)


def test_a_diff_that_no_server_can_produce_is_refused():
    later = _dump((1000, 3000, 1950, (850, 640, 460)), (600, 1800, 1110, (500, 360, 250)))
    earlier = _dump((200, 600, 390, (170, 128, 92)), (100, 300, 185, (84, 60, 41)))
    assert diff(earlier, later).accepted_tokens == 1950 + 1110 - 390 - 185
    swapped_positions = parse_spec_decode(earlier)
    odd = AcceptanceCounters(swapped_positions.drafts, swapped_positions.draft_tokens,
                             swapped_positions.accepted_tokens, (0, 0, 0))
    with pytest.raises(SpecDecodeMetricsError, match="sums to"):
        diff(odd, later)
