"""Tensor inventory of two checkpoints: did a conversion lose anything?

A format conversion (HF -> training format -> HF) does no arithmetic, so every tensor must
come back with the same name, shape, dtype and bytes. The forward pass does not use the MTP
module (DeepSeek-V3 / GLM-4.5 store it as `model.layers.{num_hidden_layers + i}`), so a
conversion can drop it and still pass parity tests and serve: at half the throughput,
because the speculative drafter is gone. A parity test cannot see that; an inventory can.

The inventory streams: each shard's safetensors header is validated by the safetensors
library, then each tensor's stored bytes are read in fixed-size chunks and hashed (blake2b)
without ever building a tensor, so peak memory is independent of the checkpoint size and
the hash covers the exact bytes on disk (any dtype, bf16 and fp8 included; no value is ever
converted). Only name, shape, dtype, hash, shard and size are kept per tensor.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator

import yaml

from roofline.io import files
from roofline.io.fields import ConfigError, option
from roofline.io.yamltext import load_yaml
from roofline.model.speculation import tau

INDEX_FILE = "model.safetensors.index.json"
CHUNK_BYTES = 16 << 20
MTP_CONFIG_FIELD = "num_nextn_predict_layers"
# DeepSeek-V3 technical report: second-token acceptance 85-90%, about 1.8x tokens/s.
DSV3_ACCEPTANCE = (0.85, 0.90)
DSV3_SPEEDUP = 1.8
CATEGORIES = ("missing", "extra", "reshaped", "retyped", "changed")
LIST_LIMIT = 12  # names shown per category on stdout; inventory.json holds them all
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
_MTP_NAMED = re.compile(r"(^|\.)mtp(_layers)?\.")  # frameworks that name MTP modules `mtp.*`


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str
    hash: str  # blake2b-128 of the stored bytes
    shard: str
    nbytes: int


@dataclass(frozen=True)
class Checkpoint:
    folder: str
    tensors: dict[str, TensorEntry]
    config: dict
    shards: tuple[str, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


@dataclass(frozen=True)
class InventoryRequest:
    before: str = option(help="source checkpoint folder (config.json + *.safetensors, sharded or not)")
    after: str = option(help="converted checkpoint folder")
    rename_map: str | None = option(None, "YAML/JSON file {old name or regex: new name}, applied to the names of "
                                          "`before`")
    strict: bool = option(False, "true: extra tensors in `after` fail too")

    def __post_init__(self) -> None:
        for key in ("before", "after"):
            if getattr(self, key) in (None, ""):
                raise ConfigError(f"{key} is required: a checkpoint folder")


@dataclass(frozen=True)
class Comparison:
    before: Checkpoint
    after: Checkpoint
    identical: tuple[str, ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]
    reshaped: tuple[str, ...]
    retyped: tuple[str, ...]
    changed: tuple[str, ...]
    renamed: dict[str, str]  # new name -> old name, for the tensors the map renamed
    unused_patterns: tuple[str, ...]
    mtp_before: tuple[str, ...]  # MTP tensor names (after renaming) in `before`
    mtp_layer_start: int | None  # num_hidden_layers of `before`
    config_diff: tuple[tuple[str, object, object], ...]
    strict: bool = False
    consequence: str = ""

    @property
    def mtp_lost(self) -> tuple[str, ...]:
        lost = set(self.missing) | set(self.reshaped) | set(self.retyped)
        return tuple(n for n in self.mtp_before if n in lost)

    @property
    def mtp_config_dropped(self) -> bool:
        b, a = _mtp_count(self.before.config), _mtp_count(self.after.config)
        return b > 0 and a < b

    @property
    def ok(self) -> bool:
        lost = self.missing or self.reshaped or self.retyped or self.changed or self.mtp_config_dropped
        return not lost and not (self.strict and self.extra)

    def counts(self) -> dict:
        c = {"identical": len(self.identical), **{k: len(getattr(self, k)) for k in CATEGORIES}}
        return dict(c, mtp_tensors=len(self.mtp_before), mtp_lost=len(self.mtp_lost),
                    mtp_config_dropped=self.mtp_config_dropped, config_diffs=len(self.config_diff), ok=self.ok)


# ---- reading a checkpoint ----------------------------------------------------------------

def _shard_files(folder: Path, field_name: str) -> tuple[list[Path], dict[str, str] | None]:
    if not folder.is_dir():
        raise ConfigError(f"{field_name}={str(folder)!r}: no such folder")
    index = folder / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ConfigError(f"{field_name}: {INDEX_FILE} has no readable weight_map ({e})") from None
        if not isinstance(weight_map, dict):
            raise ConfigError(f"{field_name}: {INDEX_FILE}'s weight_map is a {type(weight_map).__name__}; "
                              "allowed a JSON object of tensor name -> shard file")
        odd = [v for v in weight_map.values() if not isinstance(v, str)][:1]
        if odd:
            raise ConfigError(f"{field_name}: {INDEX_FILE}'s weight_map names shard {odd[0]!r}; allowed file names")
        from roofline.checkpoints.loader import shard_path
        files = [shard_path(folder, s, field_name) for s in sorted(set(weight_map.values()), key=str)]
        for f in files:
            if not f.exists():
                raise ConfigError(f"{field_name}: {INDEX_FILE} names shard {f.name}, which is not in the folder")
        return files, weight_map
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{field_name}={str(folder)!r}: no *.safetensors file and no {INDEX_FILE}")
    return files, None


def _header(path: Path) -> tuple[dict, int]:
    """The safetensors header (name -> dtype, shape, data_offsets) and where the data starts."""
    from safetensors import safe_open  # validates the header the way loaders will read it

    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
    with path.open("rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    if set(header) != names:
        raise ConfigError(f"{path.name}: its header lists other tensors than safetensors reads")
    return header, 8 + n


def _hash_range(fh, start: int, length: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    fh.seek(start)
    left = length
    while left:
        chunk = fh.read(min(CHUNK_BYTES, left))
        if not chunk:
            raise ConfigError(f"{fh.name}: file ends inside a tensor (truncated shard)")
        h.update(chunk)
        left -= len(chunk)
    return h.hexdigest()


def iter_tensors(path: Path) -> Iterator[TensorEntry]:
    """Every tensor of one safetensors file, in file order, one at a time."""
    header, data_start = _header(path)
    with path.open("rb") as fh:
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            begin, end = info["data_offsets"]
            yield TensorEntry(name=name, shape=tuple(info["shape"]), dtype=info["dtype"],
                              hash=_hash_range(fh, data_start + begin, end - begin), shard=path.name,
                              nbytes=end - begin)


def read_checkpoint(folder, field_name: str = "checkpoint") -> Checkpoint:
    folder = Path(folder)
    files, weight_map = _shard_files(folder, field_name)
    tensors: dict[str, TensorEntry] = {}
    for path in files:
        try:
            for t in iter_tensors(path):
                if t.name in tensors:
                    raise ConfigError(f"{field_name}: tensor {t.name} is in both {tensors[t.name].shard} and {t.shard}")
                tensors[t.name] = t
        except ConfigError as e:
            raise ConfigError(str(e) if str(e).startswith(field_name) else f"{field_name}: {e}") from None
        except Exception as e:  # safetensors' own parse errors, a short file, bad JSON in the header
            raise ConfigError(f"{field_name}={str(folder)!r}: {path.name} is not a readable safetensors file "
                              f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    if weight_map is not None:
        for name, shard in weight_map.items():
            if name not in tensors or tensors[name].shard != shard:
                raise ConfigError(f"{field_name}: {INDEX_FILE} puts tensor {name} in {shard}, "
                                  f"but it is {'in ' + tensors[name].shard if name in tensors else 'in no shard'}")
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{field_name}={str(folder)!r}: config.json is not JSON ({e})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{field_name}={str(folder)!r}: config.json is a {type(config).__name__}; allowed a JSON object")
    return Checkpoint(folder=str(folder), tensors=tensors, config=config, shards=tuple(p.name for p in files))


# ---- rename map --------------------------------------------------------------------------

def load_rename_map(path) -> dict[str, str]:
    """{old name or regex: new name}; YAML or JSON (JSON is YAML)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"rename_map={str(path)!r}: no such file")
    try:
        mapping = load_yaml(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"rename_map: {p.name} is neither YAML nor JSON ({e})") from e
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise ConfigError("rename_map: must be a mapping {old name or regex: new name} of strings")
    return mapping


