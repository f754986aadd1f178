"""Model presets: every YAML in roofline/conf/model loads, and the published shapes are the real ones.

The spot checks are facts from each model's Hugging Face config.json (see the `source` field
and the comment at the top of each preset file), so a typo in a preset fails here.
"""

from __future__ import annotations

import pytest
import yaml

import roofline.model.presets as presets
from roofline.io.fields import ConfigError
from roofline.model.config import ModelConfig

REAL_MODELS = [
    "llama-3.1-8b",
    "llama-3.1-70b",
    "qwen2.5-7b",
    "mistral-7b",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "deepseek-v3",
    "glm-4.5-air",
    "glm-4.7",
    "llama-3.1-405b",
    "qwen2.5-72b",
    "qwen2.5-32b",
    "qwen3-8b",
    "qwen3-32b",
    "qwen3-235b-a22b",
    "mixtral-8x22b",
    "deepseek-r1",
    "kimi-k2",
    "qwen3-coder-480b-a35b",
    "deepseek-v3.2",
    "glm-5",
    "minimax-m2.5",
    "kimi-k2.5",
    "qwen-1.8b",
    "qwen-7b",
    "qwen-14b",
    "qwen3-14b",
    "qwen3-4b",
    "qwen2.5-14b",
    "llama-3.2-3b",
]


@pytest.fixture(autouse=True)
def _fresh_cache():
    presets._load.cache_clear()
    yield
    presets._load.cache_clear()


@pytest.mark.parametrize("name", presets.list_presets())
def test_every_preset_loads(name):
    cfg = presets.get_preset(name)
    assert isinstance(cfg, ModelConfig)
    assert cfg.name == name
    assert cfg.source


def test_real_model_presets_are_listed():
    assert set(REAL_MODELS) <= set(presets.list_presets())


@pytest.mark.parametrize("name", REAL_MODELS)
def test_real_presets_cite_config_and_published_counts(name):
    cfg = presets.get_preset(name)
    assert cfg.source.startswith("https://huggingface.co/") and cfg.source.endswith("/config.json")
    assert isinstance(cfg.published_params_total, float) and cfg.published_params_total > 1e9
    assert isinstance(cfg.published_params_active, float)
    assert 0 < cfg.published_params_active <= cfg.published_params_total
    if not cfg.is_moe:
        assert cfg.published_params_active == cfg.published_params_total
    assert cfg.published_note


def _check(cfg: ModelConfig, **expected):
    got = {k: getattr(cfg, k) for k in expected}
    assert got == expected


def test_llama_3_1_8b():
    cfg = presets.get_preset("llama-3.1-8b")
    _check(cfg, vocab=128256, d=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
           max_context=131072, rope_theta=500000.0, tie_embeddings=False, is_moe=False)
    rs = cfg.rope_scaling
    assert (rs.kind, rs.factor, rs.low_freq_factor, rs.high_freq_factor, rs.original_max_position) == (
        "llama3", 8.0, 1.0, 4.0, 8192)


def test_llama_3_1_70b():
    cfg = presets.get_preset("llama-3.1-70b")
    _check(cfg, vocab=128256, d=8192, layers=80, heads=64, kv_heads=8, head_dim=128, ffn=28672,
           max_context=131072, norm_eps=1e-5)
    assert cfg.rope_scaling.kind == "llama3" and cfg.rope_scaling.factor == 8.0


def test_qwen1_presets():
    """Qwen 1 (QWenLMHeadModel): MHA, a q/k/v bias, an untied LM head, and an MLP of intermediate_size // 2 (w1, w2 and
    c_proj), so Qwen-7B's config intermediate_size 22016 is ffn 11008."""
    for name, d, layers, heads, ffn, vocab in (("qwen-1.8b", 2048, 24, 16, 5504, 151936),
                                              ("qwen-7b", 4096, 32, 32, 11008, 151936),
                                              ("qwen-14b", 5120, 40, 40, 13696, 152064)):
        _check(presets.get_preset(name), d=d, layers=layers, heads=heads, kv_heads=heads, head_dim=128, ffn=ffn,
               vocab=vocab, qkv_bias=True, tie_embeddings=False, is_moe=False)


def test_qwen2_5_7b():
    cfg = presets.get_preset("qwen2.5-7b")
    _check(cfg, vocab=152064, d=3584, layers=28, heads=28, kv_heads=4, head_dim=128, ffn=18944,
           max_context=131072, rope_theta=1e6, norm_eps=1e-6, qkv_bias=True, qk_norm=False,
           tie_embeddings=False)
    assert cfg.rope_scaling.kind == "none"


def test_mistral_7b_v0_3():
    cfg = presets.get_preset("mistral-7b")
    _check(cfg, vocab=32768, d=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=14336,
           max_context=32768, rope_theta=1e6, qkv_bias=False)


