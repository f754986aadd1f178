"""Two-matrix MLPs (up, GELU / ReLU, down) and parallel blocks (attention and the MLP on one input): GPT-J, GPT-NeoX,
Falcon, GPT-BigCode, OPT and BLOOM. Their config.json files are read for pricing (config_from_hf(pricing=True)); the
gpt-j-6b and falcon-180b presets run in the decoder (random weights, RMSNorms, no biases), which the byte model
describes; under tensor parallelism an engine that sums a parallel block's two partial outputs before one all-reduce
(vLLM's Falcon) is priced with one all-reduce a block, the others with two."""

import pytest
import torch

from roofline.checkpoints.loader import config_from_hf
from roofline.io.fields import ConfigError
from roofline.measure.devices import get_datasheet
from roofline.model.accounting import block_elementwise_elements, block_matrices, forward_cost, param_count
from roofline.model.decoder import GeluMLP, build_model
from roofline.model.presets import get_preset, scaled_down
from roofline.parallel import engines
from roofline.parallel.cost import rank_forward_cost
from roofline.parallel.layout import Layout
from roofline.parallel.whatif import Setting, WhatIf

GPTJ = dict(architectures=["GPTJForCausalLM"], n_embd=4096, n_layer=28, n_head=16, rotary_dim=64, n_inner=None,
            n_positions=2048, vocab_size=50400, activation_function="gelu_new", tie_word_embeddings=False)
FALCON_180B = dict(architectures=["FalconForCausalLM"], hidden_size=14848, num_hidden_layers=80, num_attention_heads=232,
                   num_kv_heads=8, new_decoder_architecture=True, parallel_attn=True, multi_query=True, alibi=False,
                   bias=False, vocab_size=65024, max_position_embeddings=2048)
