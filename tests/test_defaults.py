"""One home per default: every key of a command is a dataclass field declared with its default and
its help (roofline.io.fields.option), the command's structured config is built from those fields,
and its YAML file holds only the config groups and the values that differ. A default changed in
the library is then what the command composes, and a YAML value cannot drift from it unseen.

The commands are found twice, independently: from the YAML files of roofline/conf/ and from the
modules of roofline/commands/; both lists must agree."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import pytest
import yaml
from omegaconf import OmegaConf

import roofline.commands
from roofline.cli import schema
from roofline.cli.entry import CONF_DIR, compose_config, yaml_values
from roofline.io.fields import HELP, INTERNAL, option

COMMANDS = sorted(p.stem for p in CONF_DIR.glob("*.yaml"))
GROUPS = {p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra"}


def test_the_commands_of_conf_are_the_modules_of_commands():
    modules = {m.name for m in pkgutil.iter_modules(roofline.commands.__path__)}
    assert COMMANDS and set(COMMANDS) == modules


def _raw(name: str) -> dict:
    return yaml.safe_load((CONF_DIR / f"{name}.yaml").read_text()) or {}


@pytest.mark.parametrize("name", COMMANDS)
def test_the_schema_comes_first_in_the_defaults_list(name):
    assert _raw(name)["defaults"][0] == schema.schema_name(name)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_field_of_the_config_classes_is_a_key_with_help_or_internal(name):
    module = importlib.import_module(f"roofline.commands.{name}")
    for cls in module.CONFIG:
        for f in dataclasses.fields(cls):
            assert (f.metadata.get(HELP) or f.metadata.get(INTERNAL)), f"{cls.__name__}.{f.name}"
    assert schema.keys(name)  # builds: no key without help, no key declared twice with two defaults


def _differences(yaml_part: dict, keys: dict[str, schema.Key], where: str = "") -> list[str]:
    """YAML values that repeat the schema's default (a second home), or name no key."""
    out = []
    for k, v in yaml_part.items():
        if k not in keys:
            out.append(f"{where}{k}: not a key of the schema")
        elif isinstance(keys[k].default, dict):
            out += _differences(v or {}, keys[k].default, f"{where}{k}.")
        elif v == keys[k].default and not isinstance(v, bool) or v is keys[k].default:
            out.append(f"{where}{k}: {v!r} repeats the default of {keys[k].home}")
    return out


@pytest.mark.parametrize("name", COMMANDS)
def test_no_yaml_file_repeats_a_default(name):
    values = {k: v for k, v in _raw(name).items() if k != "defaults"}
    assert not _differences(values, schema.keys(name))


def _overlay(defaults: dict, values: dict) -> dict:
    out = dict(defaults)
    for k, v in values.items():
        out[k] = _overlay(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize("name", COMMANDS)
def test_the_composed_config_is_the_schema_with_the_yaml_values(name):
    composed = OmegaConf.to_container(compose_config(name))  # interpolations as written
    values = {k: v for k, v in yaml_values(name).items() if k not in GROUPS}
    expected = _overlay(schema.defaults(name), values)
    groups = {k for k in composed if k in GROUPS}
    assert {k: v for k, v in composed.items() if k not in groups} == \
           {k: v for k, v in expected.items() if k not in groups}
    assert set(composed) == set(schema.keys(name))


def test_a_default_changed_in_the_library_is_what_the_command_composes():
    @dataclasses.dataclass(frozen=True)
    class Mine:
        required: str = option(help="no default")
        alpha: float = option(0.25, "a rate")
        grid: tuple[int, ...] = option((1, 2), "a grid")
    node = schema._dataclass("mine_schema", schema._keys_of([Mine]))
    cfg = OmegaConf.structured(node)
    assert cfg.alpha == 0.25 and list(cfg.grid) == [1, 2] and OmegaConf.is_missing(cfg, "required")
    with pytest.raises(Exception, match="typo"):
        OmegaConf.merge(cfg, {"typo": 1})


def test_a_key_without_help_or_with_two_defaults_is_refused():
    @dataclasses.dataclass(frozen=True)
    class NoHelp:
        x: int = 1

    @dataclasses.dataclass(frozen=True)
    class A:
        tp: int = option(1, "ranks")

    @dataclasses.dataclass(frozen=True)
    class B:
        tp: int = option(2, "ranks")
    with pytest.raises(TypeError, match="NoHelp.x: a config key without help"):
        schema._keys_of([NoHelp])
    with pytest.raises(TypeError, match="declared again with another default"):
        schema._keys_of([A, B])
    with pytest.raises(TypeError, match="help"):
        option(1)


def test_the_check_sees_a_repeated_default():
    keys = schema._keys_of([dataclasses.make_dataclass("K", [("a", int, option(1, "a")),
                                                             ("b", bool, option(False, "b"))])])
    assert _differences({"a": 1, "b": False}, keys) and _differences({"c": 0}, keys)
    assert not _differences({"a": 2, "b": True}, keys)


def test_a_timer_group_entry_overlays_the_commands_own_timer_default():
    # specdec's calibration sweep takes fewer reps than a sweep (its request's timer default);
    # `timer=quick` must then give quick.yaml's values: the YAML used to restate max_reps/budget_s
    # after the group (`_self_` last), so `specdec timer=quick` ran with max_reps 30, budget 0.5 s
    quick = yaml.safe_load((CONF_DIR / "timer" / "quick.yaml").read_text())
    for name in ("specdec", "sweep"):
        own = schema.defaults(name)["timer"]
        assert OmegaConf.to_container(compose_config(name).timer) == own
        composed = OmegaConf.to_container(compose_config(name, ["timer=quick"]).timer)
        assert composed == {**own, **{k: v for k, v in quick.items() if k != "defaults"}}
    assert schema.defaults("specdec")["timer"]["max_reps"] < schema.defaults("sweep")["timer"]["max_reps"]
