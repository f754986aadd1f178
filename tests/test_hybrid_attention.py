"""Hybrid linear attention (Qwen3.5: three Gated DeltaNet layers to one full-attention layer): what the byte model
counts (weights, a per-sequence state in place of a KV cache, the recurrences' FLOPs), the published sizes it gives,
how the decoder carries the state, and what the what-if prices. The decoder's forward against transformers'
qwen3_next is in tests/test_checkpoint.py; its parameters and state bytes against the byte model in
tests/test_accounting.py (every preset)."""

import pytest
import torch

from roofline.io.fields import ConfigError
from roofline.measure.devices import get_datasheet
from roofline.measure.memory import resident_bytes
from roofline.model.accounting import (forward_cost, kv_bytes_per_token, linear_attention_params,
                                       linear_state_bytes_per_seq, param_count)
from roofline.model.decoder import build_model
from roofline.model.presets import get_preset, scaled_down
from roofline.parallel.sharded import shard
from roofline.spec.engine import SpecEngine
from roofline.parallel.cost import memory_per_rank, rank_forward_cost
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import Pass, Setting, WhatIf

QWEN35 = {"qwen3.5-27b": (27e9, 27e9), "qwen3.5-35b-a3b": (35e9, 3e9), "qwen3.5-122b-a10b": (122e9, 10e9),
          "qwen3.5-397b-a17b": (397e9, 17e9)}


