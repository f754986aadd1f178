"""Held-out kernel benchmarks (roofline/data/kernel_checks.yaml) priced by the what-if's kernel path."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from roofline.io.fields import ConfigError
from roofline.parallel import kernel_checks

ROOT = Path(__file__).parents[1]


def test_no_kernel_check_source_is_cited_by_a_prior():
    """A check is held out: no kernels.yaml, priors.yaml or engines.yaml source names its page or id."""
    assert kernel_checks.cited_by_priors() == []
    sources, checks = kernel_checks.load()
    assert {c["source"] for c in checks} <= set(sources)


def test_a_one_rank_benchmark_is_priced_at_its_expected_share_of_the_routing():
    """An EP8 simulation of DeepSeek (256 experts, 32 local, top-8): the one-layer model holds the 32 local experts,
    each token picking one of them on average, so its expected touched experts are the whole layer's share."""
    _, checks = kernel_checks.load()
    c = next(c for c in checks if c["shape"]["local_experts"] < c["shape"]["experts"])
    m = kernel_checks.layer_model(c)
    s = c["shape"]
    assert (m.experts, m.experts_per_token) == (s["local_experts"], s["top_k"] * s["local_experts"] // s["experts"])
    for M in (1, 16, 512):
        whole = s["local_experts"] * (1 - (1 - s["top_k"] / s["experts"]) ** M)
        local = m.experts * (1 - (1 - m.experts_per_token / m.experts) ** M)
        assert local == pytest.approx(whole)


@pytest.mark.slow
def test_the_committed_kernel_checks_are_what_the_code_prices_now_and_the_docs_quote_them():
    """results/parallel/kernel_checks.md is what `python -m roofline.cli.anchors ... out_dir=results/parallel` writes
    from this commit, and docs/planning.md quotes its overall row."""
    fresh = kernel_checks.table()
    out = ROOT / "results" / "parallel"
    shipped = pd.read_csv(out / "kernel_checks.csv")
    assert list(shipped["id"]) == list(fresh["id"]) and list(shipped["M"]) == list(fresh["M"])
    assert (out / "kernel_checks.md").read_text() == kernel_checks.markdown(fresh)
    overall = kernel_checks.markdown(fresh).splitlines()[2]
    assert overall.startswith("| all |") and overall in (ROOT / "docs" / "planning.md").read_text()


@pytest.mark.slow
def test_held_out_kernel_checks_are_bounded_at_the_measured_level():
    """All 68 rows: median |error| 9.6%, signed +1.4%, 66% inside (11.7%, +2.3%, 65% before stop 70); vLLM's tuned
    fused_moe on an H100 (gpt-oss's shape) 5.6%, within its interval at 4 of 5 batches; on an L40S (Qwen3.5's fp8
    shape) 4.0%, and its compute-bound end (16384, 32768 tokens) within 10%: a held-out check of the Ada fp8
    fused_moe share, read from another shape's table. SGLang PR #34682's Marlin MXFP4 MoE on an H20 (1k-128k
    tokens) 7.5%, every row within 12%: a held-out check of the Marlin MoE kernel's compute share read from FlagGems'
    tables of other shapes (26.7%, 24-35% too fast from 2k tokens, at the dense GEMM's share before stop 70). A
    regression of the kernel curves fails this."""
    t = kernel_checks.table()
    s = kernel_checks.summary(t)
    a, tuned, l40s = s["all"], s["vllm-pr39902-h100-gptoss-bf16-tuned"], s["vllm-pr53819-l40s-qwen35-fp8-tuned"]
    assert a["n"] >= 68
    assert a["median_abs_error_pct"] <= 11.0 and abs(a["signed_median_pct"]) <= 7.0 and a["inside"] >= 0.62
    assert tuned["median_abs_error_pct"] <= 7.0 and tuned["inside"] >= 0.8
    assert l40s["median_abs_error_pct"] <= 5.5
    big = t[(t["id"] == "vllm-pr53819-l40s-qwen35-fp8-tuned") & (t["M"] >= 16384)]
    assert len(big) == 2 and (big["error_pct"].abs() <= 10.0).all()
    marlin = t[t["id"] == "sglang-pr34682-h20-mxfp4-marlin"]
    assert len(marlin) == 8 and (marlin["error_pct"].abs() <= 12.0).all()


def _doc():
    return yaml.safe_load((ROOT / "roofline" / "data" / "kernel_checks.yaml").read_text())


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["checks"][0].pop("rows"), "missing 'rows'"),
    (lambda d: d["checks"][0].update(source="nope"), "source='nope' is not in `sources`"),
    (lambda d: d["checks"][0]["shape"].update(N=0), r"shape.N=0: allowed an integer >= 1"),
    (lambda d: d["checks"][0]["shape"].update(local_experts=3), "local_experts must divide experts"),
    (lambda d: d["checks"][0].update(rows=[[1, -5.0]]), r"rows entry \[1, -5.0\]"),
    (lambda d: d.update(checks=[]), "non-empty list `checks`"),
    (lambda d: d["checks"][0].update(kind="conv"), "kind='conv': allowed"),
    (lambda d: d["checks"][0].pop("engine"), "missing 'engine' \\(a moe check\\)"),
    (lambda d: d["checks"][0].update(unit="TFLOP/s"), "a moe check: us"),
])
def test_a_bad_kernel_checks_file_is_one_error_naming_the_field(tmp_path, edit, message):
    doc = _doc()
    edit(doc)
    (tmp_path / "k.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=message):
        kernel_checks.load(tmp_path / "k.yaml")


def test_the_anchors_command_refuses_a_bad_kernel_checks_file_in_one_line_exit_2(tmp_path):
    anchors_doc = dict(sources=dict(s1=dict(title="t", url="u", split="calibration")),
                       anchors=[dict(id="a1", source="s1", engine="vllm", device="h100_sxm", model="llama-3.1-8b",
                                     tp=1, workload=dict(B=1, L=1024), metric="itl_ms", value=7.5)])
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(anchors_doc))
    doc = _doc()
    del doc["checks"][0]["quote"]
    (tmp_path / "k.yaml").write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-m", "roofline.cli.anchors", f"anchors={tmp_path / 'a.yaml'}",
                        f"kernel_checks={tmp_path / 'k.yaml'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "missing 'quote'" in r.stderr and "Traceback" not in r.stderr


