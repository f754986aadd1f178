"""One meaning for `device`: a roofline/conf/device/ entry ties a torch device to its datasheet row, and each
command takes the half it means (sweep: the torch device; card: the datasheet row)."""

from __future__ import annotations

import pytest
import yaml

from roofline.cli.entry import CONF_DIR, compose_config, hydra_args, plain
from roofline.io.fields import ConfigError
from roofline.measure import devices
from roofline.measure.devices import get_datasheet, list_datasheets


def _device(config: str, *overrides: str, device_as: str):
    return plain(compose_config(config, list(overrides)), device_as=device_as)["device"]


def test_the_group_has_cpu_cuda_and_one_entry_per_datasheet_gpu_row():
    entries = {p.stem: yaml.safe_load(p.read_text()) for p in (CONF_DIR / "device").glob("*.yaml")}
    gpus = {s.key for s in list_datasheets() if s.kind == "gpu"}
    assert set(entries) == gpus | {"cpu", "cuda"}
    assert entries["cpu"] == dict(torch="cpu", datasheet="cpu")
    assert entries["cuda"] == dict(torch="cuda", datasheet=None)
    assert all(entries[k] == dict(torch="cuda", datasheet=k) for k in gpus)


def test_a_datasheet_row_gives_the_card_that_row_and_the_sweep_the_cuda_device():
    assert _device("card", "device=h200_sxm", device_as="datasheet") == "h200_sxm"
    assert _device("sweep", "device=h200_sxm", device_as="torch") == "cuda"
    assert _device("capacity", "device=h100_sxm", device_as="datasheet") == "h100_sxm"


def test_cpu_and_cuda_work_as_typed_and_a_gpu_index_goes_to_device_torch():
    assert _device("sweep", device_as="torch") == "cpu"  # the default
    assert _device("sweep", "device=cuda", device_as="torch") == "cuda"
    assert _device("ceilings", "device=cuda", "device.torch=cuda:1", device_as="torch") == "cuda:1"
    assert _device("card", "device=cpu", device_as="datasheet") == "cpu"


def test_device_null_leaves_the_card_and_predict_without_a_row():
    assert hydra_args(["device=null", "dtype=null"]) == ["~device", "dtype=null"]  # only a group's null
    assert _device("card", *hydra_args(["device=null"]), device_as="datasheet") is None
    assert _device("predict", device_as="datasheet") is None  # predict's default: no what-if


def test_ceilings_write_under_the_torch_device_name():
    cfg = compose_config("ceilings", ["device=h200_sxm"])
    assert plain(cfg)["out_dir"].endswith("ceilings-cuda")


def test_a_gpu_row_on_the_cpu_is_refused_naming_both_halves():
    with pytest.raises(ConfigError, match=r"device.datasheet='h200_sxm' is a gpu row but device.torch='cpu'"):
        _device("sweep", "device=h200_sxm", "device.torch=cpu", device_as="torch")


def test_a_row_that_is_not_the_running_gpu_is_refused(monkeypatch):
    import torch  # devices imports it where a device runs, not with the module
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices, "datasheet_for_running_device", lambda device="cuda": (get_datasheet("h100_sxm"), True))
    with pytest.raises(ConfigError, match=r"device=h200_sxm: cuda is a NVIDIA H100 SXM5 80GB \(h100_sxm\); "
                                          r"use device=cuda or device=h100_sxm"):
        devices.run_device("cuda", "h200_sxm")
    assert devices.run_device("cuda", "h100_sxm") == "cuda"


def test_cuda_in_a_datasheet_command_is_the_running_gpus_row(monkeypatch):
    monkeypatch.setattr(devices, "datasheet_for_running_device", lambda device="cuda": (get_datasheet("l40s"), True))
    assert devices.datasheet_row("cuda", None) == "l40s"
    with pytest.raises(ValueError, match=r"device='nope': unknown; allowed \["):
        devices.datasheet_row("cuda", "nope")
