"""The one dtype vocabulary: canonical names, storage bytes, torch dtypes, datasheet columns.

Canonical names are torch's ("bfloat16"); the short names ("bf16") are the columns of the
datasheet table (roofline/data/devices.yaml) and accepted wherever a dtype is typed.
`model=True` marks the dtypes the compact decoder runs in (weights, activations, KV cache);
the others exist for datasheet peaks: tf32 is a tensor-core compute mode of fp32 storage,
fp8 and fp4 storage types whose matmuls this code does not run.

torch is imported where a torch dtype is asked for, not with this module: the pricing and analysis
commands read this vocabulary and never start torch (tests/test_torch_free.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from roofline.io.fields import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DType:
    name: str  # canonical: torch's name
    short: str  # datasheet column and short spelling
    bits: int  # storage bits per element
    torch_name: str | None  # torch's attribute; None: a compute mode without a storage type of its own
    model: bool  # the compact decoder runs in it

    @property
    def torch(self) -> torch.dtype | None:
        """The torch dtype (imports torch)."""
        if self.torch_name is None:
            return None
        import torch
        return getattr(torch, self.torch_name)

    @property
    def bytes(self) -> int | float:
        """Storage bytes per element (a float only for sub-byte types)."""
        return self.bits // 8 if self.bits % 8 == 0 else self.bits / 8


DTYPES = MappingProxyType({d.name: d for d in (
    DType("float32", "fp32", 32, "float32", True),
    DType("bfloat16", "bf16", 16, "bfloat16", True),
    DType("float16", "fp16", 16, "float16", True),
    DType("tfloat32", "tf32", 32, None, False),
    DType("float8_e4m3fn", "fp8", 8, "float8_e4m3fn", False),
    DType("float8_e5m2", "fp8", 8, "float8_e5m2", False),
    DType("float4_e2m1", "fp4", 4, None, False),  # torch stores e2m1 only as pairs (float4_e2m1fn_x2, 1 B each)
)})
MODEL_DTYPES = tuple(n for n, d in DTYPES.items() if d.model)
DATASHEET_COLUMNS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")  # the columns devices.yaml may fill
_ALIASES = {
    **{d.short: d.name for d in DTYPES.values()},
    "float": "float32", "f32": "float32", "half": "float16", "f16": "float16",
    "float8": "float8_e4m3fn", "fp8": "float8_e4m3fn",  # both fp8 formats share one datasheet column
}


def lookup(dtype: torch.dtype | str) -> DType:
    """The DType of a torch dtype, a canonical name, a short name or a common alias."""
    name = str(dtype).lower().removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise ConfigError(f"dtype={str(dtype)!r}: unknown; allowed {list(DTYPES)} "
                          f"or {sorted(_ALIASES)}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype | str) -> str:
    """Canonical name of a dtype the decoder runs in; anything else fails naming those."""
    try:
        d = lookup(dtype)
    except ConfigError:
        d = None
    if d is None or not d.model:
        raise ConfigError(f"dtype={str(dtype)!r}: allowed {MODEL_DTYPES} (or bf16/fp16/fp32)")
    return d.name


def torch_dtype(dtype: torch.dtype | str) -> torch.dtype:
    return DTYPES[dtype_name(dtype)].torch


def dtype_bytes(dtype: torch.dtype | str) -> int:
    """Storage bytes per element of a decoder dtype."""
    return DTYPES[dtype_name(dtype)].bytes


def datasheet_column(dtype: torch.dtype | str) -> str:
    """The devices.yaml column of a dtype ("bfloat16" -> "bf16"). A precision label
    (roofline.model.formats: "bfloat16+weights=int8") is judged by its activation dtype."""
    d = lookup(str(dtype).split("+")[0])
    if d.short not in DATASHEET_COLUMNS:
        raise ConfigError(f"dtype={str(dtype)!r}: no datasheet column; allowed {list(DATASHEET_COLUMNS)}")
    return d.short
