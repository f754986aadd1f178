"""One dtype vocabulary: every spelling reaches the same entry, and each entry is consistent."""

import pytest
import torch

from roofline.model.dtypes import (DATASHEET_COLUMNS, DTYPES, MODEL_DTYPES, datasheet_column, dtype_bytes, dtype_name,
                                   lookup, torch_dtype)


@pytest.mark.parametrize("spelling, name", [
    ("bf16", "bfloat16"), ("bfloat16", "bfloat16"), (torch.bfloat16, "bfloat16"), ("torch.bfloat16", "bfloat16"),
    ("fp32", "float32"), ("float", "float32"), ("FP16", "float16"), ("half", "float16"),
])
def test_every_spelling_of_a_decoder_dtype_is_one_name(spelling, name):
    assert dtype_name(spelling) == name


@pytest.mark.parametrize("name", list(DTYPES))
def test_bytes_agree_with_torch(name):
    d = DTYPES[name]
    if d.torch is not None:
        assert d.bytes == torch.empty(0, dtype=d.torch).element_size()


def test_decoder_dtypes_are_the_three_float_formats():
    assert MODEL_DTYPES == ("float32", "bfloat16", "float16")
    assert [torch_dtype(n) for n in MODEL_DTYPES] == [torch.float32, torch.bfloat16, torch.float16]
    assert [dtype_bytes(n) for n in MODEL_DTYPES] == [4, 2, 2]


@pytest.mark.parametrize("bad", ["int8", "tf32", "fp8", "float64"])
def test_a_dtype_the_decoder_does_not_run_is_refused_naming_the_allowed(bad):
    with pytest.raises(ValueError, match=r"allowed \('float32', 'bfloat16', 'float16'\)"):
        dtype_name(bad)


def test_datasheet_columns_cover_every_entry_and_nothing_else():
    assert {d.short for d in DTYPES.values()} == set(DATASHEET_COLUMNS)
    assert datasheet_column("float8_e5m2") == datasheet_column(torch.float8_e4m3fn) == "fp8"
    assert datasheet_column("tf32") == "tf32" and lookup("tf32").torch is None


def test_unknown_spelling_names_the_vocabulary():
    with pytest.raises(ValueError, match="bfloat16"):
        lookup("int4")
