"""A finite run whose requests arrive at a rate (`vllm bench serve --request-rate`), priced by
`whatif.serve_at_rate` on `serve`'s staggered steady state: in flight by Little's law, queued past the engine's cap
or the client's, the run's duration from its last request."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from roofline.io.fields import ConfigError
from roofline.measure.devices import get_datasheet
from roofline.model.presets import get_preset
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import (SUSTAINED_REQUESTS_PER_SLOT, Setting, WhatIf, _rate_queue, serve,
                                      serve_at_rate)

REPO_ROOT = Path(__file__).resolve().parent.parent
I, O, N = 1024, 256, 1000


@pytest.fixture(scope="module")
def w():
    return WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout(), Setting(engine="vllm"))


def steady(w, C):
    """serve's staggered steady state at C requests in flight, as serve_at_rate prices it."""
    return serve(w, I, O, C, SUSTAINED_REQUESTS_PER_SLOT * C, staggered=True)


def test_the_queue_admits_first_come_first_served_and_ends_with_the_last_request():
    # arrivals 0, 1, 2, 3 s into one slot of 2 s: starts 0, 2, 4, 6; waits 0, 1, 2, 3; the last done at 8
    assert _rate_queue(4, 1.0, 1, 2.0) == (1.5, 8.0)
    assert _rate_queue(5, 1.0, 4, 2.0) == (0.0, 6.0)  # slots enough: nobody waits, the run ends at 4 + 2
    assert _rate_queue(6, 1e9, 3, 2.0) == pytest.approx((1.0, 4.0))  # all at once: two rounds of three


def test_a_slow_stream_runs_one_request_at_a_time_and_the_arrivals_bound_the_throughput(w):
    r = serve_at_rate(w, I, O, 0.1, N)
    one = steady(w, 1)
    assert r["in_flight"]["typical"] == 1 and r["queue_wait_s"]["typical"] == 0
    for k in ("ttft_s", "itl_mean_s", "e2e_s"):
        assert r[k]["typical"] == pytest.approx(one[k]["typical"])
    assert r["output_tok_s"]["typical"] == pytest.approx(0.1 * O, rel=0.01)  # N O / ((N - 1) / rate + E2E)


@pytest.mark.parametrize("rate", [2.0, 8.0, 16.0])
def test_below_saturation_the_requests_in_flight_follow_littles_law(w, rate):
    """C is the smallest whole number of requests with rate x E2E(C) <= C: one fewer would not keep up."""
    r = serve_at_rate(w, I, O, rate, N)
    C = int(r["in_flight"]["typical"])
    assert r["queue_wait_s"]["typical"] == 0 and C > 1
    assert rate * steady(w, C)["e2e_s"]["typical"] <= C
    assert rate * steady(w, C - 1)["e2e_s"]["typical"] > C - 1
    assert r["itl_mean_s"]["typical"] == pytest.approx(steady(w, C)["itl_mean_s"]["typical"])
    # the run: the last request arrives at (N - 1) / rate and stays E2E(C)
    assert r["output_tok_s"]["typical"] == pytest.approx(N * O / ((N - 1) / rate + r["e2e_s"]["typical"]))


def test_past_the_engines_cap_the_requests_queue_and_their_ttft_holds_the_wait(w):
    cap = int(serve(w, I, O, N, N)["running"]["typical"])  # the engine's KV pool and sequence cap at these lengths
    r = serve_at_rate(w, I, O, 1e4, N)
    assert r["in_flight"]["typical"] == cap and r["queue_wait_s"]["typical"] > 1.0
    full = steady(w, cap)
    assert r["ttft_s"]["typical"] == pytest.approx(full["ttft_s"]["typical"] + r["queue_wait_s"]["typical"])
    assert r["e2e_s"]["typical"] == pytest.approx(full["e2e_s"]["typical"] + r["queue_wait_s"]["typical"])
    assert r["output_tok_s"]["typical"] < cap * O / full["e2e_s"]["typical"]  # the steady state's rate at most


def test_a_client_cap_holds_the_requests_in_the_client_outside_their_ttft(w):
    """bench serve --max-concurrency 16 --request-rate inf: a request's clock starts when the client sends it."""
    r = serve_at_rate(w, I, O, 1e4, N, max_concurrency=16)
    s = serve(w, I, O, 16, N, staggered=True)
    assert r["in_flight"]["typical"] == 16 and r["queue_wait_s"]["typical"] > 10
    assert r["ttft_s"]["typical"] == pytest.approx(steady(w, 16)["ttft_s"]["typical"])
    assert r["output_tok_s"]["typical"] == pytest.approx(s["output_tok_s"]["typical"], rel=0.02)


def test_more_arrivals_never_shorten_the_ttft_nor_lower_the_requests_in_flight(w):
    rows = [serve_at_rate(w, I, O, rate, N) for rate in (0.5, 2, 8, 16, 24, 64, 1e4)]
    for a, b in zip(rows, rows[1:]):
        assert b["ttft_s"]["typical"] >= a["ttft_s"]["typical"] - 1e-12
        assert b["in_flight"]["typical"] >= a["in_flight"]["typical"]


