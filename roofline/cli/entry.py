"""The one adapter between Hydra and the library: plain dicts in, clean errors out."""

from __future__ import annotations

import difflib
import errno
import functools
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import signal
import sys
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException
from hydra.types import RunMode
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from roofline.io import files
from roofline.io.results import RUNS_ROOT, aggregate_jobs
from roofline.measure import devices
from roofline.measure.memory import TooBig
from roofline.io.fields import ConfigError
from roofline.io.runfolder import Signals
from roofline.cli import schema

JOB_FILE = "job.json"
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def yaml_values(name: str) -> dict:
    """What roofline/conf/<name>.yaml composes over its schema: its values, and for each config
    group of its defaults list the option it picks."""
    path = CONF_DIR / f"{name}.yaml"
    raw = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else {}
    values = {k: v for k, v in raw.items() if k != "defaults"}
    for entry in raw.get("defaults", []):
        if isinstance(entry, dict):
            (group, option), = entry.items()
            if group not in ("hydra", "override hydra"):
                values.setdefault(group, option)
    return values


def _help_text(name: str) -> str:
    """--help's list of keys: `key: value  # help`, the value the command composes by default
    ($ escaped for Hydra's template)."""
    return "\n".join(schema.help_lines(name, yaml_values(name))).replace("$", "$$")


# ${roofline_runs:} is the one results root in every config; ${roofline_help:NAME} is --help's text
OmegaConf.register_new_resolver("roofline_runs", lambda: str(RUNS_ROOT), replace=True)
OmegaConf.register_new_resolver("roofline_help", _help_text, replace=True)


# what `device` (a roofline/conf/device/ entry: torch device + datasheet row) means to a command
_DEVICE_AS = {"torch": devices.run_device, "datasheet": devices.datasheet_row}


def _each_key(composed: dict, defaults, visit, where: str = "") -> None:
    """visit(composed, key, default, where) for every key the command's schema gives a default and the
    composed config has, nested groups too."""
    if not isinstance(defaults, dict) or not isinstance(composed, dict):
        return
    for key, default in defaults.items():
        if key in composed and key != "defaults":
            visit(composed, key, default, where)
            _each_key(composed[key], default, visit, f"{where}{key}.")


def _flag(composed: dict, key: str, default, where: str) -> None:
    if isinstance(default, bool) and not isinstance(composed[key], bool):
        raise ConfigError(f"{where}{key}={composed[key]!r}: allowed true or false")


def _list(composed: dict, key: str, default, where: str) -> None:
    value = composed[key]
    if isinstance(default, list) and value is not None and not isinstance(value, (list, dict)):
        composed[key] = [value]


# keys that mean the same thing in commands that spell them differently (a single step's `batch` and
# `context`, a sweep's or a plan's `B` and `L`)
_SAME_MEANING = {"B": ("batch",), "batch": ("B",), "L": ("context",), "context": ("L",)}


# config groups whose entries are records this adapter reads key by key (a device's torch device and
# datasheet row, an engine's profile name): a key appended to one would be composed and then not read
_RECORD_GROUPS = ("device", "engine")


@functools.cache
def _record_keys(group: str) -> frozenset[str]:
    return frozenset(k for f in (CONF_DIR / group).glob("*.yaml") for k in OmegaConf.load(f))


def unknown_key_line(name: str, key: str) -> str:
    """One line for a key (dotted: a nested one) the command `name` does not have: the key, the keys it may
    have meant (the same meaning under another name in this command, or a near spelling), where they are listed."""
    *path, last = key.split(".")
    keys = schema.keys(name)
    for part in path:
        node = keys.get(part)
        keys = (node.default if node is not None and isinstance(node.default, dict)
                else dict.fromkeys(_record_keys(part)) if part in _RECORD_GROUPS and len(path) == 1 else {})
    meant = [k for k in _SAME_MEANING.get(last, ()) if k in keys] if not path else []
    meant += [k for k in difflib.get_close_matches(last, list(keys), n=3, cutoff=0.75) if k not in meant]
    prefix = "".join(f"{p}." for p in path)
    hint = f"; did you mean {' or '.join(f'{prefix}{k}=' for k in meant)}" if meant else ""
    return f"{key}: {name} has no such key{hint} (`--help` lists its keys)"


