"""The compact decoder: one forward over q tokens equals q single-token forwards, ragged."""

import math
import weakref

import pytest
import torch

from roofline.model.decoder import build_model
from roofline.model.presets import get_preset, list_presets, scaled_down
from roofline.model.rope import inv_frequencies, yarn_softmax_scale

PRESETS = list_presets()
TOL = dict(rtol=1e-4, atol=1e-5)  # float32, different reduction orders


def mini(name):
    return scaled_down(get_preset(name))


def fill_ragged(m, ctx, lengths):
    """Write each sequence's own context into the cache: at step t, sequence s (re)writes its
    position min(t, n_s - 1); a rewrite stores identical values, so lengths stay ragged."""
    for t in range(max(lengths)):
        pos = torch.tensor([min(t, max(n - 1, 0)) for n in lengths])
        tok = torch.stack([ctx[s, p] for s, p in enumerate(pos.tolist())])[:, None]
        m(tok, pos)


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.slow
def test_q_token_forward_equals_single_token_forwards_ragged(name):
    cfg = mini(name)
    torch.manual_seed(0)
    B, q = 3, 4
    lengths = [5, 0, 9]  # ragged contexts
    ctx = torch.randint(0, cfg.vocab, (B, max(lengths)))
    new = torch.randint(0, cfg.vocab, (B, q))
    start = torch.tensor(lengths)

    a = build_model(cfg, max_batch=B, max_context=32, seed=3)
    b = build_model(cfg, max_batch=B, max_context=32, seed=3)
    for m in (a, b):
        fill_ragged(m, ctx, lengths)
    full = a(new, start)
    steps = torch.cat([b(new[:, i:i + 1], start + i) for i in range(q)], dim=1)
    assert full.shape == (B, q, cfg.vocab)
    torch.testing.assert_close(full, steps, **TOL)


@pytest.mark.parametrize("name", [p for p in PRESETS if get_preset(p).mtp_layers])
def test_mtp_forward_over_q_positions_equals_single_positions(name):
    cfg = mini(name)
    B, q = 2, 3
    a = build_model(cfg, max_batch=B, max_context=32, seed=5)
    toks = torch.randint(0, cfg.vocab, (B, q + 1))
    start = torch.tensor([2, 6])
    _, hidden = a(toks[:, :q], start, return_hidden=True)
    logits, h2 = a.mtp_forward(hidden, toks[:, 1:], start)
    b = build_model(cfg, max_batch=B, max_context=32, seed=5)
    _, hidden_b = b(toks[:, :q], start, return_hidden=True)
    singles = torch.cat([b.mtp_forward(hidden_b[:, i:i + 1], toks[:, i + 1:i + 2], start + i)[0] for i in range(q)], 1)
    assert logits.shape == (B, q, cfg.vocab) and h2.shape == (B, q, cfg.d)
    torch.testing.assert_close(logits, singles, **TOL)


def test_keys_past_a_sequences_own_position_are_invisible():
    cfg = mini("tiny")
    m = build_model(cfg, max_batch=2, max_context=32, seed=1)
    tok = torch.randint(0, cfg.vocab, (2, 1))
    ref = m(tok, torch.tensor([0, 0]))[0]
    m.reset_cache()
    # sequence 1 writes garbage far ahead; sequence 0 at position 0 must not see it
    m(torch.randint(0, cfg.vocab, (2, 8)), torch.tensor([20, 20]))
    out = m(tok, torch.tensor([0, 0]), kv_len=28)[0]
    torch.testing.assert_close(out, ref, **TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_and_tracks_float32(dtype):
    cfg = mini("llama-3.1-8b")
    toks = torch.randint(0, cfg.vocab, (2, 5))
    start = torch.tensor([0, 0])
    ref = build_model(cfg, max_batch=2, max_context=16, seed=2)(toks, start)
    out = build_model(cfg, max_batch=2, max_context=16, seed=2, dtype=dtype)(toks, start)
    assert out.dtype == dtype
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)
    assert cos > 0.99


def test_seeded_init_is_deterministic():
    cfg = mini("qwen3-30b-a3b")
    a = build_model(cfg, max_batch=1, max_context=8, seed=7)
    b = build_model(cfg, max_batch=1, max_context=8, seed=7)
    c = build_model(cfg, max_batch=1, max_context=8, seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.embed.weight, c.embed.weight)


def test_dense_and_touched_moe_agree():
    cfg = mini("mixtral-8x7b")
    toks = torch.randint(0, cfg.vocab, (2, 3))
    start = torch.tensor([0, 0])
    a = build_model(cfg, max_batch=2, max_context=8, seed=4, moe_impl="touched")(toks, start)
    b = build_model(cfg, max_batch=2, max_context=8, seed=4, moe_impl="dense")(toks, start)
    torch.testing.assert_close(a, b, **TOL)


def test_cache_overflow_and_batch_overflow_are_refused():
    cfg = mini("tiny")
    m = build_model(cfg, max_batch=2, max_context=8)
    with pytest.raises(ValueError, match="max_context"):
        m(torch.zeros(1, 4, dtype=torch.long), torch.tensor([6]))
    with pytest.raises(ValueError, match="max_batch"):
        m(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, dtype=torch.long))


