"""Strict construction of frozen dataclasses from plain dicts (a composed config, a YAML row).

A misspelt key must fail loudly, naming the field and the allowed ones, instead of being
dropped or surfacing as a TypeError deep inside a constructor. Every `from_dict` of the
library goes through `check_fields` / `from_dict` here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """Bad input: names the field and the allowed values."""


# ---- config keys: a dataclass field is the one home of a key's default and its help ----------

HELP, INTERNAL = "help", "internal"


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = None) -> Any:
    """A command's config key declared as a dataclass field: its default (`factory` for a list or
    a nested settings dataclass) and its line of `--help`. The field is the key's one home: the
    command's structured config (roofline/cli/schema.py) is built from it, and its YAML file
    holds only values that differ. No default: a required key (`???` until it is given)."""
    if not help:
        raise TypeError("option(): every config key has a help text")
    return _field(default, factory, {HELP: help})


def internal(default: Any = dataclasses.MISSING, why: str = "", *, factory: Any = None) -> Any:
    """A field that is not a config key: the command fills it (from other keys, a file, the
    device); `why` says from what."""
    if not why:
        raise TypeError("internal(): say what fills the field")
    return _field(default, factory, {INTERNAL: why})


def _field(default: Any, factory: Any, meta: dict) -> Any:
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def config_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of `cls` that are config keys (declared with option(), not internal())."""
    return [f for f in dataclasses.fields(cls) if INTERNAL not in f.metadata]


def default_of(f: dataclasses.Field) -> Any:
    """A field's default (its factory called), or dataclasses.MISSING for a required one."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def check_fields(cls: type, raw: Mapping[str, Any], where: str, error: type[Exception] = ConfigError) -> None:
    """Raise `error` naming the unknown keys of `raw` and the fields `cls` allows."""
    known = field_names(cls)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise error(f"{where}: unknown field(s) {unknown}; allowed {sorted(known)}")


def from_dict(cls: type[T], raw: Mapping[str, Any], where: str, *, drop_none: bool = False,
              lists_to_tuples: bool = False, error: type[Exception] = ConfigError, **replace: Any) -> T:
    """`cls(**raw)` after checking every key is a field of `cls`.

    drop_none: None values mean "the field's default" (they are left out);
    lists_to_tuples: YAML/JSON lists become tuples (frozen dataclasses hold tuples);
    replace: values that override raw's after the check (already-converted fields).
    """
    check_fields(cls, raw, where, error)
    kw = {k: v for k, v in raw.items() if not (drop_none and v is None)}
    if lists_to_tuples:
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in kw.items()}
    kw.update(replace)
    return cls(**kw)


def check_int(name: str, v: Any, lo: int, hi: int | None = None, allowed: str | None = None) -> None:
    """`name`=v must be an integer (a bool is not one) in [lo, hi]; ConfigError naming it and
    what is allowed (`allowed`, or the range) otherwise."""
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        span = f"integers >= {lo}" if hi is None else f"integers in [{lo}, {hi}]"
        raise ConfigError(f"{name}={v!r}: allowed {allowed or span}")


def check_number(name: str, v: Any, lo: float, hi: float | None = None, lo_open: bool = False) -> None:
    """`name`=v must be a finite real number (not a bool) in [lo, hi] ((lo, hi] with lo_open)."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
    if ok:
        ok = (v > lo if lo_open else v >= lo) and (hi is None or v <= hi)
    if not ok:
        span = ("(" if lo_open else "[") + f"{lo}, " + (f"{hi}]" if hi is not None else "inf)")
        raise ConfigError(f"{name}={v!r}: allowed numbers in {span}")


def check_grid(name: str, value: Any, lo: float, hi: float | None = None, integer: bool = True) -> tuple:
    """A grid axis (a list, or one value) that is not empty and whose every value is an integer
    (integer=True; a bool is not one) or a finite number in [lo, hi]; ConfigError naming it otherwise."""
    vals = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not vals:
        raise ConfigError(f"{name}=[]: the grid has no points; give at least one value")
    kind = "integers" if integer else "numbers"
    for v in vals:
        ok = isinstance(v, int) if integer else (isinstance(v, (int, float)) and v == v and abs(v) != float("inf"))
        if isinstance(v, bool) or not ok or v < lo or (hi is not None and v > hi):
            raise ConfigError(f"{name}={list(vals)}: allowed {kind} in [{lo:g}, {'inf' if hi is None else f'{hi:g}'}]")
    return vals
