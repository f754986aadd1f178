"""Hugging Face checkpoints -> the compact decoder, with the real weights.

A model folder (config.json + model.safetensors, or shards with model.safetensors.index.json)
becomes a `ModelConfig` (`config_from_hf`) and a `Transformer` holding its tensors
(`load_checkpoint`). Loading is safe and lazy: safetensors only (never pickle); the headers
are read first and the whole checkpoint is checked against the config before anything is
allocated (every expected tensor present, none unknown, shapes and dtype category right, each
failure naming the tensor); then the shards are streamed one tensor at a time into a model
allocated once, in the target dtype, on the target device.

Name mapping (ours <- HF): q/k/v projections concatenate into attn.wqkv (rows q, k, v); the
routed experts' per-expert matrices stack into ffn.w1/w3/w2 [E, ...] (transformers 5 writes
per-expert names on save and fuses them in memory as experts.gate_up_proj [E, 2f, d] and
experts.down_proj [E, d, f]; both layouts load). MTP modules (DeepSeek-V3, GLM-4.5) are stored
as model.layers.{num_hidden_layers + j}: enorm, hnorm, eh_proj, shared_head.norm and a full
decoder block; their shared_head.head and embed_tokens copies must equal the main model's LM
head and embedding (checked by content hash, loaded once).

Hybrid models (Qwen3-Next, Qwen3.5's language models): Gated DeltaNet projections mapped onto the decoder's
order (Qwen3-Next stores each k-head group's q, k, v, z rows together), their RMSNorms, which scale by (1 + w),
loaded as w + 1. A multimodal release's config (Qwen3.5) is read from its text_config; its checkpoint, with the
vision encoder, is not loaded.

Sliding-window models (Mistral v0.1, Qwen with use_sliding_window) get max_context = the
window: within it, sliding-window attention is full causal attention, so the forward is exact.
Read for pricing (`pricing=True`: card, capacity, predict), they keep their context and price the window
(`sliding_window`), and a few architectures the decoder does not run are read too (PRICED_ARCHITECTURES).

fp8 block-scaled checkpoints as DeepSeek-V3 releases them (quantization_config quant_method
fp8, weight_block_size [128, 128]; each quantized `*.weight` has a float32 `*.weight_scale_inv`
per block, w = q · s) load as stored: the linears of `accounting.block_matrices` and the
routed experts stay fp8 with their scales (`roofline.model.quant`), so the model holds the
checkpoint's bytes. Dequantising on load would be a different measurement (a bf16 model).
Where the device has no fp8 kernel the layers run by dequantising per call: right for outputs
and acceptance, refused by a timed sweep (`unsupported`). MLA's kv_b is dequantised on load,
as vLLM does: the absorbed attention multiplies by its halves directly.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from roofline.checkpoints.quantization import fp8_fmt, fp8_format, priced_formats
from roofline.model.accounting import block_matrices
from roofline.model.dtypes import torch_dtype
from roofline.model.formats import parse_format
from roofline.model.quant import QuantExperts, QuantLinear, expand_scale, kernel_for, store_quantized
from roofline.io import files
from roofline.io.fields import ConfigError
from roofline.model.config import ModelConfig, RopeScaling
from roofline.model.decoder import MOE_IMPLS, RMSNorm, Transformer, keep_state_dtypes
from roofline.model.rope import rope_table

ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                 "MistralForCausalLM", "MixtralForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM",
                 "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "MiniMaxM2ForCausalLM", "Qwen3NextForCausalLM",
                 "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
HYBRID_ARCHITECTURES = ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")  # Gated DeltaNet
ZERO_CENTRED_NORMS = HYBRID_ARCHITECTURES  # RMSNorms that scale by (1 + w): loaded as w + 1
# multimodal releases whose language model is described by text_config (its config read; their checkpoints, which
# hold the vision encoder too, are not loaded)
TEXT_CONFIG_OF = {"Qwen3_5ForConditionalGeneration": "Qwen3_5ForCausalLM",
                  "Qwen3_5MoeForConditionalGeneration": "Qwen3_5MoeForCausalLM",
                  "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}
# read for pricing only (card, capacity, predict: config_from_hf(pricing=True)); the decoder does not run them.
# Gemma's GeGLU costs what a SwiGLU of its width does (three matrices, one elementwise product); Phi-3 fuses
# Llama's q/k/v and gate/up projections into one matrix each (the same shapes); Qwen2-MoE's shared expert is
# priced as shared_experts experts of moe_intermediate_size; DeepSeek-V2 is V3's MLA with softmax routing.
GEMMA_ARCHITECTURES = ("GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM")
# two-matrix MLPs (up, GELU or ReLU, down: ModelConfig.ffn_gated false), their attention and MLP in parallel (GPT-J,
# GPT-NeoX, Falcon: parallel_block) or one after the other; learned or ALiBi positions priced as a rotary's bytes
# (their elementwise share is small) and their linear biases left out (under 0.1% of the weights)
TWO_MATRIX_ARCHITECTURES = ("GPTJForCausalLM", "GPTNeoXForCausalLM", "FalconForCausalLM", "RWForCausalLM",
                            "GPTBigCodeForCausalLM", "OPTForCausalLM", "BloomForCausalLM")
PRICED_ARCHITECTURES = GEMMA_ARCHITECTURES + ("Phi3ForCausalLM", "Qwen2MoeForCausalLM",
                                              "DeepseekV2ForCausalLM") + TWO_MATRIX_ARCHITECTURES
GELU_ACTS = ("gelu_pytorch_tanh", "gelu", "gelu_new")
TWO_MATRIX_ACTS = GELU_ACTS + ("gelu_fast", "relu")
MLA_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")  # MLA + DeepSeek MoE
SPARSE_ARCHITECTURES = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")  # + DeepSeek Sparse Attention's indexer
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints saved


# ---- config.json -> ModelConfig --------------------------------------------------------------

def _rope(raw: Mapping[str, Any], pricing: bool = False) -> tuple[float, RopeScaling, float]:
    """(theta, scaling, partial_rotary) from transformers 5 `rope_parameters` or the older
    top-level rope_theta / rope_scaling / partial_rotary_factor fields. pricing: a scaling the decoder does not run
    (Phi-3's longrope, dynamic NTK) is read as none, since a rotary embedding's cost does not depend on its
    frequencies."""
    params = dict(raw.get("rope_parameters") or {})
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    partial = params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    try:
        scaling = _rope_scaling(raw, {**dict(raw.get("rope_scaling") or {}), **params})
    except ConfigError:
        if not pricing:
            raise
        scaling = RopeScaling()
    return float(theta), scaling, float(partial)


def _rope_scaling(raw: Mapping[str, Any], p: Mapping[str, Any]) -> RopeScaling:
    """The RopeScaling of the merged rope fields `p` (rope_scaling under rope_parameters)."""
    kind = p.get("rope_type", p.get("type", "default"))
    if kind == "default":
        return RopeScaling()
    if kind not in ("llama3", "yarn", "linear"):
        raise ConfigError(f"config.json rope type {kind!r}: allowed 'default', 'llama3', 'yarn', 'linear'")
    if p.get("attention_factor") is not None:
        raise ConfigError("config.json rope attention_factor: not modelled (yarn takes it from mscale/mscale_all_dim)")
    if p.get("truncate", True) is not True:
        raise ConfigError("config.json rope truncate=false: not modelled (yarn correction range is truncated)")
    orig = int(p.get("original_max_position_embeddings") or 0)
    factor = p.get("factor")
    if factor is None and kind == "yarn":
        factor = raw["max_position_embeddings"] / orig
    rs = dict(kind=kind, factor=float(factor), original_max_position=orig)
    if kind == "llama3":
        rs.update(low_freq_factor=float(p.get("low_freq_factor", 1.0)), high_freq_factor=float(p.get("high_freq_factor", 4.0)))
    if kind == "yarn":
        mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
        # transformers: amplitude mscale(f, mscale) / mscale(f, mscale_all_dim) only when both are set,
        # otherwise mscale(f, 1)
        both = bool(mscale) and bool(mscale_all)
        rs.update(beta_fast=float(p.get("beta_fast") or 32), beta_slow=float(p.get("beta_slow") or 1),
                  mscale=float(mscale) if both else 1.0, mscale_all_dim=float(mscale_all) if both else 0.0)
    return RopeScaling(**rs)


def _require(raw: Mapping[str, Any], arch: str, field: str, allowed: tuple, default: Any) -> None:
    v = raw.get(field, default)
    if v not in allowed:
        raise ConfigError(f"config.json {field}={v!r} ({arch}): not modelled; allowed {list(allowed)}")


def config_from_hf(raw: Mapping[str, Any], name: str = "", pricing: bool = False) -> ModelConfig:
    """A transformers config.json (as a dict) -> ModelConfig, field by field as roofline/conf/model/*.yaml.
    A missing required field is bad input naming that field. pricing=True: the release's quantization_config
    read as the formats a what-if prices (roofline.checkpoints.quantization: AWQ, GPTQ, fp8, compressed-tensors,
    ModelOpt, mxfp4), where loading runs only the block-scaled fp8 the decoder holds (native_format)."""
    try:
        return _config_from_hf(raw, name, pricing)
    except KeyError as e:
        archs = raw.get("architectures") or ["?"]
        raise ConfigError(f"config.json: missing field {e.args[0]!r} (required for {archs[0]})") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config.json: a field has the wrong type ({e})") from None


def _config_from_hf(raw: Mapping[str, Any], name: str = "", pricing: bool = False) -> ModelConfig:
    archs = raw.get("architectures") or []
    if len(archs) == 1 and archs[0] in TEXT_CONFIG_OF:  # the language model of a multimodal release
        raw = {"intermediate_size": 0, **raw["text_config"], "architectures": [TEXT_CONFIG_OF[archs[0]]],  # MoE: none
               "tie_word_embeddings": raw.get("tie_word_embeddings", raw["text_config"].get("tie_word_embeddings")),
               "quantization_config": raw.get("quantization_config")}
        archs = raw["architectures"]
    arch = archs[0] if len(archs) == 1 else None
    allowed = ARCHITECTURES + (PRICED_ARCHITECTURES if pricing else ())
    if arch not in allowed:
        priced = f" (priced, not run: {list(PRICED_ARCHITECTURES)})" if not pricing else ""
        raise ConfigError(f"config.json architectures={archs!r}: allowed one of {list(allowed)}{priced}")
    if arch in TWO_MATRIX_ARCHITECTURES:
        return _two_matrix_config(raw, arch, name, pricing)
    gemma = arch in GEMMA_ARCHITECTURES
    if gemma:  # GeGLU (transformers: hidden_activation, older configs hidden_act)
        act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in GELU_ACTS:
            raise ConfigError(f"config.json hidden_activation={act!r} ({arch}): not modelled; allowed {list(GELU_ACTS)}")
    else:
        _require(raw, arch, "hidden_act", ("silu",), "silu")
    _require(raw, arch, "mlp_bias", (False,), False)
    d, heads = raw["hidden_size"], raw["num_attention_heads"]
    theta, scaling, partial = _rope(raw, pricing)
    max_ctx = raw["max_position_embeddings"]
    window = raw.get("sliding_window")
    windowed = bool(window and raw.get("use_sliding_window", True) and window < max_ctx and not gemma)
    if windowed and not pricing:  # the decoder runs it up to its window (exact there); a what-if reads the window
        max_ctx = window
    kw: dict[str, Any] = dict(
        name=_model_name(raw, name, arch),
        vocab=raw["vocab_size"], d=d, layers=raw["num_hidden_layers"], heads=heads,
        kv_heads=raw.get("num_key_value_heads") or heads, head_dim=raw.get("head_dim") or d // heads,
        ffn=raw["intermediate_size"], max_context=max_ctx, rope_theta=theta, rope_scaling=scaling,
        partial_rotary=partial, norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)), source=f"Hugging Face config.json ({arch})",
        architecture=arch,
        **_released(raw.get("quantization_config"), pricing),
        mtp_layers=raw.get("num_nextn_predict_layers") or 0)  # DeepSeek-V3's field, read for any architecture
    if windowed and pricing:  # every layer attends (and an engine caches) the last `sliding_window` tokens
        kw.update(sliding_window=window, global_every=0)
    if arch in ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Phi3ForCausalLM") + GEMMA_ARCHITECTURES:
        _require(raw, arch, "attention_bias", (False,), False)  # would add an o_proj bias too
    if gemma:  # tied by default (GemmaConfig); Gemma 2 alternates a windowed and a global layer, Gemma 3 five to one
        kw["tie_embeddings"] = raw.get("tie_word_embeddings") is not False
        kw.update(_gemma_windows(raw, arch))
        kw["qk_norm"] = arch == "Gemma3ForCausalLM"
    if arch == "Qwen2MoeForCausalLM":
        _require(raw, arch, "decoder_sparse_step", (1,), 1)
        if raw.get("mlp_only_layers"):
            raise ConfigError(f"config.json mlp_only_layers ({arch}): not modelled")
        moe, shared = raw["moe_intermediate_size"], raw.get("shared_expert_intermediate_size") or 0
        if shared % moe:
            raise ConfigError(f"config.json shared_expert_intermediate_size={shared} ({arch}): priced as shared "
                              f"experts of moe_intermediate_size={moe}; allowed a multiple of it")
        kw.update(qkv_bias=True, experts=raw["num_experts"], experts_per_token=raw["num_experts_per_tok"], moe_ffn=moe,
                  shared_experts=shared // moe, shared_expert_gate=bool(shared), router_scoring="softmax",
                  norm_topk=bool(raw.get("norm_topk_prob", False)))
    if arch == "Qwen2ForCausalLM":
        kw["qkv_bias"] = True  # Qwen2 attention always has q/k/v biases (o_proj none)
    if arch == "Glm4MoeForCausalLM":
        kw["qkv_bias"] = bool(raw.get("attention_bias", False))
        kw["qk_norm"] = bool(raw.get("use_qk_norm", False))
    if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        kw["qk_norm"] = True
    if arch == "Qwen3MoeForCausalLM":
        _require(raw, arch, "decoder_sparse_step", (1,), 1)
        dense = sorted(raw.get("mlp_only_layers") or [])
        if dense != list(range(len(dense))):
            raise ConfigError(f"config.json mlp_only_layers={dense} ({arch}): only leading dense layers are modelled")
        kw.update(experts=raw.get("num_experts") or raw["num_local_experts"], experts_per_token=raw["num_experts_per_tok"],
                  moe_ffn=raw["moe_intermediate_size"], first_dense_layers=len(dense), router_scoring="softmax",
                  norm_topk=bool(raw.get("norm_topk_prob", False)))
    if arch == "MiniMaxM2ForCausalLM":  # sigmoid + selection bias, top-k, renormalised; experts intermediate_size wide
        _require(raw, arch, "scoring_func", ("sigmoid",), "sigmoid")
        _require(raw, arch, "use_routing_bias", (True,), True)
        _require(raw, arch, "shared_intermediate_size", (0,), 0)
        _require(raw, arch, "qk_norm_type", ("per_layer",), "per_layer")
        if raw.get("rotary_dim") and "partial_rotary_factor" not in (raw.get("rope_parameters") or {}):
            kw["partial_rotary"] = raw["rotary_dim"] / kw["head_dim"]  # the released configs' legacy field
        kw.update(experts=raw["num_local_experts"], experts_per_token=raw["num_experts_per_tok"],
                  moe_ffn=raw["intermediate_size"], ffn=0, router_scoring="sigmoid", norm_topk=True,
                  qk_norm=bool(raw.get("use_qk_norm", True)))
        kw["qk_norm_type"] = "per_layer" if kw["qk_norm"] else "per_head"
    if arch in HYBRID_ARCHITECTURES:  # Gated DeltaNet layers, 3 to every full (gated) attention layer; MoE with a
        kinds = raw.get("layer_types") or []  # gated shared expert in every layer (Qwen3.5 also dense)
        every = raw.get("full_attention_interval") or (kinds.index("full_attention") + 1 if kinds else 4)
        if kinds and kinds != ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(len(kinds))]:
            raise ConfigError(f"config.json layer_types ({arch}): only every {every}-th layer full attention is modelled")
        _require(raw, arch, "decoder_sparse_step", (1,), 1)
        if raw.get("mlp_only_layers"):
            raise ConfigError(f"config.json mlp_only_layers ({arch}): not modelled")
        kw.update(full_attention_interval=every, linear_k_heads=raw["linear_num_key_heads"],
                  linear_v_heads=raw["linear_num_value_heads"], linear_k_dim=raw["linear_key_head_dim"],
                  linear_v_dim=raw["linear_value_head_dim"], linear_conv_kernel=raw["linear_conv_kernel_dim"],
                  linear_state_dtype=raw.get("mamba_ssm_dtype") or "", qk_norm=True, mtp_layers=0,
                  attn_output_gate=bool(raw.get("attn_output_gate", True)))
        if arch != "Qwen3_5ForCausalLM":  # the MoE ones
            if raw["shared_expert_intermediate_size"] != raw["moe_intermediate_size"]:
                raise ConfigError(f"config.json shared_expert_intermediate_size ({arch}): modelled equal to "
                                  "moe_intermediate_size")
            kw.update(experts=raw["num_experts"], experts_per_token=raw["num_experts_per_tok"],
                      moe_ffn=raw["moe_intermediate_size"], shared_experts=1, shared_expert_gate=True, ffn=0,
                      router_scoring="softmax", norm_topk=bool(raw.get("norm_topk_prob", True)))
    if arch == "MixtralForCausalLM":  # softmax, top-k, renormalised; each expert is intermediate_size wide
        kw.update(experts=raw["num_local_experts"], experts_per_token=raw["num_experts_per_tok"],
                  moe_ffn=raw["intermediate_size"], router_scoring="softmax", norm_topk=True)
    if arch == "DeepseekV2ForCausalLM":  # softmax routing, greedy or limited to the topk_group best of n_group groups:
        _require(raw, arch, "scoring_func", ("softmax",), "softmax")  # the what-if spreads a step's tokens over all
        _require(raw, arch, "topk_method", ("greedy", "group_limited_greedy"), "greedy")  # experts either way, so
        _require(raw, arch, "moe_layer_freq", (1,), 1)  # the groups are not carried (the decoder's are V3's rule)
        kw.update(experts=raw["n_routed_experts"], experts_per_token=raw["num_experts_per_tok"],
                  moe_ffn=raw["moe_intermediate_size"], shared_experts=raw.get("n_shared_experts") or 0,
                  first_dense_layers=raw.get("first_k_dense_replace", 0), router_scoring="softmax",
                  norm_topk=bool(raw.get("norm_topk_prob", False)), routed_scale=float(raw.get("routed_scaling_factor", 1.0)))
    if arch in ("Glm4MoeForCausalLM",) + MLA_ARCHITECTURES:
        _require(raw, arch, "scoring_func", ("sigmoid",), "sigmoid")
        _require(raw, arch, "topk_method", ("noaux_tc",), "noaux_tc")
        _require(raw, arch, "moe_layer_freq", (1,), 1)
        kw.update(experts=raw["n_routed_experts"], experts_per_token=raw["num_experts_per_tok"],
                  moe_ffn=raw["moe_intermediate_size"], shared_experts=raw.get("n_shared_experts") or 0,
                  first_dense_layers=raw.get("first_k_dense_replace", 0), router_scoring="sigmoid",
                  norm_topk=bool(raw.get("norm_topk_prob", True)), routed_scale=float(raw.get("routed_scaling_factor", 1.0)),
                  router_groups=raw.get("n_group") or 1, router_topk_groups=raw.get("topk_group") or 1)
    if arch in MLA_ARCHITECTURES + ("DeepseekV2ForCausalLM",):
        _require(raw, arch, "attention_bias", (False,), False)
        nope, rope_d = raw["qk_nope_head_dim"], raw["qk_rope_head_dim"]
        kw.update(attention="mla", kv_heads=heads, head_dim=nope + rope_d, q_lora_rank=raw.get("q_lora_rank") or 0,
                  kv_lora_rank=raw["kv_lora_rank"], qk_nope_dim=nope, qk_rope_dim=rope_d, v_head_dim=raw["v_head_dim"],
                  rope_interleave=bool(raw.get("rope_interleave", True)), partial_rotary=1.0)
    if arch in SPARSE_ARCHITECTURES:  # the indexer's RoPE: halves in DeepSeek-V3.2, as GLM-5's config says for its own
        if any(t != "full" for t in raw.get("indexer_types") or []):  # GLM-5.2: most layers reuse another's top-k
            raise ConfigError(f"config.json indexer_types ({arch}): layers that share another layer's indexer are not "
                              "modelled (every sparse layer is priced with its own indexer, keys and logits)")
        kw.update(index_topk=raw["index_topk"], index_heads=raw["index_n_heads"], index_head_dim=raw["index_head_dim"],
                  index_rope_interleave=bool(raw.get("indexer_rope_interleave", False)))
    return ModelConfig(**kw)


def _model_name(raw: Mapping[str, Any], name: str, arch: str) -> str:
    """The name given, else the folder the config names (_name_or_path), else its model_type or architecture."""
    return name or Path(str(raw.get("_name_or_path") or raw.get("model_type", arch))).name


def _field(raw: Mapping[str, Any], *names: str, default: Any = KeyError) -> Any:
    """The first of `names` the config sets (older architectures spell hidden_size n_embd, n_embed, ...); a missing
    required field is a KeyError naming the first spelling."""
    for n in names:
        if raw.get(n) is not None:
            return raw[n]
    if default is KeyError:
        raise KeyError(names[0])
    return default


def _two_matrix_config(raw: Mapping[str, Any], arch: str, name: str, pricing: bool) -> ModelConfig:
    """GPT-J, GPT-NeoX, Falcon, GPT-BigCode (StarCoder), OPT and BLOOM: a two-matrix MLP of intermediate_size /
    n_inner / ffn_dim / ffn_hidden_size (4 d where unset), read as their transformers configs define them."""
    d = _field(raw, "hidden_size", "n_embd", "n_embed")
    heads = _field(raw, "num_attention_heads", "n_head")
    act = _field(raw, "activation_function", "hidden_act", "activation", default="gelu")
    if act not in TWO_MATRIX_ACTS:
        raise ConfigError(f"config.json activation {act!r} ({arch}): not modelled; allowed {list(TWO_MATRIX_ACTS)}")
    kv, parallel, partial, tie, interleave = heads, False, 1.0, True, False
    if arch == "GPTJForCausalLM":  # attention and MLP on one ln_1 output; rotate_every_two over rotary_dim
        parallel, partial, interleave = True, (raw.get("rotary_dim") or 64) / (d // heads), True
        tie = bool(raw.get("tie_word_embeddings", False))
    elif arch == "GPTNeoXForCausalLM":
        parallel, partial = bool(raw.get("use_parallel_residual", True)), float(raw.get("rotary_pct", 0.25))
        tie = bool(raw.get("tie_word_embeddings", False))
    elif arch in ("FalconForCausalLM", "RWForCausalLM"):  # FalconConfig: multi_query, parallel_attn default true
        new = bool(raw.get("new_decoder_architecture", False))
        parallel = new or bool(raw.get("parallel_attn", True))
        kv = _field(raw, "num_kv_heads", "n_head_kv") if new else (1 if raw.get("multi_query", True) else heads)
        tie = raw.get("tie_word_embeddings") is not False
    elif arch == "GPTBigCodeForCausalLM":
        kv = 1 if raw.get("multi_query", True) else heads
        tie = raw.get("tie_word_embeddings") is not False
    elif arch == "OPTForCausalLM":
        _require(raw, arch, "do_layer_norm_before", (True,), True)
        if raw.get("word_embed_proj_dim", d) != d:
            raise ConfigError(f"config.json word_embed_proj_dim={raw['word_embed_proj_dim']} ({arch}): a projected "
                              f"embedding is not modelled; allowed hidden_size={d}")
        tie = raw.get("tie_word_embeddings") is not False
    return ModelConfig(
        name=_model_name(raw, name, arch),
        vocab=raw["vocab_size"], d=d, layers=_field(raw, "num_hidden_layers", "n_layer"), heads=heads, kv_heads=kv,
        head_dim=d // heads, ffn=_field(raw, "intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", default=4 * d),
        max_context=_field(raw, "max_position_embeddings", "n_positions", "seq_length", default=2048),
        rope_theta=float(raw.get("rope_theta", raw.get("rotary_emb_base", 10000.0))), partial_rotary=float(partial),
        rope_interleave=interleave, norm_eps=float(_field(raw, "layer_norm_epsilon", "layer_norm_eps", default=1e-5)),
        tie_embeddings=tie, ffn_gated=False, parallel_block=parallel, architecture=arch,
        source=f"Hugging Face config.json ({arch})", **_released(raw.get("quantization_config"), pricing))


def _released(q: Mapping[str, Any] | None, pricing: bool) -> dict[str, str]:
    """The ModelConfig fields of the release's formats: what the decoder loads, or (pricing) what a what-if prices."""
    weights, experts = priced_formats(q) if pricing else (native_format(q), "")
    return dict(native_weights=weights, native_experts=experts)


def _gemma_windows(raw: Mapping[str, Any], arch: str) -> dict[str, int]:
    """sliding_window and global_every of a Gemma config: Gemma 2 windows every other layer (the first one);
    Gemma 3 every layer but each sliding_window_pattern-th (layer_types, where given, must say the same)."""
    window = raw.get("sliding_window") or 0
    if arch == "GemmaForCausalLM" or not window:
        return {}
    every = 2 if arch == "Gemma2ForCausalLM" else raw.get("sliding_window_pattern") or 6
    kinds = raw.get("layer_types") or []
    if kinds and "full_attention" in kinds:
        every = kinds.index("full_attention") + 1
    if kinds and kinds != ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(len(kinds))]:
        raise ConfigError(f"config.json layer_types ({arch}): only every {every}-th layer global is modelled")
    return dict(sliding_window=window, global_every=every)


def native_format(q: Mapping[str, Any] | None) -> str:
    """The weight format (roofline.model.formats name) of a quantization_config: "" for none;
    fp8 with weight_block_size [R, C] and dynamic activations (DeepSeek-V3) -> fp8_<fmt>_b<R>[x<C>]."""
    if not q:
        return ""
    block = list(q.get("weight_block_size") or [])
    fmt = fp8_fmt(q)
    ok = (q.get("quant_method") == "fp8" and fmt in ("e4m3", "e5m2") and len(block) == 2
          and q.get("activation_scheme", "dynamic") == "dynamic")
    if not ok:
        raise ConfigError(f"config.json quantization_config={dict(q)!r}: not loaded; allowed fp8 block-scaled "
                          "(quant_method 'fp8', fmt e4m3|e5m2, weight_block_size [R, C], activation_scheme "
                          "'dynamic', as DeepSeek-V3)")
    return fp8_format("block", block, fmt)


def read_config(folder: str | Path) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ConfigError(f"checkpoint={str(folder)!r}: no config.json (expected a Hugging Face model folder)")
    return files.read_json(path, f"checkpoint={str(folder)!r}", "config.json", obj=True)


def shard_path(folder: Path, name: object, field_name: str = "checkpoint") -> Path:
    """The file a shard index names, refused unless it is a plain file name inside the folder
    (an index naming ../ or an absolute path must not load a file from elsewhere)."""
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts \
            or not (folder / name).resolve().is_relative_to(folder.resolve()):
        raise ConfigError(f"{field_name}={str(folder)!r}: model.safetensors.index.json names shard {name!r}, "
                          "outside the folder; allowed file names inside it")
    return folder / name


def checkpoint_config(folder: str | Path, raw: Mapping[str, Any] | None = None, pricing: bool = False) -> ModelConfig:
    """The ModelConfig of a model folder, named after the folder (`raw`: its config.json, when already read;
    pricing: as config_from_hf)."""
    folder = Path(folder)
    return config_from_hf(read_config(folder) if raw is None else raw, name=folder.resolve().name, pricing=pricing)


# ---- the tensors -------------------------------------------------------------------------------

def shard_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()), key=str)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"checkpoint={str(folder)!r}: model.safetensors.index.json has no readable "
                              f"weight_map ({e})") from None
        files = [shard_path(folder, n) for n in names]
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        raise ConfigError(f"checkpoint={str(folder)!r}: no model.safetensors or model.safetensors.index.json "
                          "(only safetensors checkpoints load; pickle files never do)")
    folders = [n for n, f in zip(names, files) if f.is_dir()] if index.is_file() else []
    if folders:  # '.' or a sub-folder: f.name would print the folder's own name, as if a shard were missing
        raise ConfigError(f"checkpoint={str(folder)!r}: model.safetensors.index.json names {folders} as shard(s): "
                          "a folder, not a file; allowed .safetensors file names inside the folder")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ConfigError(f"checkpoint={str(folder)!r}: shard(s) {missing} named by the index are missing")
    return files


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    shape: tuple[int, ...]
    dtype: str


def tensor_headers(folder: str | Path) -> dict[str, TensorInfo]:
    """Name -> (shard, shape, dtype) of every tensor, from the safetensors headers only."""
    from safetensors import safe_open
    out: dict[str, TensorInfo] = {}
    for path in shard_files(folder):
        try:
            with safe_open(str(path), framework="pt") as f:
                for k in f.keys():
                    sl = f.get_slice(k)
                    if k in out:
                        raise ConfigError(f"tensor {k!r}: stored twice ({out[k].file.name}, {path.name})")
                    out[k] = TensorInfo(path, tuple(sl.get_shape()), sl.get_dtype())
        except ConfigError:
            raise
        except Exception as e:  # safetensors' own header errors (truncated, oversized, not UTF-8, overlapping)
            msg = str(e).splitlines()[0] if str(e) else ""
            raise ConfigError(f"checkpoint={str(folder)!r}: {path.name} is not a readable safetensors file "
                              f"({type(e).__name__}: {msg})") from None
    return out


@dataclass(frozen=True)
class Copy:
    ours: str  # parameter name in roofline.model.decoder
    dst: tuple = ()  # index into our parameter
    src: tuple = ()  # index into the checkpoint tensor


@dataclass(frozen=True)
class Entry:
    shape: tuple[int, ...]
    copies: tuple[Copy, ...]


def _linear_attention_plan(cfg: ModelConfig, hf: str, ours: str, plan: dict, whole, separate: bool) -> None:
    """Qwen3-Next's `linear_attn` -> our GatedDeltaNet: in_proj_qkvz stores each k-head group's [q, k, v, z] rows
    together and in_proj_ba each group's [b, a]; ours hold all heads' q, then k, v, z (and b, then a). Qwen3.5's
    (`separate`) keeps them in four projections in our order."""
    nk, nv, dk, dv = cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_k_dim, cfg.linear_v_dim
    r, la = nv // nk, f"{hf}.linear_attn"
    per, qkvz, ba = 2 * dk + 2 * r * dv, f"{ours}.attn.in_proj_qkvz.weight", f"{ours}.attn.in_proj_ba.weight"
    for name in ("conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight"):
        whole(f"linear_attn.{name}", f"attn.{name}")
    if separate:  # Qwen3.5: in_proj_qkv [q; k; v], in_proj_z, in_proj_b, in_proj_a: our order already
        qkv = 2 * nk * dk + nv * dv
        for h, o, rows in (("in_proj_qkv", qkvz, slice(0, qkv)), ("in_proj_z", qkvz, slice(qkv, qkv + nv * dv)),
                           ("in_proj_b", ba, slice(0, nv)), ("in_proj_a", ba, slice(nv, 2 * nv))):
            plan[f"{la}.{h}.weight"] = Entry((rows.stop - rows.start, cfg.d), (Copy(o, (rows,)),))
        return
    starts = (0, nk * dk, 2 * nk * dk, 2 * nk * dk + nv * dv)  # ours: q, k, v, z
    widths = (dk, dk, r * dv, r * dv)
    copies = []
    for g in range(nk):
        src = g * per
        for start, width in zip(starts, widths):
            copies.append(Copy(qkvz, (slice(start + g * width, start + (g + 1) * width),), (slice(src, src + width),)))
            src += width
    plan[f"{la}.in_proj_qkvz.weight"] = Entry((nk * per, cfg.d), tuple(copies))
    plan[f"{la}.in_proj_ba.weight"] = Entry((2 * nv, cfg.d), tuple(
        Copy(ba, (slice(part * nv + g * r, part * nv + (g + 1) * r),), (slice(2 * g * r + part * r, 2 * g * r + (part + 1) * r),))
        for g in range(nk) for part in (0, 1)))


def _block_plan(cfg: ModelConfig, hf: str, ours: str, moe: bool, shapes: dict, keys: set,
                linear: bool = False) -> dict[str, Entry]:
    """HF tensors of one decoder block (prefix `hf`, e.g. model.layers.3) -> our block `ours`."""
    plan: dict[str, Entry] = {}

    def whole(h: str, o: str) -> None:
        plan[f"{hf}.{h}"] = Entry(shapes[f"{ours}.{o}"], (Copy(f"{ours}.{o}"),))

    whole("input_layernorm.weight", "attn_norm.weight")
    whole("post_attention_layernorm.weight", "ffn_norm.weight")
    a = "self_attn"
    if linear:
        _linear_attention_plan(cfg, hf, ours, plan, whole, f"{hf}.linear_attn.in_proj_qkv.weight" in keys)
    elif cfg.is_mla:
        if cfg.q_lora_rank:
            whole(f"{a}.q_a_proj.weight", "attn.q_a.weight")
            whole(f"{a}.q_a_layernorm.weight", "attn.q_a_norm.weight")
            whole(f"{a}.q_b_proj.weight", "attn.q_b.weight")
        else:
            whole(f"{a}.q_proj.weight", "attn.q_proj.weight")
        whole(f"{a}.kv_a_proj_with_mqa.weight", "attn.kv_a.weight")
        whole(f"{a}.kv_a_layernorm.weight", "attn.kv_a_norm.weight")
        whole(f"{a}.kv_b_proj.weight", "attn.kv_b.weight")
        if cfg.is_sparse:  # DeepSeek Sparse Attention's indexer (transformers' DeepseekV32Indexer names)
            for h, o in (("wq_b.weight", "idx_wq_b.weight"), ("wk.weight", "idx_wk.weight"),
                         ("k_norm.weight", "idx_k_norm.weight"), ("k_norm.bias", "idx_k_norm.bias"),
                         ("weights_proj.weight", "idx_weights.weight")):
                whole(f"{a}.indexer.{h}", f"attn.{o}")
    else:
        q_rows = cfg.heads * cfg.head_dim * (2 if cfg.attn_output_gate else 1)  # + each head's gate rows
        rows = [q_rows, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim]
        start = 0
        for proj, n in zip(("q_proj", "k_proj", "v_proj"), rows):
            for kind in ("weight", "bias") if cfg.qkv_bias else ("weight",):
                full = shapes[f"{ours}.attn.wqkv.{kind}"]
                plan[f"{hf}.{a}.{proj}.{kind}"] = Entry((n, *full[1:]), (Copy(f"{ours}.attn.wqkv.{kind}", (slice(start, start + n),)),))
            start += n
        if cfg.qk_norm:
            whole(f"{a}.q_norm.weight", "attn.q_norm.weight")
            whole(f"{a}.k_norm.weight", "attn.k_norm.weight")
    if not linear:
        whole(f"{a}.o_proj.weight", "attn.wo.weight")
    if not moe:
        for h, o in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            whole(f"mlp.{h}.weight", f"ffn.{o}.weight")
        return plan
    E, f = cfg.experts, cfg.moe_ffn
    m = "block_sparse_moe" if f"{hf}.block_sparse_moe.gate.weight" in keys else "mlp"
    whole(f"{m}.gate.weight", "ffn.gate.weight")
    if cfg.router_scoring == "sigmoid":  # DeepSeek-V3 keeps the selection bias in the gate, MiniMax-M2 beside it
        bias = f"{m}.e_score_correction_bias" if f"{hf}.{m}.e_score_correction_bias" in keys else f"{m}.gate.e_score_correction_bias"
        whole(bias, "ffn.score_bias")
    xp = lambda o: f"{ours}.ffn.{o}" if f"{ours}.ffn.{o}" in shapes else f"{ours}.ffn.{o}.weight"  # noqa: E731  (fp8: a module)
    if f"{hf}.{m}.experts.gate_up_proj" in keys or f"{hf}.{m}.experts.down_proj" in keys:  # fused (transformers 5 in memory)
        w1, w2 = shapes[xp("w1")], shapes[xp("w2")]
        plan[f"{hf}.{m}.experts.gate_up_proj"] = Entry((E, 2 * f, w1[2]), (
            Copy(xp("w1"), (), (slice(None), slice(0, f))), Copy(xp("w3"), (), (slice(None), slice(f, 2 * f)))))
        plan[f"{hf}.{m}.experts.down_proj"] = Entry(w2, (Copy(xp("w2")),))
    else:
        names = (("w1", "w1"), ("w3", "w3"), ("w2", "w2")) if m == "block_sparse_moe" else \
            (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2"))
        for e in range(E):
            for h, o in names:
                plan[f"{hf}.{m}.experts.{e}.{h}.weight"] = Entry(shapes[xp(o)][1:], (Copy(xp(o), (e,)),))
    if cfg.shared_experts:  # DeepSeek's shared_experts, Qwen3-Next's shared_expert (+ its gate)
        sh = "shared_expert" if f"{hf}.{m}.shared_expert.gate_proj.weight" in keys else "shared_experts"
        for h, o in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            whole(f"{m}.{sh}.{h}.weight", f"ffn.shared.{o}.weight")
        if cfg.shared_expert_gate:
            whole(f"{m}.shared_expert_gate.weight", "ffn.shared_gate.weight")
    return plan


# checkpoint tensors that are copies of the main embedding / LM head: checked, never loaded twice
DUPLICATES = {"embed_tokens.weight": "embed", "shared_head.head.weight": "head"}


def _layer_of(key: str) -> int:
    """i of a model.layers.{i}.* tensor, -1 for the others."""
    parts = key.split(".", 3)
    return int(parts[2]) if parts[:2] == ["model", "layers"] and len(parts) > 2 and parts[2].isdigit() else -1


def load_plan(cfg: ModelConfig, keys: set, shapes: dict, layers_stored: int) -> tuple[dict[str, Entry], dict[str, str], set]:
    """(plan, duplicates, skipped): HF name -> what to copy where; MTP copies of the embedding /
    head -> which main tensor they must equal; stored main layers beyond cfg.layers (sliced load)."""
    plan: dict[str, Entry] = {}
    whole = lambda h, o: plan.__setitem__(h, Entry(shapes[o], (Copy(o),)))
    whole("model.embed_tokens.weight", "embed.weight")
    whole("model.norm.weight", "norm.weight")
    if not cfg.tie_embeddings:
        whole("lm_head.weight", "lm_head.weight")
    for i in range(cfg.layers):
        plan.update(_block_plan(cfg, f"model.layers.{i}", f"layers.{i}", cfg.layer_is_moe(i), shapes, keys,
                                cfg.layer_is_linear(i)))
    dups: dict[str, str] = {}
    if cfg.tie_embeddings and "lm_head.weight" in keys:  # some tied checkpoints store the head anyway
        dups["lm_head.weight"] = "embed"
    for j in range(cfg.mtp_layers):
        hf, ours = f"model.layers.{layers_stored + j}", f"mtp.{j}"
        for h, o in (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"), ("shared_head.norm", "norm")):
            whole(f"{hf}.{h}.weight", f"{ours}.{o}.weight")
        plan.update(_block_plan(cfg, hf, f"{ours}.block", cfg.is_moe, shapes, keys))
        for h, what in DUPLICATES.items():
            if f"{hf}.{h}" in keys:
                dups[f"{hf}.{h}"] = what
    skipped = {k for k in keys if cfg.layers <= _layer_of(k) < layers_stored}
    scales, dequant = _scale_plan(cfg, plan, shapes, keys)
    plan.update(scales)
    return plan, dups, skipped, dequant


SCALE = "_scale_inv"


def _block_index(idx: tuple, r: int, what: str) -> tuple:
    """An index into a weight's rows -> the same rows of its per-block scales."""
    out = []
    for i in idx:
        if isinstance(i, slice) and (i.start or i.stop):
            if (i.start or 0) % r:
                raise ConfigError(f"tensor {what!r}: rows from {i.start} do not start on a {r}-row scale block "
                                  "(fused projections need block-aligned parts)")
            i = slice((i.start or 0) // r, -(-i.stop // r))
        out.append(i)
    return tuple(out)


def _scale_plan(cfg: ModelConfig, plan: dict, shapes: dict, keys: set) -> tuple[dict, dict]:
    """(scale entries, dequantised-on-load weights) of an fp8 block-scaled checkpoint: a weight
    whose target is held fp8 brings its weight_scale_inv along (same rows, in blocks); a
    quantized weight whose target is a float parameter (MLA's kv_b) is dequantised on load."""
    if not cfg.native_weights:
        return {}, {}
    r, c = parse_format(cfg.native_weights).block
    scales, dequant = {}, {}
    for h, e in plan.items():
        held = [cp.ours + SCALE in shapes for cp in e.copies]
        if e.copies and all(held):
            shape = (*e.shape[:-2], -(-e.shape[-2] // r), -(-e.shape[-1] // c))
            scales[h + SCALE] = Entry(shape, tuple(Copy(cp.ours + SCALE, _block_index(cp.dst, r, h), _block_index(cp.src, r, h))
                                                   for cp in e.copies))
        elif h + SCALE in keys:
            dequant[h] = h + SCALE
    return scales, dequant


def _main_name(what: str, cfg: ModelConfig) -> str:
    return "model.embed_tokens.weight" if what == "embed" or cfg.tie_embeddings else "lm_head.weight"


def check_against(cfg: ModelConfig, headers: dict[str, TensorInfo], layers_stored: int, shapes: dict,
                  fp8_names: set = frozenset()):
    keys = set(headers)
    plan, dups, skipped, dequant = load_plan(cfg, keys, shapes, layers_stored)
    missing = sorted(set(plan) - keys)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(f"checkpoint is missing tensor {missing[0]!r}{more} that its config.json implies"
                          f" ({cfg.name}: {cfg.layers} layers, {cfg.mtp_layers} MTP)")
    extra = sorted(k for k in keys - set(plan) - set(dups) - skipped - set(dequant.values())
                   if not k.endswith(IGNORED_SUFFIXES))
    if extra:
        hint = ""
        if any(k.startswith(f"model.layers.{layers_stored + cfg.mtp_layers}.") for k in extra):
            hint = f"; layers beyond num_hidden_layers + num_nextn_predict_layers={cfg.mtp_layers}"
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ConfigError(f"checkpoint has unexpected tensor {extra[0]!r}{more}: not part of the model its config.json "
                          f"describes{hint}")
    for k, e in plan.items():
        info = headers[k]
        held_fp8 = any(cp.ours in fp8_names for cp in e.copies)
        allowed = ("F32",) if k.endswith(SCALE) else FP8_DTYPES if held_fp8 else \
            FLOAT_DTYPES + FP8_DTYPES if k in dequant else FLOAT_DTYPES
        if info.dtype not in allowed:
            raise ConfigError(f"tensor {k!r}: dtype {info.dtype}; allowed {list(allowed)} "
                              f"(weight format {cfg.native_weights or 'float'} from config.json)")
        if info.shape != tuple(e.shape):
            raise ConfigError(f"tensor {k!r}: shape {list(info.shape)}, config.json implies {list(e.shape)}")
    for k, what in dups.items():
        main = headers[_main_name(what, cfg)]
        if headers[k].shape != main.shape:
            raise ConfigError(f"tensor {k!r}: shape {list(headers[k].shape)}, a copy of the main {what} has {list(main.shape)}")
    return plan, dups, dequant


# the float dtypes a weight is checked finite in (torch has no isfinite for the fp8 ones; their
# scales, in one of these, are checked)
_CHECKED_FINITE = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _read(info: TensorInfo, name: str) -> torch.Tensor:
    from safetensors import safe_open
    with safe_open(str(info.file), framework="pt", device="cpu") as f:
        return f.get_tensor(name)


def _dequantize(q: torch.Tensor, scale: torch.Tensor, fmt) -> torch.Tensor:
    return q.float() * expand_scale(scale.float(), fmt, *q.shape)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest() + str(t.dtype)


def load_checkpoint(folder: str | Path, *, dtype: str | torch.dtype = "bfloat16", device: str | torch.device = "cpu",
                    max_batch: int = 1, max_context: int | None = None, moe_impl: str = "touched",
                    layers: int | None = None) -> Transformer:
    """The model of a Hugging Face folder with its weights, in `dtype` on `device`.

    max_context: the static cache's length (default: the model's). layers: load only the first
    n decoder layers (layer slicing of a model too big for the device; MTP modules still load).
    Every checkpoint tensor is read once, straight into its place; nothing is initialised twice.
    """
    from safetensors import safe_open
    if moe_impl not in MOE_IMPLS:
        raise ConfigError(f"moe_impl={moe_impl!r}: allowed {MOE_IMPLS}")
    raw = read_config(folder)
    full = checkpoint_config(folder, raw)
    if layers is not None and not (isinstance(layers, int) and 1 <= layers <= full.layers):
        raise ConfigError(f"layers={layers!r}: allowed 1..{full.layers} (num_hidden_layers of the checkpoint)")
    cfg = full if layers is None else full.scaled(layers=layers)
    max_context = max_context or cfg.max_context
    with torch.device("meta"):
        meta = keep_state_dtypes(Transformer(cfg, max_batch, max_context, moe_impl).to(dtype=torch_dtype(dtype)),
                                 torch_dtype(dtype))
    fmt = parse_format(cfg.native_weights) if cfg.native_weights else None
    if fmt is not None:  # storage for the checkpoint's fp8 tensors, filled as they are
        store_quantized(meta, fmt, reference=kernel_for(fmt, device) is None)
    held = dict(meta.named_parameters())
    fp8_names = set()
    for name, mod in meta.named_modules():
        if isinstance(mod, (QuantLinear, QuantExperts)):
            held.update({f"{name}.{b}": t for b, t in mod.named_buffers(recurse=False)})
            fp8_names.add(f"{name}.weight")
    shapes = {n: tuple(t.shape) for n, t in held.items()}
    headers = tensor_headers(folder)
    plan, dups, dequant = check_against(cfg, headers, full.layers, shapes, fp8_names)
    covered = {c.ours for e in plan.values() for c in e.copies}
    assert covered == set(shapes), f"loader plan misses {sorted(set(shapes) - covered)}"  # a bug here, not in the checkpoint

    model = meta.to_empty(device=device)
    cos, sin = rope_table(cfg, max_context, device)
    model.rope_cos, model.rope_sin = cos, sin
    model.reset_cache()
    params = dict(model.named_parameters())
    for name, mod in model.named_modules():
        if isinstance(mod, (QuantLinear, QuantExperts)):
            params.update({f"{name}.{b}": t for b, t in mod.named_buffers(recurse=False)})
    digests: dict[str, str] = {}
    want_digest = set(dups) | {_main_name(w, cfg) for w in dups.values()}
    by_file: dict[Path, list[str]] = {}
    for k in plan.keys() | dups.keys():
        by_file.setdefault(headers[k].file, []).append(k)
    with torch.no_grad():
        for path, names in by_file.items():
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for k in sorted(names):
                    t = f.get_tensor(k)
                    if t.dtype in _CHECKED_FINITE and not bool(torch.isfinite(t).all()):
                        raise ConfigError(f"checkpoint={str(folder)!r}: tensor {k!r} in {path.name} holds NaN or "
                                          "infinite values; a model with them computes nothing to time")
                    if k in dequant:  # MLA's kv_b: the absorbed attention needs it in float
                        t = _dequantize(t, _read(headers[dequant[k]], dequant[k]), fmt)
                    if k in want_digest:
                        digests[k] = _digest(t)
                    for c in plan[k].copies if k in plan else ():
                        params[c.ours].data[c.dst].copy_(t[c.src])
                    del t
        if (raw.get("architectures") or [""])[0] in ZERO_CENTRED_NORMS:  # (1 + w) -> w
            for mod in model.modules():
                if isinstance(mod, RMSNorm):
                    mod.weight.add_(1.0)
    for k, what in dups.items():
        if digests[k] != digests[_main_name(what, cfg)]:
            warnings.warn(f"checkpoint tensor {k!r} differs from the main model's {_main_name(what, cfg)!r}: "
                          f"the MTP module here uses the main {what}, as DeepSeek-V3 / GLM-4.5 share it", stacklevel=2)
    return model.eval().requires_grad_(False)
