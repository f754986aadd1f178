"""Helpers shared by several test modules (no test module imports another).

- synthetic run folders, written by one writer (write_run): CPU-like physics (plots, report), a
  preset at an exact T = t0 + bytes / BW (quality gates), medians with repetitions (compare);
- seeded random transformers models of every supported family, and an MTP layer appended to a
  saved checkpoint (checkpoint loading, real acceptance);
- a word-level chat tokenizer saved like a checkpoint's (prompts, real acceptance).
transformers, safetensors and tokenizers (the test extras) are imported inside the helpers that
use them, so the modules that need none of them import this one without them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from roofline.io.results import append_row, append_samples, write_csv

# ---- a synthetic run folder ---------------------------------------------------------------------

WEIGHT_BYTES = 0.43e9
PARAMS = WEIGHT_BYTES / 2  # bf16
LAYERS, KV_ELEMS, D, HEAD_FLOPS = 4, 2 * 4 * 128, 2048, 2048  # kv heads x head dim x 2 (K,V); d; h x d_h
# T(tokens)/T(1) measured on the project's CPUs (docs/design.md §5), extended linearly past 128.
RATIO_TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
RATIO = [1.0, 0.99, 0.97, 1.15, 1.5, 2.2, 3.8, 6.9, 13.5, 26.5]
BW_Q1 = 19e9
MEASURED_BW_GBPS, MEASURED_BF16_TFLOPS = 21.0, 0.42
PROVENANCE = dict(device="cpu", device_name="AMD EPYC 9R14 (synthetic)", cpu_model="AMD EPYC 9R14 (synthetic)",
                  torch_version="2.13.0+cpu", threads=2, git_commit="0123456789ab",
                  time_utc="2026-03-01T12:00:00+00:00", schema_version=1)


def physics(kind: str, q: int, B: int, L: int, weight_bytes: float = WEIGHT_BYTES) -> dict:
    tokens = B * q
    kv_read = B * LAYERS * KV_ELEMS * (L + q) * 2
    kv_write = B * LAYERS * KV_ELEMS * q * 2
    embed = tokens * D * 2
    total = weight_bytes + kv_read + kv_write + embed
    flops_matmul = 2 * (weight_bytes / 2) * tokens
    flops_attention = 4 * B * q * (L + q / 2) * HEAD_FLOPS * LAYERS
    flops = flops_matmul + flops_attention
    return dict(kv_len=L + q, tokens=tokens, weight_bytes=weight_bytes, kv_read_bytes=kv_read,
                kv_write_bytes=kv_write, embed_bytes=embed, bytes_total=total, flops=flops,
                flops_matmul=flops_matmul, flops_attention=flops_attention, intensity=flops / total)


def form_time(p: dict, truth: dict) -> float:
    """The cost model's own form with known parameters (truth: t0 s, bw B/s, f FLOP/s for the
    matmuls past the knee, f_attn FLOP/s, knee tokens), attention FLOPs split from the matmuls."""
    mm = p["flops_matmul"] * max(0.0, 1 - truth["knee"] / p["tokens"])
    return truth["t0"] + p["bytes_total"] / truth["bw"] + mm / truth["f"] + p["flops_attention"] / truth["f_attn"]


def make_synthetic_run(run_dir: Path, ceilings: bool = True, datasheet: bool = True, seed: int = 0,
                       truth: dict | None = None, Bs=(1, 4), Ls=(0, 4096), noise: float = 0.01) -> Path:
    """points.jsonl + points.csv (+ run.json, ceilings.json) of a small CPU sweep: q 1..128,
    B in `Bs`, L in `Ls`, two MTP points and one failed (oom) point. Times: CPU-like T(q)/T(1)
    ratios, or with `truth` the cost model's form with those parameters (form_time), times
    1 + `noise` x a standard normal."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    grid = [("forward", q, B, L) for B in Bs for L in Ls for q in (1, 2, 4, 8, 16, 32, 64, 128)]
    grid += [("mtp", 1, 1, 0), ("mtp", 1, 4, 0)]
    for n, (kind, q, B, L) in enumerate(grid):
        key = dict(point_id=f"p{n:03d}", kind=kind, model="cpu-demo", dtype="bfloat16", mode="eager",
                   q=q, B=B, L=L, layers_run=LAYERS, layers_full=LAYERS)
        if (B, L, q) == (4, 4096, 128):
            rows.append(key | PROVENANCE | dict(status="oom", error="RuntimeError: DefaultCPUAllocator: "
                                                "can't allocate memory: you tried to allocate 4294967296 bytes",
                                                extrapolated=False, t_l2="warm", t_threads=2))
            continue
        p = physics(kind, q, B, L, WEIGHT_BYTES if kind == "forward" else 0.16e9)
        if truth is not None:
            t = form_time(p, truth)
        else:
            t = p["bytes_total"] / BW_Q1 * np.interp(np.log2(B * q), np.log2(RATIO_TOKENS), RATIO)
        t *= 1 + noise * rng.standard_normal()
        timing = dict(t_median_s=t, t_p10_s=0.97 * t, t_p90_s=1.05 * t, t_cv=0.03, t_n=15, t_l2="warm", t_threads=2)
        derived = dict(achieved_GBps=p["bytes_total"] / t / 1e9, achieved_TFLOPs=p["flops"] / t / 1e12,
                       tokens_per_s=B * q / t, ridge_datasheet=None, bound_datasheet=None)
        rows.append(key | timing | p | derived | PROVENANCE | dict(status="ok", error=None, extrapolated=False))
    return write_run(run_dir, rows, {"model": "cpu-demo", "dtype": "bfloat16", "device": "cpu", "mode": "eager",
                                     "l2": "warm"}, synthetic_ceilings(datasheet) if ceilings else None)


