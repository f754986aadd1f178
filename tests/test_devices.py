"""The datasheet table: sources, units, invariants between columns, and device detection."""

from __future__ import annotations

import pytest
import torch

from roofline.measure import devices
from roofline.measure.devices import detect, get_datasheet, list_datasheets, parse_device, datasheet_for_running_device
from roofline.model.dtypes import DATASHEET_COLUMNS

GPUS = [s for s in list_datasheets() if s.kind == "gpu"]


def _ids(rows):
    return [r.key for r in rows]


@pytest.mark.parametrize("sheet", list_datasheets(), ids=_ids(list_datasheets()))
def test_every_number_has_a_source_url(sheet):
    for field, dtype, _ in sheet.numbers():
        source = sheet.source_for(field, dtype)
        where = f"{sheet.key}.{field}" + (f".{dtype}" if dtype else "")
        assert source and "http" in source, f"{where} has no source URL"


@pytest.mark.parametrize("sheet", GPUS, ids=_ids(GPUS))
def test_gpu_units_are_sane(sheet):
    assert 100 <= sheet.mem_bw_GBps <= 20_000, "bandwidth must be GB/s (1 GB = 1e9 B)"
    assert sheet.bandwidth_Bps() == pytest.approx(sheet.mem_bw_GBps * 1e9)
    for field, _, value in sheet.numbers():
        assert value > 0, f"{sheet.key}.{field} must be positive"
    for d, tflops in sheet.dense_tflops.items():
        if tflops is not None:
            assert 1 <= tflops <= 50_000, f"{sheet.key}.dense_tflops.{d} must be TFLOP/s"
    assert sheet.mem_bytes is None or 1e9 <= sheet.mem_bytes <= 1e12
    assert sheet.l2_bytes is None or 1 << 20 <= sheet.l2_bytes <= 1 << 30


@pytest.mark.parametrize("sheet", GPUS, ids=_ids(GPUS))
def test_dense_never_exceeds_sparse(sheet):
    both = [d for d in DATASHEET_COLUMNS
            if sheet.dense_tflops.get(d) is not None and sheet.sparse_tflops.get(d) is not None]
    for d in both:
        assert sheet.dense_tflops[d] <= sheet.sparse_tflops[d], f"{sheet.key}.{d}"


@pytest.mark.parametrize("sheet", GPUS, ids=_ids(GPUS))
def test_narrower_dtypes_are_not_slower(sheet):
    chain = [sheet.dense_tflops.get(d) for d in ("fp32", "bf16", "fp8")]
    present = [v for v in chain if v is not None]
    assert present == sorted(present), f"{sheet.key}: expected fp8 >= bf16 >= fp32, got {chain}"