def test_a_sequence_called_at_position_zero_starts_from_an_empty_state():
    """The recurrent state takes every token it is fed: a sequence restarted at 0 forgets the old one (a second run of
    the same prompt gives the same logits), one continued keeps it (the prompt in two calls equals it in one)."""
    cfg = scaled_down(get_preset("qwen3.5-35b-a3b"))
    m = build_model(cfg, max_batch=2, max_context=32, seed=1)
    tokens = torch.randint(0, cfg.vocab, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        once = m(tokens, 0)
        again = m(tokens, 0)
        head, tail = m(tokens[:, :4], 0), m(tokens[:, 4:], 4)
    torch.testing.assert_close(again, once)
    torch.testing.assert_close(torch.cat((head, tail), 1), once, rtol=1e-4, atol=1e-5)
    assert m.layers[0].attn.state_cache.dtype == torch.float32  # Qwen3.5's mamba_ssm_dtype, whatever the weights'


def test_what_cannot_take_a_recurrent_state_says_so():
    cfg = scaled_down(get_preset("qwen3.5-35b-a3b"))
    m = build_model(cfg, max_batch=1, max_context=16)
    with pytest.raises(ConfigError, match="cannot be rolled back"):
        SpecEngine(m)
    with pytest.raises(ConfigError, match="not sharded here"):
        shard(m, Layout(tp=2), 0)


def test_a_hybrid_needs_its_gated_deltanet_shapes_and_no_mla():
    q = get_preset("qwen3.5-35b-a3b")
    with pytest.raises(ConfigError, match="Gated DeltaNet layers need"):
        q.scaled(linear_v_dim=0)
    with pytest.raises(ConfigError, match="multiple of linear_k_heads"):
        q.scaled(linear_v_heads=24, linear_k_heads=16)
    with pytest.raises(ConfigError, match="not modelled together"):
        q.scaled(mtp_layers=1)
    with pytest.raises(ConfigError, match="must divide the Gated DeltaNet heads"):
        Layout(tp=32).check(get_preset("qwen3.5-397b-a17b"))  # 32 heads, but 16 Gated DeltaNet k heads


@pytest.mark.parametrize("name", list(QWEN35))
def test_the_counted_parameters_are_the_published_sizes(name):
    """The names' totals (which likely include the released vision encoder, left out here) within 1.5%; the active
    counts include the embedding and LM head (0.5-1 B each), which the names' figures round or leave out."""
    total, active = QWEN35[name]
    pc = param_count(get_preset(name))
    assert abs(pc.total / total - 1) < 0.015
    assert 0.95 < pc.active / active < 1.2


def test_a_gated_deltanet_layer_and_its_state():
    q = get_preset("qwen3.5-35b-a3b")  # 16 k heads, 32 v heads of 128, conv 4, d 2048, fp32 state
    d, conv_dim = 2048, 2 * 16 * 128 + 32 * 128
    assert linear_attention_params(q) == (d * (2 * 16 * 128 + 2 * 32 * 128) + d * 64 + conv_dim * 4 + 2 * 32 + 128
                                          + 32 * 128 * d)
    assert (q.linear_layers, q.full_share) == (30, 0.25)
    assert kv_bytes_per_token(q, "bfloat16") == 10 * 2 * 2 * 256 * 2  # the 10 full-attention layers' K and V
    assert linear_state_bytes_per_seq(q, "bfloat16") == 30 * (32 * 128 * 128 * 4 + conv_dim * 3 * 2)


@pytest.mark.parametrize("L", [0, 1000, 100000])
def test_a_decode_step_reads_and_writes_every_state_and_the_full_layers_kv(L):
    q = get_preset("qwen3.5-35b-a3b")
    c = forward_cost(q, "bfloat16", 4, 1, L)
    state = linear_state_bytes_per_seq(q, "bfloat16")
    kv = kv_bytes_per_token(q, "bfloat16")
    assert c.kv_read_bytes == 4 * (kv * (L + 1) + state)
    assert c.kv_write_bytes == 4 * (kv + state)
    assert resident_bytes(q, "bfloat16", 4, L).kv == 4 * (kv * L + state)



def test_a_dequantise_per_step_kv_path_is_charged_for_the_full_attention_layers_only():
    """A quantized cache read through a dequantising copy (kv_impl 'dequant') costs that copy in the layers that hold
    a cache: the full-attention ones (1 of 4 here); a Gated DeltaNet layer holds no KV to dequantise."""
    from roofline.model.accounting import kv_dequant_bytes
    from roofline.model.formats import parse_precision
    cfg, dt = scaled_down(get_preset("qwen3.5-35b-a3b")), "bfloat16+kv=int8"
    assert (cfg.layers, cfg.linear_layers) == (4, 3)
    extra = forward_cost(cfg, dt, 2, 1, 64, kv_impl="dequant").kv_read_bytes - forward_cost(
        cfg, dt, 2, 1, 64, kv_impl="float").kv_read_bytes
    assert extra == kv_dequant_bytes(cfg, parse_precision(dt), 2, 1, 65) > 0

def test_tensor_parallel_ranks_split_the_gated_deltanet_heads_and_their_state():
    q = get_preset("qwen3.5-397b-a17b")
    one, eight = (rank_forward_cost(q, Layout(tp=t), "bfloat16", 2, 1, 0) for t in (1, 8))
    state = 2 * linear_state_bytes_per_seq(q, "bfloat16")
    kv = 2 * kv_bytes_per_token(q, "bfloat16")  # L = 0: the new token's K and V
    assert one.kv_read_bytes == kv + state and one.kv_write_bytes == kv + state
    assert eight.kv_write_bytes == kv / 2 + state / 8  # each rank one of the 2 KV heads, an eighth of the states
    _, kv1 = memory_per_rank(q, Layout(tp=1), "bfloat16", 1, 1)
    _, kv8 = memory_per_rank(q, Layout(tp=8), "bfloat16", 1, 1)
    assert kv1 == kv_bytes_per_token(q, "bfloat16") + state / 2
    assert kv8 == kv_bytes_per_token(q, "bfloat16") / 2 + state / 16


def test_long_context_decode_and_the_pool_are_priced_on_a_quarter_of_the_layers():
    """Against Qwen3-30B-A3B (48 full-attention layers), a Qwen3.5-35B-A3B step at 128k tokens and 64 sequences costs
    a fraction as much, while at 1k tokens its states make it no cheaper; its pool holds more 32k-token sequences."""
    dev = get_datasheet("h200_sxm")
    w35, w3 = (WhatIf(get_preset(n), dev, "bfloat16", Layout(), Setting(engine="vllm"))
               for n in ("qwen3.5-35b-a3b", "qwen3-30b-a3b"))
    t = {(n, L): w.pass_detail(Pass(64, 1, L), 1, "vllm")["seconds"]
         for n, w in (("35", w35), ("3", w3)) for L in (1024, 131072)}
    assert t["35", 131072] < 0.5 * t["3", 131072]
    assert t["35", 1024] > 0.9 * t["3", 1024]
    assert w35.max_running("vllm", 32768) > 2 * w3.max_running("vllm", 32768)