def test_mixtral_8x7b():
    cfg = presets.get_preset("mixtral-8x7b")
    _check(cfg, vocab=32000, d=4096, layers=32, heads=32, kv_heads=8, experts=8, experts_per_token=2,
           moe_ffn=14336, ffn=14336, shared_experts=0, first_dense_layers=0,
           router_scoring="softmax", norm_topk=True, routed_scale=1.0)
    assert all(cfg.layer_is_moe(i) for i in range(cfg.layers))


def test_qwen3_30b_a3b():
    cfg = presets.get_preset("qwen3-30b-a3b")
    _check(cfg, vocab=151936, d=2048, layers=48, heads=32, kv_heads=4, head_dim=128, experts=128,
           experts_per_token=8, moe_ffn=768, shared_experts=0, first_dense_layers=0, qk_norm=True,
           qkv_bias=False, router_scoring="softmax", norm_topk=True, max_context=40960)


def test_deepseek_v3():
    cfg = presets.get_preset("deepseek-v3")
    _check(cfg, vocab=129280, d=7168, layers=61, heads=128, kv_heads=128, attention="mla",
           q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
           head_dim=192, ffn=18432, experts=256, experts_per_token=8, moe_ffn=2048,
           shared_experts=1, first_dense_layers=3, router_scoring="sigmoid", norm_topk=True,
           routed_scale=2.5, mtp_layers=1, rope_interleave=True, max_context=163840, router_groups=8,
           router_topk_groups=4)
    rs = cfg.rope_scaling
    assert (rs.kind, rs.factor, rs.original_max_position, rs.beta_fast, rs.beta_slow, rs.mscale,
            rs.mscale_all_dim) == ("yarn", 40.0, 4096, 32.0, 1.0, 1.0, 1.0)
    assert cfg.kv_elems_per_token_layer == 512 + 64
    assert not cfg.layer_is_moe(2) and cfg.layer_is_moe(3)
    assert cfg.published_params_total == 671e9


def test_glm_4_5_air():
    cfg = presets.get_preset("glm-4.5-air")
    _check(cfg, vocab=151552, d=4096, layers=46, heads=96, kv_heads=8, head_dim=128, ffn=10944,
           partial_rotary=0.5, rope_interleave=False, qkv_bias=True, qk_norm=False, experts=128,
           experts_per_token=8, moe_ffn=1408, shared_experts=1, first_dense_layers=1,
           router_scoring="sigmoid", norm_topk=True, routed_scale=1.0, mtp_layers=1, router_groups=1,
           max_context=131072, rope_theta=1e6)
    assert cfg.rotary_dim == 64


def test_glm_4_7():
    """GLM-4.5 / 4.6 / 4.7's 355B-A32B shapes (two secondary copies of the config: the preset's header), the
    GLM-4.5-Air architecture with per-head QK-norm, 3 dense layers, 160 experts and a 2.5 routed scale."""
    cfg = presets.get_preset("glm-4.7")
    _check(cfg, vocab=151552, d=5120, layers=92, heads=96, kv_heads=8, head_dim=128, ffn=12288,
           partial_rotary=0.5, rope_interleave=False, qkv_bias=True, qk_norm=True, experts=160,
           experts_per_token=8, moe_ffn=1536, shared_experts=1, first_dense_layers=3,
           router_scoring="sigmoid", norm_topk=True, routed_scale=2.5, mtp_layers=1, router_groups=1,
           max_context=202752, tie_embeddings=False)
    assert cfg.rotary_dim == 64 and not cfg.layer_is_moe(2) and cfg.layer_is_moe(3)

def test_llama_3_1_405b():
    cfg = presets.get_preset("llama-3.1-405b")
    _check(cfg, vocab=128256, d=16384, layers=126, heads=128, kv_heads=8, head_dim=128, ffn=53248,
           max_context=131072, rope_theta=500000.0, norm_eps=1e-5, tie_embeddings=False, qkv_bias=False,
           is_moe=False)
    rs = cfg.rope_scaling
    assert (rs.kind, rs.factor, rs.low_freq_factor, rs.high_freq_factor, rs.original_max_position) == (
        "llama3", 8.0, 1.0, 4.0, 8192)


def test_qwen2_5_72b():
    cfg = presets.get_preset("qwen2.5-72b")
    _check(cfg, vocab=152064, d=8192, layers=80, heads=64, kv_heads=8, head_dim=128, ffn=29568,
           max_context=131072, rope_theta=1e6, norm_eps=1e-5, qkv_bias=True, qk_norm=False,
           tie_embeddings=False, is_moe=False)
    assert cfg.rope_scaling.kind == "none"


