"""Run folders that cannot be corrupted: lock, checked resume, retry, fingerprint, force, extend."""

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

import roofline.measure.sweep as sw
from roofline.io import results, runfolder
from roofline.measure.memory import TooBig
from roofline.io.fields import ConfigError
from roofline.model.presets import REPO_ROOT, get_preset
from roofline.measure.sweep import SweepRequest, grid, run_sweep
from roofline.measure.timer import TimerSettings

FAST = TimerSettings(warmup=1, min_reps=3, max_reps=4, budget_s=0.02)


def sweep_request(**kw):
    base = dict(model=get_preset("tiny"), q=(1, 2), B=(1,), L=(0, 8), timer=FAST)
    base.update(kw)
    return SweepRequest(**base)


def test_a_second_writer_is_refused_with_the_holders_pid(tmp_path):
    with runfolder.locked(tmp_path):
        with pytest.raises(runfolder.RunLocked, match=f"pid {os.getpid()}"):
            run_sweep(sweep_request(), tmp_path, progress=False)
    assert not (tmp_path / "points.jsonl").exists()
    run_sweep(sweep_request(), tmp_path, progress=False)  # free again once the holder is done
    assert not (tmp_path / runfolder.LOCK).exists()


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / runfolder.LOCK).write_text(f"pid {dead.stdout.strip()} on this host")
    out = run_sweep(sweep_request(), tmp_path, progress=False)
    assert out["ok"] == len(grid(sweep_request()))


def test_a_mid_file_bad_line_is_quarantined_and_the_good_rows_after_it_kept(tmp_path):
    run_sweep(sweep_request(), tmp_path, progress=False)
    f = tmp_path / "points.jsonl"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:1] + ["garbage{", "{}", "null", lines[1]] + lines[2:]) + "\n")
    out = run_sweep(sweep_request(), tmp_path, progress=False)
    assert out["measured_now"] == 0 and out["resumed"] == len(lines)  # nothing after the garbage was lost
    assert [q["line"] for q in out["quarantined"]] == [2, 3, 4]
    assert "not JSON" in out["quarantined"][0]["reason"] and "not a JSON object" in out["quarantined"][2]["reason"]
    assert f.read_text().splitlines() == lines
    moved = [json.loads(l) for l in (tmp_path / runfolder.QUARANTINE).read_text().splitlines()]
    assert [m["text"] for m in moved] == ["garbage{", "{}", "null"]


def test_a_torn_last_line_and_a_duplicate_row_are_quarantined(tmp_path):
    run_sweep(sweep_request(), tmp_path, progress=False)
    f = tmp_path / "points.jsonl"
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines + [lines[0]]) + "\n" + lines[1][:20])
    r = runfolder.load_points(tmp_path)
    assert [q["reason"] for q in r.quarantined] == ["duplicate point_id", "torn last line (the writer was killed mid-line, or the disk was full)"]
    assert len(r.rows) == len(lines) and f.read_text().splitlines() == lines


def test_transient_failures_are_retried_on_resume(tmp_path):
    def failing(w, p, timer):
        if p.q == 2:
            raise TooBig("needs 9 GB, 1 GB free")
        return sw._measure(w, p, timer)
    first = run_sweep(sweep_request(), tmp_path, progress=False, measure=failing)
    assert first["failed"] == 2
    again = run_sweep(sweep_request(), tmp_path, progress=False)
    assert again["retried"] and again["measured_now"] == 2 and again["failed"] == 0
    df = pd.read_csv(tmp_path / "points.csv")
    assert len(df) == len(grid(sweep_request())) and (df["status"] == "ok").all()
    assert len((tmp_path / runfolder.RETRIED).read_text().splitlines()) == 2  # the failed rows are kept aside


def test_retry_failed_false_keeps_the_failed_rows(tmp_path):
    boom = lambda w, p, timer: (_ for _ in ()).throw(RuntimeError("flaky"))
    run_sweep(sweep_request(), tmp_path, progress=False, measure=boom)
    again = run_sweep(sweep_request(), tmp_path, progress=False, retry_failed=False)
    assert again["measured_now"] == 0 and again["failed"] == len(grid(sweep_request()))


def test_the_fingerprint_holds_code_torch_and_device(monkeypatch):
    s = sweep_request()
    ident = s.identity()
    assert {"code_version", "torch_version", "device_name"} <= set(ident)
    before = s.fingerprint()
    monkeypatch.setattr(sw.torch, "__version__", "9.9.9")
    assert s.fingerprint() != before


def test_a_run_of_other_code_is_refused_naming_what_changed_and_force_remeasures(tmp_path, monkeypatch):
    run_sweep(sweep_request(), tmp_path, progress=False)
    monkeypatch.setattr(sw.provenance, "code_version", lambda: "0123abcd")
    with pytest.raises(ConfigError, match="code_version.*0123abcd.*force=true"):
        run_sweep(sweep_request(), tmp_path, progress=False)
    out = run_sweep(sweep_request(), tmp_path, progress=False, force=True)
    assert out["measured_now"] == len(grid(sweep_request()))
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("previous-")]
    assert len(aside) == 1 and (aside[0] / "points.jsonl").exists()


