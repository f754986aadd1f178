"""Quantized routed experts: each expert is a packed linear of the weights format, the model
holds the bytes the byte model charges, a step charges the touched experts' packed bytes, and
the quantized MoE computes what its dequantised float experts compute."""

import copy

import pytest
import torch

from roofline.model import quant
from roofline.model.accounting import expert_bytes, forward_cost, moe_layers, resident_weight_bytes
from roofline.model.decoder import MoE, build_model
from roofline.model.formats import precision
from roofline.model.presets import get_preset, scaled_down

MOE = ["mixtral-8x7b", "deepseek-v3"]  # GQA + MoE; MLA + MoE + shared expert + MTP
FORMATS = ["int8", "int4_g32"]


def mini(name):
    cfg = scaled_down(get_preset(name))
    # torch's CPU int4 packing takes 16 output rows at a time: the miniature's MLA kv_a has
    # kv_lora_rank + qk_rope_dim = 40 rows (DeepSeek-V3's has 576), so give it 32
    return cfg.scaled(kv_lora_rank=24) if cfg.is_mla else cfg


def held(module) -> int:
    return sum(m.held_bytes() for m in module.modules() if isinstance(m, quant.QuantLinear))


def moe_blocks(m):
    return [b.ffn for b in list(m.layers) + [t.block for t in m.mtp] if isinstance(b.ffn, MoE)]


@pytest.mark.parametrize("name", MOE)
@pytest.mark.parametrize("weights", FORMATS)
def test_quantized_experts_hold_the_bytes_the_accounting_charges(name, weights):
    cfg, prec = mini(name), precision("bfloat16", weights)
    m = build_model(cfg, max_batch=1, max_context=16, dtype=torch.bfloat16, precision=prec)
    for ffn in moe_blocks(m):
        packed = [getattr(ffn, w) for w in ("w1", "w3", "w2")]
        assert all(isinstance(p, quant.PackedExperts) and len(p.experts) == cfg.experts for p in packed)
        assert sum(held(p) for p in packed) == cfg.experts * expert_bytes(cfg, prec)
    assert quant.held_weight_bytes(m) == resident_weight_bytes(cfg, prec, with_mtp=True)


def test_fp8_experts_by_reference_hold_their_bytes_and_are_refused_for_timing():
    cfg, prec = mini("mixtral-8x7b"), precision("bfloat16", "fp8_e4m3_b32")
    m = build_model(cfg, max_batch=1, max_context=16, dtype=torch.bfloat16)
    quant.quantize_model(m, prec, "cpu", reference=True)
    assert quant.held_weight_bytes(m) == resident_weight_bytes(cfg, prec, with_mtp=True)
    with pytest.raises(quant.Unsupported, match=r"weights=fp8_e4m3_b32 on device=cpu"):
        quant.require_fast(m, prec, "cpu")


@pytest.mark.parametrize("weights", FORMATS)
def test_a_step_charges_the_packed_bytes_of_the_experts_it_touched(weights):
    cfg, prec = mini("mixtral-8x7b"), precision("bfloat16", weights)
    m = build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16, precision=prec)
    m(torch.randint(0, cfg.vocab, (2, 3), generator=torch.Generator().manual_seed(0)), 0)
    touched = m.last_experts_touched()
    one = held(moe_blocks(m)[0]) / cfg.experts  # the packed tensors of one expert: w1, w3 and w2
    c = forward_cost(cfg, prec, 2, 3, 0, touched=touched)
    assert c.expert_bytes == pytest.approx(moe_layers(cfg) * touched * one, rel=1e-12)
    assert c.expert_bytes < forward_cost(cfg, "bfloat16", 2, 3, 0, touched=touched).expert_bytes / 1.8


def dequantised_twin(ffn: MoE, q: MoE) -> MoE:
    """A copy of the float `ffn` (same router) whose experts, routed and shared, are the
    dequantised packed experts of `q`, in the activation dtype."""
    ref = copy.deepcopy(ffn)
    dt = ffn.w1.dtype
    for w in ("w1", "w3", "w2"):
        packed = getattr(q, w)
        getattr(ref, w).data = torch.stack([packed.dequantize(e) for e in range(len(packed.experts))]).to(dt)
        if ref.shared is not None:
            getattr(ref.shared, w).weight.data = getattr(q.shared, w).dequantize().to(dt)
    return ref


@pytest.mark.parametrize("name", MOE)
@pytest.mark.parametrize("weights", FORMATS)
def test_quantized_moe_matches_its_dequantised_float_experts(name, weights):
    """Same router, same tokens: the packed experts compute the bf16 matmul of their
    dequantised weights (2^-6 relative), while the unquantised experts differ by the format's
    rounding."""
    cfg = mini(name)
    m = build_model(cfg, max_batch=1, max_context=16, dtype=torch.bfloat16, seed=1)
    i = cfg.first_dense_layers
    ffn = copy.deepcopy(m.layers[i].ffn)
    quant.quantize_model(m, precision("bfloat16", weights), "cpu")
    q = m.layers[i].ffn
    ref = dequantised_twin(ffn, q)
    x = torch.randn(6, cfg.d, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y, y_ref, y_float = q(x).float(), ref(x).float(), ffn(x).float()
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    assert rel(y, y_ref) < 2 ** -6
    assert rel(y_ref, y_float) > 2 * rel(y, y_ref) if weights.startswith("int4") else rel(y_ref, y_float) > 0


def test_dense_and_touched_quantized_moe_agree():
    cfg = mini("mixtral-8x7b")
    a = build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16, precision="bfloat16+weights=int8")
    b = build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16, precision="bfloat16+weights=int8",
                    moe_impl="dense")
    toks = torch.randint(0, cfg.vocab, (2, 4), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a(toks, 0).float(), b(toks, 0).float(), rtol=2e-2, atol=2e-2)
    assert b.last_experts_touched() == cfg.experts


def test_sweep_runs_int8_experts_and_charges_the_touched_ones(tmp_path):
    from roofline.io.results import read_rows
    from roofline.measure.sweep import SweepRequest, run_sweep
    from roofline.measure.timer import TimerSettings
    cfg, lab = mini("mixtral-8x7b"), "bfloat16+weights=int8"
    req = SweepRequest(model=cfg, q=(2,), B=(1,), L=(4,), dtypes=(lab,),
                     timer=TimerSettings(warmup=0, min_reps=2, max_reps=2))
    run_sweep(req, tmp_path, progress=False, noise=None)
    (r,) = read_rows(tmp_path / "points.jsonl")
    assert r["status"] == "ok" and r["weights_format"] == "int8" and 1 <= r["experts_touched"] <= cfg.experts
    c = forward_cost(cfg, lab, 1, 2, 4, touched=r["experts_touched"])
    assert (r["weight_bytes"], r["expert_bytes"]) == (c.weight_bytes, c.expert_bytes)