def _refuse_appended_keys(name: str, composed: dict) -> None:
    """A key the schema lacks, appended with Hydra's `+key=value`, would be composed and then silently
    not read (`card +B=8` priced batch 1): refused as the key without `+` is, and so is a key appended
    to a device or engine entry (the model and timer entries are checked field by field by the library)."""
    extra = [k for k in composed if k not in schema.keys(name) and k != "overrides"]
    for group in _RECORD_GROUPS:
        if isinstance(composed.get(group), dict):
            extra += [f"{group}.{k}" for k in composed[group] if k not in _record_keys(group)]
    if extra:
        raise ConfigError(unknown_key_line(name, extra[0]))


def _check_flags(composed: dict, defaults) -> None:
    """A key whose default (the command's schema) is true/false takes only true or false
    (`force=maybe` is refused, not taken as true)."""
    _each_key(composed, defaults, _flag)


def _lists_from_scalars(composed: dict, defaults) -> None:
    """A key whose default (the command's schema) is a list takes one value as the list of that value
    (`B=16` is `B=[16]`), where each command would otherwise iterate over a number; in place."""
    _each_key(composed, defaults, _list)


def plain(cfg: DictConfig, device_as: str | None = None) -> dict:
    """The composed config as a dict, with the command-line overrides (provenance).

    device_as: the string the library takes for the `device` entry: "torch" (the device to run
    on) or "datasheet" (the datasheet row; `cuda` means the running GPU's). device=null: None."""
    c = OmegaConf.to_container(cfg, resolve=True)
    # a required key left unset (MISSING in the schema) reaches the library as None: its check names the key
    c = {k: None if v == MISSING else v for k, v in c.items()}
    c["overrides"] = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    if HydraConfig.initialized():
        name = HydraConfig.get().job.config_name
        _refuse_appended_keys(name, c)
        defaults = schema.defaults(name)
        _check_flags(c, defaults)
        _lists_from_scalars(c, defaults)
    if device_as is not None:
        entry = c.get("device")
        c["device"] = None if entry is None else _DEVICE_AS[device_as](entry["torch"], entry["datasheet"])
    return c


def _multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def job_dir(record: dict | None) -> None:
    """In a multirun, leave the job's summary where the aggregation callback looks for it (None:
    a follower rank of a torchrun / srun launch, whose rank 0 reports)."""
    if record is not None and _multirun():
        out = Path(HydraConfig.get().runtime.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        files.write_json_atomic(out / JOB_FILE, record, indent=None)


BAD_INPUT = 2  # exit status of bad input (a field, a path, a file), everywhere
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT; SIGTERM: 143), after what was measured is saved
# what bad input raises: a field (ConfigError), a point too big for the device, a file that is not
# JSON or text; any other exception (a ValueError of the library included) is a bug: its traceback
BAD_INPUT_ERRORS = (ConfigError, TooBig, json.JSONDecodeError, UnicodeDecodeError)
# file-system errors that mean the path given was wrong (missing, not writable, not a folder)
_BAD_PATH = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR, errno.EEXIST}


def _one_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def interrupted_multirun(saved: dict | None) -> None:
    """A multirun stopped by Ctrl-C or SIGTERM (Hydra calls no end callback then): the job it
    stopped records its run folder, and every finished point of every job is aggregated."""
    hc = HydraConfig.get()
    job = Path(hc.runtime.output_dir)
    job.mkdir(parents=True, exist_ok=True)
    files.write_json_atomic(job / JOB_FILE, dict(status="interrupted", **(saved or {})), indent=None)
    aggregate_finished()


class _Sweep:
    """The running multirun's sweep folder, as its jobs saw it. Hydra clears its config when a job
    returns (run_job puts back the one it found: none), so between two jobs `_multirun()` is
    false; a signal that lands there still aggregates the finished jobs."""
    dir: Path | None = None


_SWEEP = _Sweep()


def _remember_sweep() -> None:
    if _multirun():
        _SWEEP.dir = Path(HydraConfig.get().sweep.dir).absolute()


def _sweep_dir() -> Path | None:
    _remember_sweep()
    return _SWEEP.dir


def aggregate_finished() -> None:
    """Every finished point of every job so far, aggregated, and said on stderr."""
    summary = aggregate_jobs(_sweep_dir(), JOB_FILE)
    print(f"multirun interrupted: {summary['rows']} points saved across {summary['jobs']} job(s), "
          f"aggregated in {summary['aggregate']}", file=sys.stderr)


class _Saved:
    """What a command has saved so far (its summary dict), for the message of a late interrupt."""
    summary: dict | None = None


_LAST = _Saved()  # the running command's (fail_fast's), for a signal that lands after it returned