def test_a_gemm_check_reads_a_published_rate_as_time_and_prices_one_gemm():
    """TFLOP/s become 2 M N K / rate; the price is the pass's own pricing of one GEMM (its memory side at M = 1)."""
    _, checks = kernel_checks.load()
    c = next(c for c in checks if c["kind"] == "gemm" and c["weights"] == "bf16")
    N, K = c["shape"]["N"], c["shape"]["K"]
    assert kernel_checks.published_us(c, 16, 2.0) == pytest.approx(2 * 16 * N * K / 2.0e12 * 1e6)
    p = kernel_checks.price(c, 1)
    assert p["optimistic"] < p["typical"] < p["pessimistic"]
    assert 2 * N * K / p["typical"] * 1e-3 == pytest.approx(3350 * 0.78, rel=0.15)  # GB/s: the bf16 bytes streamed


def test_a_memory_bound_bf16_gemm_streams_at_one_fraction_and_ampere_keeps_its_measured_skinny_loss():
    """vLLM PR #49363 (H100, cuBLAS bf16, 43008 x 5376): M = 128 in 162.3 us, M = 256 in 199.5 us, still streaming the
    weights at 0.82-0.85 of the bandwidth at 128; a streaming fraction that fell with M (read on an A100, where those
    rows were compute-bound) priced them +47 / +74%. On an A100 the same baseline's loss is on the compute side: a
    GEMM of its 313M weights at M = 128 is compute-bound (0.5757 ms measured in fp16)."""
    from roofline.measure.devices import get_datasheet
    from roofline.parallel import kernels as K
    from roofline.parallel.whatif import one_gemm_seconds
    kern, h100, a100 = K.load_kernels(), get_datasheet("h100_sxm"), get_datasheet("a100_80gb_sxm")
    assert one_gemm_seconds(h100, "bfloat16", 128, 43008, 5376, 1, kern) * 1e6 == pytest.approx(162.3, rel=0.15)
    assert one_gemm_seconds(h100, "bfloat16", 256, 43008, 5376, 1, kern) * 1e6 == pytest.approx(199.5, rel=0.15)
    N, Kd = 16384, 19122  # 313.3M weights (the baseline's shape is not stated)
    r = K.gemm_seconds(128, N, Kd, 2 * N * Kd, "dense", 0, a100.mem_bw_GBps * 1e9, 312e12, 19.5e12, "a100_80gb_sxm",
                       1, kern)
    assert r["compute"] > r["memory"]
    assert r["seconds"] * 1e3 == pytest.approx(0.5757, rel=0.20)


def test_a_gemm_of_more_rows_never_prices_faster_on_ampere():
    """Ampere's measured skinny-GEMM share rises from 0.60 at M = 128 to 0.83 at 256 while the tile / wave utilisation,
    counted beside it, also rises inside a wave: a GEMM of 160 rows priced faster than one of 128, and an A100
    Llama-3.1-8B TP 4 step at 160 sequences 3% below its step at 128. Each GEMM is at least what it costs at the
    table's row counts below its own."""
    from roofline.measure.devices import get_datasheet
    from roofline.model.presets import get_preset
    from roofline.parallel import kernels as K
    from roofline.parallel.layout import Layout
    from roofline.parallel.whatif import Setting, WhatIf, one_gemm_seconds
    kern, a100 = K.load_kernels(), get_datasheet("a100_80gb_sxm")
    for N, Kd in ((3584, 4096), (4096, 3584), (1536, 4096), (7168, 8192), (32064, 4096)):
        for s in range(3):
            t = [one_gemm_seconds(a100, "bfloat16", M, N, Kd, s, kern) for M in range(1, 2200, 7)]
            assert all(b >= a * (1 - 1e-12) for a, b in zip(t, t[1:])), (N, Kd, s)
    for engine in ("vllm", "llama.cpp"):
        w = WhatIf(get_preset("llama-3.1-8b"), a100, "bfloat16", Layout(tp=4), Setting(engine=engine))
        steps = [w.itl(B, 128)["typical"] for B in (96, 128, 160, 192, 224, 256)]
        assert steps == sorted(steps), engine
