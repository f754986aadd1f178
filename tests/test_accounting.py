"""The byte/FLOP model equals the code it describes, for a miniature of every preset."""

import pytest
import torch

from roofline.model.accounting import (experts_touched, forward_cost, kv_bytes_per_token, linear_state_bytes_per_seq,
                                       mtp_cost, param_count)
from roofline.model.decoder import build_model
from roofline.model.presets import get_preset, list_presets, scaled_down

PRESETS = list_presets()


def mini(name):
    return scaled_down(get_preset(name))


def n_params(module, prefix=None):
    return sum(p.numel() for n, p in module.named_parameters() if prefix is None or n.startswith(prefix))


@pytest.mark.parametrize("name", PRESETS)
def test_param_count_equals_instantiated_model(name):
    cfg = mini(name)
    m = build_model(cfg, max_batch=1, max_context=16)
    pc = param_count(cfg)
    assert pc.total + pc.mtp == n_params(m)
    assert pc.mtp == n_params(m, "mtp.")


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_bytes_per_token_equals_cache_tensors(name, dtype):
    cfg = mini(name)
    B, Lmax = 3, 32
    m = build_model(cfg, max_batch=B, max_context=Lmax, dtype=dtype)
    main = [b for n, b in m.named_buffers() if "cache" in n and not n.startswith("mtp")]
    cache_bytes = sum(b.numel() * b.element_size() for b in main)
    # + a Gated DeltaNet layer's conv inputs and recurrent state per sequence, whatever its length
    assert cache_bytes == kv_bytes_per_token(cfg, dtype) * B * Lmax + linear_state_bytes_per_seq(cfg, dtype) * B


@pytest.mark.parametrize("name", [p for p in PRESETS if get_preset(p).is_moe])
def test_moe_weight_bytes_follow_the_experts_the_code_ran(name):
    cfg = mini(name)
    m = build_model(cfg, max_batch=4, max_context=32, seed=1)
    B, q = 2, 3
    m(torch.randint(0, cfg.vocab, (B, q)), torch.zeros(B, dtype=torch.long))
    touched = m.last_experts_touched()
    assert 1 <= touched <= cfg.experts
    base = forward_cost(cfg, "float32", B, q, 0, touched=0.0).weight_bytes
    with_experts = forward_cost(cfg, "float32", B, q, 0, touched=touched).weight_bytes
    n_moe = sum(cfg.layer_is_moe(i) for i in range(cfg.layers))
    assert with_experts - base == pytest.approx(n_moe * touched * 3 * cfg.d * cfg.moe_ffn * 4)


def test_weight_bytes_of_a_dense_decode_step_are_all_weights_but_the_embedding():
    cfg = get_preset("llama-3.1-8b")
    pc = param_count(cfg)
    c = forward_cost(cfg, "bfloat16", 1, 1, 0)
    assert c.weight_bytes == 2 * (pc.total - pc.embedding)


def test_tied_embedding_is_read_once_as_the_head():
    cfg = mini("tiny").scaled(tie_embeddings=True)
    pc = param_count(cfg)
    assert forward_cost(cfg, "float32", 1, 1, 0).weight_bytes == 4 * pc.total


def test_uniform_routing_expectation():
    cfg = get_preset("deepseek-v3")
    assert experts_touched(cfg, 1) == pytest.approx(8)
    assert experts_touched(cfg, 10_000) == pytest.approx(256, rel=1e-6)
    assert experts_touched(cfg, 32) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 32))


def test_kv_read_scales_with_the_slice_attention_reads():
    cfg = get_preset("llama-3.1-8b")
    c = forward_cost(cfg, "bfloat16", B=4, q=1, L=1023)
    # 32 layers x 2 (K,V) x 8 heads x 128 dims x 2 bytes = 131072 B per token
    assert kv_bytes_per_token(cfg, "bf16") == 131072
    assert c.kv_read_bytes == 4 * 131072 * 1024
    assert c.kv_write_bytes == 4 * 131072


def test_attention_flops_causal_convention():
    cfg = get_preset("llama-3.1-8b")
    c = forward_cost(cfg, "bfloat16", B=2, q=4, L=100)
    assert c.flops_attention == 2 * (128 + 128) * 32 * 32 * 2 * (4 * 100 + 4 * 5 // 2)


def test_matmul_flops_are_twice_active_matmul_weights_per_token():
    cfg = get_preset("mixtral-8x7b")
    c = forward_cost(cfg, "bfloat16", B=3, q=2, L=0)
    assert c.flops_matmul == 2 * param_count(cfg).matmul_active * 6


def test_mla_cache_holds_latent_and_rope_key():
    cfg = get_preset("deepseek-v3")
    assert kv_bytes_per_token(cfg, "bf16") == 61 * (512 + 64) * 2


def test_mtp_cost_counts_one_block_eh_proj_and_the_shared_head():
    cfg = mini("deepseek-v3")
    c = mtp_cost(cfg, "float32", 1, 1, 0, touched=0.0)
    pc = param_count(cfg)
    expert = 3 * cfg.d * cfg.moe_ffn
    assert c.weight_bytes == 4 * (pc.mtp - cfg.experts * expert + cfg.vocab * cfg.d)


def test_bad_shapes_and_dtypes_are_rejected_with_the_field_named():
    cfg = get_preset("tiny")
    with pytest.raises(ValueError, match="q="):
        forward_cost(cfg, "float32", 1, 0, 0)
    with pytest.raises(ValueError, match="B="):
        forward_cost(cfg, "float32", -1, 1, 0)
    with pytest.raises(ValueError, match="max_context"):
        forward_cost(cfg, "float32", 1, 1, cfg.max_context)
    with pytest.raises(ValueError, match="allowed"):
        forward_cost(cfg, "int8", 1, 1, 0)
