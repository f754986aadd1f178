"""What the what-if asks for on every pass is computed once: a format or precision label parsed once (the same frozen
object back), a config's layer kinds counted once per length, and neither cache changes an answer or an error."""

import dataclasses

import pytest

from roofline.io.fields import ConfigError
from roofline.model.formats import parse_format, parse_precision
from roofline.model.presets import get_preset


def test_a_format_or_precision_given_as_text_is_parsed_once_into_a_frozen_object():
    assert parse_format("int4_g128") is parse_format("int4_g128")
    p = parse_precision("bfloat16+weights=fp8_b128")
    assert p is parse_precision("bfloat16+weights=fp8_b128") and p.weights.name == "fp8_e4m3_b128"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.weights.bits = 4


@pytest.mark.parametrize("name", ["fp9", ["int4_g128"]])
def test_a_bad_format_is_still_one_line_naming_it_cached_or_not(name):
    for _ in range(2):  # an error is not cached: the second call says it again
        with pytest.raises(ConfigError, match="weights=.*unknown format"):
            parse_format(name)


def test_layer_kinds_are_counted_once_and_a_caller_cannot_change_them():
    cfg = get_preset("deepseek-v3")
    kinds = cfg.layer_kinds()
    assert kinds == {(False, False): 3, (True, False): 58} and cfg.layer_kinds(10) == {(False, False): 3,
                                                                                        (True, False): 7}
    kinds[(True, False)] = 0
    assert cfg.layer_kinds()[(True, False)] == 58
    dense = dataclasses.replace(cfg, first_dense_layers=0)  # a replaced config counts its own
    assert dense.layer_kinds() == {(True, False): 61} and not dense.has_dense_layers and cfg.has_dense_layers
    assert dense != cfg and dataclasses.replace(dense, first_dense_layers=3) == cfg  # the memo is not a field
