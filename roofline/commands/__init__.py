"""The command layer: one module per command of `roofline` / `python -m roofline.cli.<command>`.

Each module's `run(c)` takes the command's composed config as a plain dict (roofline/conf/<command>.yaml,
`overrides` the command line) and orchestrates it: the request built from the dict, the
library run, the files written, the console text and the JSON summary (its last line of stdout)
printed. It returns None, an exit status (`REGRESSION`, 1 for a lost tensor), or for the sweep
the record of its job. The first line of each module's docstring is its line in `roofline --help`.

Below this floor the library only computes; roofline/cli/ above it only composes the config
(Hydra) and turns errors into exit statuses (docs/design.md, "Floors").
"""

from dataclasses import dataclass, fields

from roofline.io.fields import ConfigError, option
from roofline.model.config import ModelConfig
from roofline.model.formats import with_overrides

@dataclass(frozen=True)
class FormatKeys:
    """The precision overrides every pricing or measuring command takes (roofline.model.formats)."""

    weights: str | None = option(None, "weight format for every dtype: int8 | int4_g128 | fp8 | fp8_e4m3_b128 | "
                                       "native (the preset's release format); null: native where a command prices "
                                       "a deployment without a fit (card, predict, capacity), the dtype where it "
                                       "measures or applies a fit")
    kv: str | None = option(None, "KV cache format: fp8 | fp8_e5m2 | int8")
    lm_head: str | None = option(None, "LM head format (default: the activation dtype)")
    experts: str | None = option(None, "routed experts' format (MoE): mxfp4 | nvfp4 | int4_g128 | fp8 | ... | native; "
                                       "default: the weights' (weights=native: the release's, gpt-oss's mxfp4)")


FORMAT_KEYS = tuple(f.name for f in fields(FormatKeys))


@dataclass(frozen=True)
class LayoutKeys:
    """The parallel layout (roofline.parallel.layout.Layout): measured by a sweep, priced elsewhere."""

    tp: int = option(1, "tensor-parallel ranks")
    ep: int = option(1, "expert-parallel ranks among the tp ranks (MoE presets)")
    dp_attention: bool = option(False, "attention replicated, batch split over the ranks, tokens to experts "
                                       "by all-to-all (ep = tp)")


@dataclass(frozen=True)
class GraphKeys:
    """The engine's CUDA-graph batch sizes of a priced deployment (roofline.parallel.whatif.graph_batch)."""

    graph_batch_sizes: list | None = option(None, "the decode batches your engine captures as CUDA graphs with padding "
                                                  "(sizes or [first, last, step] ranges; TensorRT-LLM's "
                                                  "cuda_graph_config batch_sizes with enable_padding): a decode-only "
                                                  "step runs its GEMMs at the next size; null: the engine's default "
                                                  "(engines.yaml graph_padding)")


def priced_weights(c) -> str | None:
    """The `weights` key of a pricing command: as given, else the preset's release format (`native`: a
    deployment serves the checkpoint as released, DeepSeek-V3 / R1 in block-scaled fp8), except where a fit
    is applied (its rows were measured in the dtype; the fit's own precision decides)."""
    if c.get("weights") is not None:
        return c["weights"]
    return None if c.get("fit") else "native"


def served_label(dtype: str, c: dict, model, weights: str | None, pop: bool = False) -> str:
    """The precision label of `dtype` under the command's format keys (`weights` as the command resolves it;
    kv, lm_head, experts from c) and the model's release formats (weights=native); pop=True removes the
    FormatKeys from c (a request that takes the label alone)."""
    native = model.native_weights if model is not None else ""
    native_experts = model.native_experts if model is not None else ""
    label = with_overrides([dtype], weights, c.get("kv"), c.get("lm_head"), native, c.get("experts"), native_experts,
                           model)[0]
    for k in (FORMAT_KEYS if pop else ()):
        c.pop(k, None)
    return label


REGRESSION = 3  # asked to fail (compare fail_above=, specdec fail_on_mismatch=true) and it did: a CI verdict


def given_on_command_line(overrides, key: str) -> bool:
    """Whether the command line (Hydra's override list) set `key` or a key under it."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides or ()}
    return any(k == key or k.startswith(key + ".") for k in keys)


def not_both(c: dict, given: str, ignored: str) -> None:
    """`given` replaces `ignored`: asking for both on the command line is a contradiction, not a choice."""
    if c.get(given) and given_on_command_line(c.get("overrides"), ignored):
        raise ConfigError(f"{ignored}= and {given}= are both given: {given} replaces {ignored} "
                          f"(its config is read from {given}); drop one")


@dataclass(frozen=True)
class CheckpointKeys:
    """A Hugging Face model folder in place of the model preset (card, predict, capacity)."""

    checkpoint: str | None = option(None, "a Hugging Face model folder: its config.json replaces the model preset "
                                          "(no weights read; the architectures roofline.checkpoints.loader reads)")


def target_model(c: dict) -> ModelConfig | None:
    """The model a command prices: `checkpoint=` (a Hugging Face folder's config.json) or the `model` preset
    (None where neither is set: predict's fitted model). Both on the command line: ConfigError."""
    not_both(c, "checkpoint", "model")
    if c.get("checkpoint"):
        from roofline.checkpoints.loader import checkpoint_config  # the loader and torch, only for a folder
        return checkpoint_config(c["checkpoint"], pricing=True)
    return ModelConfig.from_dict(c["model"]) if c.get("model") else None


def axis(value, field: str) -> tuple:
    """A grid axis from the config: a list, or one value (`q=4`, and each job of `-m 'q=1,2'`)."""
    if value is None:
        raise ConfigError(f"{field}: the grid has no points (null)")
    return tuple(value) if isinstance(value, (list, tuple)) else (value,)


def refuse_unused(overrides, unused: dict[str, str], why: str) -> None:
    """ConfigError when the command line set a key (or a key under it) that this request does
    not use: `unused` maps each such key to what it belongs to; `why` names the mode."""
    hit = sorted(k for k in unused if given_on_command_line(overrides, k))
    if hit:
        them = "it" if len(hit) == 1 else "them"
        raise ConfigError(f"{', '.join(f'{k}=' for k in hit)} given with {why}, which does not use {them} "
                          f"({'; '.join(f'{k}: {unused[k]}' for k in hit)}); drop {them}")
