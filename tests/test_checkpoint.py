"""Hugging Face checkpoints: forward parity with transformers per family, MTP against the
DeepSeek-V3 equations, loader errors that name the tensor, and the card on a model folder."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors import safe_open  # noqa: E402

from roofline.checkpoints.loader import ARCHITECTURES, checkpoint_config, config_from_hf, load_checkpoint  # noqa: E402
from roofline.io.fields import ConfigError  # noqa: E402
from roofline.model.presets import REPO_ROOT  # noqa: E402
from tests.helpers import BASE, FAMILIES, add_mtp_layer, hf_model, rms  # noqa: E402

def ours_vs_hf(hf, folder, B=2, q=7, seed=1):
    cfg = hf.config
    tokens = torch.randint(0, cfg.vocab_size, (B, q), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ref = hf(tokens).logits.double()
        model = load_checkpoint(folder, dtype="float32", device="cpu", max_batch=B, max_context=32)
        ours = model(tokens, torch.zeros(B, dtype=torch.long)).double()
    cos = torch.nn.functional.cosine_similarity(ours.flatten(), ref.flatten(), dim=0).item()
    return cos, (ours - ref).abs().max().item(), ref.abs().max().item()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_forward_parity_with_transformers(family, tmp_path):
    hf = hf_model(family)
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    if getattr(hf.config, "num_nextn_predict_layers", 0):
        add_mtp_layer(hf, tmp_path)  # as released: transformers does not save it
    assert checkpoint_config(tmp_path).layers == FAMILIES[family].get("num_hidden_layers", BASE["num_hidden_layers"])
    cos, err, scale = ours_vs_hf(hf, tmp_path)
    assert cos >= 0.99999 and err < 1e-4, f"{family}: cosine {cos:.8f}, max abs error {err:.2e} (max |logit| {scale:.2f})"


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_sharded_checkpoint_loads_the_same(family, tmp_path):
    hf = hf_model(family, seed=2, num_nextn_predict_layers=0) if family == "deepseek_v3" else hf_model(family, seed=2)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json").is_file(), shards
    cos, err, _ = ours_vs_hf(hf, tmp_path)
    assert cos >= 0.99999 and err < 1e-4, f"{family} sharded: cosine {cos:.8f}, max abs error {err:.2e}"


def test_fused_expert_tensors_load(tmp_path):
    """transformers 5 keeps experts fused in memory (experts.gate_up_proj [E, 2f, d], experts.down_proj
    [E, d, f]); a checkpoint written from that state dict directly loads too."""
    hf = hf_model("glm4_moe", seed=3, num_nextn_predict_layers=0)
    hf.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(k.endswith("experts.gate_up_proj") for k in state)
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cos, err, _ = ours_vs_hf(hf, tmp_path)
    assert cos >= 0.99999 and err < 1e-4, f"fused experts: cosine {cos:.8f}, max abs error {err:.2e}"


def test_group_limited_routing_picks_only_the_best_groups(tmp_path):
    hf = hf_model("deepseek_v3", seed=4, num_nextn_predict_layers=0)
    hf.save_pretrained(tmp_path)
    model = load_checkpoint(tmp_path, dtype="float32", max_batch=1, max_context=8)
    assert (model.cfg.router_groups, model.cfg.router_topk_groups) == (2, 1)
    moe = model.layers[1].ffn
    x = torch.randn(64, 64)
    w, idx = moe.route(x)
    assert (idx // 4).unique(dim=1).shape[1] == 1  # both experts of every token in one group of 4
    _, ref_w, ref_idx = hf.model.layers[1].mlp.gate(x)
    assert torch.equal(idx.sort(-1).values, ref_idx.sort(-1).values)
    torch.testing.assert_close(w.gather(-1, idx.argsort(-1)), ref_w.gather(-1, ref_idx.argsort(-1)))


# ---- MTP: transformers drops it; we write it and check it against the equations ---------------

def mtp_reference(hf, mtp, hidden, next_tokens):
    """DeepSeek-V3 §2.2: h' = M [RMSNorm(h); RMSNorm(Emb(t_{i+1}))]-> TRM -> OutHead, with the
    concatenation order of the released weights (embedding first)."""
    eps = hf.config.rms_norm_eps
    emb = hf.model.embed_tokens(next_tokens)
    x = torch.cat((rms(emb, mtp["enorm.weight"], eps), rms(hidden, mtp["hnorm.weight"], eps)), -1) @ mtp["eh_proj.weight"].T
    q = x.shape[1]
    pos = torch.arange(q)[None].expand(x.shape[0], q)
    cos_sin = hf.model.rotary_emb(x, pos)
    mask = torch.full((q, q), float("-inf")).triu(1)[None, None]
    out = mtp["layer"](x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
    out = out[0] if isinstance(out, tuple) else out
    return rms(out, mtp["shared_head.norm.weight"], eps) @ mtp["shared_head.head.weight"].T


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe", "deepseek_v32"])
def test_mtp_module_matches_the_deepseek_v3_equations(family, tmp_path):
    hf = hf_model(family, seed=6)
    hf.save_pretrained(tmp_path)
    mtp = add_mtp_layer(hf, tmp_path)
    B, q = 2, 6
    g = torch.Generator().manual_seed(7)
    hidden = torch.randn(B, q, hf.config.hidden_size, generator=g)
    next_tokens = torch.randint(0, hf.config.vocab_size, (B, q), generator=g)
    with torch.no_grad():
        ref = mtp_reference(hf, mtp, hidden, next_tokens).double()
        model = load_checkpoint(tmp_path, dtype="float32", max_batch=B, max_context=16)
        ours, _ = model.mtp_forward(hidden, next_tokens, torch.zeros(B, dtype=torch.long))
    ours = ours.double()
    cos = torch.nn.functional.cosine_similarity(ours.flatten(), ref.flatten(), dim=0).item()
    err = (ours - ref).abs().max().item()
    assert cos >= 0.99999 and err < 1e-4, f"{family} MTP: cosine {cos:.8f}, max abs error {err:.2e}"


def test_mtp_copy_of_the_head_that_differs_is_reported(tmp_path):
    hf = hf_model("deepseek_v3", seed=8)
    hf.save_pretrained(tmp_path)
    add_mtp_layer(hf, tmp_path)
    _rewrite(tmp_path, lambda t: t.update({"model.layers.3.shared_head.head.weight": t["lm_head.weight"] + 1e-3}))
    with pytest.warns(UserWarning, match=r"model\.layers\.3\.shared_head\.head\.weight.*differs"):
        load_checkpoint(tmp_path, dtype="float32", max_context=8)


def test_checkpoint_without_its_mtp_layer_fails_naming_it(tmp_path):
    hf = hf_model("deepseek_v3", seed=9)  # config says num_nextn_predict_layers=1; save drops the layer
    hf.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"missing tensor 'model\.layers\.3\.(enorm|eh_proj|hnorm|input_layernorm)"):
        load_checkpoint(tmp_path, dtype="float32", max_context=8)


def test_mtp_layer_its_config_does_not_declare_is_unexpected(tmp_path):
    hf = hf_model("deepseek_v3", seed=12)
    hf.save_pretrained(tmp_path)
    add_mtp_layer(hf, tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["num_nextn_predict_layers"] = 0
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"unexpected tensor 'model\.layers\.3\..*num_nextn_predict_layers=0"):
        load_checkpoint(tmp_path, dtype="float32", max_context=8)


# ---- loader errors ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    hf_model("llama", seed=10).save_pretrained(folder)
    return folder


def _rewrite(folder, edit):
    path = folder / "model.safetensors"
    with safe_open(str(path), framework="pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    edit(tensors)
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})


def _broken(llama_dir, tmp_path, edit):
    folder = tmp_path / "broken"
    shutil.copytree(llama_dir, folder)
    _rewrite(folder, edit)
    return folder


def test_missing_tensor_is_named(llama_dir, tmp_path):
    folder = _broken(llama_dir, tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ConfigError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_checkpoint(folder, dtype="float32", max_context=8)


def test_wrong_shape_is_named(llama_dir, tmp_path):
    key = "model.layers.2.self_attn.k_proj.weight"
    folder = _broken(llama_dir, tmp_path, lambda t: t.update({key: t[key][:16]}))
    with pytest.raises(ConfigError, match=r"'model\.layers\.2\.self_attn\.k_proj\.weight': shape \[16, 64\], config\.json implies \[32, 64\]"):
        load_checkpoint(folder, dtype="float32", max_context=8)


def test_unexpected_tensor_is_named(llama_dir, tmp_path):
    folder = _broken(llama_dir, tmp_path, lambda t: t.update({"model.layers.0.mlp.extra_proj.weight": torch.zeros(2, 2)}))
    with pytest.raises(ConfigError, match=r"unexpected tensor 'model\.layers\.0\.mlp\.extra_proj\.weight'"):
        load_checkpoint(folder, dtype="float32", max_context=8)


def test_integer_tensor_is_named(llama_dir, tmp_path):
    key = "model.norm.weight"
    folder = _broken(llama_dir, tmp_path, lambda t: t.update({key: t[key].to(torch.int32)}))
    with pytest.raises(ConfigError, match=r"'model\.norm\.weight': dtype I32"):
        load_checkpoint(folder, dtype="float32", max_context=8)


def test_config_with_a_wrong_hidden_size_fails_on_the_first_tensor(llama_dir, tmp_path):
    folder = tmp_path / "wrong-config"
    shutil.copytree(llama_dir, folder)
    raw = json.loads((folder / "config.json").read_text())
    raw["hidden_size"] = 80
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"tensor 'model\..*': shape \[.*\], config\.json implies \[.*80.*\]"):
        load_checkpoint(folder, dtype="float32", max_context=8)


def test_unknown_architecture_names_the_field_and_the_allowed_list():
    with pytest.raises(ConfigError) as err:
        config_from_hf({"architectures": ["GPT2LMHeadModel"], "hidden_size": 64})
    assert "architectures" in str(err.value) and "GPT2LMHeadModel" in str(err.value)
    for arch in ARCHITECTURES:
        assert arch in str(err.value)


HUB_CONFIGS = {  # the published config.json fields the preset YAMLs cite (older layout: top-level rope fields)
    "deepseek-v3": dict(
        architectures=["DeepseekV3ForCausalLM"], vocab_size=129280, hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
        n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, topk_method="noaux_tc", n_group=8, topk_group=4,
        num_experts_per_tok=8, moe_layer_freq=1, first_k_dense_replace=3, norm_topk_prob=True, scoring_func="sigmoid",
        hidden_act="silu", max_position_embeddings=163840, rms_norm_eps=1e-6, rope_theta=10000,
        num_nextn_predict_layers=1, tie_word_embeddings=False, attention_bias=False,
        rope_scaling=dict(beta_fast=32, beta_slow=1, factor=40, mscale=1.0, mscale_all_dim=1.0,
                          original_max_position_embeddings=4096, type="yarn"),
        quantization_config=dict(activation_scheme="dynamic", fmt="e4m3", quant_method="fp8",
                                 weight_block_size=[128, 128])),
    "glm-5": dict(
        architectures=["GlmMoeDsaForCausalLM"], vocab_size=154880, hidden_size=6144, intermediate_size=12288,
        moe_intermediate_size=2048, num_hidden_layers=78, num_attention_heads=64, num_key_value_heads=64, head_dim=64,
        n_shared_experts=1, n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=2048,
        qk_rope_head_dim=64, qk_nope_head_dim=192, qk_head_dim=256, v_head_dim=256, topk_method="noaux_tc",
        n_group=1, topk_group=1, num_experts_per_tok=8, moe_layer_freq=1, first_k_dense_replace=3,
        norm_topk_prob=True, scoring_func="sigmoid", hidden_act="silu", max_position_embeddings=202752,
        rms_norm_eps=1e-5, num_nextn_predict_layers=1, tie_word_embeddings=False, attention_bias=False,
        index_head_dim=128, index_n_heads=32, index_topk=2048, indexer_rope_interleave=True, rope_interleave=True,
        rope_parameters=dict(rope_theta=1000000, rope_type="default")),
    "minimax-m2.5": dict(
        architectures=["MiniMaxM2ForCausalLM"], model_type="minimax_m2", num_hidden_layers=62, hidden_size=3072,
        num_attention_heads=48, num_key_value_heads=8, head_dim=128, intermediate_size=1536, vocab_size=200064,
        num_experts_per_tok=8, num_local_experts=256, max_position_embeddings=196608, rope_theta=5000000,
        rotary_dim=64, hidden_act="silu", rms_norm_eps=1e-06, tie_word_embeddings=False, use_qk_norm=True,
        qk_norm_type="per_layer", use_routing_bias=True, use_mtp=True, mtp_transformer_layers=1, num_mtp_modules=3,
        shared_intermediate_size=0, scoring_func="sigmoid",
        quantization_config=dict(quant_method="fp8", fmt="float8_e4m3fn", activation_scheme="dynamic",
                                 weight_block_size=[128, 128],
                                 modules_to_not_convert=["gate", "e_score_correction_bias", "lm_head"])),
    # Qwen3.5 releases are multimodal: the language model's fields are text_config's
    "qwen3.5-27b": dict(architectures=["Qwen3_5ForConditionalGeneration"], tie_word_embeddings=False, text_config=dict(
        model_type="qwen3_5_text", vocab_size=248320, hidden_size=5120, num_hidden_layers=64, num_attention_heads=24,
        num_key_value_heads=4, head_dim=256, attn_output_gate=True, attention_bias=False, full_attention_interval=4,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=48,
        linear_value_head_dim=128, max_position_embeddings=262144, mlp_only_layers=[], intermediate_size=17408,
        rms_norm_eps=1e-06, mamba_ssm_dtype="float32", hidden_act="silu", mtp_num_hidden_layers=1,
        rope_parameters=dict(mrope_interleaved=True, mrope_section=[11, 11, 10], rope_type="default",
                             rope_theta=10000000, partial_rotary_factor=0.25))),
    "qwen3.5-35b-a3b": dict(architectures=["Qwen3_5MoeForConditionalGeneration"], tie_word_embeddings=False,
                            text_config=dict(
        model_type="qwen3_5_moe_text", vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
        num_key_value_heads=2, head_dim=256, attn_output_gate=True, attention_bias=False, full_attention_interval=4,
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_value_head_dim=128, max_position_embeddings=262144, mlp_only_layers=[], moe_intermediate_size=512,
        shared_expert_intermediate_size=512, num_experts=256, num_experts_per_tok=8, rms_norm_eps=1e-06,
        mamba_ssm_dtype="float32", hidden_act="silu", mtp_num_hidden_layers=1,
        rope_parameters=dict(mrope_interleaved=True, mrope_section=[11, 11, 10], rope_type="default",
                             rope_theta=10000000, partial_rotary_factor=0.25))),
    "glm-4.5-air": dict(
        architectures=["Glm4MoeForCausalLM"], vocab_size=151552, hidden_size=4096, num_hidden_layers=46,
        num_attention_heads=96, num_key_value_heads=8, head_dim=128, partial_rotary_factor=0.5, attention_bias=True,
        use_qk_norm=False, intermediate_size=10944, first_k_dense_replace=1, moe_intermediate_size=1408,
        n_routed_experts=128, num_experts_per_tok=8, n_shared_experts=1, norm_topk_prob=True,
        routed_scaling_factor=1.0, n_group=1, topk_group=1, num_nextn_predict_layers=1,
        max_position_embeddings=131072, rope_theta=1000000, rope_scaling=None, rms_norm_eps=1e-5,
        tie_word_embeddings=False, hidden_act="silu"),
    "qwen3-30b-a3b": dict(
        architectures=["Qwen3MoeForCausalLM"], vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144, moe_intermediate_size=768,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=40960, rope_theta=1000000.0, rope_scaling=None, rms_norm_eps=1e-6,
        tie_word_embeddings=False, attention_bias=False, sliding_window=None, use_sliding_window=False),
    "mixtral-8x7b": dict(
        architectures=["MixtralForCausalLM"], vocab_size=32000, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
        rope_theta=1e6, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False, num_local_experts=8,
        num_experts_per_tok=2),
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192)),
    "qwen2.5-7b": dict(
        architectures=["Qwen2ForCausalLM"], vocab_size=152064, hidden_size=3584, intermediate_size=18944,
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=131072,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, sliding_window=131072,
        use_sliding_window=False),
    # the four below: the configs as github.com/citsjtu2020/LLM-Prof sglang/Model_Config.md copies them (the presets'
    # headers), every field that names a shape, a norm or a position encoding
    "qwen3-14b": dict(
        architectures=["Qwen3ForCausalLM"], attention_bias=False, head_dim=128, hidden_act="silu", hidden_size=5120,
        intermediate_size=17408, max_position_embeddings=40960, num_attention_heads=40, num_hidden_layers=40,
        num_key_value_heads=8, rms_norm_eps=1e-6, rope_scaling=None, rope_theta=1000000, sliding_window=None,
        tie_word_embeddings=False, use_sliding_window=False, vocab_size=151936),
    "qwen3-4b": dict(
        architectures=["Qwen3ForCausalLM"], attention_bias=False, head_dim=128, hidden_act="silu", hidden_size=2560,
        intermediate_size=9728, max_position_embeddings=40960, num_attention_heads=32, num_hidden_layers=36,
        num_key_value_heads=8, rms_norm_eps=0.000001, rope_scaling=None, rope_theta=1000000, sliding_window=None,
        tie_word_embeddings=True, use_sliding_window=False, vocab_size=151936),
    "qwen2.5-14b": dict(
        architectures=["Qwen2ForCausalLM"], hidden_act="silu", hidden_size=5120, intermediate_size=13824,
        max_position_embeddings=131072, num_attention_heads=40, num_hidden_layers=48, num_key_value_heads=8,
        rms_norm_eps=1e-05, rope_theta=1000000.0, sliding_window=131072, tie_word_embeddings=False,
        use_sliding_window=False, vocab_size=152064),
    "llama-3.2-3b": dict(
        architectures=["LlamaForCausalLM"], attention_bias=False, head_dim=128, hidden_act="silu", hidden_size=3072,
        intermediate_size=8192, max_position_embeddings=131072, mlp_bias=False, num_attention_heads=24,
        num_hidden_layers=28, num_key_value_heads=8, rms_norm_eps=1e-05, rope_theta=500000.0,
        rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0, original_max_position_embeddings=8192,
                          rope_type="llama3"),
        tie_word_embeddings=True, vocab_size=128256),
}


HUB_CONFIGS["deepseek-v3.2"] = dict(  # DeepSeek-V3's fields + its sparse attention
    HUB_CONFIGS["deepseek-v3"], architectures=["DeepseekV32ForCausalLM"], index_head_dim=128, index_n_heads=64,
    index_topk=2048, quantization_config=dict(HUB_CONFIGS["deepseek-v3"]["quantization_config"], scale_fmt="ue8m0"))


@pytest.mark.parametrize("preset", list(HUB_CONFIGS))
def test_published_config_maps_to_the_preset(preset):
    from roofline.model.presets import get_preset
    skip = {"name", "source", "published_params_total", "published_params_active", "published_note", "architecture"}
    ours, want = config_from_hf(HUB_CONFIGS[preset]).to_dict(), get_preset(preset).to_dict()
    assert {k: v for k, v in ours.items() if k not in skip} == {k: v for k, v in want.items() if k not in skip}
    assert ours["architecture"]  # the config's (a multimodal release's: its language model's); presets may leave ""
    assert want["architecture"] in ("", ours["architecture"])



def test_a_later_release_of_the_same_architecture_prices_as_its_preset_or_is_refused_by_name():
    """GLM-5.1's config.json differs from GLM-5's only in transformers_version (ai-dynamo/aiconfigurator's copies):
    the glm-5 preset. GLM-5.2's adds indexer_types, 3 of every 4 sparse layers reusing another layer's top-k
    ('shared'), which is not modelled: refused by name, not priced as GLM-5's indexer in every layer."""
    from roofline.model.presets import get_preset
    skip = {"name", "source", "published_params_total", "published_params_active", "published_note", "architecture"}
    glm51 = dict(HUB_CONFIGS["glm-5"], transformers_version="5.4.0")
    assert {k: v for k, v in config_from_hf(glm51).to_dict().items() if k not in skip} == {
        k: v for k, v in get_preset("glm-5").to_dict().items() if k not in skip}
    shared = (["full"] * 3 + ["full", "shared", "shared", "shared"] * 19)[:78]
    glm52 = dict(HUB_CONFIGS["glm-5"], indexer_types=shared, index_topk_freq=4, max_position_embeddings=1048576)
    with pytest.raises(ConfigError, match="indexer_types"):
        config_from_hf(glm52)
    assert config_from_hf(dict(glm52, indexer_types=["full"] * 78)).is_sparse

def test_tied_embeddings_load(tmp_path):
    hf = hf_model("qwen3", seed=11, tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    assert checkpoint_config(tmp_path).tie_embeddings
    cos, err, _ = ours_vs_hf(hf, tmp_path)
    assert cos >= 0.99999 and err < 1e-4, f"tied: cosine {cos:.8f}, max abs error {err:.2e}"


# ---- the card on a model folder --------------------------------------------------------------

def test_card_takes_a_model_folder(llama_dir):
    hf = hf_model("llama", seed=10)
    out = subprocess.run([sys.executable, "-m", "roofline.cli.card", f"checkpoint={llama_dir}", "device=null"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    assert rec["params_total"] == sum(p.numel() for p in hf.parameters())
    assert rec["model"] == llama_dir.name and rec["layers"] == BASE["num_hidden_layers"]


# ---- the sweep on a model folder -------------------------------------------------------------

def test_sweep_times_the_checkpoint_weights_layer_sliced(llama_dir, tmp_path):
    from roofline.measure.sweep import SweepRequest, BuiltModel, run_sweep
    from roofline.measure.timer import TimerSettings
    kw = dict(model=checkpoint_config(llama_dir), q=(1, 2), B=(1,), L=(0, 4), dtypes=("float32",), layers=1,
              timer=TimerSettings(warmup=1, min_reps=3, max_reps=3, budget_s=0.02))
    req = SweepRequest(checkpoint=str(llama_dir), **kw)
    assert req.fingerprint() != SweepRequest(**kw).fingerprint()
    model = BuiltModel(req, "float32", 1, "eager").model
    assert len(model.layers) == 1
    with safe_open(str(llama_dir / "model.safetensors"), framework="pt") as fh:
        qkv = torch.cat([fh.get_tensor(f"model.layers.0.self_attn.{p}_proj.weight") for p in "qkv"])
        assert torch.equal(model.layers[0].attn.wqkv.weight, qkv)
    out = run_sweep(req, tmp_path / "run", progress=False)
    assert out["ok"] == out["points"] == 8  # forward q in {1, 2} x L in {0, 4} x depths {1, 2}


# ----------------------------------------------------------------------------- fp8 block-scaled checkpoints

def fp8_block_checkpoint(hf, folder, deq_folder, block):
    """Rewrite a saved checkpoint as DeepSeek-V3 releases it: every attention / MLP projection
    (experts and shared experts too) fp8 e4m3 with a float32 weight_scale_inv per block;
    `deq_folder` gets the dequantised float weights of the same checkpoint (the reference)."""
    from roofline.model.formats import parse_format
    from roofline.model.quant import quantize
    fmt = parse_format(f"fp8_e4m3_b{block}")
    path = folder / "model.safetensors"
    with safe_open(str(path), framework="pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    fp8, deq = {}, {}
    for k, v in tensors.items():
        if k.endswith(".weight") and "_proj" in k.split(".")[-2] and (".self_attn." in k or ".mlp." in k):
            qz = quantize(v.float(), fmt)
            fp8[k], fp8[k + "_scale_inv"], deq[k] = qz.q, qz.scale, qz.dequantize()
        else:
            fp8[k] = deq[k] = v
    shutil.copytree(folder, deq_folder)
    safetensors_torch.save_file(deq, str(deq_folder / "model.safetensors"), metadata={"format": "pt"})
    safetensors_torch.save_file(fp8, str(path), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = dict(activation_scheme="dynamic", fmt="e4m3", quant_method="fp8",
                                      weight_block_size=[block, block])
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("block", [16, 128])
def test_fp8_block_scaled_checkpoint_loads_fp8_and_runs(block, tmp_path):
    from roofline.model.accounting import resident_weight_bytes
    from roofline.model.formats import precision
    from roofline.model.quant import held_weight_bytes
    hf = hf_model("deepseek_v3", seed=9)
    hf.save_pretrained(tmp_path / "fp8")
    add_mtp_layer(hf, tmp_path / "fp8")
    fp8_block_checkpoint(hf, tmp_path / "fp8", tmp_path / "deq", block)
    cfg = checkpoint_config(tmp_path / "fp8")
    assert cfg.native_weights == f"fp8_e4m3_b{block}"
    model = load_checkpoint(tmp_path / "fp8", dtype="float32", max_batch=2, max_context=16)
    ref = load_checkpoint(tmp_path / "deq", dtype="float32", max_batch=2, max_context=16)
    assert model.layers[1].attn.q_a.weight.dtype == torch.float8_e4m3fn  # kept as stored
    assert model.layers[1].ffn.w1.weight.dtype == torch.float8_e4m3fn  # routed experts too
    assert model.layers[1].attn.kv_b.weight.dtype == torch.float32  # dequantised on load (absorbed MLA)
    assert held_weight_bytes(model) == resident_weight_bytes(cfg, precision("float32", "native", native=cfg.native_weights))
    tokens = torch.randint(0, cfg.vocab, (2, 6), generator=torch.Generator().manual_seed(3))
    start = torch.zeros(2, dtype=torch.long)
    with torch.no_grad():
        ours, want = model(tokens, start).double(), ref(tokens, start).double()
    assert torch.isfinite(ours).all()
    assert (ours - want).abs().max().item() < 1e-4 * want.abs().max().item()


def test_fp8_checkpoint_sweep_rows_say_unsupported_on_cpu(tmp_path):
    from roofline.io.results import read_rows
    from roofline.measure.sweep import SweepRequest, run_sweep
    from roofline.measure.timer import TimerSettings
    hf = hf_model("deepseek_v3", seed=10, num_nextn_predict_layers=0)
    hf.save_pretrained(tmp_path / "fp8")
    fp8_block_checkpoint(hf, tmp_path / "fp8", tmp_path / "deq", 16)
    req = SweepRequest(model=checkpoint_config(tmp_path / "fp8"), q=(1,), B=(1,), L=(4,), checkpoint=str(tmp_path / "fp8"),
                     timer=TimerSettings(warmup=0, min_reps=2, max_reps=2))
    run_sweep(req, tmp_path / "run", progress=False)
    rows = read_rows(tmp_path / "run" / "points.jsonl")
    assert [r["status"] for r in rows] == ["unsupported"]
    assert "weights=fp8_e4m3_b16 on device=cpu" in rows[0]["error"]


def test_a_block_fp8_config_without_fmt_loads_as_e4m3():
    """Qwen3's and DeepSeek's fp8 releases print fmt e4m3; a config without the field was refused as fmt None."""
    q = dict(quant_method="fp8", activation_scheme="dynamic", weight_block_size=[128, 128])
    assert config_from_hf(dict(HUB_CONFIGS["llama-3.1-8b"], quantization_config=q)).native_weights == "fp8_e4m3_b128"


def test_quantization_config_that_is_not_fp8_block_scaled_is_refused():
    raw = dict(HUB_CONFIGS["llama-3.1-8b"], quantization_config=dict(quant_method="awq", bits=4))
    with pytest.raises(ConfigError, match="quantization_config.*allowed fp8 block-scaled"):
        config_from_hf(raw)


@pytest.mark.parametrize("field, value, says", [
    ("hidden_size", True, r"model\.d=True: must be a positive integer"),
    ("num_hidden_layers", True, r"model\.layers=True"),
    ("rms_norm_eps", float("nan"), r"model\.norm_eps=nan"),
    ("rms_norm_eps", 0.0, r"model\.norm_eps=0\.0"),
    ("rope_theta", float("inf"), r"model\.rope_theta=inf"),
])
def test_a_config_json_with_a_bool_or_a_non_finite_number_is_refused(field, value, says):
    """N17: `hidden_size: true` made a card for d=1 (a bool is an int in Python); NaN eps was accepted."""
    raw = dict(HUB_CONFIGS["llama-3.1-8b"], **{field: value})
    with pytest.raises(ConfigError, match=says):
        config_from_hf(raw)
