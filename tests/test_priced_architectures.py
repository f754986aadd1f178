"""Architectures the what-if prices from a Hugging Face config.json that the decoder does not run (Gemma 1-3's GeGLU,
Phi-3's fused projections, Qwen2-MoE's shared expert, DeepSeek-V2's MLA with softmax routing): read by
config_from_hf(pricing=True), i.e. `card` / `capacity` / `predict checkpoint=DIR`, refused by the loader that runs
weights. The configs hold the fields of each release's config.json that the reader uses; their parameter totals
are checked against the totals the model cards publish (which checks those fields)."""

import json
import math

import pytest

from roofline.checkpoints.loader import config_from_hf
from roofline.io.fields import ConfigError
from roofline.model.accounting import param_count

CONFIGS = {  # name: (config.json fields, published total parameters)
    "gemma-2-9b": (dict(architectures=["Gemma2ForCausalLM"], hidden_size=3584, intermediate_size=14336,
                        num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                        vocab_size=256000, max_position_embeddings=8192, sliding_window=4096,
                        hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, attention_bias=False), 9.24e9),
    "gemma-3-27b": (dict(architectures=["Gemma3ForConditionalGeneration"], text_config=dict(
        hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=16,
        head_dim=128, vocab_size=262208, sliding_window=1024, sliding_window_pattern=6, max_position_embeddings=131072,
        rope_scaling=dict(rope_type="linear", factor=8.0), hidden_activation="gelu_pytorch_tanh")),
        27.0e9),  # the card's 27B less the 0.4B vision encoder, which the text config does not describe
    "phi-3-mini-4k": (dict(architectures=["Phi3ForCausalLM"], hidden_size=3072, intermediate_size=8192,
                           num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                           max_position_embeddings=4096, sliding_window=2047, hidden_act="silu",
                           tie_word_embeddings=False), 3.82e9),
    "qwen1.5-moe-a2.7b": (dict(architectures=["Qwen2MoeForCausalLM"], hidden_size=2048, intermediate_size=5632,
                               num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16, vocab_size=151936,
                               max_position_embeddings=8192, num_experts=60, num_experts_per_tok=4,
                               moe_intermediate_size=1408, shared_expert_intermediate_size=5632, hidden_act="silu",
                               tie_word_embeddings=False, decoder_sparse_step=1, norm_topk_prob=False), 14.3e9),
    "deepseek-v2-lite": (dict(architectures=["DeepseekV2ForCausalLM"], hidden_size=2048, intermediate_size=10944,
                              num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, vocab_size=102400,
                              max_position_embeddings=163840, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128,
                              qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64, n_shared_experts=2,
                              num_experts_per_tok=6, moe_intermediate_size=1408, first_k_dense_replace=1,
                              moe_layer_freq=1, topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
                              routed_scaling_factor=1.0, hidden_act="silu", tie_word_embeddings=False,
                              rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096,
                                                beta_fast=32, beta_slow=1, mscale=0.707, mscale_all_dim=0.707)),
                         15.7e9),
    "deepseek-v2": (dict(architectures=["DeepseekV2ForCausalLM"], hidden_size=5120, intermediate_size=12288,
                         num_hidden_layers=60, num_attention_heads=128, num_key_value_heads=128, vocab_size=102400,
                         max_position_embeddings=163840, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                         qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=160, n_shared_experts=2,
                         num_experts_per_tok=6, moe_intermediate_size=1536, first_k_dense_replace=1, moe_layer_freq=1,
                         topk_method="group_limited_greedy", n_group=8, topk_group=3, scoring_func="softmax",
                         norm_topk_prob=False, routed_scaling_factor=16.0, hidden_act="silu"), 236e9),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_priced_architecture_reproduces_its_published_size_and_the_loader_refuses_it(name):
    raw, published = CONFIGS[name]
    cfg = config_from_hf(raw, name, pricing=True)
    assert param_count(cfg).total == pytest.approx(published, rel=5e-3)
    with pytest.raises(ConfigError, match="priced, not run"):
        config_from_hf(raw, name)


def test_gemma_windows_qwen2_moe_shared_expert_and_deepseek_v2_mla_are_read():
    g2 = config_from_hf(CONFIGS["gemma-2-9b"][0], pricing=True)
    assert (g2.sliding_window, g2.global_every, g2.max_context, g2.tie_embeddings) == (4096, 2, 8192, True)
    g3 = config_from_hf(CONFIGS["gemma-3-27b"][0], pricing=True)
    assert (g3.sliding_window, g3.global_every, g3.qk_norm, g3.tie_embeddings) == (1024, 6, True, True)
    phi = CONFIGS["phi-3-mini-4k"][0]  # a window on every layer: priced as one, where the decoder stops at it
    assert (config_from_hf(phi, pricing=True).sliding_window, config_from_hf(phi, pricing=True).max_context) == (2047, 4096)
    mistral = dict(phi, architectures=["MistralForCausalLM"])
    assert config_from_hf(mistral).max_context == 2047 and config_from_hf(mistral).sliding_window == 0
    q = config_from_hf(CONFIGS["qwen1.5-moe-a2.7b"][0], pricing=True)
    assert (q.experts, q.experts_per_token, q.shared_experts, q.shared_expert_gate, q.qkv_bias) == (60, 4, 4, True, True)
    ds = config_from_hf(CONFIGS["deepseek-v2-lite"][0], pricing=True)
    assert (ds.attention, ds.q_lora_rank, ds.kv_lora_rank, ds.first_dense_layers, ds.shared_experts) == ("mla", 0, 512, 1, 2)
    bad = dict(CONFIGS["qwen1.5-moe-a2.7b"][0], shared_expert_intermediate_size=5000)
    with pytest.raises(ConfigError, match="shared_expert_intermediate_size=5000"):
        config_from_hf(bad, pricing=True)
    with pytest.raises(ConfigError, match="hidden_activation='relu'"):
        config_from_hf(dict(CONFIGS["gemma-2-9b"][0], hidden_activation="relu"), pricing=True)


@pytest.mark.parametrize("name", ["gemma-2-9b", "deepseek-v2-lite", "qwen1.5-moe-a2.7b"])
def test_card_prices_a_folder_of_a_priced_architecture(name, tmp_path, capsys):
    from roofline.commands import card
    from tests.helpers import composed
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIGS[name][0]))
    card.run(composed("card", f"checkpoint={folder}", "device=h100_sxm", "engine=vllm", "batch=8", "context=2048",
                      device_as=card.DEVICE_AS))
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["model"] == name and math.isfinite(rec["whatif_itl_ms"]) and rec["whatif_itl_ms"] > 0
