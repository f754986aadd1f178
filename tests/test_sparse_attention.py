"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the indexer's selection in the decoder, its bytes and FLOPs
in the byte model, and what the what-if prices for it. The decoder's forward against transformers' reference is in
tests/test_checkpoint.py (families deepseek_v32, glm_moe_dsa)."""

import pytest
import torch

from roofline.io.fields import ConfigError
from roofline.measure.devices import get_datasheet
from roofline.model.accounting import forward_cost, kv_split_token_bytes, param_count
from roofline.model.decoder import build_model
from roofline.model.formats import parse_precision
from roofline.model.presets import get_preset, scaled_down
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import Pass, Setting, WhatIf

FP8 = "bfloat16+weights=fp8_e4m3_b128+kv=fp8_e4m3"


def dense_twin(cfg):
    """The same model without the indexer: dense MLA."""
    return cfg.scaled(index_topk=0, index_heads=0, index_head_dim=0)


def test_sparse_attention_needs_mla_with_a_q_latent_and_all_three_indexer_fields():
    ds = get_preset("deepseek-v3.2")
    with pytest.raises(ConfigError, match="MLA with a q_lora_rank"):
        get_preset("llama-3.1-8b").scaled(index_topk=2048, index_heads=64, index_head_dim=128)
    with pytest.raises(ConfigError, match="MLA with a q_lora_rank"):
        ds.scaled(q_lora_rank=0)
    with pytest.raises(ConfigError, match="needs all three"):
        ds.scaled(index_heads=0)
    with pytest.raises(ConfigError, match="index_head_dim >= qk_rope_dim"):
        ds.scaled(index_head_dim=32)


def test_the_indexer_is_what_deepseek_v3_2_adds_to_deepseek_v3():
    v3, v32 = get_preset("deepseek-v3"), get_preset("deepseek-v3.2")
    extra = param_count(v32).total - param_count(v3).total
    per_layer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64  # wq_b, wk, LayerNorm, weights_proj
    assert extra == v3.layers * per_layer
    assert v32.kv_elems_per_token_layer == v3.kv_elems_per_token_layer + 128  # + one index key a token


@pytest.mark.parametrize("L", [100, 2047, 5000, 131071])
def test_a_decode_step_reads_every_index_key_and_the_selected_latents(L):
    cfg = get_preset("deepseek-v3.2")
    c = forward_cost(cfg, "bfloat16", 3, 1, L)
    att, idx = kv_split_token_bytes(cfg, parse_precision("bfloat16"))
    assert (att, idx) == (576 * 2, 128 * 2)
    assert c.kv_read_bytes == 3 * cfg.layers * (att * min(L + 1, 2048) + idx * (L + 1))
    dense = forward_cost(dense_twin(cfg), "bfloat16", 3, 1, L)
    indexer = 2 * 64 * 128 * cfg.layers * 3 * (L + 1)  # every cached key and the new one
    if L + 1 <= 2048:  # every key selected: dense MLA's attention + the indexer's scores
        assert c.flops_attention == dense.flops_attention + indexer
    else:  # 2048 keys a query
        assert c.flops_attention == 2 * (576 + 512) * 128 * cfg.layers * 3 * 2048 + indexer
        assert c.flops_attention < dense.flops_attention


def test_a_prefill_attends_at_most_index_topk_keys_a_query():
    cfg = get_preset("deepseek-v3.2")
    assert cfg.attended_pairs(0, 4096) == 2048 * 2049 / 2 + (4096 - 2048) * 2048
    assert cfg.indexer_pairs(0, 4096) == 4096 * 4097 / 2
    assert cfg.attended_pairs(5000, 1) == 2048 and cfg.indexer_pairs(5000, 1) == 5001


def test_only_index_topk_keys_reach_the_output():
    """Past index_topk cached tokens a decode step's output depends on the selected latents only: changing the latent
    of the token the indexer ranks lowest leaves it unchanged, changing the one it ranks highest does not."""
    cfg = scaled_down(get_preset("deepseek-v3.2"))  # index_topk 8
    model = build_model(cfg, max_batch=1, max_context=32, seed=0)
    ctx = torch.randint(0, cfg.vocab, (1, 20), generator=torch.Generator().manual_seed(1))
    attn = model.layers[-1].attn
    scores = {}

    def keep_index(mod, args, out):  # the last layer's index scores for the decode step (recomputed as _sparse does)
        x = args[0]
        q_lat = mod.q_a_norm(mod.q_a(x))
        cos, sin = args[1], args[2]
        from roofline.model.rope import apply_rope
        iq = apply_rope(mod.idx_wq_b(q_lat).view(1, 1, cfg.index_heads, cfg.index_head_dim), cos, sin,
                        cfg.index_rope_interleave)
        keys = mod.index_cache[:1, :21].float()
        s = torch.relu(torch.einsum("bqjd,btd->bqjt", iq.float(), keys)) * cfg.index_head_dim ** -0.5
        w = mod.idx_weights(x).float() * cfg.index_heads ** -0.5
        scores["index"] = torch.einsum("bqj,bqjt->bqt", w, s)[0, 0]

    with torch.no_grad():
        model(ctx, 0)
        nxt = torch.tensor([[3]])
        h = attn.register_forward_hook(keep_index)
        base = model(nxt, 20)
        h.remove()
        order = scores["index"].argsort(descending=True)
        low, high = int(order[-1]), int(order[0])
        assert low < 20 and high < 21
        kept = attn.kv_cache.clone()
        for pos, changes in ((low, False), (high, True)):
            attn.kv_cache.copy_(kept)
            attn.kv_cache[0, pos] += 1.0
            out = model(nxt, 20)
            assert (not torch.allclose(out, base, atol=1e-6)) == changes, pos


def _whatif(name, engine="sglang"):
    return WhatIf(get_preset(name), get_datasheet("h200_sxm"), FP8, Layout(tp=8), Setting(engine=engine))


def test_long_context_decode_is_priced_on_the_selected_tokens_not_the_context():
    """At 128k tokens a DeepSeek-V3 decode step reads each sequence's whole latent cache; DeepSeek-V3.2's reads 2048
    latents and the 128k index keys (132 B a token in engines; here the cache's format), so its attention term is a
    fraction of V3's and the step is faster; at 1k tokens every token is selected and the indexer is extra work."""
    v3, v32 = _whatif("deepseek-v3"), _whatif("deepseek-v3.2")
    for B in (1, 64):
        long3, long32 = (w.pass_detail(Pass(B, 1, 131072), 1, "sglang") for w in (v3, v32))
        short3, short32 = (w.pass_detail(Pass(B, 1, 1024), 1, "sglang") for w in (v3, v32))
        assert long32["terms"]["attention"] < long3["terms"]["attention"]
        assert short32["seconds"] > short3["seconds"]
    big3, big32 = (w.pass_detail(Pass(64, 1, 131072), 1, "sglang")["seconds"] for w in (v3, v32))
    assert big32 < 0.6 * big3  # the KV term dominates V3's step there: (576 + 128) against 576 x 64 bytes a token


def test_the_kv_pool_holds_the_index_keys_too():
    v3, v32 = _whatif("deepseek-v3"), _whatif("deepseek-v3.2")
    assert v32.max_running("sglang", 65536) < v3.max_running("sglang", 65536)
