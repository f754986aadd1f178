"""train the small MTP model, its tokenizer and draft model on the CPU

`python -m roofline.cli.train [target_steps=300 control=true out_dir=DIR]` (roofline/conf/train.yaml): the
composed config as a plain dict in, the JSON summary out."""

from __future__ import annotations

from collections.abc import Mapping

from roofline.io import files
from roofline.io.fields import from_dict
from roofline.train.trainer import ModelShape, TrainRequest, run_training

# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (TrainRequest,)


def train(c: Mapping) -> dict:
    raw = {k: v for k, v in c.items() if k != "overrides"}
    shapes = {k: from_dict(ModelShape, raw.pop(k), k) for k in ("target", "draft")}
    summary = run_training(from_dict(TrainRequest, raw, "train", **shapes))
    return dict(out_dir=str(c["out_dir"]), overrides=c.get("overrides", []), **summary)


def run(c: dict) -> None:
    print(files.json_text(train(c)))
