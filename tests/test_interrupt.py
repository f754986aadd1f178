"""Nothing lost: a sweep (and a multirun) stopped by SIGINT or SIGTERM at a random moment keeps
every point it reported finished, says how many it saved, and the same command measures only
the rest. The busy-machine monitor is on (it used to hold up to `every` rows in memory)."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roofline.io import results

REPO = Path(__file__).resolve().parents[1]
GRID = ["model=tiny", "'q=[1,2,4]'", "'B=[1,2]'", "'L=[16,64]'", "timer.warmup=1", "timer.min_reps=3",
        "timer.max_reps=5", "timer.budget_s=0.05", "noise.every=3"]
TOTAL = 16  # 12 forward points + 4 of tiny's MTP module (mtp_q=[1])


# the end of a script that signals itself: the handler exits 130 before the sleep ends (exit 0: not handled)
_SIGINT_ITSELF = "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\nsys.exit(0)\n"


def _python(script: str, cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    """`script` run by a fresh interpreter that imports this checkout's roofline."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "roofline.cli.sweep"] + [a.strip("'") for a in args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rows(path: Path) -> list[dict]:
    return results.read_rows(path / "points.jsonl") if (path / "points.jsonl").exists() else []


def _wait_for(cond, limit_s=240.0):
    t0 = time.time()
    while not cond():
        if time.time() - t0 > limit_s:
            raise AssertionError("the sweep never got that far")
        time.sleep(0.05)


def _reported_by_the_bar(stderr: str) -> int:
    """The last count the progress bar printed (bar.close() prints the final one)."""
    counts = [int(n) for n, total in re.findall(r"(\d+)/(\d+) \[", stderr) if int(total) == TOTAL]
    return counts[-1] if counts else 0