def test_qwen2_5_32b():
    cfg = presets.get_preset("qwen2.5-32b")
    _check(cfg, vocab=152064, d=5120, layers=64, heads=40, kv_heads=8, head_dim=128, ffn=27648,
           max_context=131072, rope_theta=1e6, norm_eps=1e-5, qkv_bias=True, qk_norm=False,
           tie_embeddings=False, is_moe=False)
    assert cfg.rope_scaling.kind == "none"


def test_qwen3_8b():
    cfg = presets.get_preset("qwen3-8b")
    _check(cfg, vocab=151936, d=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288,
           max_context=40960, rope_theta=1e6, norm_eps=1e-6, qk_norm=True, qkv_bias=False,
           tie_embeddings=False, is_moe=False)
    assert cfg.rope_scaling.kind == "none"


def test_qwen3_14b_and_4b():
    _check(presets.get_preset("qwen3-14b"), vocab=151936, d=5120, layers=40, heads=40, kv_heads=8, head_dim=128,
           ffn=17408, max_context=40960, rope_theta=1e6, norm_eps=1e-6, qk_norm=True, qkv_bias=False,
           tie_embeddings=False, is_moe=False)
    small = presets.get_preset("qwen3-4b")
    _check(small, vocab=151936, d=2560, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=9728, max_context=40960,
           qk_norm=True, tie_embeddings=True, is_moe=False)
    assert small.heads * small.head_dim != small.d  # explicit head_dim, not hidden / heads


def test_qwen2_5_14b_and_llama_3_2_3b():
    _check(presets.get_preset("qwen2.5-14b"), vocab=152064, d=5120, layers=48, heads=40, kv_heads=8, head_dim=128,
           ffn=13824, max_context=131072, rope_theta=1e6, norm_eps=1e-5, qkv_bias=True, tie_embeddings=False)
    cfg = presets.get_preset("llama-3.2-3b")
    _check(cfg, vocab=128256, d=3072, layers=28, heads=24, kv_heads=8, head_dim=128, ffn=8192, max_context=131072,
           rope_theta=500000.0, tie_embeddings=True, qkv_bias=False)
    rs = cfg.rope_scaling
    assert (rs.kind, rs.factor, rs.original_max_position) == ("llama3", 32.0, 8192)


def test_qwen3_32b():
    cfg = presets.get_preset("qwen3-32b")
    _check(cfg, vocab=151936, d=5120, layers=64, heads=64, kv_heads=8, head_dim=128, ffn=25600,
           max_context=40960, rope_theta=1e6, norm_eps=1e-6, qk_norm=True, qkv_bias=False,
           tie_embeddings=False, is_moe=False)
    assert cfg.heads * cfg.head_dim != cfg.d  # explicit head_dim, not hidden / heads


def test_qwen3_235b_a22b():
    cfg = presets.get_preset("qwen3-235b-a22b")
    _check(cfg, vocab=151936, d=4096, layers=94, heads=64, kv_heads=4, head_dim=128, ffn=12288,
           experts=128, experts_per_token=8, moe_ffn=1536, shared_experts=0, first_dense_layers=0,
           qk_norm=True, qkv_bias=False, router_scoring="softmax", norm_topk=True, max_context=40960,
           rope_theta=1e6, norm_eps=1e-6, tie_embeddings=False)
    assert all(cfg.layer_is_moe(i) for i in range(cfg.layers))


def test_mixtral_8x22b():
    cfg = presets.get_preset("mixtral-8x22b")
    _check(cfg, vocab=32000, d=6144, layers=56, heads=48, kv_heads=8, head_dim=128, experts=8,
           experts_per_token=2, moe_ffn=16384, ffn=16384, shared_experts=0, first_dense_layers=0,
           router_scoring="softmax", norm_topk=True, routed_scale=1.0, max_context=65536,
           rope_theta=1e6, norm_eps=1e-5, tie_embeddings=False)
    assert all(cfg.layer_is_moe(i) for i in range(cfg.layers))


def test_deepseek_r1():
    cfg = presets.get_preset("deepseek-r1")
    _check(cfg, vocab=129280, d=7168, layers=61, heads=128, kv_heads=128, attention="mla",
           q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128,
           head_dim=192, ffn=18432, experts=256, experts_per_token=8, moe_ffn=2048,
           shared_experts=1, first_dense_layers=3, router_scoring="sigmoid", norm_topk=True,
           routed_scale=2.5, mtp_layers=1, rope_interleave=True, max_context=163840, router_groups=8,
           router_topk_groups=4, native_weights="fp8_e4m3_b128")
    rs = cfg.rope_scaling
    assert (rs.kind, rs.factor, rs.original_max_position, rs.beta_fast, rs.beta_slow, rs.mscale,
            rs.mscale_all_dim) == ("yarn", 40.0, 4096, 32.0, 1.0, 1.0, 1.0)
    assert not cfg.layer_is_moe(2) and cfg.layer_is_moe(3)
    assert cfg.published_params_total == 671e9
    assert cfg.source.startswith("https://huggingface.co/deepseek-ai/DeepSeek-R1/")


