"""YAML text to Python data, through libyaml's C parser where PyYAML was built with it (its wheels are).

The data files are large (roofline/data/deployments.yaml is over half a megabyte): PyYAML's pure-Python safe
loader takes about 1.7 s for it, the C one about 0.2 s, with the same result (safe tags only, either way)."""

from __future__ import annotations

import yaml

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str):
    """yaml.safe_load(text), through the C parser where there is one."""
    return yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader, C or Python
