"""A Hugging Face quantization_config -> the formats a what-if prices (roofline.model.formats names).

The checkpoint loader runs only what the decoder can hold (bf16 / fp16 / fp32, DeepSeek-style block-scaled
fp8: `loader.native_format`). Pricing needs less: the bytes each weight class streams and the kernel family
that moves them. So `card`, `capacity` and `predict` read a quantized release's config as the engines do
(vLLM's `quantization` methods of the same names):

- `awq` (AutoAWQ, 4 bits, a zero point per group): int4_g<group>;
- `gptq` (4 bits: int4_g<group>, `_sym` when `sym`; 8 bits: int8);
- `fp8` with `weight_block_size` (DeepSeek-V3): fp8_<fmt>_b<R>[x<C>]; without: per-tensor fp8;
- `fbgemm_fp8` (Meta's Llama 3.1 405B FP8: per-channel weights, per-token activations): fp8_channel;
- `compressed-tensors` (llm-compressor; one config group of `Linear` targets): float 8-bit weights as fp8
  (tensor / channel / block strategy), int 4-bit groups as int4_g<group>[_sym], int 8-bit as int8;
- `modelopt` (NVIDIA Model Optimizer): quant_algo FP8 -> fp8, NVFP4 -> nvfp4;
- `mxfp4` (gpt-oss): the routed experts mxfp4, the rest as released (bf16).

Modules a config leaves out (`ignore`, `modules_to_not_convert`, `exclude_modules`: the LM head, routers) are
priced in the activation dtype, as the lm_head key's default does. Anything else (bitsandbytes, mixed
per-layer precision, per-channel int4, activation formats) is refused naming the field, rather than priced as
something it is not.
"""

from __future__ import annotations

from typing import Any, Mapping

from roofline.io.fields import ConfigError
from roofline.model.formats import parse_format

PRICED_METHODS = ("awq", "gptq", "fp8", "fbgemm_fp8", "compressed-tensors", "modelopt", "mxfp4")


def _refuse(q: Mapping[str, Any], why: str) -> ConfigError:
    return ConfigError(f"config.json quantization_config (quant_method {q.get('quant_method')!r}): {why}; priced: "
                       f"{' | '.join(PRICED_METHODS)} (roofline/checkpoints/quantization.py), or drop it and give "
                       "weights= / experts=")


def _int4(q: Mapping[str, Any], group: Any, sym: bool) -> str:
    if not isinstance(group, int) or isinstance(group, bool) or group <= 0:
        raise _refuse(q, f"int4 group size {group!r} (per-channel int4, -1, is not a format here)")
    return parse_format(f"int4_g{group}" + ("_sym" if sym else "")).name


def fp8_fmt(q: Mapping[str, Any]) -> str:
    """An fp8 quantization_config's element format: e4m3 where it names none, MiniMax-M2's float8_* spellings read."""
    fmt = q.get("fmt", "e4m3")
    return {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}.get(fmt, fmt)


def fp8_format(strategy: str, block: list | None = None, fmt: str = "e4m3") -> str:
    """The fp8 weight format of a scale strategy: block [R, C] -> fp8_<fmt>_b<R>[x<C>], channel, else per tensor."""
    if strategy == "block" and block:
        r, c = block
        return parse_format(f"fp8_{fmt}_b{r}" + (f"x{c}" if c != r else "")).name
    return parse_format(f"fp8_{fmt}" + ("_channel" if strategy == "channel" else "")).name


def _compressed_tensors(q: Mapping[str, Any]) -> str:
    groups = [g for g in (q.get("config_groups") or {}).values() if isinstance(g, Mapping)]
    if len(groups) != 1:
        raise _refuse(q, f"{len(groups)} config_groups (one, for every Linear, is priced)")
    w = groups[0].get("weights") or {}
    bits, kind, strategy = w.get("num_bits"), w.get("type"), w.get("strategy")
    if kind == "float" and bits == 8:
        return fp8_format(strategy, w.get("block_structure"))
    if kind == "int" and bits == 4 and strategy == "group":
        return _int4(q, w.get("group_size"), bool(w.get("symmetric", True)))
    if kind == "int" and bits == 8:
        return parse_format("int8").name
    raise _refuse(q, f"weights {kind!r} {bits!r}-bit, strategy {strategy!r}")


def priced_formats(q: Mapping[str, Any] | None) -> tuple[str, str]:
    """(weights, experts) formats of a quantization_config, "" for the model's float dtype (experts "" = the
    weights')."""
    if not q:
        return "", ""
    method = q.get("quant_method")
    if method == "awq":
        if q.get("bits", 4) != 4:
            raise _refuse(q, f"bits {q.get('bits')!r} (AWQ is priced at 4)")
        return _int4(q, q.get("group_size", 128), not q.get("zero_point", True)), ""
    if method == "gptq":
        if q.get("bits") == 8:
            return parse_format("int8").name, ""
        if q.get("bits") != 4:
            raise _refuse(q, f"bits {q.get('bits')!r} (GPTQ is priced at 4 and 8)")
        return _int4(q, q.get("group_size", 128), bool(q.get("sym", True))), ""
    if method == "fp8":
        fmt = fp8_fmt(q)
        if fmt not in ("e4m3", "e5m2"):
            raise _refuse(q, f"fmt {q.get('fmt')!r}")
        block = list(q.get("weight_block_size") or [])
        return fp8_format("block" if len(block) == 2 else "tensor", block, fmt), ""
    if method == "fbgemm_fp8":
        return fp8_format("channel"), ""
    if method == "compressed-tensors":
        return _compressed_tensors(q), ""
    if method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        if algo in ("FP8", "NVFP4"):
            return ("nvfp4" if algo == "NVFP4" else parse_format("fp8").name), ""
        raise _refuse(q, f"quant_algo {q.get('quant_algo')!r} (FP8 and NVFP4 are priced; a mixed precision per "
                         "layer is not)")
    if method == "mxfp4":
        return "", "mxfp4"
    raise _refuse(q, "not priced")