def _interrupted_line(saved: dict | None, signum: int) -> str:
    name = signal.Signals(signum).name
    if saved:
        return (f"interrupted: {saved['ok'] + saved['failed']} points saved in {saved['run_dir']} ({name}); "
                "the same command resumes")
    return f"interrupted ({name})"


def _late_signal(signum, frame) -> None:
    """A signal outside fail_fast: while Hydra composes (nothing written yet) or after the command
    returned (everything it wrote is whole: every write is atomic). Say so, exit 128 + signum at
    once; the interpreter's teardown has nothing left to save."""
    try:
        print(_interrupted_line(_LAST.summary, signum), file=sys.stderr)
        # between two jobs (or after the last): the finished jobs are aggregated, as after an interrupt in one
        if _multirun() or _SWEEP.dir is not None:
            try:
                aggregate_finished()
            except Exception as e:  # os._exit below would drop it without a word: say what stopped it
                print(f"multirun interrupted: the finished jobs were not aggregated ({type(e).__name__}: "
                      f"{_one_line(e)}); the same command resumes", file=sys.stderr)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(128 + signum)


def hold_signals_to_the_end() -> None:
    """SIGINT and SIGTERM exit 128 + signum with a message until the process ends, also in the
    moments no fail_fast holds them (CI found a SIGTERM that landed after the sweep's summary, in
    the interpreter's teardown: the process died of it, returncode -15, without a word)."""
    if threading.current_thread() is threading.main_thread():
        for s in Signals.HANDLED:
            signal.signal(s, _late_signal)


@contextmanager
def fail_fast():
    """Bad input (BAD_INPUT_ERRORS) exits 2 with the library's message (it names the field and the
    allowed values); any other exception keeps its traceback;
    a file-system error is one line too (2 when the path is wrong, 1 when the disk is full).
    Ctrl-C says what was saved and exits 130.

    In a multirun a failed job records its error in its job.json and returns, so the other
    jobs run and the aggregation callback sees every job (and then exits non-zero).

    SIGINT and SIGTERM are handled for the whole command, not only while points are measured: a
    signal that lands after the last point (while the summary or the report is written) still
    exits 128 + signum and says what was saved. A command that has its summary sets
    `done.summary`, and an interrupt after that point reports it."""
    global _LAST
    done = _LAST = _Saved()
    _remember_sweep()
    try:
        with Signals():
            yield done
    except KeyboardInterrupt as e:
        saved = getattr(e, "summary", None) or done.summary
        signum = getattr(e, "signum", INTERRUPTED - 128)
        print(_interrupted_line(saved, signum), file=sys.stderr)
        if _multirun():
            interrupted_multirun(saved)
        sys.exit(128 + signum)
    except Exception as e:
        print(f"error: {_one_line(e)}", file=sys.stderr)
        if _multirun():
            job_dir(dict(status="failed", error=f"{type(e).__name__}: {e}"))
            return
        if isinstance(e, BAD_INPUT_ERRORS):
            sys.exit(BAD_INPUT)
        if isinstance(e, OSError):
            sys.exit(BAD_INPUT if e.errno in _BAD_PATH else 1)
        raise


def hydra_error_line(e: BaseException) -> str:
    """Hydra's multi-line report of a composition error as one line naming the key or group."""
    if isinstance(e, MissingConfigException) and e.options is not None and "/" in (e.missing_cfg_file or ""):
        group, _, option = e.missing_cfg_file.rpartition("/")
        hint = "; a GPU by index: device=cuda device.torch=cuda:N" if group == "device" else ""
        return f"{group}={option}: unknown; allowed {sorted(e.options)}{hint}"
    cause = e.__cause__
    schema_key = re.match(r"Key '[^']+' not in '(\w+?)_schema(_\w+)?'", str(cause or ""))
    if (isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and schema_key and getattr(cause, "full_key", None)
            and importlib.util.find_spec(f"roofline.commands.{schema_key.group(1)}")):
        return unknown_key_line(schema_key.group(1), cause.full_key)
    text = str(e).split("\nConfig search path:")[0]
    parts = [line.strip().rstrip(".") for line in text.splitlines() if line.strip()]
    if isinstance(cause, OmegaConfBaseException) and str(cause).strip():
        parts.insert(1, str(cause).strip().splitlines()[0].rstrip("."))
    line = "; ".join(parts) or type(e).__name__
    override = getattr(e, "override", None)  # OverrideParseException: the override Hydra could not read
    return f"{override}: {line}" if override and override not in line else line