def write_run(run_dir: Path, rows: list[dict], run_json: dict | None = None, ceilings: dict | None = None,
              samples: dict[str, list[float]] | None = None, jsonl: bool = True) -> Path:
    """The one writer of a synthetic run folder, as a sweep leaves it: points.csv of `rows` (and
    points.jsonl, unless `jsonl` is false: rows without the full schema are read from the CSV),
    run.json, ceilings.json, and the repetitions of each point (`samples`: {point_id: seconds})."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for pid, s in (samples or {}).items():
        append_samples(run_dir, pid, list(s))
    for row in rows if jsonl else ():
        append_row(run_dir / "points.jsonl", row)
    write_csv(rows, run_dir / "points.csv")
    if run_json is not None:
        (run_dir / "run.json").write_text(json.dumps(run_json))
    if ceilings is not None:
        (run_dir / "ceilings.json").write_text(json.dumps(ceilings))
    return run_dir


def roof_run(run_dir: Path, bw_GBps=10.0, t0_s=2e-4, qs=(1, 2, 4, 8, 16), Bs=(1, 2), Ls=(0, 64), model="tiny",
             ceiling_GBps=None, converged=True) -> Path:
    """A run folder of a preset whose times follow T = t0 + bytes / BW exactly (the library's
    byte count, 1% seeded noise); `ceiling_GBps`: a ceilings.json with that measured roof."""
    import dataclasses

    from roofline.model.accounting import forward_cost
    from roofline.model.presets import get_preset
    cfg = get_preset(model)
    rng = np.random.default_rng(0)
    rows = []
    for q in qs:
        for B in Bs:
            for L in Ls:
                c = forward_cost(cfg, "bfloat16", B, q, L).as_row()
                t = (t0_s + c["bytes_total"] / (bw_GBps * 1e9)) * (1 + 0.01 * rng.standard_normal())
                rows.append({**c, **dict(point_id=f"forward|bfloat16|eager|q{q}|B{B}|L{L}|l{cfg.layers}",
                                         kind="forward", model=cfg.name, dtype="bfloat16", mode="eager", q=q, B=B,
                                         L=L, layers_run=cfg.layers, layers_full=cfg.layers, status="ok",
                                         t_median_s=t, t_ci_rel=0.01, converged=converged,
                                         achieved_GBps=c["bytes_total"] / t / 1e9,
                                         achieved_TFLOPs=c["flops"] / t / 1e12, device_name="test CPU",
                                         extrapolated=False)})
    ceilings = None if not ceiling_GBps else dict(summary=dict(mem_bw_GBps=ceiling_GBps,
                                                               peak_tflops={"bfloat16": 1.0}))
    return write_run(run_dir, rows, dict(fingerprint="x", spec=dict(model=dataclasses.asdict(cfg))), ceilings,
                     jsonl=False)


def repeated_run(run_dir: Path, medians, seed, spread=0.01, n=30) -> Path:
    """A run folder with one ok point per median (seconds) and its `n` repetitions (compare)."""
    rng = np.random.default_rng(seed)
    rows, samples = [], {}
    for i, med in enumerate(medians):
        pid = f"forward|bfloat16|eager|q{i + 1}|B1|L0|l2"
        s = med * (1 + spread * rng.standard_normal(n))
        samples[pid] = list(s)
        rows.append(dict(point_id=pid, kind="forward", dtype="bfloat16", mode="eager", q=i + 1, B=1, L=0,
                         status="ok", t_median_s=float(np.median(s)), t_n=n, t_ci_rel=0.01, device_name="cpu X"))
    return write_run(run_dir, rows, samples=samples, jsonl=False)


def synthetic_ceilings(datasheet: bool = True) -> dict:
    bandwidth = []
    for kernel, scale in (("copy", 0.9), ("triad", 1.0)):
        for l2 in ("warm", "cold"):
            for e in range(16, 32):
                ws = 2 ** e
                in_cache = ws <= 32 * 2**20
                gbps = scale * (MEASURED_BW_GBPS if not in_cache else (150.0 if ws <= 2**20 else 60.0))
                if l2 == "cold" and in_cache:
                    gbps = scale * MEASURED_BW_GBPS * 0.95
                bandwidth.append(dict(kernel=kernel, variant="torch", dtype="fp32", l2=l2, working_set_bytes=ws,
                                      bytes_moved=ws, t_median_s=ws / gbps / 1e9, t_p10_s=None, t_p90_s=None,
                                      GBps=gbps, pct_datasheet=100 * gbps / 38.4 if datasheet else None))
    return {
        "schema_version": 1,
        "provenance": {k: PROVENANCE[k] for k in ("device", "device_name", "torch_version", "git_commit",
                                                   "time_utc")},
        "datasheet": ({"key": "synthetic", "name": "synthetic test datasheet", "mem_bw_GBps": 38.4,
                       "peak_tflops": {"bf16": 1.2, "fp32": 0.6}, "cache_bytes": 32 * 2**20}
                      if datasheet else None),
        "bandwidth": bandwidth,
        "matmul": [dict(kind="square", name="4096^3", dtype="bf16", M=4096, N=4096, K=4096, t_median_s=0.33,
                        TFLOPs=MEASURED_BF16_TFLOPS, GBps=0.3, pct_datasheet_flops=35.0)],
        "telemetry": [],
        "failures": [],
        "summary": {"mem_bw_GBps": MEASURED_BW_GBPS, "mem_bw_kernel": "triad",
                    "peak_tflops": {"bf16": MEASURED_BF16_TFLOPS},
                    "ridge_measured": {"bf16": MEASURED_BF16_TFLOPS * 1e12 / (MEASURED_BW_GBPS * 1e9)},
                    "cache_bytes": 32 * 2**20},
    }


# ---- transformers models and checkpoints ---------------------------------------------------

BASE = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
SIGMOID_MOE = dict(MOE, n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True)
# a hybrid's miniature: 3 Gated DeltaNet layers (2 k heads, 4 v heads) to one full-attention layer, partial RoPE
GATED_DELTANET = dict(num_hidden_layers=4, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                      linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=4,
                      rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25))
FAMILIES = {
    "llama": dict(rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=32)),
    "qwen2": dict(),
    "qwen3": dict(head_dim=24),
    "mistral": dict(sliding_window=None),
    "qwen3_moe": dict(MOE, num_experts=8, norm_topk_prob=True, mlp_only_layers=[0]),
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32),
    "deepseek_v3": dict(SIGMOID_MOE, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, n_group=2, topk_group=1, routed_scaling_factor=2.5,
                        num_nextn_predict_layers=1,
                        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, beta_fast=32.0,
                                             beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                                             original_max_position_embeddings=32)),
    # GLM-5: DeepSeek Sparse Attention (as deepseek_v32 below) with interleaved RoPE in the indexer too
    "glm_moe_dsa": dict(SIGMOID_MOE, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1, routed_scaling_factor=2.5,
                        num_nextn_predict_layers=1, index_n_heads=8, index_head_dim=16, index_topk=4,
                        indexer_rope_interleave=True, rope_interleave=True,
                        rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    # MiniMax-M2: one QK-norm over all heads (per_layer), sigmoid routing with a selection bias, no shared expert,
    # partial RoPE (the released configs' rotary_dim)
    "minimax_m2": dict(num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, head_dim=16,
                       rope_parameters=dict(rope_type="default", rope_theta=5000000.0, partial_rotary_factor=0.5)),
    # Qwen3-Next: three Gated DeltaNet layers to one gated full-attention layer, MoE with a gated shared expert
    "qwen3_next": dict(MOE, **GATED_DELTANET, num_experts=8, shared_expert_intermediate_size=32, norm_topk_prob=True),
    # Qwen3.5: the same layers, Gated DeltaNet projections in four (in_proj_qkv, z, b, a), the state in float32
    "qwen3_5_moe_text": dict(MOE, **GATED_DELTANET, num_experts=8, shared_expert_intermediate_size=32,
                             attn_output_gate=True, mamba_ssm_dtype="float32"),
    "qwen3_5_text": dict(GATED_DELTANET, attn_output_gate=True, mamba_ssm_dtype="float32"),
    "glm4_moe": dict(SIGMOID_MOE, head_dim=16, attention_bias=True, use_qk_norm=True, n_group=1, topk_group=1,
                     num_nextn_predict_layers=1, routed_scaling_factor=1.5,
                     rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)),
}
# DeepSeek Sparse Attention: 4 of up to 7 keys selected (q = 7 in the parity tests), 8 indexer heads (ties at ReLU's
# zero across every head are rare)
FAMILIES["deepseek_v32"] = dict(FAMILIES["deepseek_v3"], index_n_heads=8, index_head_dim=16, index_topk=4)


def hf_model(family: str, seed: int = 0, **changes):
    """A seeded random transformers model: every weight, norm, bias and router bias random."""
    import transformers
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(family, **{**BASE, **FAMILIES[family], **changes})
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    randomize(model)
    return model


def randomize(module: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if not t.is_floating_point() or "inv_freq" in name:
                continue
            if name.endswith("norm.weight") or "layernorm" in name:
                t.copy_(1 + 0.1 * torch.randn_like(t))
            else:
                t.copy_(0.05 * torch.randn_like(t))


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def add_mtp_layer(hf, folder, seed=5) -> dict:
    """Append model.layers.{n}.* (a random MoE decoder block + enorm, hnorm, eh_proj, shared_head,
    embed_tokens) to the checkpoint, per-expert names as released checkpoints store them."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    import copy
    cfg, n = hf.config, hf.config.num_hidden_layers
    torch.manual_seed(seed)
    typed = [a for a in ("mlp_layer_types", "layer_types", "indexer_types") if len(getattr(cfg, a, None) or []) == n]
    if typed:  # configs that type each layer (DeepSeek-V3.2's, GLM-5's): the MTP block is one more layer, MoE
        cfg = copy.copy(cfg)
        for a in typed:
            setattr(cfg, a, list(getattr(cfg, a)) + ["sparse" if a == "mlp_layer_types" else getattr(cfg, a)[-1]])
    layer = type(hf.model.layers[-1])(cfg, layer_idx=n).eval()
    randomize(layer)
    d = cfg.hidden_size
    extra = {"enorm.weight": 1 + 0.1 * torch.randn(d), "hnorm.weight": 1 + 0.1 * torch.randn(d),
             "eh_proj.weight": 0.05 * torch.randn(d, 2 * d), "shared_head.norm.weight": 1 + 0.1 * torch.randn(d),
             "shared_head.head.weight": hf.lm_head.weight.detach().clone(),
             "embed_tokens.weight": hf.model.embed_tokens.weight.detach().clone()}
    f = cfg.moe_intermediate_size
    for k, v in layer.state_dict().items():
        if k.endswith("experts.gate_up_proj"):
            for e in range(v.shape[0]):
                extra[k.replace("gate_up_proj", f"{e}.gate_proj.weight")] = v[e, :f]
                extra[k.replace("gate_up_proj", f"{e}.up_proj.weight")] = v[e, f:]
        elif k.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                extra[k.replace("down_proj", f"{e}.down_proj.weight")] = v[e]
        else:
            extra[k] = v
    path = folder / "model.safetensors"
    with safe_open(str(path), framework="pt") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    tensors.update({f"model.layers.{n}.{k}": v.contiguous().clone() for k, v in extra.items()})
    save_file(tensors, str(path), metadata={"format": "pt"})
    return dict(layer=layer, **extra)


# ---- a chat tokenizer -------------------------------------------------------------------------

# Emits BOS as text; the prompt is a byte-exact prefix of prompt + answer.
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
WORDS = "hello what is two plus two four the sky blue why because light scatters you are a helpful bot".split()
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
CONVERSATION = [{"role": "system", "content": "you are a helpful bot"},
                {"role": "user", "content": "what is two plus two"},
                {"role": "assistant", "content": "four"}]


def save_tokenizer(folder, template=TEMPLATE):
    """A word-level tokenizer whose encode() adds BOS, the way Llama's does, saved like a checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = template
    fast.save_pretrained(str(folder))
    return folder


def composed(name: str, *overrides: str, device_as: str | None = None) -> dict:
    """The plain dict the entry point of command `name` hands to roofline.commands.<name>.run for
    `overrides` (its schema, its YAML file, the overrides), without running it."""
    from roofline.cli.entry import compose_config, plain
    return plain(compose_config(name, list(overrides)), device_as=device_as)
