"""Real acceptance per position: a checkpoint, its MTP head or a draft model, real prompts.

The prompts reach the model as it was trained: rendered by the checkpoint's chat template
with the generation prompt and tokenized once (roofline.checkpoints.prompts). The drafter proposes, the
target verifies, and the counters come out under vLLM's names, so the per-position α can go
straight into `roofline.cli.predict` (as a profile) next to a vLLM metrics dump's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from roofline.checkpoints.loader import load_checkpoint
from roofline.measure import memory
from roofline.io.fields import ConfigError, check_int, check_number, internal, option
from roofline.model.speculation import DRAFTERS
from roofline.model.formats import precision
from roofline.model.quant import kernel_for, quantize_model
from roofline.spec.counters import AcceptanceCounters
from roofline.spec.drafters import DraftModelDrafter, MTPDrafter, NgramDrafter
from roofline.checkpoints.prompts import encode_conversations
from roofline.spec.engine import DecodeSettings, SpecEngine



@dataclass(frozen=True)
class AcceptanceRequest:
    """One real-acceptance measurement: a checkpoint, its drafter, chat prompts (roofline/conf/acceptance.yaml)."""

    checkpoint: str = option(help="a Hugging Face model folder (config.json, safetensors, tokenizer, chat template)")
    prompts: str = option(help="JSONL, one {\"messages\": [{\"role\": ..., \"content\": ...}, ...]} per line")
    drafter: str = option("mtp", "mtp (the checkpoint's MTP layers) | draft_model | ngram")
    draft_checkpoint: str = option("", "the draft model's folder (drafter=draft_model; same vocabulary)")
    k: int = option(3, "draft length: tokens drafted per round")
    max_new: int = option(64, "tokens generated per conversation")
    batch: int = option(4, "conversations decoded together")
    temperature: float = option(0.0, "0: greedy; > 0: sampled")
    top_p: float = option(1.0, "nucleus sampling: the probability mass kept (with temperature > 0)")
    dtype: str = option("bfloat16", "float32 | bfloat16 | float16: activations (and every class not overridden)")
    # measure in another precision (roofline.model.formats): quantization changes outputs, so
    # acceptance measured in one precision may not transfer
    weights: str | None = internal(None, "the weights key (roofline.commands.FormatKeys)")
    kv: str | None = internal(None, "the kv key (roofline.commands.FormatKeys)")
    lm_head: str | None = internal(None, "the lm_head key (roofline.commands.FormatKeys)")
    experts: str | None = internal(None, "the experts key (roofline.commands.FormatKeys)")
    device: str = internal("cpu", "the torch device of the `device` group's entry")
    max_prompt: int = option(2048, "prompts longer than this many tokens are skipped (never truncated)")
    seed: int = option(0, "seed of the sampling (temperature > 0)")

    def __post_init__(self) -> None:
        for name in ("checkpoint", "prompts"):
            if not getattr(self, name):
                raise ConfigError(f"{name} is required")
        if self.drafter not in DRAFTERS:
            raise ConfigError(f"drafter={self.drafter!r}: allowed {DRAFTERS}")
        if self.drafter == "draft_model" and not self.draft_checkpoint:
            raise ConfigError("drafter='draft_model' needs draft_checkpoint (a model folder)")
        for name in ("k", "batch", "max_new", "max_prompt"):
            check_int(name, getattr(self, name), 1)
        check_int("seed", self.seed, 0)
        check_number("temperature", self.temperature, 0.0)
        check_number("top_p", self.top_p, 0.0, 1.0, lo_open=True)


def make_drafter(name: str, target, draft_checkpoint: str = "", load_kw: dict | None = None):
    """A real drafter for `target`: its MTP module, a draft model folder, or n-gram lookup."""
    if name == "mtp":
        return MTPDrafter(target)
    if name == "draft_model":
        return DraftModelDrafter(load_checkpoint(draft_checkpoint, **(load_kw or {})), target.cfg.vocab)
    if name == "ngram":
        return NgramDrafter(target.cfg.vocab)
    raise ConfigError(f"drafter={name!r}: allowed {DRAFTERS}")


def measure_acceptance(req: AcceptanceRequest) -> dict:
    """Counters summed over every batch of prompts, and the per-position acceptance."""
    prompts = encode_conversations(req.checkpoint, req.prompts, max_len=req.max_prompt)
    if not prompts:
        raise ConfigError(f"prompts={req.prompts!r}: no conversation fits max_prompt={req.max_prompt}")
    ctx = max(len(p) for p in prompts) + req.max_new + 2 * req.k + 2
    kw = dict(dtype=req.dtype, device=req.device, max_batch=req.batch, max_context=ctx)
    from roofline.checkpoints.loader import checkpoint_config
    window = checkpoint_config(req.checkpoint).max_context
    if ctx > window:
        raise ConfigError(f"the longest prompt ({max(len(p) for p in prompts)} tokens) + max_new={req.max_new} + "
                          f"the drafts of k={req.k} need {ctx} positions: more than the checkpoint's context window "
                          f"(max_position_embeddings={window}); lower k, max_new or max_prompt")
    need = memory.peak_bytes(checkpoint_config(req.checkpoint), req.dtype, req.batch, ctx, req.k + 1,
                             with_mtp=req.drafter == "mtp")
    if req.drafter == "draft_model":
        need = memory.add(need, memory.peak_bytes(checkpoint_config(req.draft_checkpoint), req.dtype, req.batch, ctx,
                                                  2, with_mtp=False))
    memory.require(need, req.device, "acceptance (target" + (" + draft model)" if req.drafter == "draft_model" else ")"))
    target = load_checkpoint(req.checkpoint, **kw)
    prec = precision(req.dtype, req.weights, req.kv, req.lm_head, target.cfg.native_weights, req.experts,
                     target.cfg.native_experts)
    if not prec.is_plain:  # outputs, not speed, matter here: formats without a fast kernel run dequantised
        quantize_model(target, prec, req.device, reference=kernel_for(prec.weights, req.device) is None)
    drafter = make_drafter(req.drafter, target, req.draft_checkpoint, kw)
    engine = SpecEngine(target, drafter)
    s = DecodeSettings(max_new=req.max_new, k=req.k, temperature=req.temperature, top_p=req.top_p, seed=req.seed)
    total = AcceptanceCounters(accepted_per_pos=(0,) * req.k)
    with torch.inference_mode():
        for i in range(0, len(prompts), req.batch):
            _, m = engine.generate(prompts[i:i + req.batch], s)
            total += m.counters
    return dict(**total.vllm_names(), prompts=len(prompts), drafter=req.drafter, k=req.k, precision=prec.label,
                acceptance_rate=total.acceptance_rate(), mean_acceptance_length=total.mean_acceptance_length(),
                alpha_per_pos=list(total.per_position_alpha()))
