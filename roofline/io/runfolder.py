"""A run folder that cannot be corrupted: one writer at a time, every line checked on resume.

- `locked(run_dir)`: an exclusive lock (flock on `run.lock`, which names the holder's pid).
  A second writer is refused with that pid; a lock left by a dead process is free again
  (the kernel drops a lock with its holder), so it is simply taken over.
- `load_points(run_dir, retry)`: every line of points.jsonl is parsed and checked (a JSON
  object with a point_id and a known status). A bad line anywhere (garbage, `{}`, `null`,
  a torn last line, a second row of the same point) is moved to points.quarantine.jsonl
  with its line number and the reason, and the good rows after it are kept. Rows whose
  status is in `retry` (transient failures: an OOM, a momentary too_big) are moved to
  points.retried.jsonl so that the sweep measures those points again.
- `set_aside(run_dir)`: `force=true` moves a previous run's files, and everything derived from
  them (fit.json, reports, noise.json, figures/, stray temporary files), into
  `previous-<time>/` (nothing is deleted) so that the folder starts empty.
- `Signals`: while a sweep runs, SIGINT (Ctrl-C) and SIGTERM (`timeout`, Slurm, Kubernetes)
  both become `Interrupted` (a KeyboardInterrupt naming the signal), raised between two
  writes, never inside one: a signal that arrives while a row or a correction is being
  appended is held until that write is complete, so every point counted as finished is a
  whole line on disk.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import signal
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection, Iterator

from roofline.io.files import write_atomic
from roofline.io.fields import ConfigError

SCHEMA_VERSION = 1  # of a points.jsonl row (roofline.io.results: the columns)
# math_fallback: measured, but attention ran torch's math path on CUDA (roofline.measure.forward)
STATUSES = ("ok", "oom", "error", "unsupported", "too_big", "math_fallback")
CORRECTIONS = "points.corrections.jsonl"
LOCK = "run.lock"
POINTS = "points.jsonl"
QUARANTINE = "points.quarantine.jsonl"
RETRIED = "points.retried.jsonl"
RUN_FILES = ("run.json", POINTS, CORRECTIONS, "points.csv", "samples.jsonl", QUARANTINE, RETRIED, "ceilings.json",
             "ceilings_bandwidth.csv", "ceilings_matmul.csv")
# what the commands derive from a run's rows into its folder: set aside with them, so that a forced
# re-measurement never sits beside the old run's fit, report or noise verdict
DERIVED_FILES = ("fit.json", "noise.json", "report.md", "report.html", "report_costmodel.md", "report_specdec.md",
                 "predict.csv", "capacity.csv", "capacity.json", "overhead.json", "specdec.csv")
DERIVED_DIRS = ("figures",)
TRANSIENT = ("oom", "too_big", "error")


def check_folder_path(path: Path, field: str) -> None:
    """A folder the command will create or write: refused naming `field` when it is a dangling
    symlink or a symlink loop (mkdir says only "File exists"), a file, or a name too long."""
    path = Path(path)
    long = [part for part in path.parts if len(part.encode()) > 255]
    if long:  # checked first: is_symlink() itself fails on such a name
        raise ConfigError(f"{field}={str(path)!r}: a name is longer than 255 bytes ({long[0][:40]}...)")
    for p in (path, *path.parents):
        if p.is_symlink() and not p.exists():
            try:
                p.resolve(strict=True)
            except RuntimeError:
                raise ConfigError(f"{field}={str(path)!r}: {str(p)!r} is a symlink loop") from None
            except OSError:
                pass
            raise ConfigError(f"{field}={str(path)!r}: {str(p)!r} is a symlink to {os.readlink(p)!r}, which does not exist")
        if p.exists() and not p.is_dir():
            raise ConfigError(f"{field}={str(path)!r}: {str(p)!r} is a file, not a folder")


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM during a sweep; `signum` says which (the exit status is 128 + signum)."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


class Signals:
    """`with Signals() as sig:` SIGINT and SIGTERM raise Interrupted; `with sig.writing():`
    holds a signal until the block (one append) is done. Outside the main thread (where
    Python cannot install handlers) it does nothing and Ctrl-C stays a KeyboardInterrupt."""

    HANDLED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.critical, self.pending, self.saved = False, None, {}

    def _handler(self, signum, frame) -> None:
        if self.critical:
            self.pending = signum
            return
        raise Interrupted(signum)

    def __enter__(self) -> "Signals":
        if threading.current_thread() is threading.main_thread():
            for s in self.HANDLED:
                self.saved[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self.saved.items():
            signal.signal(s, old)
        self.saved = {}

    @staticmethod
    @contextmanager
    def ignored() -> Iterator[None]:
        """SIGINT and SIGTERM ignored for the block (the summary written after an interrupt)."""
        saved = {}
        if threading.current_thread() is threading.main_thread():
            saved = {s: signal.signal(s, signal.SIG_IGN) for s in Signals.HANDLED}
        try:
            yield
        finally:
            for s, old in saved.items():
                signal.signal(s, old)

    @contextmanager
    def writing(self) -> Iterator[None]:
        self.critical = True
        try:
            yield
        finally:
            self.critical = False
            if self.pending is not None:
                signum, self.pending = self.pending, None
                raise Interrupted(signum)


class RunLocked(ConfigError):
    """Another live process is writing this run folder."""


@contextmanager
def locked(run_dir: Path) -> Iterator[Path]:
    """Hold the folder's write lock for the duration of the block."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunLocked(f"out_dir={str(run_dir)!r} is being written by another sweep ({holder}); "
                            f"wait for it, or choose another out_dir") from None
        # the holder we waited on may have removed the file: lock the file that is at the path now
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    me = f"pid {os.getpid()} on {socket.gethostname()} since {dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ}"
    os.ftruncate(fd, 0)
    os.pwrite(fd, me.encode(), 0)
    remove_stale_temps(run_dir)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale_temps(run_dir: Path) -> list[str]:
    """Remove the temporary files (`.<name>.<pid>.tmp`, roofline.io.files.write_atomic) of writers
    that are gone (killed before their rename, or on a full disk); a live writer's are left."""
    removed = []
    for p in sorted(Path(run_dir).glob(".*.*.tmp")):
        pid = p.name.rsplit(".", 2)[-2]
        if p.is_file() and pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed


# what every row of this code has (roofline.measure.sweep writes them all); a row lacking one
# (an older or foreign writer) cannot be summarised or fitted
REQUIRED = ("kind", "model", "dtype", "mode", "q", "B", "L", "layers_run", "layers_full")


def _problem(row) -> str | None:
    if not isinstance(row, dict):
        return f"not a JSON object ({type(row).__name__})"
    if not isinstance(row.get("point_id"), str) or not row["point_id"]:
        return "no point_id"
    if row.get("status") not in STATUSES:
        return f"status={row.get('status')!r}, allowed {STATUSES}"
    if row.get("schema_version") != SCHEMA_VERSION:
        return f"schema_version={row.get('schema_version')!r}, this code reads {SCHEMA_VERSION}"
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        return f"missing field(s) {missing}"
    if row["status"] == "ok" and not (isinstance(row.get("t_median_s"), (int, float))
                                      and not isinstance(row["t_median_s"], bool) and row["t_median_s"] > 0
                                      and row["t_median_s"] != float("inf")):
        return f"status 'ok' without a positive finite t_median_s ({row.get('t_median_s')!r})"
    return None


@dataclass
class Resumed:
    rows: list[dict]  # the valid rows kept, in file order
    quarantined: list[dict] = field(default_factory=list)  # {line, reason} of each line moved out
    retried: list[str] = field(default_factory=list)  # point_ids of failed rows moved out to be measured again


