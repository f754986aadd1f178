"""Each command's structured config, built from the dataclass fields that are the one home of its
keys' defaults and help (roofline.io.fields.option), and stored in Hydra's ConfigStore.

`roofline.commands.<name>.CONFIG` lists the dataclasses whose config fields are the command's
keys, in the order `--help` and `--cfg job` show them; a field whose default is a settings
dataclass (the sweep's `timer`, `noise`) is a nested node built the same way. The structured
config is `<name>_schema`; roofline/conf/<name>.yaml puts it first in its defaults list and holds
only its config groups and the values that differ from it. The schema is closed: a key it does
not have is refused while Hydra composes, naming the key. Every value is typed `Any`: the
library's own checks name the field and the allowed values.
"""

from __future__ import annotations

import dataclasses
import importlib
from functools import cache
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from roofline.io.fields import HELP, config_fields, default_of


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key: its default (a nested {name: Key} for a settings dataclass), its help."""

    name: str
    default: Any
    help: str
    home: str  # the dataclass that declares it (module.Class)


def _plain(value: Any, where: str) -> Any:
    """A default as a config holds it: tuples as lists, nothing OmegaConf cannot carry."""
    if isinstance(value, (tuple, list)):
        return [_plain(v, where) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{where}: a default of type {type(value).__name__} cannot be a config value")


def _keys_of(classes, instance=None) -> dict[str, Key]:
    keys: dict[str, Key] = {}
    for cls in classes:
        for f in config_fields(cls):
            where = f"{cls.__module__}.{cls.__qualname__}.{f.name}"
            if HELP not in f.metadata:
                raise TypeError(f"{where}: a config key without help (declare it with option(), "
                                "or internal() if the command fills it)")
            default = default_of(f) if instance is None else getattr(instance, f.name)
            if dataclasses.is_dataclass(default):
                default = _keys_of([type(default)], default)
            elif default is not dataclasses.MISSING:
                default = _plain(default, where)
            key = Key(f.name, default, f.metadata[HELP], f"{cls.__module__}.{cls.__qualname__}")
            if f.name in keys and keys[f.name].default != key.default:
                raise TypeError(f"{where}: key {f.name!r} declared again with another default "
                                f"({key.default!r}; {keys[f.name].home} says {keys[f.name].default!r})")
            keys.setdefault(f.name, key)
    return keys


@cache
def keys(name: str) -> dict[str, Key]:
    """{key: Key} of the command `name`, from roofline.commands.<name>.CONFIG."""
    module = importlib.import_module(f"roofline.commands.{name}")
    return _keys_of(module.CONFIG)


def _dataclass(title: str, ks: dict[str, Key]) -> type:
    fields = []
    for k in ks.values():
        if isinstance(k.default, dict):
            node = _dataclass(f"{title}_{k.name}", k.default)
            fields.append((k.name, node, dataclasses.field(default_factory=node)))
        elif isinstance(k.default, list):
            fields.append((k.name, Any, dataclasses.field(default_factory=lambda v=k.default: list(v))))
        else:
            fields.append((k.name, Any, dataclasses.field(default=MISSING if k.default is dataclasses.MISSING
                                                          else k.default)))
    return dataclasses.make_dataclass(title, fields)


def schema_name(name: str) -> str:
    return f"{name}_schema"


@cache
def register(name: str) -> str:
    """Store the structured config of the command `name` in Hydra's ConfigStore; its name."""
    ConfigStore.instance().store(name=schema_name(name), node=_dataclass(schema_name(name), keys(name)))
    return schema_name(name)


def defaults(name: str) -> dict:
    """The schema's defaults as a plain nested dict (a required key: `???`)."""
    def plain(ks):
        return {k.name: plain(k.default) if isinstance(k.default, dict)
                else (MISSING if k.default is dataclasses.MISSING else k.default) for k in ks.values()}
    return plain(keys(name))


def help_lines(name: str, values: dict | None = None) -> list[str]:
    """`key: value  # help` for every key (nested ones indented); `values`: what the command's
    YAML file composes over the schema (shown instead of the schema's default)."""
    def show(v):
        if isinstance(v, list):
            return "[" + ", ".join(show(x) for x in v) + "]"
        return "null" if v is None else "true" if v is True else "false" if v is False else "''" if v == "" else str(v)

    lines = []

    def walk(ks, vals, indent):
        for k in ks.values():
            val = vals.get(k.name, k.default)
            if isinstance(k.default, dict):
                lines.append(f"{indent}{k.name}:  # {k.help}")
                walk(k.default, val if isinstance(val, dict) and val is not k.default else {}, indent + "  ")
            else:
                text = "???" if val is dataclasses.MISSING or val == MISSING else show(val)
                lines.append(f"{indent}{k.name}: {text}  # {k.help}")
    walk(keys(name), values or {}, "")
    return lines
