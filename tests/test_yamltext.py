"""roofline.io.yamltext: the C parser where PyYAML has one, the same data as yaml.safe_load, safe tags only, and a
malformed file still a one-line error where the library reads a user's file."""

from pathlib import Path

import pytest
import yaml

from roofline.io.fields import ConfigError
from roofline.io.yamltext import SAFE_LOADER, load_yaml
from roofline.parallel import anchors

DATA = sorted((Path(__file__).resolve().parents[1] / "roofline" / "data").glob("*.yaml"))


def test_the_c_parser_is_taken_where_pyyaml_was_built_with_it():
    assert SAFE_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    assert issubclass(SAFE_LOADER, yaml.constructor.SafeConstructor)  # safe tags only, C or Python


@pytest.mark.parametrize("path", DATA, ids=lambda p: p.name)
def test_every_data_file_reads_as_safe_load_reads_it(path):
    text = path.read_text()
    assert load_yaml(text) == yaml.safe_load(text)


def test_a_python_object_tag_is_refused():
    with pytest.raises(yaml.YAMLError):
        load_yaml("!!python/object/apply:os.system ['true']")


def test_a_malformed_anchors_file_is_one_line_naming_the_file(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("sources: {s1: [unclosed\nanchors: []\n")
    with pytest.raises(ConfigError, match=r"a\.yaml'?: not YAML \(") as e:
        anchors.load(p)
    assert "\n" not in str(e.value)
