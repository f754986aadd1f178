"""Hydra search-path plugin: the preset folders of $ROOFLINE_PRESETS join the `model` group.

ROOFLINE_PRESETS names folders of preset YAML files (os.pathsep-separated), the ones the
library's registry (roofline.model.presets) reads. Hydra needs a `model/` folder in a search
path entry, so the files are linked into one staging folder per set of preset folders.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


def staged_presets(folders: list[Path]) -> Path:
    key = hashlib.sha256(os.pathsep.join(map(str, folders)).encode()).hexdigest()[:12]
    stage = Path(tempfile.gettempdir()) / f"roofline-presets-{os.getuid()}-{key}"
    (stage / "model").mkdir(parents=True, exist_ok=True)
    for folder in folders:
        for f in sorted(folder.glob("*.yaml")):
            link = stage / "model" / f.name
            if link.is_symlink() and link.resolve() != f.resolve():
                link.unlink()
            if not link.exists():
                link.symlink_to(f.resolve())
    return stage


class RooflinePresets(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        folders = [Path(p) for p in os.environ.get("ROOFLINE_PRESETS", "").split(os.pathsep) if p]
        if folders:
            search_path.append("roofline-presets", f"file://{staged_presets(folders)}")