def rename(names, mapping: dict[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """old name -> new name, and the patterns that matched nothing.

    An exact key wins; otherwise the first regex (in file order) that matches the WHOLE name
    is applied, with groups (\\1, \\g<name>) expanded in the new name. Unmatched names stay."""
    patterns = []
    for key in mapping:
        try:
            patterns.append((key, re.compile(key)))
        except re.error as e:
            raise ConfigError(f"rename_map: key {key!r} is not a valid regex ({e})") from e
    used, out = set(), {}
    for name in names:
        new = name
        if name in mapping:
            new = mapping[name]
            used.add(name)
        else:
            for key, rx in patterns:
                m = rx.fullmatch(name)
                if m:
                    new = m.expand(mapping[key])
                    used.add(key)
                    break
        out[name] = new
    seen: dict[str, str] = {}
    for old, new in out.items():
        if new in seen:
            raise ConfigError(f"rename_map: {seen[new]} and {old} both become {new}")
        seen[new] = old
    return out, tuple(k for k in mapping if k not in used)


# ---- comparing ---------------------------------------------------------------------------

def _mtp_count(config: dict) -> int:
    return int(_text_config(config).get(MTP_CONFIG_FIELD) or 0)


def _text_config(config: dict) -> dict:
    return config.get("text_config", config) if "num_hidden_layers" not in config else config


def is_mtp(name: str, num_hidden_layers: int | None) -> bool:
    m = _LAYER.match(name)
    if m and num_hidden_layers is not None:
        return int(m.group(1)) >= num_hidden_layers
    return bool(_MTP_NAMED.search(name))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(before: dict, after: dict) -> tuple[tuple[str, object, object], ...]:
    """(field, before, after) for every field that differs; `<absent>` where one side lacks it."""
    b, a = _flatten(before), _flatten(after)
    absent = "<absent>"
    keys = sorted(set(b) | set(a))
    return tuple((k, b.get(k, absent), a.get(k, absent)) for k in keys if b.get(k, absent) != a.get(k, absent))


def mtp_consequence(c: Comparison) -> str:
    """The throughput consequence, in words, of what happened to the MTP module ("" if nothing)."""
    n_before, n_after = _mtp_count(c.before.config), _mtp_count(c.after.config)
    lo, hi = (tau([a]) for a in DSV3_ACCEPTANCE)
    cost = (f"speculative decoding with this checkpoint falls back to plain decoding (one token per target "
            f"forward instead of tau = 1 + alpha = {lo:.2f}-{hi:.2f}); at DeepSeek-V3's reported second-token "
            f"acceptance ({DSV3_ACCEPTANCE[0]:.0%}-{DSV3_ACCEPTANCE[1]:.0%}) that forfeits the ~{DSV3_SPEEDUP}x "
            f"decode throughput of MTP speculation (SGLang, H200 TP8: 1.8x at batch 1, 1.5x at batch 32).")
    if c.mtp_lost and len(c.mtp_lost) == len(c.mtp_before):
        return f"the MTP drafter is gone ({len(c.mtp_lost)} MTP tensors lost): " + cost
    if c.mtp_lost:
        return (f"the MTP module is incomplete ({len(c.mtp_lost)} of {len(c.mtp_before)} MTP tensors lost) and "
                f"cannot draft: " + cost)
    if c.mtp_config_dropped:
        return (f"the MTP weights are present but {MTP_CONFIG_FIELD} dropped from {n_before} to {n_after}: serving "
                f"engines read that field and will not build the drafter, so " + cost)
    changed = [n for n in c.mtp_before if n in set(c.changed)]
    if changed:
        return (f"{len(changed)} MTP tensors changed content: the drafter still runs, but its acceptance (and with it "
                f"the speculative speedup) is no longer the published one; measure it again.")
    return ""


def compare(before: Checkpoint, after: Checkpoint, mapping: dict[str, str] | None = None,
            strict: bool = False) -> Comparison:
    names, unused = rename(before.tensors, mapping or {})
    b = {new: before.tensors[old] for old, new in names.items()}
    a = after.tensors
    common = [n for n in b if n in a]
    cats = dict(
        missing=[n for n in b if n not in a],
        extra=[n for n in a if n not in b],
        reshaped=[n for n in common if b[n].shape != a[n].shape],
        retyped=[n for n in common if b[n].shape == a[n].shape and b[n].dtype != a[n].dtype],
        changed=[n for n in common if (b[n].shape, b[n].dtype) == (a[n].shape, a[n].dtype) and b[n].hash != a[n].hash],
    )
    identical = [n for n in common if (b[n].shape, b[n].dtype, b[n].hash) == (a[n].shape, a[n].dtype, a[n].hash)]
    n_layers = _text_config(before.config).get("num_hidden_layers")
    c = Comparison(before=before, after=after, identical=tuple(sorted(identical)),
                   **{k: tuple(sorted(v)) for k, v in cats.items()},
                   renamed={new: old for old, new in names.items() if new != old}, unused_patterns=unused,
                   mtp_before=tuple(sorted(n for n in b if is_mtp(n, n_layers))), mtp_layer_start=n_layers,
                   config_diff=config_diff(before.config, after.config), strict=strict)
    return replace(c, consequence=mtp_consequence(c))


def run_inventory(req: InventoryRequest) -> Comparison:
    mapping = load_rename_map(req.rename_map) if req.rename_map else None
    before = read_checkpoint(req.before, "before")
    after = read_checkpoint(req.after, "after")
    return compare(before, after, mapping, req.strict)


# ---- output ------------------------------------------------------------------------------

def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB"


def _describe(c: Comparison, cat: str, name: str) -> str:
    b = c.before.tensors[c.renamed.get(name, name)] if cat != "extra" else None
    a = c.after.tensors.get(name)
    if cat == "missing":
        return f"{name}  {list(b.shape)} {b.dtype}  {b.nbytes:,} B  ({b.shard})"
    if cat == "extra":
        return f"{name}  {list(a.shape)} {a.dtype}  {a.nbytes:,} B  ({a.shard})"
    if cat == "reshaped":
        return f"{name}  {list(b.shape)} -> {list(a.shape)}"
    if cat == "retyped":
        return f"{name}  {b.dtype} -> {a.dtype}"
    return f"{name}  {list(b.shape)} {b.dtype}  hash {b.hash[:12]} -> {a.hash[:12]}"


def format_report(c: Comparison) -> str:
    lines = []
    for side, ck in (("before", c.before), ("after", c.after)):
        lines.append(f"{side:6}: {ck.folder}  {len(ck.tensors)} tensors, {_gb(ck.nbytes)} (1 GB = 1e9 B), "
                     f"{len(ck.shards)} shard(s)")
    nb, na = _mtp_count(c.before.config), _mtp_count(c.after.config)
    start = c.mtp_layer_start
    where = f"model.layers.{{i >= {start}}} (num_hidden_layers={start} of before)" if start is not None else \
        "`mtp.*` names (before has no num_hidden_layers)"
    lines.append(f"MTP: {len(c.mtp_before)} tensors in {where}, {len(c.mtp_lost)} lost; "
                 f"{MTP_CONFIG_FIELD}: {nb} -> {na}" + ("  << DROPPED" if c.mtp_config_dropped else ""))
    if c.consequence:
        lines.append(f"  consequence: {c.consequence}")
    if c.mtp_lost:
        lost_bytes = sum(c.before.tensors[c.renamed.get(n, n)].nbytes for n in c.mtp_lost)
        lines.append(f"  lost MTP tensors ({len(c.mtp_lost)}, {lost_bytes:,} B):")
        lines += [f"    {n}" for n in c.mtp_lost[:LIST_LIMIT]]
        if len(c.mtp_lost) > LIST_LIMIT:
            lines.append(f"    ... and {len(c.mtp_lost) - LIST_LIMIT} more (inventory.json)")
    counts = c.counts()
    lines.append("counts: " + ", ".join(f"{k} {counts[k]}" for k in ("identical", *CATEGORIES)))
    if c.renamed or c.unused_patterns:
        lines.append(f"rename map: {len(c.renamed)} tensors renamed; patterns that matched nothing: "
                     f"{list(c.unused_patterns) or 'none'}")
    for cat in CATEGORIES:
        names = getattr(c, cat)
        if names:
            lines.append(f"{cat} ({len(names)}):")
            lines += [f"  {_describe(c, cat, n)}" for n in names[:LIST_LIMIT]]
            if len(names) > LIST_LIMIT:
                lines.append(f"  ... and {len(names) - LIST_LIMIT} more (inventory.json)")
    if c.config_diff:
        lines.append(f"config.json differences ({len(c.config_diff)}):")
        lines += [f"  {k}: {b!r} -> {a!r}" for k, b, a in c.config_diff[:LIST_LIMIT]]
    if c.ok:
        lines.append("verdict: OK" + (f" ({len(c.extra)} extra tensors; strict=false)" if c.extra else ""))
    else:
        why = [f"{len(getattr(c, k))} {k}" for k in CATEGORIES if getattr(c, k) and (k != "extra" or c.strict)]
        if c.mtp_config_dropped:
            why.append(f"{MTP_CONFIG_FIELD} dropped {nb} -> {na}")
        lines.append("verdict: LOSS (" + ", ".join(why) + ")")
    return "\n".join(lines)


def to_json(c: Comparison) -> dict:
    def side(ck: Checkpoint) -> dict:
        return dict(folder=ck.folder, shards=list(ck.shards), nbytes=ck.nbytes, config=ck.config,
                    tensors=[asdict(t) for t in ck.tensors.values()])

    return dict(counts=c.counts(), consequence=c.consequence, mtp_tensors=list(c.mtp_before),
                mtp_lost=list(c.mtp_lost), mtp_layer_start=c.mtp_layer_start,
                **{k: list(getattr(c, k)) for k in CATEGORIES},
                renamed=c.renamed, unused_patterns=list(c.unused_patterns),
                config_diff=[dict(field=k, before=b, after=a) for k, b, a in c.config_diff],
                before=side(c.before), after=side(c.after))


def write_outputs(c: Comparison, out_dir) -> Path:
    """inventory.txt (the report) and inventory.json (every tensor of both sides) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "inventory.txt").write_text(format_report(c) + "\n")
    return files.write_json_atomic(out / "inventory.json", to_json(c))
