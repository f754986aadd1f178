"""Bad input: one line, exit 2, the field named, nothing written; Ctrl-C and file-system errors too."""

import errno
import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from roofline.cli.entry import fail_fast
from roofline.commands import axis
from roofline.checkpoints.inventory import read_checkpoint
from roofline.checkpoints.loader import config_from_hf, shard_files
from roofline.io import results
from roofline.io.fields import ConfigError
from roofline.measure.slicing import slicing_error
from roofline.measure.sweep import SweepRequest
from roofline.measure.timer import TimerSettings
from roofline.model.presets import REPO_ROOT, get_preset


def _exit_of(exc, capsys):
    with pytest.raises(SystemExit) as e:
        with fail_fast():
            raise exc
    return e.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("exc, code, line", [
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/fit.json"), 2,
     "error: No such file or directory: /x/fit.json"),
    (PermissionError(errno.EACCES, "Permission denied", "/ro/run"), 2, "error: Permission denied: /ro/run"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/run.json"), 2, "error: Read-only file system: /ro/run.json"),
    (OSError(errno.ENOSPC, "No space left on device", "/full/points.jsonl"), 1,
     "error: No space left on device: /full/points.jsonl"),
    (ConfigError("q=[0]: allowed integers >= 1"), 2, "error: q=[0]: allowed integers >= 1"),
])
def test_file_system_and_input_errors_are_one_line(exc, code, line, capsys):
    assert _exit_of(exc, capsys) == (code, [line])


def test_a_library_valueerror_is_a_bug_and_keeps_its_traceback(capsys):
    """Only bad input exits 2: a ValueError that is not a ConfigError (an internal check of the
    library) propagates, after its one line, so its traceback is seen."""
    with pytest.raises(ValueError, match="median_ci: no samples"):
        with fail_fast():
            raise ValueError("median_ci: no samples")
    assert capsys.readouterr().err.strip() == "error: median_ci: no samples"


def test_a_file_that_is_not_json_is_bad_input(capsys):
    import json
    code, _ = _exit_of(json.JSONDecodeError("Expecting value", "{", 1), capsys)
    assert code == 2


def test_ctrl_c_exits_130_saying_what_was_saved(capsys):
    from roofline.measure.sweep import SweepInterrupted
    code, lines = _exit_of(SweepInterrupted(dict(ok=3, failed=1, run_dir="/r")), capsys)
    assert code == 130 and lines == ["interrupted: 4 points saved in /r (SIGINT); the same command resumes"]


def test_sigterm_exits_143_saying_what_was_saved(capsys):
    import signal
    from roofline.measure.sweep import SweepInterrupted
    code, lines = _exit_of(SweepInterrupted(dict(ok=2, failed=0, run_dir="/r"), signal.SIGTERM), capsys)
    assert code == 143 and lines == ["interrupted: 2 points saved in /r (SIGTERM); the same command resumes"]


def test_grid_axes_accept_a_scalar():
    assert axis(4, "q") == (4,) and axis([1, 2], "q") == (1, 2)
    with pytest.raises(ConfigError, match="q: the grid has no points"):
        axis(None, "q")


def test_an_unknown_timer_key_is_named():
    from roofline.io.fields import from_dict
    with pytest.raises(ConfigError, match=r"timer: unknown field\(s\) \['foo'\]; allowed \["):
        from_dict(TimerSettings, dict(warmup=1, foo=2), "timer")


def test_a_sliced_config_that_cannot_be_built_fails_fast():
    with pytest.raises(ConfigError, match="layers=1: 1 layers of 'deepseek-v3' cannot be built.*first_dense_layers"):
        SweepRequest(model=get_preset("deepseek-v3"), q=(1,), B=(1,), L=(0,), layers=1)


def test_slicing_bad_arguments_name_the_field(tmp_path):
    with pytest.raises(ConfigError, match="full_dir='/nope': not a run folder"):
        results.load_run("/nope", "full_dir")
    with pytest.raises(ConfigError, match="sliced_dir is required"):
        results.load_run(None, "sliced_dir")
    import pandas as pd
    failed = pd.DataFrame(dict(kind=["forward"], dtype="bfloat16", mode="eager", q=1, B=1, L=0, status="oom"))
    with pytest.raises(ConfigError, match="full_dir: the run has no"):
        slicing_error(failed, failed)


def test_config_json_missing_a_field_names_it():
    raw = dict(architectures=["LlamaForCausalLM"], hidden_size=64, num_attention_heads=4, vocab_size=128,
               num_hidden_layers=2, max_position_embeddings=256)
    with pytest.raises(ConfigError, match="config.json: missing field 'intermediate_size'"):
        config_from_hf(raw)


def _model_folder(tmp_path, name="m"):
    folder = tmp_path / name
    folder.mkdir()
    save_file({"a.weight": torch.zeros(2, 2)}, str(folder / "model-1.safetensors"))
    return folder


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_a_shard_index_naming_a_file_outside_the_folder_is_refused(tmp_path, shard):
    folder = _model_folder(tmp_path)
    save_file({"b.weight": torch.zeros(2)}, str(tmp_path / "outside.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a.weight": "model-1.safetensors", "b.weight": shard}}))
    with pytest.raises(ConfigError, match="outside the folder"):
        shard_files(folder)
    with pytest.raises(ConfigError, match="after=.*outside the folder"):
        read_checkpoint(folder, "after")