def _died_after_it_finished(returncode: int, sig, stdout: str, summary: str) -> bool:
    """Killed by the signal itself after printing its final summary: the signal landed in the
    interpreter's last moments, after CPython's finalisation gave the signals back to the
    system (hold_signals_to_the_end covers everything before); all the work was saved."""
    return returncode == -int(sig) and any(line.startswith(summary) for line in stdout.splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_sweep_killed_at_a_random_moment_keeps_every_finished_point(tmp_path, sig):
    out = tmp_path / "run"
    args = GRID + [f"out_dir={out}", "progress=true"]
    p = _start(args, tmp_path)
    _wait_for(lambda: len(_rows(out)) >= 1 or p.poll() is not None)
    time.sleep(random.Random(int(sig)).uniform(0.0, 0.8))  # a random moment, the same on every run (~0.77 s)
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=120)
    rows = _rows(out)
    if p.returncode == 0 or _died_after_it_finished(p.returncode, sig, stdout, '{"run_dir"'):
        pytest.skip("the sweep finished before the signal (a fast machine): nothing to count")
    assert p.returncode == 128 + int(sig), stderr[-2000:]
    said = re.search(r"interrupted: (\d+) points saved in \S+ \((SIGINT|SIGTERM)\)", stderr)
    assert said and said.group(2) == signal.Signals(sig).name, stderr[-2000:]
    assert int(said.group(1)) == len(rows)  # what it says it saved is what is on disk
    reported = _reported_by_the_bar(stderr)
    assert reported >= 1 and len(rows) >= reported  # every point counted as finished is on disk
    assert len(rows) <= reported + 1  # the monitor holds nothing back (at most the row being counted)
    assert len({r["point_id"] for r in rows}) == len(rows)
    assert (out / "points.csv").exists()  # the table of what was saved, written on the way out
    # the same command measures only what is missing, and the folder ends whole
    done = subprocess.run([sys.executable, "-m", "roofline.cli.sweep"] + [a.strip("'") for a in args[:-1]]
                          + ["progress=false"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["measured_now"] == TOTAL - len(rows) and summary["resumed"] == len(rows)
    assert len({r["point_id"] for r in _rows(out)}) == TOTAL


@pytest.mark.slow
def test_a_multirun_interrupted_keeps_the_finished_jobs_and_the_points_of_the_one_it_stopped(tmp_path):
    sweep_dir = tmp_path / "multi"
    grid = [a for a in GRID if not a.startswith("'q=")]
    args = ["-m", "q=1,2,4", *grid, "progress=false", f"hydra.sweep.dir={sweep_dir}",
            "out_dir=" + str(tmp_path / "runs") + "/q${q}"]
    p = _start(args, tmp_path)
    _wait_for(lambda: (sweep_dir / "0" / "job.json").exists() or p.poll() is not None)
    _wait_for(lambda: len(_rows(tmp_path / "runs" / "q2")) >= 1 or p.poll() is not None)
    time.sleep(random.Random(7).uniform(0.0, 1.5))
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    if p.returncode == 0 or _died_after_it_finished(p.returncode, signal.SIGINT, stdout, '{"aggregate"'):
        pytest.skip("the multirun finished before the signal: nothing to count")
    assert p.returncode == 130, stderr[-2000:]
    finished = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"run_dir"')]
    # the job the signal stopped says what it saved; on a loaded machine the signal can land between two jobs
    # (one finished, the next not started), and then no job was stopped: nothing of its own to count. The line
    # then names the job that had just finished (the late-signal handler reports the last summary), whose points
    # its own summary line already counts (a fresh-clone run counted them twice: 24 reported, 16 on disk)
    said = re.search(r"interrupted: (\d+) points saved in (\S+) \(SIGINT\)", stderr)
    stopped = said is not None and said.group(2) not in {s["run_dir"] for s in finished}
    reported = sum(s["ok"] + s["failed"] for s in finished) + (int(said.group(1)) if stopped else 0)
    on_disk = sum(len(_rows(d)) for d in (tmp_path / "runs").iterdir())
    assert finished and on_disk == reported  # every job's finished points, the interrupted one's too
    total = re.search(r"multirun interrupted: (\d+) points saved across (\d+) job", stderr)
    assert total and int(total.group(1)) == on_disk, stderr[-2000:]
    agg = (sweep_dir / "aggregate.csv").read_text().splitlines()
    assert len(agg) - 1 == on_disk


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_after_the_last_point_still_exits_128_plus_signum_and_says_what_was_saved(capsys, sig):
    """The CI run that found it: a fast sweep had measured all 16 points and was writing its
    summary when the signal came; the handlers were already gone and the process died of the
    signal (returncode -15), without a word. fail_fast now holds them for the whole command."""
    from roofline.cli.entry import fail_fast
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(SystemExit) as stop:
        with fail_fast() as done:
            done.summary = dict(ok=15, failed=1, run_dir="runs/x")
            os.kill(os.getpid(), sig)
            time.sleep(1.0)  # the handler runs at the next bytecode; never reached
            raise AssertionError("the signal was not handled")
    assert stop.value.code == 128 + int(sig)
    assert f"interrupted: 16 points saved in runs/x ({signal.Signals(sig).name})" in capsys.readouterr().err
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are given back


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_after_the_command_returned_exits_128_plus_signum_and_says_what_was_saved(tmp_path, sig):
    """The second CI run that found it: the sweep had returned (summary printed, fail_fast left)
    and the process was tearing down when SIGTERM came; it died of it (returncode -15). The
    command wrapper now holds both signals until the process ends."""
    script = (
        "import os, signal, sys, time\n"
        "from roofline.cli.entry import fail_fast, hold_signals_to_the_end\n"
        "hold_signals_to_the_end()\n"
        "with fail_fast() as done:\n"
        "    done.summary = dict(ok=3, failed=0, run_dir='runs/y')\n"
        "print('{\"summary\": 1}', flush=True)\n"
        f"os.kill(os.getpid(), {int(sig)})\n"
        "time.sleep(5)\n"
        "sys.exit(0)\n")
    p = _python(script, cwd=REPO, timeout=60)
    assert p.returncode == 128 + int(sig), p.stderr[-2000:]
    assert p.stdout.strip() == '{"summary": 1}'  # what was printed before stays printed
    assert f"interrupted: 3 points saved in runs/y ({signal.Signals(sig).name})" in p.stderr


def test_a_multirun_jobs_file_is_written_whole_so_a_late_signal_can_aggregate_it(tmp_path, monkeypatch):
    """A fresh-clone run on a loaded machine: SIGINT landed as a multirun's last job ended, and the late handler,
    which aggregates every job's job.json, printed no 'multirun interrupted' line. The job files were written with
    write_text (open, write, close: a handler running in between reads a torn file); they go through the atomic
    writer (a temporary file renamed over it), so a reader sees no file or the whole one."""
    from types import SimpleNamespace

    from roofline.cli import entry
    from roofline.io import files
    written = []
    real = files.write_atomic
    monkeypatch.setattr(files, "write_atomic", lambda path, data: written.append(Path(path)) or real(path, data))
    monkeypatch.setattr(entry, "_multirun", lambda: True)
    hc = SimpleNamespace(runtime=SimpleNamespace(output_dir=str(tmp_path / "0")), sweep=SimpleNamespace(dir=str(tmp_path)))
    monkeypatch.setattr(entry.HydraConfig, "get", staticmethod(lambda: hc))
    entry.job_dir(dict(status="ok", run_dir=str(tmp_path / "runs" / "a"), ok=2, failed=0))
    assert written == [tmp_path / "0" / entry.JOB_FILE]
    assert json.loads((tmp_path / "0" / entry.JOB_FILE).read_text())["ok"] == 2
    monkeypatch.setattr(entry, "aggregate_finished", lambda: None)
    hc.runtime.output_dir = str(tmp_path / "1")
    entry.interrupted_multirun(dict(ok=1, failed=0, run_dir="runs/b"))
    assert written[-1] == tmp_path / "1" / entry.JOB_FILE
    assert json.loads(written[-1].read_text()) == dict(status="interrupted", ok=1, failed=0, run_dir="runs/b")


def test_a_late_signal_whose_aggregation_fails_says_why_instead_of_nothing(tmp_path):
    """A fresh-clone run (stop 68) ended a multirun interrupted by SIGINT with exit 130, the job's 'interrupted: 8
    points saved' line and no 'multirun interrupted' line. The late handler exits with os._exit in a finally: an
    error in its aggregation was dropped without a word. It now says what stopped the aggregation."""
    script = (
        "import os, signal, sys, time\n"
        "from roofline.cli import entry\n"
        "entry._multirun = lambda: True\n"
        "def broken():\n"
        "    raise OSError(2, 'No such file or directory', 'sweep/1/job.json')\n"
        "entry.aggregate_finished = broken\n"
        "entry.hold_signals_to_the_end()\n"
        + _SIGINT_ITSELF)
    p = _python(script, cwd=tmp_path, timeout=60)
    assert p.returncode == 130, p.stderr[-2000:]
    assert ("multirun interrupted: the finished jobs were not aggregated (FileNotFoundError: No such file or "
            "directory: sweep/1/job.json); the same command resumes") in p.stderr


def test_a_signal_between_two_jobs_of_a_multirun_still_aggregates_the_finished_ones(tmp_path):
    """The root cause of the stop-68 fresh-clone failure (exit 130, the job's 'interrupted: 8 points saved' line, no
    'multirun interrupted' line): Hydra's run_job puts back the config it found when a job returns (none, in a
    multirun), so between two jobs `_multirun()` was false and the late handler did not aggregate. A real two-job
    Hydra multirun here, signalled once its jobs have returned: the same state as between two jobs."""
    script = (
        "import os, signal, sys, time\n"
        "import hydra\n"
        "from roofline.cli import entry\n"
        "@hydra.main(config_path=None, version_base='1.3')\n"
        "def task(cfg):\n"
        "    with entry.fail_fast() as done:\n"
        "        done.summary = dict(ok=0, failed=0, run_dir='runs/x')\n"
        "        entry.job_dir(dict(status='ok', ok=0, failed=0, run_dir=f'runs/x{cfg.x}'))\n"
        "entry.hold_signals_to_the_end()\n"
        "sys.argv[1:] = ['-m', '+x=1,2', 'hydra.sweep.dir=sweep']\n"
        "task()\n"
        + _SIGINT_ITSELF)
    p = _python(script, cwd=tmp_path, timeout=120)
    assert p.returncode == 130, p.stderr[-2000:]
    assert "interrupted: 0 points saved in runs/x (SIGINT)" in p.stderr
    assert "multirun interrupted: 0 points saved across 2 job(s)" in p.stderr, p.stderr[-2000:]
    assert (tmp_path / "sweep" / "aggregate.csv").exists()
