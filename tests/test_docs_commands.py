"""The README and docs/ say what they can back: every command line in them is checked.

A command line is a line of a ```bash (sh, shell, console) block of README.md or docs/*.md, or an
inline code span that starts with `python -m roofline.cli.` or `roofline `. Each one is

- **run** for real on tiny inputs when it is in RUNS below (overrides substituted: the tiny
  model, the quick timer, outputs under a temporary folder);
- else **composed**: a `roofline.cli` or `roofline` line is composed by Hydra (`--cfg job`: every
  key, group option and value type checked, nothing run; a multirun (`-m`) line is split into its
  jobs and each composed); `python3 dev.py demo` composes every command the demo runs;
- else **marked**: its block follows `<!-- not-run: REASON -->` (a GPU, the package index, minutes
  of work). A marked block must hold a line that needs the mark, so a stale mark fails too.

Every check runs in one Python process (one torch import), so the whole page costs a few
seconds of composition plus the handful of real runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_BLOCKS = {"bash", "sh", "shell", "console"}
MARK = re.compile(r"^<!--\s*not-run:\s*(.*?)\s*-->$")
README_MAX_WORDS = 1500
DRIVER_TIMEOUT_S = 600

# A line run for real: its text (after $VAR expansion, shell quoting removed) -> the overrides
# that make it tiny ({tmp}: a fresh folder; {run}: a copy of the committed results/cpu-demo run;
# {synthetic}: a synthetic run folder of tests.helpers) and a file it must leave ("" for none).
QUICK_SWEEP = {"model": "tiny", "q": "[1,2]", "B": "[1]", "L": "[16]", "dtypes": "[float32]", "mtp_q": "[]",
               "timer": "quick", "noise.enabled": "false", "progress": "false", "out_dir": "{tmp}"}
RUNS = {
    "roofline.cli.sweep model=cpu-demo q=[1,2,4,8] B=[1,4] out_dir=results/runs/mine":
        (QUICK_SWEEP, "{tmp}/points.csv"),
    "roofline.cli.fit results_dir=results/runs/mine": ({"results_dir": "{run}", "folds": "2"}, "{run}/fit.json"),
    "roofline.cli.report results_dir=results/runs/mine": ({"results_dir": "{synthetic}"}, "{synthetic}/report.md"),
    "roofline.cli.predict fit=results/cpu-demo/fit.json drafter=ngram out_dir=results/runs/predict":
        ({"fit": "{run}/fit.json", "k": "[0,1,2]", "B": "[1,4]", "L": "[128]", "plot_L": "128", "out_dir": "{tmp}"},
         "{tmp}/predict.csv"),
    "roofline.cli.capacity model=llama-3.1-8b device=h100_sxm": ({"out_dir": "{tmp}"}, "{tmp}"),
    "roofline.cli.card model=llama-3.1-8b device=h200_sxm context=4096": ({}, ""),
    "roofline.cli.card checkpoint=results/trained-stdlib/target": ({}, ""),
    "roofline.cli.inventory before=results/trained-stdlib/target after=DIR":
        ({"after": "results/trained-stdlib/target"}, ""),
    "roofline.cli.compare a=results/cpu-demo b=results/runs/mine allow_other_model=true": ({"b": "{run}"}, ""),
    "roofline sweep --help": ({}, ""),
    "roofline -sc install=bash": ({}, ""),
}
# Lines no page may hold: each must fail its composition
BAD = [["roofline.cli.sweep", "model=tiny", "no_such_key=1"], ["roofline.cli.card", "model=no-such-preset"],
       ["roofline.cli.sweep", "-m", "model=tiny,cpu-demo", "timer.no_such_field=1"],
       ["roofline", "fit", "results_dir=x", "foldz=2"]]


@dataclass
class Line:
    where: str  # file:line
    text: str  # the command as written
    argv: list[str]  # after $VAR expansion and shell quoting
    mark: str | None = None  # the block's not-run reason
    checks: list[str] = field(default_factory=list)  # the driver's check ids (plan())


def _expand(text: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: env.get(m.group(1), m.group(0)), text)


def _tokens(text: str, env: dict[str, str]) -> list[str]:
    return shlex.split(_expand(text, env), comments=True)


def command(tokens: list[str]) -> list[str] | None:
    """`roofline.cli.<cmd> args...`, `roofline args...` or `dev.py <job>` of a shell line; None
    for any other program. `eval "$(...)"` is its inner command; a launcher before
    `-m roofline.cli.<cmd>` (torchrun, srun, a python) is dropped."""
    if tokens[:1] == ["eval"] and len(tokens) == 2 and (m := re.fullmatch(r"\$\((.*)\)", tokens[1])):
        tokens = shlex.split(m.group(1))
    for i, t in enumerate(tokens[:-1]):
        if t == "-m" and tokens[i + 1].startswith("roofline.cli."):
            return tokens[i + 1:]
    if tokens[:1] == ["roofline"]:
        return tokens
    if len(tokens) >= 3 and Path(tokens[0]).name.startswith("python") and tokens[1] == "dev.py":
        return tokens[1:]
    return None


def block_lines(rel: str, text: list[str]) -> tuple[list[Line], list[tuple[int, str]], list[str]]:
    """The command lines of a page's shell blocks, its prose lines (numbered), and its problems
    (a mark before no block). $VAR is what an earlier `VAR=value` line of the page set."""
    lines, prose, problems = [], [], []
    fence, info, mark, pending, env = None, "", None, None, {}
    i = 0
    while i < len(text):
        raw, stripped = text[i], text[i].strip()
        i += 1
        if fence is None:
            if stripped.startswith(("```", "~~~")):
                fence, info = stripped[:3], stripped[3:].strip().split(" ")[0].lower()
                mark, pending = pending, None
            elif (m := MARK.match(stripped)):
                if not m.group(1):
                    problems.append(f"{rel}:{i}: a not-run mark without a reason")
                pending = m.group(1) or "?"
            else:
                if stripped and pending is not None:
                    problems.append(f"{rel}:{i}: a not-run mark not followed by a code block")
                    pending = None
                prose.append((i, raw))
            continue
        if stripped.startswith(fence):
            fence = None
            continue
        start = i
        while raw.rstrip().endswith("\\") and i < len(text):  # a continued command
            raw = raw.rstrip()[:-1] + " " + text[i].strip()
            i += 1
        if info not in SHELL_BLOCKS or not raw.strip() or raw.strip().startswith("#"):
            continue
        if re.fullmatch(r"[A-Za-z_]\w*=\S*", raw.strip()):  # P=.venv/bin/python
            name, _, value = raw.strip().partition("=")
            env[name] = _expand(value, env)
            continue
        lines.append(Line(f"{rel}:{start}", raw.strip(), _tokens(raw, env), mark))
    if pending is not None:
        problems.append(f"{rel}: a not-run mark at the end of the page")
    return lines, prose, problems


def span_lines(rel: str, prose: list[tuple[int, str]]) -> list[Line]:
    """Inline code spans of the prose that are commands; a span may wrap onto the next line of
    its paragraph."""
    lines, paragraph = [], []
    for n, raw in prose + [(0, "")]:
        if raw.strip():
            paragraph.append((n, raw))
            continue
        joined, starts = "", []
        for n, r in paragraph:
            starts.append((len(joined), n))
            joined += r.strip() + " "
        for m in re.finditer(r"`([^`]+)`", joined):
            span = " ".join(m.group(1).split())
            if re.search(r"<\w+>", span):  # a template (`python -m roofline.cli.<name>`), not a command
                continue
            if span.startswith(("python -m roofline.cli.", "python3 -m roofline.cli.", "roofline ")):
                n = max(line for offset, line in starts if offset <= m.start())
                lines.append(Line(f"{rel}:{n}", span, shlex.split(span)))
        paragraph = []
    return lines


def doc_lines(path: Path) -> tuple[list[Line], list[str]]:
    """The command lines of one page, and its problems."""
    rel = path.relative_to(REPO).as_posix()
    lines, prose, problems = block_lines(rel, path.read_text().splitlines())
    return lines + span_lines(rel, prose), problems


def all_lines() -> tuple[list[Line], list[str]]:
    lines, problems = [], []
    for path in DOCS:
        got, bad = doc_lines(path)
        lines += got
        problems += bad
    return lines, problems


LINES, PROBLEMS = all_lines()


def composable(argv: list[str]) -> bool:
    return bool(argv) and (argv[0].startswith("roofline.cli.") or argv[0] == "roofline"
                           or argv[:2] == ["dev.py", "demo"])


def demo_commands() -> list[list[str]]:
    """The commands `python3 dev.py demo` runs, without running them."""
    sys.path.insert(0, str(REPO))
    try:
        import dev
    finally:
        sys.path.remove(str(REPO))
    ran: list[list[str]] = []
    real = dev.run
    dev.run = lambda *cmd: ran.append([str(c) for c in cmd])
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its closing line of wall time
            dev.demo()
    finally:
        dev.run = real
    return [command(cmd) for cmd in ran if command(cmd)]


def substitute(argv: list[str], overrides: dict[str, str], where: dict[str, str]) -> list[str]:
    """argv with each key of overrides set (replaced where given, else appended)."""
    values = {k: v.format(**{"tmp": "{tmp}", **where}) for k, v in overrides.items()}
    out = []
    for a in argv:
        k = a.split("=", 1)[0]
        out.append(f"{k}={values.pop(k)}" if "=" in a and k in values else a)
    return out + [f"{k}={v}" for k, v in values.items()]


# ---- the driver: one process, every check --------------------------------------------------

def drive(jobs_path: str, out_path: str) -> None:
    """Run each job of jobs_path (argv + compose or run) in this process; write rc and output."""
    import runpy

    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    def invoke(argv: list[str]) -> tuple[int, str]:
        GlobalHydra.instance().clear()
        out = io.StringIO()
        code = 0
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                if argv[0] == "roofline":
                    from roofline.cli import main as cli
                    cli.main(argv[1:])
                else:
                    sys.argv = [argv[0].replace(".", "/") + ".py", *argv[1:]]
                    runpy.run_module(argv[0], run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException as e:  # noqa: BLE001 - a traceback is a failed check, reported
                import traceback
                traceback.print_exc(file=out)
                code = 1
        return code, out.getvalue()

    def compose(argv: list[str]) -> tuple[int, str]:
        if any(a in ("--help", "-h", "-sc") or a.startswith("-sc") for a in argv):
            return invoke(argv)  # help and completion: cheap, and they are what the line shows
        head = 2 if argv[0] == "roofline" else 1
        args = argv[head:]
        if "-m" in args or "--multirun" in args:
            args = [a for a in args if a not in ("-m", "--multirun")]
            parsed = OverridesParser.create().parse_overrides(args)
            jobs = [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
        else:
            jobs = [args]
        for job in jobs:
            code, out = invoke([*argv[:head], *job, "--cfg", "job"])
            if code:
                return code, f"job {job}: " + out
        return 0, f"{len(jobs)} job(s) composed"

    results = {}
    for job in json.loads(Path(jobs_path).read_text()):
        t0 = time.perf_counter()
        code, out = (compose if job["mode"] == "compose" else invoke)(job["argv"])
        results[job["id"]] = dict(rc=code, out=out[-3000:], wall_s=round(time.perf_counter() - t0, 2))
        Path(out_path).write_text(json.dumps(results))


# ---- the checks ---------------------------------------------------------------------------

def plan(lines: list[Line], where: dict[str, str]) -> list[dict]:
    """The driver's jobs, one per distinct check; each line's checks name them."""
    jobs: dict[str, dict] = {}
    for line in lines:
        argv = line.argv and command(line.argv)
        if not argv:
            continue
        key = " ".join(argv)
        if key in RUNS:
            overrides, _ = RUNS[key]
            jobs.setdefault("run " + key, dict(id="run " + key, mode="run", argv=substitute(argv, overrides, where)))
            line.checks.append("run " + key)
        elif argv[:2] == ["dev.py", "demo"]:
            for cmd in demo_commands():
                k = "compose " + " ".join(cmd)
                jobs.setdefault(k, dict(id=k, mode="compose", argv=cmd))
                line.checks.append(k)
        elif composable(argv):
            jobs.setdefault("compose " + key, dict(id="compose " + key, mode="compose", argv=argv))
            line.checks.append("compose " + key)
    return list(jobs.values())


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict:
    """Every check of every page, run once in one process: {check id: {rc, out}}."""
    from tests.helpers import make_synthetic_run
    base = tmp_path_factory.mktemp("docs")
    shutil.copytree(REPO / "results" / "cpu-demo", base / "run")
    make_synthetic_run(base / "synthetic", ceilings=False)
    where = dict(run=str(base / "run"), synthetic=str(base / "synthetic"))
    jobs = plan(LINES, where) + [dict(id=f"bad {n}", mode="compose", argv=argv) for n, argv in enumerate(BAD)]
    for n, job in enumerate(jobs):  # a fresh folder per run
        if job["mode"] == "run":
            tmp = base / f"out{n}"
            job["argv"] = [a.replace("{tmp}", str(tmp)) for a in job["argv"]]
            job["tmp"] = str(tmp)
    (base / "jobs.json").write_text(json.dumps(jobs))
    env = dict(os.environ, ROOFLINE_RESULTS=str(base / "runs"))
    r = subprocess.run([sys.executable, "-c", "import sys; from tests.test_docs_commands import drive; "
                        "drive(sys.argv[1], sys.argv[2])", str(base / "jobs.json"), str(base / "results.json")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=DRIVER_TIMEOUT_S)
    results = json.loads((base / "results.json").read_text()) if (base / "results.json").exists() else {}
    assert r.returncode == 0, r.stderr[-3000:]
    for job in jobs:
        if job["mode"] == "run" and job["id"] in results:
            _, leaves = RUNS[job["id"][len("run "):]]
            path = leaves.format(tmp=job["tmp"], **where)
            if leaves and not Path(path).exists():
                results[job["id"]] = dict(rc=-1, out=f"ran, but left no {path}\n" + results[job["id"]]["out"])
    return results


@pytest.mark.slow
@pytest.mark.parametrize("n", range(len(BAD)), ids=[" ".join(argv) for argv in BAD])
def test_composition_fails_on_a_bad_line(n, checked):
    """The composition check can fail: a key, a group option or a multirun job that does not exist."""
    assert checked[f"bad {n}"]["rc"] == 2, checked[f"bad {n}"]


@pytest.mark.slow  # one Python start-up and the real runs of RUNS
@pytest.mark.parametrize("line", LINES, ids=[line.where for line in LINES])
def test_command_line_works(line: Line, checked):
    if not line.checks:
        assert line.mark, (f"{line.where}: `{line.text}` is neither run nor composed; run it in RUNS of "
                           "this test, or mark its block <!-- not-run: REASON -->")
        return
    for check in line.checks:
        result = checked.get(check)
        assert result is not None, f"{line.where}: {check} did not run (the driver stopped before it)"
        assert result["rc"] == 0, f"{line.where}: `{line.text}`: {check} exited {result['rc']}\n{result['out']}"


def test_every_run_and_mark_is_used():
    keys = {" ".join(c) for line in LINES if line.argv and (c := command(line.argv))}
    assert set(RUNS) <= keys, f"RUNS lines no page holds any more: {sorted(set(RUNS) - keys)}"
    assert not PROBLEMS, PROBLEMS
    needs = {}
    for line in LINES:
        if line.mark is not None:
            c = line.argv and command(line.argv)
            needs.setdefault(line.where.rsplit(":", 1)[0] + " " + line.mark, []).append(
                not (c and (" ".join(c) in RUNS or composable(c))))
    stale = [block for block, need in needs.items() if not any(need)]
    assert not stale, f"not-run marks on blocks whose every line is checked: {stale}"


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("page", DOCS, ids=[p.relative_to(REPO).as_posix() for p in DOCS])
def test_relative_links_point_to_files(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_readme_is_a_five_minute_read():
    words = len((REPO / "README.md").read_text().split())
    assert words <= README_MAX_WORDS, f"README.md has {words} words (at most {README_MAX_WORDS}); move depth into docs/"


def test_readme_table_lists_every_command():
    """Every entry point (an roofline/cli/ module with its roofline/conf/ file) has a row, found independently
    of the `roofline` command's own list."""
    commands = sorted(p.stem for p in (REPO / "roofline" / "cli").glob("*.py") if (REPO / "roofline" / "conf" / f"{p.stem}.yaml").exists())
    rows = {m.group(1).strip("` ") for m in re.finditer(r"^\| *([^|]+?) *\|", (REPO / "README.md").read_text(), re.M)}
    assert len(commands) >= 15
    missing = [c for c in commands + ["roofline"] if c not in rows]
    assert not missing, f"README's table of commands lacks {missing}"