def _append_lines(path: Path, lines: list[str]) -> None:
    with open(path, "a") as f:
        f.writelines(line + "\n" for line in lines)
        f.flush()
        os.fsync(f.fileno())


def check_lines(raw: bytes) -> tuple[list[tuple[bytes, dict]], list[tuple[int, bytes, str]]]:
    """Every line of a points.jsonl checked, writing nothing: ([(line, row)] kept in file order,
    [(line number, text, why)] of the bad ones). A second row of a point is bad, except that a
    measured row supersedes a failed one."""
    kept: list[tuple[bytes, dict]] = []
    bad: list[tuple[int, bytes, str]] = []
    seen: dict[str, int] = {}
    chunks = raw.split(b"\n")
    torn = chunks.pop()  # b"" when the file ends with a newline
    for n, line in enumerate(chunks, 1):
        if not line.strip():
            bad.append((n, line, "empty line"))
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            bad.append((n, line, f"not JSON ({e.msg if hasattr(e, 'msg') else e})"))
            continue
        why = _problem(row)
        if why is None and row["point_id"] in seen:
            first = kept[seen[row["point_id"]]][1]
            if first["status"] != "ok" and row["status"] == "ok":  # keep the measured one
                bad.append((n, kept[seen[row["point_id"]]][0], "duplicate point_id (a failed row, superseded)"))
                kept[seen[row["point_id"]]] = (line, row)
                continue
            why = "duplicate point_id"
        if why:
            bad.append((n, line, why))
            continue
        seen[row["point_id"]] = len(kept)
        kept.append((line, row))
    if torn:
        bad.append((len(chunks) + 1, torn, "torn last line (the writer was killed mid-line, or the disk was full)"))
    return kept, bad


def read_points(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """The valid rows of a run folder's points.jsonl and {line, reason} of each bad line, for a
    reader (fit, report, plots, compare): the checks of the resume, nothing moved or rewritten."""
    path = Path(run_dir) / POINTS
    if not path.exists():
        return [], []
    kept, bad = check_lines(path.read_bytes())
    return [r for _, r in kept], [dict(line=n, reason=why) for n, _, why in bad]


def load_points(run_dir: Path, retry: Collection[str] = TRANSIENT) -> Resumed:
    """Read and check points.jsonl (see the module docstring); rewrite it atomically when
    anything had to be moved out. Call with the folder's lock held."""
    path = Path(run_dir) / POINTS
    if not path.exists():
        return Resumed([])
    kept, bad = check_lines(path.read_bytes())
    out = Resumed([r for _, r in kept])
    moved_retry = [(line, r) for line, r in kept if r["status"] in retry]
    if moved_retry:
        _append_lines(path.with_name(RETRIED), [line.decode() for line, _ in moved_retry])
        out.retried = [r["point_id"] for _, r in moved_retry]
        out.rows = [r for _, r in kept if r["status"] not in retry]
    if bad:
        _append_lines(path.with_name(QUARANTINE), [json.dumps(dict(line=n, reason=why, text=text.decode(errors="replace")))
                                                   for n, text, why in bad])
        out.quarantined = [dict(line=n, reason=why) for n, _, why in bad]
    if bad or moved_retry:
        keep_lines = [line for line, r in kept if r["status"] not in retry]
        write_atomic(path, b"".join(line + b"\n" for line in keep_lines))
    return out


def set_aside(run_dir: Path) -> Path | None:
    """Move a previous run's files into run_dir/previous-<UTC time>/; None when there were none."""
    run_dir = Path(run_dir)
    present = [run_dir / f for f in RUN_FILES + DERIVED_FILES if (run_dir / f).exists()]
    present += [run_dir / d for d in DERIVED_DIRS if (run_dir / d).is_dir()]
    present += sorted(p for p in run_dir.glob(".*.tmp") if p.is_file())  # a write killed before its rename
    if not present:
        return None
    dest = run_dir / f"previous-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S%fZ}"
    dest.mkdir()
    for p in present:
        os.replace(p, dest / p.name)
    return dest
