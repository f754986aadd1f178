"""The device check (scripts/gpu_check.sh): its CPU dry run writes every file, a failed step never
stops the later ones, the offline install uses only the wheelhouse, and the goals read right."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from roofline.report import devcheck

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = ["setup", "compose_gpu", "ceilings_copy", "sweep_b1", "sweep_compiled", "sweep_rest", "sweep_moe", "env",
         "gpu_tests", "ceilings_full", "fit", "fit_moe", "predict", "summary"]
GPU_STEPS = [s for s in STEPS if s != "compose_gpu"]  # the dry run alone composes the GPU branch's arguments
FILES = {"summary.md", "steps.tsv", "ceilings.json", "sweep.csv", "env.json", "fit.json", "predict.csv",
         "logs.tar.gz"}  # the device tool brings back at most 8 files


def _env(tmp_path, **env):
    e = dict(os.environ, ROOFLINE_CHECK_DRY="1", OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"),
             PY=sys.executable)
    e.update(env)
    e.pop("TRITON_INTERPRET", None)
    return e


def _run(tmp_path, **env):
    return subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=_env(tmp_path, **env), capture_output=True,
                          text=True, timeout=1800)


def _steps(out: Path) -> dict[str, int]:
    lines = (out / "steps.tsv").read_text().splitlines()[1:]
    return {line.split("\t")[0]: int(line.split("\t")[1]) for line in lines}


def _bundle(out: Path) -> list[str]:
    with tarfile.open(out / "logs.tar.gz") as t:
        return t.getnames()


@pytest.mark.slow
def test_cpu_dry_run_writes_its_files_and_a_failed_step_stops_nothing_but_fails_the_check(tmp_path):
    # the gpu-tests step is pointed at a file that does not exist: pytest fails, the rest runs
    r = _run(tmp_path, GPU_TESTS="tests/no_such_test_file.py")
    out = tmp_path / "out"
    assert r.returncode == 1, r.stderr[-2000:]  # a failed step fails the check (CI can tell)
    assert {p.name for p in out.iterdir()} == FILES
    steps = _steps(out)
    assert list(steps) == STEPS
    assert steps["gpu_tests"] != 0 and all(rc == 0 for s, rc in steps.items() if s != "gpu_tests"), steps
    env = json.loads((out / "env.json").read_text())
    assert env["device"] == "cpu" and {a["dispatcher"] for a in env["attention"]} == {"cpu_grouped_matmul", "flash"}
    sweep = pd.read_csv(out / "sweep.csv")
    assert (sweep["status"] == "ok").all() and (sweep["kernels_per_forward"] > 0).all()
    assert sweep["attn_backend"].notna().all()
    assert set(sweep["B"]) == {1, 2} and (sweep["mode"] == "eager").all()  # B=1 first, then the rest, one folder
    assert json.loads((out / "fit.json").read_text())["groups"]
    text = (out / "summary.md").read_text()
    assert "## Goals" in text and "## T(q)/T(1)" in text and "### gpu_tests (exit" in text
    assert "no_such_test_file" in text  # the failure's last log lines
    # the MoE run (a tiny MoE, eager on the CPU: its touched experts), its rows and its fit's group in the summary
    assert "## MoE decode (q = 1)" in text and "touched" in text and "moe_impl touched" in text
    names = _bundle(out)
    assert any(n.endswith("logs/gpu_tests.log") for n in names) and any(n.endswith("sweep/points.jsonl") for n in names)
    assert sum(p.stat().st_size for p in out.iterdir()) < 2_000_000
    # the GPU branch's exact arguments were composed by Hydra and validated: each one line
    compose = (tmp_path / "work" / "logs" / "compose_gpu.log").read_text()
    assert compose.count("valid sweep: llama-3.1-8b on cuda") == 3 and compose.count("valid ceilings: cuda") == 2
    assert compose.count("valid sweep: qwen3-30b-a3b on cuda, modes ['graph']") == 1


@pytest.mark.slow
def test_a_check_cut_after_its_second_measuring_step_keeps_what_ran_and_says_so(tmp_path):
    """SIGTERM to the check's process group while the headline sweep runs (what a time limit or a
    lost lease does): the copy ceilings are in $OUT, the sweep's finished rows are in the bundle,
    and summary.md lists the steps that ran."""
    p = subprocess.Popen(["bash", str(SCRIPT)], cwd=REPO, env=_env(tmp_path), start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, work = tmp_path / "out", tmp_path / "work"
    rows = work / "sweep" / "points.jsonl"
    t0 = time.time()
    while not (rows.exists() and rows.read_text().count("\n") >= 2):
        assert p.poll() is None and time.time() - t0 < 900, "the check ended before its sweep had rows"
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0
    steps = _steps(out)
    assert list(steps)[:3] == ["setup", "compose_gpu", "ceilings_copy"] and steps["ceilings_copy"] == 0
    assert json.loads((out / "ceilings.json").read_text())["summary"]["mem_bw_GBps"] > 0
    text = (out / "summary.md").read_text()
    assert "stopped by a signal" in text and "| ceilings_copy | 0 |" in text
    with tarfile.open(out / "logs.tar.gz") as t:
        saved = t.extractfile(next(n for n in t.getnames() if n.endswith("sweep/points.jsonl"))).read()
    assert saved.count(b"\n") >= 2  # the rows the sweep finished came back in the bundle


def test_a_check_whose_steps_all_fail_exits_non_zero_and_still_writes_its_summary(tmp_path):
    """PY=false: every step fails at once; the check runs them all, records each, and exits 1."""
    r = _run(tmp_path, PY="false")
    out = tmp_path / "out"
    assert r.returncode == 1, r.stderr[-2000:]
    steps = _steps(out)
    assert list(steps) == STEPS and all(rc != 0 for rc in steps.values())
    assert "## Failures" in (out / "summary.md").read_text() and (out / "logs.tar.gz").exists()


def _gpu_limits(text: str) -> dict[str, int]:
    block = text.split("R=G;", 1)[1].split("declare -A LIMIT=(", 1)[1].split(")", 1)[0]
    return {k: int(v) for k, v in re.findall(r"\[(\w+)\]=(\d+)", block)}


def test_the_script_never_stops_on_failure_and_limits_every_step():
    text = SCRIPT.read_text()
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("set -e" in line or "set -o errexit" in line for line in code if "echo" not in line)
    assert "pip install" not in text.replace("pip install -q --no-index", "")  # nothing from an index on the node
    assert "dev.py setup" not in text
    calls = [line.split()[1] for line in code if line.strip().startswith("step ")]
    assert calls == STEPS  # every step goes through `step` (timeout -s INT + recorded exit status)
    assert "timeout --foreground -s INT" in text
    limits = _gpu_limits(text)
    assert list(limits) == GPU_STEPS
    budget = int(re.search(r"BUDGET_S=\$\{ROOFLINE_CHECK_BUDGET_S:-(\d+)\}", text.split("R=G;", 1)[1]).group(1))
    assert budget <= 570  # one device command (600 s at most), with room for the bundle
    # the headline figures (copy roofs, 8B B=1 graph sweep) are on disk within 3 minutes, even at every limit
    assert limits["setup"] + limits["ceilings_copy"] + limits["sweep_b1"] <= 180


@pytest.mark.skipif(not list((REPO / "wheelhouse").glob("*.whl")), reason="no ./wheelhouse (python3 dev.py wheels)")
def test_setup_installs_from_the_wheelhouse_alone_on_a_python_without_hydra(tmp_path):
    bare = next((p for p in ("/usr/bin/python3", shutil.which("python3")) if p and subprocess.run(
        [p, "-c", "import hydra"], capture_output=True).returncode != 0), None)
    if bare is None:
        pytest.skip("no python3 without hydra here")
    r = _run(tmp_path, PY=bare, PIP_INDEX_URL="http://127.0.0.1:9/nothing", PIP_NO_INDEX="1")
    steps = _steps(tmp_path / "out")
    assert steps["setup"] == 0 and list(steps) == STEPS, r.stderr[-2000:]
    site = tmp_path / "work" / "site"  # what the later steps import (hydra's own needs, packaging and
    assert all((site / m / "__init__.py").exists() for m in ("hydra", "omegaconf", "antlr4"))  # pyyaml, the node has)


def _ceilings(triton, torch_copy, cache=60 * 2**20):
    rows = [dict(kernel="triton_copy_persistent", l2="cold", working_set_bytes=8 * cache, GBps=triton),
            dict(kernel="triton_copy_grid", l2="warm", working_set_bytes=8 * cache, GBps=9e9),  # warm: not HBM
            dict(kernel="torch_copy", l2="cold", working_set_bytes=8 * cache, GBps=torch_copy),
            dict(kernel="torch_copy", l2="cold", working_set_bytes=cache, GBps=9e9)]  # fits in cache
    return {"bandwidth": rows, "summary": {"cache_bytes": cache}}


def test_goals_are_ratios_of_one_run_and_missing_inputs_are_not_measured():
    rows = pd.DataFrame([dict(mode="compiled", kind="forward", q=1, B=1, L=L, status="ok", achieved_GBps=g)
                         for L, g in ((512, 3800.0), (4096, 3500.0))])
    fit = {"groups": [{"key": {"kind": "forward"}, "errors": [
        dict(split="5-fold held-out", method="fit", regime="all", n=40, MAPE_pct=2.5),
        dict(split="5-fold held-out", method="roofline", regime="all", n=40, MAPE_pct=30.0)]}]}
    g = {r["goal"]: r for r in devcheck.goals(_ceilings(4500.0, 4300.0), rows, fit, 4800.0)}
    assert g["triton_copy_vs_torch_copy"]["measured"] == pytest.approx(4500 / 4300, abs=1e-4)
    assert g["triton_copy_vs_torch_copy"]["met"] is True
    assert g["triton_copy_vs_datasheet"]["measured"] == pytest.approx(0.9375) and g["triton_copy_vs_datasheet"]["met"]
    assert g["decode_B1_compiled_vs_copy_ceiling"]["measured"] == pytest.approx(3500 / 4500, abs=1e-4)
    assert g["decode_B1_compiled_vs_copy_ceiling"]["met"] is False  # the longest context misses 85%
    assert g["heldout_fit_mape_pct"]["measured"] == 2.5 and g["heldout_fit_mape_pct"]["met"] is True
    none = {r["goal"]: r for r in devcheck.goals(None, pd.DataFrame(), None, None)}
    assert all(r["met"] is None and r["measured"] is None for r in none.values())


def test_the_summary_names_each_failed_step_with_its_last_log_lines_and_gives_t_q_over_t_1(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "sweep_b1.log").write_text("\n".join(f"line {i}" for i in range(20)) + "\nRuntimeError: CUDA error\n")
    steps = [dict(step="setup", rc="0", seconds="1.0", limit_s="20"),
             dict(step="sweep_b1", rc="124", seconds="100.0", limit_s="100")]
    rows = pd.DataFrame([dict(kind="forward", dtype="bfloat16", mode="graph", q=q, B=1, L=512, layers_run=32,
                              layers_full=32, status="ok", t_median_s=t, achieved_GBps=g, achieved_TFLOPs=0.1)
                         for q, t, g in ((1, 0.004, 4000.0), (4, 0.005, 3300.0))])
    text = devcheck.summary_markdown(steps, None, devcheck.goals(None, rows, None, None), rows, logs)
    assert "### sweep_b1 (exit 124)" in text and "RuntimeError: CUDA error" in text and "line 13" in text
    assert "line 12" not in text  # the last 8 lines, not the whole log
    tq = devcheck.tq_table(rows)
    assert list(tq["t_over_t1"]) == [1.0, 1.25]


def _devcheck_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("devcheck_script", REPO / "scripts" / "devcheck.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("config,overrides", [
    ("sweep", ["model=llama-3.1-8b", "device=cuda", "dtypes=[bfloat16]", "modes=[graph]", "q=[1,2]", "B=[1]",
               "L=[512]", "timer.warmup=2", "progress=false", "out_dir=/tmp/x"]),
    ("predict", ["fit=/tmp/f.json", "drafter=ngram", "alphas=[0.6]", "out_dir=/tmp/p"]),
    ("fit", []),
    ("ceilings", ["device=cuda"]),
])
def test_the_dry_runs_compose_step_composes_each_command_as_its_entry_point_does(config, overrides, capsys):
    # a config whose defaults list names its registered schema composes only once the schema is registered:
    # the compose step must go through the entry point's own composition, not Hydra's bare compose
    assert _devcheck_script().compose(config, overrides) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(f"{config}: ")


def test_the_dry_runs_compose_step_fails_on_an_unknown_key(capsys):
    assert _devcheck_script().compose("sweep", ["model=tiny", "no_such_key=1"]) == 2
    assert "no_such_key" in capsys.readouterr().err


def test_the_compose_step_validates_an_moe_graph_sweep_for_the_gpu_and_leaves_the_rule_as_it_was(capsys):
    """Without the GPU, the one check it cannot pass (that the grouped MoE path captures: bf16 on sm90) is
    assumed for that composition alone, and said; the process's own MoE/mode rule is untouched after it."""
    from roofline.measure import sweep
    before = sweep.grouped_moe_runs
    args = ["model=qwen3-30b-a3b", "device=cuda", "dtypes=[bfloat16]", "modes=[graph]", "q=[1,2]", "B=[1,2]",
            "L=[512]", "progress=false", "out_dir=/tmp/x"]
    assert _devcheck_script().compose("sweep", args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "valid sweep: qwen3-30b-a3b on cuda, modes ['graph']" in out
    if not torch.cuda.is_available():
        assert "assumed to capture" in out
    assert sweep.grouped_moe_runs is before
    assert not sweep.grouped_moe_runs("cpu", "bfloat16")
