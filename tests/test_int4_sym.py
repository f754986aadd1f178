"""Symmetric int4 (int4_g<g>_sym: a scale per group, no zero point), Kimi-K2.5's released experts: its bytes, priced
by the what-if, refused by the decoder's int4 kernel (which takes a zero point)."""

import pytest
import torch

from roofline.model.accounting import expert_bytes, resident_weight_bytes
from roofline.model.formats import parse_format, precision
from roofline.model.presets import get_preset
from roofline.model.quant import Unsupported, quantize


def test_a_symmetric_group_holds_its_scale_and_no_zero_point():
    sym, asym = parse_format("int4_g32_sym"), parse_format("int4_g32")
    assert (sym.name, sym.zero_point, asym.zero_point) == ("int4_g32_sym", False, True)
    assert sym.matrix_bytes(2048, 7168, 2) == 2048 * 7168 // 2 + 2048 * 7168 // 32 * 2  # 4.5 bits a weight
    assert asym.matrix_bytes(2048, 7168, 2) - sym.matrix_bytes(2048, 7168, 2) == 2048 * 7168 // 32 * 2


def test_kimi_k2_5_as_released_holds_int4_experts_beside_bf16_attention():
    cfg = get_preset("kimi-k2.5")
    released = precision("bfloat16", weights="native", native=cfg.native_weights, native_experts=cfg.native_experts)
    assert released.label == "bfloat16+experts=int4_g32_sym"
    assert expert_bytes(cfg, released) == 3 * (7168 * 2048 // 2 + 7168 * 2048 // 32 * 2)
    held, bf16 = resident_weight_bytes(cfg, released.label), resident_weight_bytes(cfg, "bfloat16")
    assert bf16 - held == 60 * 384 * (expert_bytes(cfg, precision("bfloat16")) - expert_bytes(cfg, released))
    assert 590e9 < held < 600e9  # the routed experts at 4.5 bits, the rest (MLA, shared expert, dense layer) bf16


def test_the_decoder_refuses_to_run_symmetric_int4():
    with pytest.raises(Unsupported, match="priced by the what-if"):
        quantize(torch.randn(16, 64), parse_format("int4_g32_sym"))