def test_llama3_rope_scaling_keeps_short_and_stretches_long_wavelengths():
    rs = get_preset("llama-3.1-8b").rope_scaling
    plain, _ = inv_frequencies(128, 500000.0, type(rs)())
    scaled, amp = inv_frequencies(128, 500000.0, rs)
    assert amp == 1.0
    assert scaled[0] == plain[0]  # highest frequency untouched
    assert scaled[-1] == pytest.approx(plain[-1] / rs.factor)  # longest wavelength divided by factor


def test_deepseek_yarn_softmax_scale():
    rs = get_preset("deepseek-v3").rope_scaling
    assert yarn_softmax_scale(rs) == pytest.approx((0.1 * math.log(40) + 1) ** 2)


class _LiveFloat32(torch.utils._python_dispatch.TorchDispatchMode):
    """Peak bytes of float32 CPU storage alive at once among tensors created inside the mode
    (a storage counted once, however many views of it ops return)."""

    def __init__(self):
        super().__init__()
        self.live, self.peak = {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.device.type == "cpu":
                ptr = t.untyped_storage().data_ptr()
                if ptr not in self.live:
                    self.live[ptr] = t.untyped_storage().nbytes()
                    weakref.finalize(t.untyped_storage(), self.live.pop, ptr, None)
                    self.peak = max(self.peak, sum(self.live.values()))
        return out


def test_bf16_build_never_materialises_the_model_in_float32():
    cfg = mini("llama-3.1-8b")
    with _LiveFloat32() as log:
        m = build_model(cfg, max_batch=2, max_context=16, seed=2, dtype=torch.bfloat16)
    params = list(m.parameters())
    assert all(p.dtype == torch.bfloat16 for p in params)
    assert all(b.dtype == torch.bfloat16 for b in m.kv_cache_tensors())
    largest = max(p.numel() for p in params) * 4
    model_f32 = sum(p.numel() for p in params) * 4
    rope = 2 * m.rope_cos.numel() * 4
    # one float32 draw alive at a time (the largest parameter at most) + the float32 RoPE tables
    assert log.peak <= largest + rope < model_f32 / 2


def test_rope_tables_stay_float32_in_half_precision_models():
    from roofline.model.rope import rope_table
    cfg = mini("llama-3.1-8b")
    m = build_model(cfg, max_batch=1, max_context=64, dtype=torch.bfloat16)
    cos, sin = rope_table(cfg, 64)
    assert m.rope_cos.dtype == torch.float32
    assert torch.equal(m.rope_cos, cos) and torch.equal(m.rope_sin, sin)


def test_meta_build_has_shapes_and_dtypes_and_no_storage():
    cfg = get_preset("llama-3.1-8b")  # the real 8B: instant on the meta device
    m = build_model(cfg, max_batch=4, max_context=4096, dtype=torch.bfloat16, device="meta")
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in m.parameters())
    from roofline.model.accounting import param_count
    assert sum(p.numel() for p in m.parameters()) == param_count(cfg).total


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("q", [1, 4])
def test_uniform_int_start_equals_the_masked_ragged_path(name, q):
    """The sweep's mask-free call (int start_pos) computes what the masked path computes."""
    cfg = mini(name)
    B, L = 2, 6
    ctx = torch.randint(0, cfg.vocab, (B, L))
    new = torch.randint(0, cfg.vocab, (B, q))
    a = build_model(cfg, max_batch=B, max_context=32, seed=3)
    b = build_model(cfg, max_batch=B, max_context=32, seed=3)
    for m in (a, b):
        fill_ragged(m, ctx, [L] * B)
    masked = a(new, torch.full((B,), L))
    uniform = b(new, L)
    torch.testing.assert_close(uniform, masked, **TOL)
    attending = cfg.layers - cfg.linear_layers  # a Gated DeltaNet layer reads no mask
    assert b.last_mask_bytes == (0 if q == 1 else q * (L + q) * (1 + attending))  # CPU: one small bool mask
    for x, y in zip(a.kv_cache_tensors(), b.kv_cache_tensors()):
        torch.testing.assert_close(x, y, **TOL)  # the slice write stores what the index write stores


def test_uniform_start_rejects_a_kv_len_it_would_not_read():
    m = build_model(mini("tiny"), max_batch=1, max_context=16)
    with pytest.raises(ValueError, match="kv_len"):
        m(torch.zeros(1, 2, dtype=torch.long), 3, kv_len=9)


def test_gpu_mask_choice_is_no_mask_or_an_unmaterialised_lower_right_causal():
    from torch.nn.attention.bias import CausalBias

    from roofline.model.decoder import _causal_mask, attend, attention_mask, mask_bytes
    cuda = torch.device("cuda")  # choosing needs no device
    assert attention_mask(7, 1, 8, cuda) is None
    bias = attention_mask(5, 3, 8, cuda)
    assert isinstance(bias, CausalBias) and mask_bytes(bias, 32) == 0
    assert torch.equal(bias._materialize("cpu"), _causal_mask(torch.tensor([5]), 3, 8)[0, 0])
    assert isinstance(attention_mask(torch.tensor([5, 2]), 3, 8, cuda), torch.Tensor)  # ragged keeps its mask
    # and the bias computes the masked attention (GQA: 4 query heads over 2 KV heads)
    q, k, v = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    ref = attend(q, k, v, _causal_mask(torch.tensor([5, 5]), 3, 8))
    torch.testing.assert_close(attend(q, k, v, bias), ref, **TOL)
