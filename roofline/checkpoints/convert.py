"""Checkpoint layouts: our model -> a Hugging Face folder, and HF <-> a Megatron-style layout.

`save_hf` writes a dense GQA `Transformer` (Llama architecture) as transformers stores
LlamaForCausalLM, its MTP modules as DeepSeek-V3 stores them: `model.layers.{L + j}` holds
enorm, hnorm, eh_proj, shared_head.norm and a full decoder block, plus copies of the
embedding (`embed_tokens`) and of the LM head (`shared_head.head`), with
`num_nextn_predict_layers` in config.json. transformers loads the main model and ignores
those layers; roofline.checkpoints.loader loads both.

The second layout is Megatron-LM's as its HF converters meet it: fused QKV
(`self_attention.linear_qkv`, rows grouped per KV head: its query heads, then its key, then its
value), fused gate/up (`mlp.linear_fc1`), renamed norms, `decoder.layers.*` / `mtp.layers.*`,
and one shard per tensor-parallel rank (`mp_rank_{r:02d}/model.safetensors`): column-parallel
weights split on rows, row-parallel ones on columns, the rest replicated. The conversion does
no arithmetic: `to_megatron` then `from_megatron` returns every tensor bit for bit, unless
`drop_mtp` drops the MTP module and sets num_nextn_predict_layers = 0, the way a pipeline that
only knows the main model silently does. A forward-parity check cannot see that (the forward
never uses the MTP module); `roofline.cli.inventory` can.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from roofline.io.fields import ConfigError
from roofline.model.decoder import Transformer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
MEGATRON_CONFIG = "megatron_config.json"


# ---- ours -> Hugging Face ------------------------------------------------------------------

def _block_tensors(model: Transformer, ours: str, hf: str, sd: dict) -> dict[str, torch.Tensor]:
    cfg = model.cfg
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    wq, wk, wv = sd[f"{ours}.attn.wqkv.weight"].split([q, kv, kv])
    return {f"{hf}.input_layernorm.weight": sd[f"{ours}.attn_norm.weight"],
            f"{hf}.self_attn.q_proj.weight": wq, f"{hf}.self_attn.k_proj.weight": wk,
            f"{hf}.self_attn.v_proj.weight": wv, f"{hf}.self_attn.o_proj.weight": sd[f"{ours}.attn.wo.weight"],
            f"{hf}.post_attention_layernorm.weight": sd[f"{ours}.ffn_norm.weight"],
            f"{hf}.mlp.gate_proj.weight": sd[f"{ours}.ffn.w1.weight"],
            f"{hf}.mlp.up_proj.weight": sd[f"{ours}.ffn.w3.weight"],
            f"{hf}.mlp.down_proj.weight": sd[f"{ours}.ffn.w2.weight"]}


def hf_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """Our parameters under their Hugging Face names (DeepSeek-V3's for the MTP modules)."""
    cfg = model.cfg
    if cfg.is_moe or cfg.is_mla or cfg.qkv_bias or cfg.qk_norm:
        raise ConfigError(f"model={cfg.name!r}: save_hf writes dense GQA (Llama) models only")
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.layers):
        out.update(_block_tensors(model, f"layers.{i}", f"model.layers.{i}", sd))
    head = out["model.embed_tokens.weight" if cfg.tie_embeddings else "lm_head.weight"]
    for j in range(cfg.mtp_layers):
        hf, ours = f"model.layers.{cfg.layers + j}", f"mtp.{j}"
        out.update({f"{hf}.enorm.weight": sd[f"{ours}.enorm.weight"], f"{hf}.hnorm.weight": sd[f"{ours}.hnorm.weight"],
                    f"{hf}.eh_proj.weight": sd[f"{ours}.eh_proj.weight"],
                    f"{hf}.shared_head.norm.weight": sd[f"{ours}.norm.weight"],
                    f"{hf}.embed_tokens.weight": out["model.embed_tokens.weight"],
                    f"{hf}.shared_head.head.weight": head})
        out.update(_block_tensors(model, f"{ours}.block", hf, sd))
    return out