def test_kimi_k2():
    cfg = presets.get_preset("kimi-k2")
    _check(cfg, vocab=163840, d=7168, layers=61, heads=64, kv_heads=64, attention="mla", q_lora_rank=1536,
           kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64, v_head_dim=128, head_dim=192, ffn=18432,
           experts=384, experts_per_token=8, moe_ffn=2048, shared_experts=1, first_dense_layers=1,
           router_scoring="sigmoid", norm_topk=True, routed_scale=2.827, mtp_layers=0, max_context=131072,
           rope_theta=50000.0, router_groups=1, router_topk_groups=1, native_weights="fp8_e4m3_b128")
    rs = cfg.rope_scaling
    assert (rs.kind, rs.factor, rs.original_max_position, rs.beta_fast, rs.beta_slow) == ("yarn", 32.0, 4096, 1.0, 1.0)
    assert not cfg.layer_is_moe(0) and cfg.layer_is_moe(1)
    assert cfg.source.startswith("https://huggingface.co/moonshotai/Kimi-K2-Instruct/")


def test_qwen3_coder_480b_a35b():
    cfg = presets.get_preset("qwen3-coder-480b-a35b")
    _check(cfg, vocab=151936, d=6144, layers=62, heads=96, kv_heads=8, head_dim=128, experts=160,
           experts_per_token=8, moe_ffn=2560, shared_experts=0, first_dense_layers=0, router_scoring="softmax",
           norm_topk=True, qk_norm=True, max_context=262144, rope_theta=1e7, tie_embeddings=False)
    assert all(cfg.layer_is_moe(i) for i in range(cfg.layers))


def test_unknown_preset_lists_allowed_names():
    with pytest.raises(ConfigError) as err:
        presets.get_preset("no-such-model")
    msg = str(err.value)
    assert "no-such-model" in msg
    for name in ["tiny", "cpu-demo", *REAL_MODELS]:
        assert name in msg


def test_preset_dir_from_env(tmp_path, monkeypatch):
    raw = {"vocab": 1000, "d": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16,
           "ffn": 128, "max_context": 128, "source": "test"}
    (tmp_path / "my-extra.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("ROOFLINE_PRESETS", str(tmp_path))
    assert "my-extra" in presets.list_presets()
    cfg = presets.get_preset("my-extra")
    assert cfg.name == "my-extra" and cfg.vocab == 1000 and cfg.ffn == 128
    monkeypatch.delenv("ROOFLINE_PRESETS")
    assert "my-extra" not in presets.list_presets()
    with pytest.raises(ConfigError):
        presets.get_preset("my-extra")


def test_a_card_whose_count_is_far_from_the_published_one_prints_how_the_preset_counts():
    """The published counts of some releases are nominal or leave the embedding or LM head out (gpt-oss: its model
    card's 3.61B active leaves out the 0.58B table this count includes); a card 5% or more off the published count
    prints the preset's published_note beside it, one within prints none (the record carries the note either way)."""
    from roofline.commands.card import CardRequest, card_record, render_card
    far = card_record(CardRequest(model=presets.get_preset("gpt-oss-20b"), device=None))
    assert abs(far["rel_diff_active"]) >= 0.05 and far["published_note"]
    lines = render_card(far).splitlines()
    i = next(n for n, line in enumerate(lines) if line.startswith("params active"))
    assert lines[i + 1] == f"published      {far['published_note']}"
    near = card_record(CardRequest(model=presets.get_preset("llama-3.1-8b"), device=None))
    assert near["published_note"] and abs(near["rel_diff_active"]) < 0.05 and abs(near["rel_diff_total"]) < 0.05
    assert not any(line.startswith("published ") for line in render_card(near).splitlines())


def test_the_card_what_if_line_names_the_batch_and_context_it_prices():
    """The what-if ITL line priced the card's batch and context without saying so: read beside a finite run's ITL
    (64 running) it looked like a contradiction. It names them, as the decode-step line above it does, and a larger
    batch or context prices a slower step."""
    from roofline.commands.card import CardRequest, card_record, render_card
    from roofline.measure.devices import get_datasheet
    recs = {}
    for batch, context in ((1, 0), (16, 4096)):
        rec = card_record(CardRequest(model=presets.get_preset("llama-3.1-8b"), device=get_datasheet("h100_sxm"),
                                      engine="vllm", batch=batch, context=context))
        line = next(line for line in render_card(rec).splitlines() if line.startswith("what-if ITL"))
        assert f") at B={batch}, L={context} as tp1, engine vllm" in line, line
        recs[batch] = rec["whatif_itl_ms"]
    assert recs[16] > recs[1]
