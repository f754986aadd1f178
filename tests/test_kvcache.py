"""The quantized KV cache runs: the model holds fp8 / int8 codes and their scales, exactly the
bytes the byte model charges, new keys/values are stored within the format's bound, and the
forward (decode, verification, ragged positions, a sweep row) works on it."""

import pytest
import torch

from roofline.model import kvcache, quant
from roofline.model.accounting import forward_cost, kv_bytes_per_token
from roofline.model.decoder import build_model
from roofline.model.formats import parse_precision
from roofline.model.presets import get_preset, scaled_down

KV = ["fp8_e4m3", "fp8_e5m2", "int8"]
MODELS = ["tiny", "deepseek-v3", "mixtral-8x7b"]  # GQA; MLA's latent cache; GQA + MoE


def mini(name):
    return get_preset("tiny") if name == "tiny" else scaled_down(get_preset(name))


def label(kv):
    return f"bfloat16+kv={kv}"


def main_caches(m):
    return {n: b for n, b in m.named_buffers() if "cache" in n and not n.startswith("mtp")}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("kv", KV)
def test_cache_tensors_held_are_the_kv_bytes_the_accounting_charges(name, kv):
    cfg, B, ctx = mini(name), 3, 24
    m = build_model(cfg, max_batch=B, max_context=ctx, dtype=torch.bfloat16, precision=label(kv))
    held = main_caches(m)
    codes = [b for n, b in held.items() if not n.endswith("_scale")]
    assert codes and all(b.dtype == getattr(torch, parse_precision(label(kv)).kv.storage) for b in codes)
    assert all(b.dtype == torch.float32 for n, b in held.items() if n.endswith("_scale"))
    held_bytes = sum(b.numel() * b.element_size() for b in held.values())
    # a forward reading the whole cache (B sequences, kv_len = ctx) reads every byte held, scales included
    assert held_bytes == forward_cost(cfg, label(kv), B, 1, ctx - 1).kv_read_bytes
    plain = sum(b.numel() * b.element_size() for b in main_caches(build_model(cfg, max_batch=B, max_context=ctx,
                                                                                 dtype=torch.bfloat16)).values())
    assert plain == kv_bytes_per_token(cfg, "bfloat16") * B * ctx
    assert held_bytes < plain


def prefill(m, toks):
    m.reset_cache()
    return m(toks, 0).float()


@pytest.mark.parametrize("name", ["tiny", "deepseek-v3"])
@pytest.mark.parametrize("kv", KV)
def test_written_keys_and_values_are_within_the_format_bound(name, kv):
    """Layer 0 computes the same keys/values in both models (the cache is not read before it
    is written there): the quantized cache holds them within the format's rounding bound."""
    cfg = mini(name)
    toks = torch.randint(0, cfg.vocab, (2, 7), generator=torch.Generator().manual_seed(1))
    ref = build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16, seed=2)
    qm = build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16, seed=2, precision=label(kv))
    prefill(ref, toks), prefill(qm, toks)
    fmt = parse_precision(label(kv)).kv
    worst = 0.0
    for cname in qm.layers[0].attn.CACHE_NAMES:
        x = kvcache.head(getattr(ref.layers[0].attn, cname), 2, 7, qm.layers[0].attn.POS_DIM).float()
        codes = kvcache.head(getattr(qm.layers[0].attn, cname), 2, 7, qm.layers[0].attn.POS_DIM)
        scale = getattr(qm.layers[0].attn, cname + "_scale")
        if fmt.kind == "int8":
            scale = kvcache.head(scale, 2, 7, qm.layers[0].attn.POS_DIM).reshape(-1)
        qz = quant.Quantized(fmt, codes.reshape(-1, x.shape[-1]), scale)
        ratio = (qz.dequantize() - x.reshape(-1, x.shape[-1])).abs() / quant.error_bound(qz)
        assert ratio.max() <= 1.0 + 1e-5  # a half step exactly, up to fp32 rounding of x / s
        worst = max(worst, ratio.max().item())
    assert worst > 0.3  # rounded at the format's step, not stored in a finer one