def hf_config(model: Transformer, bos_id: int | None = None, eos_id: int | None = None, dtype: str = "bfloat16",
              **extra) -> dict:
    cfg = model.cfg
    return dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=cfg.vocab, hidden_size=cfg.d,
                intermediate_size=cfg.ffn, num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                num_key_value_heads=cfg.kv_heads, head_dim=cfg.head_dim, max_position_embeddings=cfg.max_context,
                rms_norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_embeddings,
                hidden_act="silu", attention_bias=False, mlp_bias=False, num_nextn_predict_layers=cfg.mtp_layers,
                bos_token_id=bos_id, eos_token_id=eos_id, torch_dtype=dtype, **extra)


def save_file_dedup(tensors: dict[str, torch.Tensor], path: Path, dtype: torch.dtype | None = None) -> None:
    """safetensors refuses tensors that share storage (the MTP copies of the embedding): clone each."""
    from safetensors.torch import save_file
    out = {k: (v.to(dtype) if dtype is not None else v).contiguous().clone() for k, v in tensors.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path), metadata={"format": "pt"})


def save_hf(model: Transformer, folder: Path, *, dtype: str = "bfloat16", tokenizer_dir: Path | None = None,
            **config_extra) -> Path:
    """config.json + model.safetensors (+ the tokenizer files copied from tokenizer_dir)."""
    from roofline.model.dtypes import torch_dtype
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file_dedup(hf_tensors(model), folder / "model.safetensors", torch_dtype(dtype))
    (folder / "config.json").write_text(json.dumps(hf_config(model, dtype=dtype, **config_extra), indent=2) + "\n")
    if tokenizer_dir is not None:
        copy_tokenizer(tokenizer_dir, folder)
    return folder


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        if (Path(src) / name).exists():
            shutil.copyfile(Path(src) / name, Path(dst) / name)


# ---- Hugging Face <-> Megatron-style -------------------------------------------------------

# (HF suffix inside a block, Megatron suffix, tensor-parallel split dim: 0 column, 1 row, None replicated)
_BLOCK = (("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight", None),
          ("self_attn.o_proj.weight", "self_attention.linear_proj.weight", 1),
          ("post_attention_layernorm.weight", "mlp.linear_fc1.layer_norm_weight", None),
          ("mlp.down_proj.weight", "mlp.linear_fc2.weight", 1))
_MTP_ONLY = (("enorm.weight", "enorm.weight", None), ("hnorm.weight", "hnorm.weight", None),
             ("eh_proj.weight", "eh_proj.weight", None), ("shared_head.norm.weight", "final_layernorm.weight", None))
_MTP_COPIES = ("embed_tokens.weight", "shared_head.head.weight")  # copies of the main embedding / head


