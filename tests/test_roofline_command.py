"""The `roofline` command: subcommands, Hydra completion through it, --help with every key's
comment, presets from $ROOFLINE_PRESETS in the model group, and a wheel that ships roofline/conf/."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from roofline.cli import main as cli
from roofline.model.presets import REPO_ROOT


def test_usage_lists_every_subcommand(capsys):
    cli.main([])
    out = capsys.readouterr().out
    assert out.startswith("usage: roofline <command>") and all(f"  {c} " in out for c in cli.COMMANDS)


def test_every_entry_point_and_config_is_a_subcommand():
    """Found independently of cli.COMMANDS: every roofline/cli/<name>.py with a Hydra entry and
    every roofline/conf/<name>.yaml is a subcommand, and every subcommand has both."""
    entries = {p.stem for p in (REPO_ROOT / "roofline" / "cli").glob("*.py") if "main_of(" in p.read_text() and p.stem != "entry"}
    configs = {p.stem for p in (REPO_ROOT / "roofline" / "conf").glob("*.yaml")}
    assert len(entries) >= 17 and entries == configs == set(cli.COMMANDS)
    assert all(cli.COMMANDS.values()), [c for c, line in cli.COMMANDS.items() if not line]


def test_an_unknown_subcommand_exits_2_naming_the_allowed_ones(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["swep"])
    assert e.value.code == 2 and "error: command 'swep': allowed ['acceptance', 'anchors'" in capsys.readouterr().err


def test_completion_of_the_subcommand_name(capsys, monkeypatch):
    monkeypatch.setenv("COMP_LINE", "roofline c")
    cli.main(["-sc", "query=bash"])
    assert capsys.readouterr().out.split() == ["capacity", "card", "ceilings", "collectives", "compare"]


def _run(args, env=None, cwd=REPO_ROOT):
    return subprocess.run([sys.executable, "-m", "roofline.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_completion_goes_through_to_the_subcommands_config():
    r = _run(["-sc", "query=bash"], env={"COMP_LINE": "roofline sweep model="})
    assert r.returncode == 0 and "model=cpu-demo" in r.stdout.split() and "model=tiny" in r.stdout.split()


def test_help_shows_each_keys_comment():
    r = _run(["sweep", "--help"])
    assert r.returncode == 0
    assert "dry_run: false  # true: print the expanded grid" in r.stdout
    assert "model: cpu-demo  # model preset" in r.stdout and "  every: 6  # points between" in r.stdout
    assert "# tokens already in each sequence's KV cache" in r.stdout
    assert "model: cpu-demo, deepseek-r1, deepseek-v3" in r.stdout
    assert "device: a100_40gb_pcie, " in r.stdout and "# roofline/conf/device/: cpu | cuda" in r.stdout


def test_presets_of_roofline_presets_are_in_the_model_group(tmp_path):
    text = (REPO_ROOT / "roofline" / "conf" / "model" / "tiny.yaml").read_text().replace("name: tiny", "name: my-tiny")
    (tmp_path / "my-tiny.yaml").write_text(text)
    r = _run(["card", "model=my-tiny"], env={"ROOFLINE_PRESETS": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert '"model": "my-tiny"' in r.stdout.splitlines()[-1]


@pytest.mark.slow
def test_a_wheel_ships_conf_and_runs_outside_the_checkout(tmp_path):
    """Built from a copy of the sources without the editable install's egg-info: setuptools takes
    data files listed in an existing SOURCES.txt, so a checkout with one shipped conf/ even when
    package-data named it wrongly (a fresh clone's wheel then had no configs)."""
    src = tmp_path / "src"
    shutil.copytree(REPO_ROOT, src, ignore=shutil.ignore_patterns(
        "*.egg-info", "build", ".venv", ".git", "results", "wheelhouse", "__pycache__", ".pytest_cache"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "whl"), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "whl").glob("roofline-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {"roofline/conf/sweep.yaml", "roofline/conf/model/tiny.yaml", "roofline/conf/hydra/quiet.yaml", "roofline/conf/device/h200_sxm.yaml"} <= set(names)
    assert "roofline = roofline.cli.main:main" in zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("entry_points.txt"))).decode()
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    r = _run(["card", "model=tiny"], env={"PYTHONPATH": str(site)}, cwd=work)
    assert r.returncode == 0, r.stderr  # no "Primary config directory not found"
    r = _run(["capacity", "model=tiny", "B=[1]", "memory_gb=1", "context=64", "output=16", "speculative=false"], env={"PYTHONPATH": str(site)}, cwd=work)
    assert r.returncode == 0, r.stderr
    assert (work / "results" / "runs" / "capacity").is_dir()  # the results root, not site-packages


def test_the_bash_hook_registers_for_roofline_with_or_without_a_subcommand(capsys):
    for argv in (["-sc", "install=bash"], ["sweep", "-sc", "install=bash"]):
        cli.main(argv)
        out = capsys.readouterr().out
        assert out.rstrip().endswith("-F _roofline_completion roofline") and "python" not in out


def test_completion_in_a_real_bash_offers_subcommands_keys_and_group_options():
    """The hook as a user installs it (`eval "$(roofline -sc install=bash)"`), then bash's own
    completion call of the function, as Tab makes it."""
    bindir = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(bindir, "roofline")):
        pytest.skip("the roofline script is not installed beside this python (pip install -e .)")
    script = r'''eval "$(roofline -sc install=bash)"
complete -p roofline
ask() { COMP_LINE="$1"; COMP_POINT=${#1}; COMP_WORDS=($1); [[ "$1" == *" " ]] && COMP_WORDS+=("");
        COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _roofline_completion; echo "${COMPREPLY[*]}"; }
ask "roofline sw"
ask "roofline sweep mod"
ask "roofline sweep model="'''
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PATH": bindir + os.pathsep + os.environ["PATH"]}, cwd=REPO_ROOT)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[0].endswith(" roofline"), r.stderr
    assert lines[1].split() == ["sweep"]
    assert "model=" in lines[2].split() and any(w.startswith("modes") for w in lines[2].split())  # a key and a group
    assert {"model=cpu-demo", "model=tiny"} <= set(lines[3].split())


def test_presets_of_roofline_presets_compose_beside_hydras_own_flags(tmp_path):
    """The presets folder reaches Hydra as a flag put first: an override appended after the
    user's `--cfg job` made Hydra's argument parser refuse the line."""
    text = (REPO_ROOT / "roofline" / "conf" / "model" / "tiny.yaml").read_text().replace("name: tiny", "name: my-tiny")
    (tmp_path / "my-tiny.yaml").write_text(text)
    r = subprocess.run([sys.executable, "-m", "roofline.cli.card", "model=my-tiny", "device=null", "--cfg", "job"],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ROOFLINE_PRESETS": str(tmp_path)})
    assert r.returncode == 0 and "name: my-tiny" in r.stdout, r.stderr