def test_no_engine_named_spans_the_profiles_each_at_its_own_cap():
    w = WhatIf(get_preset("llama-3.1-8b"), get_datasheet("h100_sxm"), "bfloat16", Layout())
    r = serve_at_rate(w, I, O, 4.0, N)
    assert r["output_tok_s"]["optimistic"] >= r["output_tok_s"]["typical"] >= r["output_tok_s"]["pessimistic"]
    assert r["ttft_s"]["optimistic"] <= r["ttft_s"]["typical"] <= r["ttft_s"]["pessimistic"]
    per_engine = {e: serve_at_rate(WhatIf(w.cfg, w.device, w.dtype, w.layout, Setting(engine=e)), I, O, 4.0, N)
                  for e in w.setting.engine_names()}
    assert r["ttft_s"]["pessimistic"] == max(v["ttft_s"]["pessimistic"] for v in per_engine.values())


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "2"])
def test_a_rate_that_is_not_a_positive_number_is_named(w, bad):
    with pytest.raises(ConfigError, match=r"request_rate="):
        serve_at_rate(w, I, O, bad, N)


def test_a_rate_through_an_offline_entry_point_is_refused(w):
    """vLLM's offline benchmark (the LLM class) takes every request at once: no rate to give it."""
    with pytest.raises(ConfigError, match=r"request_rate=4 with client='offline'"):
        serve_at_rate(w, I, O, 4, N, client="offline")


def test_the_card_prices_a_run_at_a_rate_and_names_a_bad_rate():
    cmd = [sys.executable, "-m", "roofline.cli.card", "model=llama-3.1-8b", "device=h100_sxm", "engine=vllm",
           "input_len=1024", "output_len=256"]
    ok = subprocess.run(cmd + ["request_rate=8"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    rec = json.loads(ok.stdout.strip().splitlines()[-1])
    assert rec["run_request_rate"] == 8 and rec["run_num_prompts"] == 1000 and rec["run_in_flight"] > 1
    assert "arriving 8 a second (Poisson)" in ok.stdout and "Little's law" in ok.stdout
    for args, field in ((["request_rate=-1"], "request_rate=-1"), (["request_rate=2", "input_len=0", "output_len=0"],
                                                                  "request_rate=2 prices a finite run")):
        bad = subprocess.run(cmd + args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
        lines = bad.stderr.strip().splitlines()
        assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}"), bad.stderr


def _rate_anchor(tmp_path, **workload):
    import yaml
    a = dict(id="r1", source="s1", engine="vllm", device="h100_sxm", model="llama-3.1-8b", tp=1,
             workload=dict(input_len=I, output_len=O, **workload), metric="tpot_ms", value=10.0)
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(dict(sources=dict(s1=dict(title="t", url="u", split="calibration")), anchors=[a])))
    return path


def test_a_users_anchor_of_a_run_at_a_rate_is_priced_by_serve_at_rate(tmp_path, w):
    """An anchors file's finite run may give request_rate (concurrency then the client's cap, optional)."""
    from roofline.parallel import anchors
    t = anchors.table(_rate_anchor(tmp_path, request_rate=8, num_prompts=500))
    expected = serve_at_rate(w, I, O, 8, 500)["itl_mean_s"]["typical"] * 1e3
    assert t["predicted"].iloc[0] == pytest.approx(expected)
    capped = anchors.table(_rate_anchor(tmp_path, request_rate=8, num_prompts=500, concurrency=4))
    assert capped["predicted"].iloc[0] == pytest.approx(serve_at_rate(w, I, O, 8, 500, 4)["itl_mean_s"]["typical"]
                                                         * 1e3)
    for bad, match in ((dict(request_rate=0), r"\(r1\): workload.request_rate=0"),
                       (dict(request_rate=2, concurrency=0), r"\(r1\): workload.concurrency=0"),
                       (dict(concurrency=4, request_rate="x"), r"\(r1\): workload.request_rate='x'")):
        with pytest.raises(ConfigError, match=match):
            anchors.table(_rate_anchor(tmp_path, **bad))


def test_a_calibration_point_measured_at_a_rate_is_priced_at_that_rate(tmp_path, w):
    """calibrate= takes a bench serve run at --request-rate: its time against serve_at_rate's, placed at the requests
    in flight; its output tok/s is refused (the arrivals set it)."""
    from roofline.analysis import calibrate
    r = serve_at_rate(w, I, O, 8, 1000)
    path = tmp_path / "pts.yaml"
    path.write_text(f"points:\n  - {{request_rate: 8, input_len: {I}, output_len: {O}, "
                    f"tpot_ms: {1.3 * r['itl_mean_s']['typical'] * 1e3}}}\n")
    (p,) = calibrate.priced_points(w, calibrate.load_points(path))
    assert p["ratio"] == pytest.approx(1.3) and p["B"] == r["in_flight"]["typical"] and p["L"] == I + O // 2
    assert calibrate.calibrated(w, path).scale == pytest.approx(1.3)
    path.write_text(f"points:\n  - {{request_rate: 8, input_len: {I}, output_len: {O}, output_tok_s: 2000}}\n")
    with pytest.raises(ConfigError, match=r"points\[0\]: output_tok_s of a run at a rate"):
        calibrate.load_points(path)
    path.write_text(f"points:\n  - {{request_rate: -2, input_len: {I}, output_len: {O}, tpot_ms: 9}}\n")
    with pytest.raises(ConfigError, match=r"points\[0\].request_rate=-2"):
        calibrate.load_points(path)
