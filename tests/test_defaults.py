"""One home per default: a key that a roofline/conf/*.yaml file and the library dataclass it feeds both
default must default to the same value (a drift would make `python -m roofline.cli.X` and a
library call of the same request measure different things)."""

import dataclasses

import pytest
import yaml

from roofline.analysis.capacity import CapacityRequest
from roofline.analysis.costmodel import FitSettings
from roofline.checkpoints.inventory import InventoryRequest
from roofline.commands.card import CardRequest
from roofline.commands.predict import PredictRequest
from roofline.measure.ceilings import CeilingsRequest
from roofline.measure.noise import NoiseSettings
from roofline.measure.timer import TimerSettings
from roofline.model.presets import REPO_ROOT
from roofline.parallel.collectives import CollectiveRequest
from roofline.spec.real_acceptance import AcceptanceRequest
from roofline.spec.validation import SpecValidationRequest
from roofline.train.trainer import TrainRequest

# (config file, key inside it or None for the top level, the dataclass it is turned into)
PAIRS = [("timer/default.yaml", None, TimerSettings), ("predict.yaml", None, PredictRequest),
         ("capacity.yaml", None, CapacityRequest), ("fit.yaml", None, FitSettings),
         ("inventory.yaml", None, InventoryRequest), ("card.yaml", None, CardRequest),
         ("ceilings.yaml", None, CeilingsRequest), ("collectives.yaml", None, CollectiveRequest),
         ("acceptance.yaml", None, AcceptanceRequest), ("specdec.yaml", None, SpecValidationRequest),
         ("train.yaml", None, TrainRequest), ("sweep.yaml", "noise", NoiseSettings)]


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _same(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return a == b or (a in (None, "") and b in (None, ""))  # "" and null both mean: not given


def shared_defaults(conf: str, key, cls) -> list[tuple[str, object, object]]:
    """(field, the config file's value, the dataclass's default) for every plain value both give."""
    values = yaml.safe_load((REPO_ROOT / "roofline" / "conf" / conf).read_text())
    values = values[key] if key else values
    out = []
    for f in dataclasses.fields(cls):
        if f.name not in values or values[f.name] == "???":
            continue
        mine, lib = values[f.name], _default(f)
        if lib is dataclasses.MISSING or isinstance(mine, dict) or dataclasses.is_dataclass(lib) \
                or (isinstance(mine, str) and "${" in mine):
            continue
        out.append((f.name, mine, lib))
    return out


@pytest.mark.parametrize("conf, key, cls", PAIRS, ids=[p[0] + (f":{p[1]}" if p[1] else "") for p in PAIRS])
def test_a_config_file_and_its_dataclass_default_alike(conf, key, cls):
    pairs = shared_defaults(conf, key, cls)
    assert pairs, f"roofline/conf/{conf} and {cls.__name__} share no default: the pair is wrong"
    drift = [(name, mine, lib) for name, mine, lib in pairs if not _same(mine, lib)]
    assert not drift, f"roofline/conf/{conf} vs {cls.__name__} (field, yaml, dataclass): {drift}"


def test_the_check_sees_a_drift():
    assert not _same([128, 1024, 3072], (128, 1024, 4096)) and not _same(0.6, 2.0) and not _same(True, 1)
    assert _same([1, 2], (1, 2)) and _same(None, "") and _same(2, 2.0)