def test_extend_adds_new_grid_values_and_keeps_the_measured_points(tmp_path):
    run_sweep(sweep_request(), tmp_path, progress=False)
    old = {r["point_id"]: r["t_median_s"] for r in results.read_rows(tmp_path / "points.jsonl")}
    with pytest.raises(ConfigError, match="extend=true"):
        run_sweep(sweep_request(q=(4,)), tmp_path, progress=False)
    out = run_sweep(sweep_request(q=(4,)), tmp_path, progress=False, extend=True)
    assert out["resumed"] == len(old) and out["points"] == len(grid(sweep_request(q=(1, 2, 4))))
    rows = {r["point_id"]: r["t_median_s"] for r in results.read_rows(tmp_path / "points.jsonl")}
    assert all(rows[k] == v for k, v in old.items())
    meta = json.loads((tmp_path / "run.json").read_text())
    assert meta["identity"]["q"] == [1, 2, 4] and len(meta["extended"]) == 1
    assert run_sweep(sweep_request(q=(1, 2, 4)), tmp_path, progress=False)["measured_now"] == 0  # the union grid resumes


def test_a_folder_with_points_but_no_run_json_is_refused(tmp_path):
    (tmp_path / "points.jsonl").write_text(json.dumps({"point_id": "x", "status": "ok", "t_median_s": 1}) + "\n")
    with pytest.raises(ConfigError, match="no run.json"):
        run_sweep(sweep_request(), tmp_path, progress=False)
    assert not (tmp_path / "run.json").exists()


def test_run_json_is_written_atomically(tmp_path, monkeypatch):
    from roofline.io import files
    def torn(path, data, indent=1):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(files, "write_json_atomic", torn)
    with pytest.raises(OSError):
        run_sweep(sweep_request(), tmp_path, progress=False)
    assert not (tmp_path / "run.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_quick_ceilings_are_not_measured_again_on_restart(tmp_path, monkeypatch):
    import roofline.measure.ceilings as ce
    from roofline.measure.devices import running_device_name
    fake = {"schema_version": ce.SCHEMA_VERSION, "summary": {"mem_bw_GBps": 10.0, "peak_tflops": {"bfloat16": 1.0}},
            "provenance": {"device_name": running_device_name("cpu")}}
    for k in ce.TOP_KEYS:
        fake.setdefault(k, {})
    for k in ce.SUMMARY_KEYS:
        fake["summary"].setdefault(k, None)
    calls = []
    monkeypatch.setattr(ce, "measure_ceilings", lambda sweep_request: calls.append(1) or fake)
    run_sweep(sweep_request(ceilings="quick", q=(1,), L=(0,)), tmp_path, progress=False)
    run_sweep(sweep_request(ceilings="quick", q=(1,), L=(0,)), tmp_path, progress=False)
    assert calls == [1]


def test_a_ceilings_file_of_another_device_is_refused(tmp_path):
    import roofline.measure.ceilings as ce
    doc = {k: {} for k in ce.TOP_KEYS}
    doc.update(schema_version=ce.SCHEMA_VERSION, provenance={"device_name": "NVIDIA H200"},
               summary={k: None for k in ce.SUMMARY_KEYS})
    (tmp_path / "c.json").write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="measured on 'NVIDIA H200'"):
        run_sweep(sweep_request(ceilings=str(tmp_path / "c.json")), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_samples_sidecar_and_p99_per_point(tmp_path):
    run_sweep(sweep_request(), tmp_path, progress=False)
    samples = results.read_samples(tmp_path)
    df = pd.read_csv(tmp_path / "points.csv")
    for _, r in df.iterrows():
        s = sorted(samples[r["point_id"]])
        assert len(s) == r["t_n"] and r["t_p99_s"] <= s[-1] and r["t_p99_s"] >= r["t_p90_s"]
    assert "samples_s" not in df.columns


def test_device_cuda_without_a_gpu_is_one_line_and_writes_nothing(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, "-m", "roofline.cli.sweep", "model=tiny", "device=cuda", "L=[0]",
                        f"out_dir={tmp_path / 'x'}"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: device='cuda': CUDA is not available here (every GPU entry runs on cuda: cuda, cuda:N or a datasheet "
        "GPU row such as h100_sxm); allowed ('cpu',)"]
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
def test_ctrl_c_ends_cleanly_with_what_was_saved(tmp_path):
    import signal
    import time
    out = tmp_path / "run"
    # 96 points of 50 repetitions: long enough that a loaded machine cannot finish the sweep between
    # the third saved point and the signal (a finished sweep exits 0, which this test is not about)
    cmd = [sys.executable, "-m", "roofline.cli.sweep", "model=tiny", "q=[1,2,3,4,5,6,7,8]", "B=[1,2,4]",
           "L=[0,16,32,48]", "timer.min_reps=50", "timer.max_reps=50", "timer.budget_s=10", "progress=false",
           f"out_dir={out}"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    jsonl = out / "points.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not jsonl.exists() or len(jsonl.read_text().splitlines()) < 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    saved = results.read_rows(jsonl)
    assert len(saved) < 96, "the sweep finished before the signal arrived"
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith(f"interrupted: {len(saved)} points saved in {out}")
    assert "Traceback" not in err
    assert len(pd.read_csv(out / "points.csv")) == len(saved)  # the table holds what was saved
    assert not (out / runfolder.LOCK).exists()