def test_a_corrupt_safetensors_file_names_the_side(tmp_path):
    folder = _model_folder(tmp_path)
    (folder / "model-1.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ConfigError, match="before=.*model-1.safetensors is not a readable safetensors file"):
        read_checkpoint(folder, "before")


def test_inventory_of_a_corrupt_file_exits_2_not_the_loss_code(tmp_path):
    good = _model_folder(tmp_path, "good")
    bad = _model_folder(tmp_path, "bad")
    (bad / "model-1.safetensors").write_bytes(b"garbage")
    r = subprocess.run([sys.executable, "-m", "roofline.cli.inventory", f"before={good}", f"after={bad}"],
                       cwd=REPO_ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: after="), r.stderr


def test_sweep_cli_takes_a_scalar_axis_and_names_an_unknown_timer_key(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "roofline.cli.sweep", "model=tiny", "q=2", "B=1", "L=0", "progress=false",
                         "timer.min_reps=3", "timer.budget_s=0.02", f"out_dir={tmp_path / 'a'}"],
                        cwd=REPO_ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.strip().splitlines()[-1])["points"] == 2  # forward + mtp at q=2
    bad = subprocess.run([sys.executable, "-m", "roofline.cli.sweep", "model=tiny", "+timer.foo=1",
                          f"out_dir={tmp_path / 'b'}"], cwd=REPO_ROOT, capture_output=True, text=True)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: timer: unknown field(s) ['foo']")
    assert not (tmp_path / "b").exists()


# Hydra's own errors, raised while composing the config: each invocation runs in one child
# interpreter (fresh Hydra state per case), in an empty folder with the results root inside it.
HYDRA_CASES = {
    "a key the config lacks": (["roofline.cli.sweep", "timer.foo=1"], "timer.foo"),
    "an override that does not parse": (["roofline.cli.sweep", "q=[1,2"], "q=[1,2"),
    "a group option that does not exist": (["roofline.cli.sweep", "model=nope"], "model=nope"),
    "a device the group does not hold": (["roofline.cli.card", "device=foo"], "device=foo"),
    "a key another command spells otherwise": (["roofline.cli.card", "B=8"],
                                                "B: card has no such key; did you mean batch="),
    "a key appended with + that nothing reads": (["roofline.cli.card", "+B=8"],
                                                  "B: card has no such key; did you mean batch="),
    "a key appended to a device entry": (["roofline.cli.card", "+device.foo=1"], "device.foo: card has no such key"),
    "a misspelt nested key": (["roofline.cli.sweep", "timer.min_rep=3"], "did you mean timer.min_reps="),
    "a plan's batch given as a step's": (["roofline.cli.capacity", "batch=8"], "did you mean B="),
}
_DRIVER = """
import contextlib, io, json, runpy, sys
from hydra.core.global_hydra import GlobalHydra
out = []
for module, *args in json.loads(sys.argv[1]):
    sys.argv = [module.replace(".", "/") + ".py", *args]
    err, code = io.StringIO(), 0
    with contextlib.redirect_stderr(err):
        try:
            runpy.run_module(module, run_name="__main__")
        except SystemExit as e:
            code = e.code
    GlobalHydra.instance().clear()
    out.append(dict(code=code, stderr=err.getvalue()))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def hydra_errors(tmp_path_factory):
    work = tmp_path_factory.mktemp("work")
    cases = [argv for argv, _ in HYDRA_CASES.values()]
    r = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(cases)], cwd=work, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "ROOFLINE_RESULTS": str(work / "runs")},
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return dict(zip(HYDRA_CASES, json.loads(r.stdout.strip().splitlines()[-1]))), work


@pytest.mark.parametrize("case", list(HYDRA_CASES))
def test_hydra_errors_are_one_line_naming_the_key_exit_2(case, hydra_errors):
    results, _ = hydra_errors
    lines = results[case]["stderr"].strip().splitlines()
    assert results[case]["code"] == 2 and len(lines) == 1, results[case]
    assert lines[0].startswith("error: ") and HYDRA_CASES[case][1] in lines[0]


def test_hydra_errors_write_nothing(hydra_errors):
    _, work = hydra_errors
    assert list(work.iterdir()) == []  # no run folder, no results root, no outputs/ of Hydra's


def test_an_unknown_device_lists_the_entries_and_says_how_to_pick_a_gpu(hydra_errors):
    line = hydra_errors[0]["a device the group does not hold"]["stderr"].strip()
    assert "allowed [" in line and "'h200_sxm'" in line and "device.torch=cuda:N" in line


def test_every_entry_point_composes_through_the_one_wrapper():
    """hydra.main called directly would print Hydra's multi-line errors again."""
    direct = [f.name for f in (REPO_ROOT / "roofline" / "cli").glob("*.py")
              if f.name != "entry.py" and "hydra.main(" in f.read_text()]
    assert direct == []