def _load_all(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from roofline.checkpoints.loader import shard_files
    out: dict[str, torch.Tensor] = {}
    for f in shard_files(folder):
        out.update(load_file(str(f)))
    return out


def _qkv_fuse(q, k, v, hkv: int) -> torch.Tensor:
    """Megatron's grouped QKV rows: for each KV head, its query heads, its key, its value."""
    dh = k.shape[0] // hkv
    per_group = q.shape[0] // hkv  # the query rows of one KV head's group
    return torch.cat((q.view(hkv, per_group, -1), k.view(hkv, dh, -1), v.view(hkv, dh, -1)), 1).reshape(-1, q.shape[-1])


def _qkv_split(w, heads: int, hkv: int, dh: int):
    g = heads // hkv
    w = w.view(hkv, (g + 2) * dh, -1)
    q, k, v = w.split([g * dh, dh, dh], 1)
    return q.reshape(heads * dh, -1), k.reshape(hkv * dh, -1), v.reshape(hkv * dh, -1)


def _meg_block(src: dict, hf: str, meg: str, cfg: dict) -> dict[str, tuple[torch.Tensor, int | None]]:
    """(tensor, split dim) per Megatron name of one HF block."""
    out = {f"{meg}.{m}": (src[f"{hf}.{h}"], d) for h, m, d in _BLOCK}
    out[f"{meg}.self_attention.linear_qkv.weight"] = (_qkv_fuse(
        src[f"{hf}.self_attn.q_proj.weight"], src[f"{hf}.self_attn.k_proj.weight"], src[f"{hf}.self_attn.v_proj.weight"],
        cfg["num_key_value_heads"]), 0)
    out[f"{meg}.mlp.linear_fc1.weight"] = (torch.cat(  # gate and up, each split per rank then stacked
        (src[f"{hf}.mlp.gate_proj.weight"], src[f"{hf}.mlp.up_proj.weight"]), 0), "fc1")
    return out


def _shard(t: torch.Tensor, dim, rank: int, tp: int) -> torch.Tensor:
    if dim is None:
        return t
    if dim == "fc1":  # [gate; up]: each rank holds its slice of both
        gate, up = t.chunk(2, 0)
        return torch.cat((gate.chunk(tp, 0)[rank], up.chunk(tp, 0)[rank]), 0)
    return t.chunk(tp, dim)[rank]


def _unshard(parts: list[torch.Tensor], dim) -> torch.Tensor:
    if dim is None:
        return parts[0]
    if dim == "fc1":
        halves = [p.chunk(2, 0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
    return torch.cat(parts, dim)


def _megatron_plan(cfg: dict) -> dict[str, tuple[str, object]]:
    """Megatron name -> (kind, split dim); kind is what from_megatron rebuilds it into."""
    L, n_mtp = cfg["num_hidden_layers"], cfg.get("num_nextn_predict_layers") or 0
    dims = {"embedding.word_embeddings.weight": 0, "decoder.final_layernorm.weight": None}
    if not cfg.get("tie_word_embeddings"):
        dims["output_layer.weight"] = 0
    for prefix in [f"decoder.layers.{i}" for i in range(L)] + [f"mtp.layers.{j}" for j in range(n_mtp)]:
        dims.update({f"{prefix}.{m}": d for _, m, d in _BLOCK})
        dims[f"{prefix}.self_attention.linear_qkv.weight"] = 0
        dims[f"{prefix}.mlp.linear_fc1.weight"] = "fc1"
        if prefix.startswith("mtp."):
            dims.update({f"{prefix}.{m}": d for _, m, d in _MTP_ONLY})
    return dims


def to_megatron(src_dir: str | Path, dst_dir: str | Path, tp: int = 2, drop_mtp: bool = False) -> Path:
    """HF folder -> Megatron-style folder: one shard per TP rank, fused QKV and gate/up, renamed."""
    src_dir, dst = Path(src_dir), Path(dst_dir)
    cfg = json.loads((src_dir / "config.json").read_text())
    if cfg.get("architectures") != ["LlamaForCausalLM"]:
        raise ConfigError(f"checkpoint={str(src_dir)!r}: the Megatron converter handles LlamaForCausalLM folders")
    if tp < 1 or cfg["num_key_value_heads"] % tp or cfg["intermediate_size"] % tp:
        raise ConfigError(f"tp={tp}: must divide num_key_value_heads={cfg['num_key_value_heads']} and "
                          f"intermediate_size={cfg['intermediate_size']}")
    src = _load_all(src_dir)
    L, n_mtp = cfg["num_hidden_layers"], cfg.get("num_nextn_predict_layers") or 0
    full: dict[str, tuple[torch.Tensor, object]] = {"embedding.word_embeddings.weight": (src["model.embed_tokens.weight"], 0),
                                                    "decoder.final_layernorm.weight": (src["model.norm.weight"], None)}
    if not cfg.get("tie_word_embeddings"):
        full["output_layer.weight"] = (src["lm_head.weight"], 0)
    for i in range(L):
        full.update(_meg_block(src, f"model.layers.{i}", f"decoder.layers.{i}", cfg))
    for j in range(0 if drop_mtp else n_mtp):
        hf, meg = f"model.layers.{L + j}", f"mtp.layers.{j}"
        full.update(_meg_block(src, hf, meg, cfg))
        full.update({f"{meg}.{m}": (src[f"{hf}.{h}"], d) for h, m, d in _MTP_ONLY})
    if drop_mtp:
        cfg = dict(cfg, num_nextn_predict_layers=0)
    dtype = next(iter(src.values())).dtype
    for r in range(tp):
        save_file_dedup({k: _shard(t, d, r, tp) for k, (t, d) in full.items()},
                        dst / f"mp_rank_{r:02d}" / "model.safetensors", dtype)
    (dst / MEGATRON_CONFIG).write_text(json.dumps(dict(hf_config=cfg, tensor_parallel=tp), indent=2) + "\n")
    copy_tokenizer(src_dir, dst)
    return dst


def from_megatron(src_dir: str | Path, dst_dir: str | Path) -> Path:
    """Megatron-style folder -> HF folder (the MTP copies of embedding and head rebuilt from the main ones)."""
    from safetensors.torch import load_file
    src_dir, dst = Path(src_dir), Path(dst_dir)
    meta_path = src_dir / MEGATRON_CONFIG
    if not meta_path.is_file():
        raise ConfigError(f"checkpoint={str(src_dir)!r}: no {MEGATRON_CONFIG} (not a Megatron-style folder)")
    meta = json.loads(meta_path.read_text())
    cfg, tp = meta["hf_config"], meta["tensor_parallel"]
    ranks = [load_file(str(src_dir / f"mp_rank_{r:02d}" / "model.safetensors")) for r in range(tp)]
    plan = _megatron_plan(cfg)
    unknown = sorted(set(ranks[0]) - set(plan))
    if unknown:
        raise ConfigError(f"checkpoint={str(src_dir)!r}: unexpected tensor {unknown[0]!r} for its config")
    meg = {k: _unshard([r[k] for r in ranks], d) for k, d in plan.items()}
    L, n_mtp = cfg["num_hidden_layers"], cfg.get("num_nextn_predict_layers") or 0
    h, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    dh = cfg.get("head_dim") or cfg["hidden_size"] // h
    out = {"model.embed_tokens.weight": meg["embedding.word_embeddings.weight"],
           "model.norm.weight": meg["decoder.final_layernorm.weight"]}
    if not cfg.get("tie_word_embeddings"):
        out["lm_head.weight"] = meg["output_layer.weight"]
    head = out["model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"]
    blocks = [(f"decoder.layers.{i}", f"model.layers.{i}") for i in range(L)]
    blocks += [(f"mtp.layers.{j}", f"model.layers.{L + j}") for j in range(n_mtp)]
    for m, hf in blocks:
        out.update({f"{hf}.{hs}": meg[f"{m}.{ms}"] for hs, ms, _ in _BLOCK})
        q, k, v = _qkv_split(meg[f"{m}.self_attention.linear_qkv.weight"], h, hkv, dh)
        out.update({f"{hf}.self_attn.q_proj.weight": q, f"{hf}.self_attn.k_proj.weight": k,
                    f"{hf}.self_attn.v_proj.weight": v})
        gate, up = meg[f"{m}.mlp.linear_fc1.weight"].chunk(2, 0)
        out.update({f"{hf}.mlp.gate_proj.weight": gate, f"{hf}.mlp.up_proj.weight": up})
        if m.startswith("mtp."):
            out.update({f"{hf}.{hs}": meg[f"{m}.{ms}"] for hs, ms, _ in _MTP_ONLY})
            out.update({f"{hf}.embed_tokens.weight": out["model.embed_tokens.weight"],
                        f"{hf}.shared_head.head.weight": head})
    save_file_dedup(out, dst / "model.safetensors")
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    copy_tokenizer(src_dir, dst)
    return dst


def round_trip(src_dir: str | Path, work_dir: str | Path, tp: int = 2, drop_mtp: bool = False) -> Path:
    """HF -> Megatron (tp shards) -> HF; returns the HF folder that came back."""
    work = Path(work_dir)
    meg = to_megatron(src_dir, work / "megatron", tp, drop_mtp)
    return from_megatron(meg, work / "hf")