def hydra_args(args: list[str]) -> list[str]:
    """The command line as Hydra 1.3 takes it: `group=null` (no option, as a defaults list
    writes it; e.g. the card's `device=null`) becomes `~group`, which Hydra wants instead."""
    return [f"~{a[:-len('=null')]}" if a.endswith("=null") and (CONF_DIR / a[:-len("=null")]).is_dir() else a
            for a in args]


def staged_presets(folders: list[Path]) -> Path:
    """One folder holding a `model/` group of links to the preset YAML files of `folders` (Hydra
    wants a group folder in a search-path entry), one per set of folders, reused."""
    key = hashlib.sha256(os.pathsep.join(map(str, folders)).encode()).hexdigest()[:12]
    stage = Path(tempfile.gettempdir()) / f"roofline-presets-{os.getuid()}-{key}"
    (stage / "model").mkdir(parents=True, exist_ok=True)
    for folder in folders:
        for f in sorted(folder.glob("*.yaml")):
            link = stage / "model" / f.name
            if link.is_symlink() and link.resolve() != f.resolve():
                link.unlink()
            if not link.exists():
                link.symlink_to(f.resolve())
    return stage


def preset_search_path(argv: list[str]) -> list[str]:
    """The Hydra flag that lets the preset folders of $ROOFLINE_PRESETS (os.pathsep-separated, the
    ones the library's registry roofline.model.presets reads) join the `model` group: Hydra
    searches a --config-dir after roofline/conf/, so a built-in preset keeps its name. A flag,
    put first, and not an override: an override after the user's `--cfg job` would be refused
    by Hydra's argument parser. None where the user gives a --config-dir of their own."""
    folders = [Path(p) for p in os.environ.get("ROOFLINE_PRESETS", "").split(os.pathsep) if p]
    if not folders or any(a in ("--config-dir", "-cd") or a.startswith("--config-dir=") for a in argv):
        return []
    return ["--config-dir", str(staged_presets(folders))]


def command(config_name: str):
    """hydra.main over roofline/conf/<config_name>.yaml for an entry point in roofline/cli/. Hydra's own
    errors (a key the config lacks, an override it cannot parse, a group option that does not
    exist) become one line on stderr and exit 2: they happen while composing, before the
    command runs or writes anything. HYDRA_FULL_ERROR=1 keeps Hydra's full report."""
    schema.register(config_name)

    def wrap(task):
        # absolute: Hydra reads it as a folder, whichever module defines the task
        app = hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base="1.3")(task)

        @functools.wraps(task)
        def main() -> None:
            hold_signals_to_the_end()
            sys.argv[1:] = preset_search_path(sys.argv[1:]) + hydra_args(sys.argv[1:])
            before = os.environ.get("HYDRA_FULL_ERROR")
            if before == "1":
                return app()
            os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra re-raises its errors instead of printing them
            try:
                return app()
            # a ValueError here is Hydra's (the command's own are fail_fast's, inside the task)
            except (HydraException, OmegaConfBaseException, ValueError) as e:
                print(f"error: {hydra_error_line(e)}", file=sys.stderr)
                sys.exit(BAD_INPUT)
            finally:
                if before is None:
                    os.environ.pop("HYDRA_FULL_ERROR", None)
                else:
                    os.environ["HYDRA_FULL_ERROR"] = before
        return main
    return wrap


def main_of(name: str):
    """The Hydra entry of the command `name` (roofline/cli/<name>.py is this and nothing else):
    compose roofline/conf/<name>.yaml, give the plain dict to roofline.commands.<name>.run (with
    `device` as its module's DEVICE_AS says: "torch", "datasheet" or absent; with `done` where
    run takes it), and turn what run returns into the exit: an int is the exit status (a CI
    verdict), a dict the job record a multirun aggregates."""
    module = importlib.import_module(f"roofline.commands.{name}")
    takes_done = "done" in inspect.signature(module.run).parameters

    def main(cfg) -> None:
        with fail_fast() as done:
            c = plain(cfg, device_as=getattr(module, "DEVICE_AS", None))
            result = module.run(c, done) if takes_done else module.run(c)
            if isinstance(result, dict):
                job_dir(result)
            elif isinstance(result, int) and not isinstance(result, bool) and result:
                sys.exit(result)
    # the task belongs to roofline.cli.<name>: Hydra names the job after the task's module
    main.__module__, main.__doc__ = f"roofline.cli.{name}", module.__doc__
    return command(name)(main)


def compose_config(name: str, overrides: list[str] = ()) -> DictConfig:
    """The config the entry point of `name` composes for `overrides` (Hydra's compose API; tests)."""
    from hydra import compose, initialize_config_dir
    schema.register(name)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(name, overrides=hydra_args(list(overrides)))