CONFIGS = {  # name: (config.json fields, the model card's exact parameter total, relative tolerance)
    # the model card's n_parameters; the MLP's and LayerNorms' biases are not held (-0.05%)
    "gpt-j-6b": (GPTJ, 6_053_381_344, 6e-4),
    # GPT-NeoX-20B's model card; every linear's bias not held (-0.015%)
    "gpt-neox-20b": (dict(architectures=["GPTNeoXForCausalLM"], hidden_size=6144, num_hidden_layers=44,
                          num_attention_heads=64, intermediate_size=24576, vocab_size=50432, rotary_pct=0.25,
                          use_parallel_residual=True, max_position_embeddings=2048, hidden_act="gelu_fast",
                          tie_word_embeddings=False), 20_554_567_680, 2e-4),
    # BLOOM's model card: 176,247,271,424 parameters (ALiBi, tied head, 4 x 14336 MLP)
    "bloom": (dict(architectures=["BloomForCausalLM"], hidden_size=14336, n_layer=70, n_head=112, vocab_size=250880),
              176_247_271_424, 1e-4),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_two_matrix_config_reproduces_its_published_total_and_the_loader_refuses_it(name):
    raw, published, rel = CONFIGS[name]
    cfg = config_from_hf(raw, name, pricing=True)
    assert not cfg.ffn_gated and cfg.architecture == raw["architectures"][0]
    assert param_count(cfg).total == pytest.approx(published, rel=rel)
    with pytest.raises(ConfigError, match="priced, not run"):
        config_from_hf(raw, name)


def test_the_presets_are_their_config_json():
    skip = {"name", "source", "published_params_total", "published_params_active", "published_note"}
    for raw, preset in ((GPTJ, "gpt-j-6b"), (FALCON_180B, "falcon-180b")):
        ours, want = config_from_hf(raw, pricing=True).to_dict(), get_preset(preset).to_dict()
        assert {k: v for k, v in ours.items() if k not in skip} == {k: v for k, v in want.items() if k not in skip}
    j, f = get_preset("gpt-j-6b"), get_preset("falcon-180b")
    assert (j.parallel_block, j.ffn, j.head_dim, j.rotary_dim, j.tie_embeddings) == (True, 16384, 256, 64, False)
    assert (f.parallel_block, f.kv_heads, f.head_dim, f.ffn, f.tie_embeddings) == (True, 8, 64, 59392, True)


def test_each_family_reads_its_block_and_heads():
    seven = config_from_hf(dict(architectures=["FalconForCausalLM"], hidden_size=4544, num_hidden_layers=32,
                                num_attention_heads=71, multi_query=True, parallel_attn=True, vocab_size=65024), pricing=True)
    assert (seven.kv_heads, seven.parallel_block, seven.ffn, seven.head_dim) == (1, True, 4 * 4544, 64)
    star = config_from_hf(dict(architectures=["GPTBigCodeForCausalLM"], n_embd=6144, n_layer=40, n_head=48,
                               n_inner=24576, multi_query=True, vocab_size=49152, n_positions=8192,
                               activation_function="gelu_pytorch_tanh"), pricing=True)
    assert (star.kv_heads, star.parallel_block, star.max_context, star.tie_embeddings) == (1, False, 8192, True)
    opt = config_from_hf(dict(architectures=["OPTForCausalLM"], hidden_size=9216, num_hidden_layers=64,
                              num_attention_heads=72, ffn_dim=36864, vocab_size=50272, max_position_embeddings=2048,
                              activation_function="relu", word_embed_proj_dim=9216), pricing=True)
    assert (opt.ffn, opt.parallel_block, opt.kv_heads) == (36864, False, 72)
    neox = CONFIGS["gpt-neox-20b"][0]
    assert not config_from_hf(dict(neox, use_parallel_residual=False), pricing=True).parallel_block
    with pytest.raises(ConfigError, match="activation 'silu'"):  # a gated MLP under a two-matrix architecture
        config_from_hf(dict(GPTJ, activation_function="silu"), pricing=True)
    with pytest.raises(ConfigError, match="word_embed_proj_dim=512"):  # OPT-350m's projected embedding
        config_from_hf(dict(architectures=["OPTForCausalLM"], hidden_size=1024, num_hidden_layers=24,
                            num_attention_heads=16, ffn_dim=4096, vocab_size=50272, word_embed_proj_dim=512), pricing=True)
    with pytest.raises(ConfigError, match="missing field 'hidden_size'"):
        config_from_hf(dict(architectures=["GPTNeoXForCausalLM"], num_hidden_layers=2), pricing=True)


def test_a_two_matrix_mlp_is_two_matrices_and_one_activation():
    cfg = get_preset("gpt-j-6b")
    assert [n for n, _, _ in block_matrices(cfg, False)] == ["attn.wqkv", "attn.wo", "ffn.w1", "ffn.w2"]
    gated = cfg.scaled(ffn_gated=True)
    assert param_count(gated).total - param_count(cfg).total == cfg.layers * cfg.d * cfg.ffn  # the gate
    # the activation reads and writes F elements where SiLU-and-mul reads 2F and writes F
    assert block_elementwise_elements(gated, False) - block_elementwise_elements(cfg, False) == cfg.ffn
    one, g = forward_cost(cfg, "bfloat16", 1, 1, 0), forward_cost(gated, "bfloat16", 1, 1, 0)
    assert g.weight_bytes - one.weight_bytes == cfg.layers * cfg.d * cfg.ffn * 2
    with pytest.raises(ConfigError, match="ffn_gated=false / parallel_block"):
        get_preset("mixtral-8x7b").scaled(ffn_gated=False)


def test_the_parallel_block_adds_attention_and_the_mlp_of_one_input():
    cfg = scaled_down(get_preset("gpt-j-6b"))
    m = build_model(cfg, max_batch=2, max_context=16, seed=1)
    blk = m.layers[0]
    assert isinstance(blk.ffn, GeluMLP) and not hasattr(blk.ffn, "w3")
    x = torch.randn(2, 3, cfg.d)
    pos, cos, sin, kv_len, mask = m._positions(torch.zeros(2, 3, dtype=torch.long), 0, None)

    def attn(h):
        m.reset_cache()
        return blk.attn(blk.attn_norm(h), cos, sin, 0, pos, kv_len, mask)

    def run():
        m.reset_cache()
        return blk(x, cos, sin, 0, pos, kv_len, mask)
    want = x + attn(x) + blk.ffn(blk.ffn_norm(x))
    torch.testing.assert_close(run(), want)
    blk.parallel = False  # the sequential block is another function of the same weights
    h = x + attn(x)
    seq = run()
    torch.testing.assert_close(seq, h + blk.ffn(blk.ffn_norm(h)))
    assert not torch.allclose(seq, want)


def test_vllm_reduces_falcons_parallel_block_once_and_tensorrt_llm_twice():
    cfg = get_preset("falcon-180b")
    vllm, trt = engines.profile("vllm", 1), engines.profile("trtllm", 1)
    assert (vllm.block_reduces(cfg), trt.block_reduces(cfg)) == (1, 2)
    assert vllm.block_reduces(get_preset("gpt-j-6b")) == 2  # vLLM's GPT-J reduces each output
    assert vllm.block_reduces(get_preset("llama-3.1-70b")) == 2  # a sequential block: two
    lay = Layout(tp=8)
    counts = {r: [c.count for c in rank_forward_cost(cfg, lay, "bfloat16", 8, 1, 100, reduces=r).collectives
                  if c.kind == "all_reduce"] for r in (1, 2)}
    assert counts == {1: [cfg.layers], 2: [2 * cfg.layers]}
    dev = get_datasheet("h100_sxm")
    w = WhatIf(cfg, dev, "bfloat16+weights=fp8", lay, Setting(engine="vllm"))
    anon = WhatIf(cfg.scaled(architecture=""), dev, "bfloat16+weights=fp8", lay, Setting(engine="vllm"))
    one, two = w.step_terms(8, 2048, "vllm"), anon.step_terms(8, 2048, "vllm")
    # comm = all-reduces x their cost + the logits' all-gather (the same in both): the all-reduces' share doubles
    gather = 2 * one["comm"] - two["comm"]
    assert one["comm"] > 0 and 0 <= gather < 0.05 * one["comm"]
    assert {k: v for k, v in one.items() if k != "comm"} == pytest.approx({k: v for k, v in two.items() if k != "comm"})


def test_a_bad_parallel_block_reduces_entry_is_one_error_naming_it():
    with pytest.raises(ConfigError, match="parallel_block_reduces"):
        engines.one_reduce_parallel({"parallel_block_reduces": {"value": {"FalconForCausalLM": 3}}}, "engines.x")
    assert engines.one_reduce_parallel({}, "engines.x") == ()