DEVICE_NAMES = [
    ("NVIDIA H200", "h200_sxm"),
    ("NVIDIA H200 NVL", "h200_nvl"),
    ("NVIDIA H100 80GB HBM3", "h100_sxm"),
    ("NVIDIA H100 PCIe", "h100_pcie"),
    ("NVIDIA A100-SXM4-80GB", "a100_80gb_sxm"),
    ("NVIDIA A100-SXM4-40GB", "a100_40gb_sxm"),
    ("NVIDIA A100-PCIE-40GB", "a100_40gb_pcie"),
    ("NVIDIA A100 80GB PCIe", "a100_80gb_pcie"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA B200", "b200"),
    ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI325X", "mi325x"),
    ("NVIDIA H20", "h20"),
    ("NVIDIA B300 SXM6 AC", "b300"),
    ("AMD Instinct MI355X", "mi355x"),
    ("NVIDIA H800", "h800"),
    ("NVIDIA H800 80GB HBM3", "h800"),
    ("NVIDIA A800-SXM4-80GB", "a800_80gb_sxm"),
    ("NVIDIA GB200", "gb200"),
]


@pytest.mark.parametrize(("device_name", "key"), DEVICE_NAMES)
def test_detect_maps_real_device_names_to_their_row(device_name, key):
    sheet = detect(device_name)
    assert sheet is not None and sheet.key == key


@pytest.mark.parametrize("device_name",
                         ["NVIDIA GeForce GTX 1080", "NVIDIA L40", "NVIDIA H100 NVL",
                          "AMD EPYC 9B14", ""])
def test_detect_returns_none_for_unknown_names(device_name):
    assert detect(device_name) is None


def test_every_gpu_row_is_detectable():
    assert {key for _, key in DEVICE_NAMES} == {s.key for s in GPUS}


def test_h200_bf16_ridge_is_206_flop_per_byte():
    assert get_datasheet("h200_sxm").ridge("bfloat16") == pytest.approx(206, rel=0.02)


def test_h100_sxm_bandwidth_matches_reference_figure():
    assert get_datasheet("h100_sxm").bandwidth_Bps() == pytest.approx(3.35e12, rel=1e-3)


def test_peak_flops_accepts_torch_and_short_dtype_names():
    h200 = get_datasheet("h200_sxm")
    assert h200.peak_flops(str(torch.bfloat16)) == h200.peak_flops("bf16") == 989.5e12
    assert h200.peak_flops("float16") == h200.peak_flops("fp16")
    assert h200.peak_flops("float32") == pytest.approx(67e12)
    assert h200.peak_flops("bf16", sparse=True) == pytest.approx(1979e12)


def test_unknown_dtype_fails_naming_allowed_names():
    with pytest.raises(ValueError, match="allowed.*bf16"):
        get_datasheet("h200_sxm").peak_flops("int4")


def test_ridge_is_none_where_a_datasheet_number_is_missing():
    assert get_datasheet("a100_80gb_sxm").ridge("fp8") is None
    assert get_datasheet("cpu").ridge("bf16") is None


def test_get_spec_error_names_allowed_keys():
    with pytest.raises(ValueError) as err:
        get_datasheet("h300")
    assert "h300" in str(err.value) and "h200_sxm" in str(err.value) and "cpu" in str(err.value)


def test_cpu_row_is_measured_only_with_no_numbers():
    cpu = get_datasheet("cpu")
    assert cpu.kind == "cpu" and cpu.measured_only
    assert cpu.numbers() == []
    assert cpu.bandwidth_Bps() is None and cpu.peak_flops("bf16") is None


def test_mi300x_cache_for_flushing_is_the_infinity_cache_not_the_l2():
    mi300x = get_datasheet("mi300x")
    assert mi300x.l2_bytes == 32 * 2**20
    assert mi300x.cache_bytes() == 256 * 2**20
    assert get_datasheet("h200_sxm").cache_bytes() == get_datasheet("h200_sxm").l2_bytes


def test_running_cpu_gets_the_measured_only_row():
    sheet, matched = datasheet_for_running_device("cpu")
    assert sheet.key == "cpu" and matched
    assert devices.running_device_name("cpu")


def test_unmatched_gpu_gets_a_measured_only_stand_in(monkeypatch):
    monkeypatch.setattr(devices, "running_device_name", lambda device="cuda": "NVIDIA Quantum X9")
    sheet, matched = datasheet_for_running_device("cuda")
    assert not matched
    assert sheet.measured_only and sheet.name == "NVIDIA Quantum X9" and sheet.ridge("bf16") is None


def test_running_device_rejects_unknown_device_names():
    with pytest.raises(ValueError, match="allowed"):
        devices.running_device_name("tpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_running_gpu_name_and_l2_agree_with_the_table():
    name = devices.running_device_name("cuda")
    sheet, matched = datasheet_for_running_device("cuda")
    assert name == torch.cuda.get_device_name()
    assert matched == (detect(name) is not None)
    if matched and sheet.l2_bytes is not None:
        assert sheet.l2_bytes == torch.cuda.get_device_properties(0).L2_cache_size


def test_table_loader_rejects_a_number_written_as_text():
    row = {"key": "x", "name": "X", "vendor": "nvidia", "kind": "gpu", "mem_bw_GBps": 100,
           "dense_tflops": {}, "l2_bytes": None, "mem_bytes": "80.0e9", "sources": {}}
    with pytest.raises(ValueError, match="mem_bytes"):
        devices._row(row)


@pytest.mark.parametrize("text, kind, index", [("cpu", "cpu", None), ("cuda", "cuda", None), ("cuda:1", "cuda", 1)])
def test_parse_device_reads_the_three_forms(text, kind, index):
    dev = parse_device(text, need_available=False)
    assert (dev.type, dev.index) == (kind, index)


@pytest.mark.parametrize("bad", ["gpu", "meta", "cuda:x", "mps", "cpu:3", ""])
def test_parse_device_refuses_other_strings_naming_the_forms(bad):
    with pytest.raises(ValueError, match="allowed 'cpu', 'cuda', 'cuda:N'"):
        parse_device(bad, need_available=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_parse_device_refuses_cuda_where_there_is_none():
    with pytest.raises(ValueError, match="CUDA is not available"):
        parse_device("cuda:0")