@pytest.mark.parametrize("name", ["tiny", "deepseek-v3"])
def test_forward_on_a_quantized_cache_tracks_the_float_cache_by_its_precision(name):
    """Prefill then decode steps: logits stay close to the bf16 cache's, and the error grows
    as the format coarsens (int8 per token < fp8 e4m3 < fp8 e5m2)."""
    cfg = mini(name)
    g = torch.Generator().manual_seed(4)
    toks = torch.randint(0, cfg.vocab, (2, 12), generator=g)

    def run(precision):
        m = build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16, seed=3, precision=precision)
        out = [prefill(m, toks[:, :8])]
        out += [m(toks[:, i:i + 1], i).float() for i in range(8, 12)]
        return torch.cat(out, 1)

    ref = run(None)
    err = {kv: ((run(label(kv)) - ref).norm() / ref.norm()).item() for kv in KV}
    assert 0 < err["int8"] < err["fp8_e4m3"] < err["fp8_e5m2"] < 0.125  # e5m2's relative step is 2^-3
    assert err["fp8_e4m3"] < 2 ** -4


@pytest.mark.parametrize("kv", KV)
def test_verification_at_ragged_positions_equals_the_uniform_path(kv):
    """The speculative verify call (q > 1, tensor start_pos: per-sequence index writes of codes
    and scales) computes what the sweep's uniform call computes on a quantized cache."""
    cfg = mini("tiny")
    toks = torch.randint(0, cfg.vocab, (2, 9), generator=torch.Generator().manual_seed(5))
    a, b = (build_model(cfg, max_batch=2, max_context=16, dtype=torch.bfloat16, precision=label(kv))
            for _ in range(2))
    for m in (a, b):
        prefill(m, toks[:, :6])
    ragged = a(toks[:, 6:], torch.full((2,), 6))
    uniform = b(toks[:, 6:], 6)
    torch.testing.assert_close(ragged, uniform, rtol=2e-2, atol=2e-2)
    for (n, x), y in zip(a.named_buffers(), b.buffers()):
        if "cache" in n:
            assert torch.equal(x.view(torch.uint8) if x.dtype.itemsize == 1 else x,
                               y.view(torch.uint8) if y.dtype.itemsize == 1 else y), n


def test_float_kv_other_than_the_activations_is_refused():
    m = build_model(mini("tiny"), max_batch=1, max_context=16, dtype=torch.bfloat16)
    with pytest.raises(quant.Unsupported, match=r"kv=float32 with activations bfloat16"):
        quant.quantize_model(m, "bfloat16+kv=fp32", "cpu")


def test_sweep_rows_on_a_quantized_cache_are_ok_and_charge_the_bytes_held(tmp_path):
    from roofline.io.results import read_rows
    from roofline.measure.sweep import SweepRequest, run_sweep
    from roofline.measure.timer import TimerSettings
    cfg, B, L = mini("tiny"), 2, 8
    labels = (label("fp8_e4m3"), label("int8"))
    req = SweepRequest(model=cfg, q=(1, 3), B=(B,), L=(L,), dtypes=labels, mtp_q=(1,),
                     timer=TimerSettings(warmup=0, min_reps=2, max_reps=2))
    run_sweep(req, tmp_path, progress=False, noise=None)
    rows = {(r["dtype"], r["kind"], r["q"]): r for r in read_rows(tmp_path / "points.jsonl")}
    for lab in labels:
        for q in (1, 3):  # decode and verification
            r = rows[(lab, "forward", q)]
            assert r["status"] == "ok" and r["kv_impl"] == kvcache.KV_IMPL and r["kv_format"] != "bfloat16"
            held = build_model(cfg, max_batch=B, max_context=L + q, dtype=torch.bfloat16, precision=lab)
            # the codes and scales held, plus the dequantised bf16 copy the per-step path writes and reads
            copy = 2 * B * cfg.layers * (L + q) * cfg.kv_elems_per_token_layer * 2
            assert r["kv_read_bytes"] == sum(b.numel() * b.element_size() for b in main_caches(held).values()) + copy
        assert rows[(lab, "mtp", 1)]["status"] == "ok"
