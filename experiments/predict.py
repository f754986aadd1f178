"""Predict speculative-decoding speedups: `python -m experiments.predict fit=<run>/fit.json model=deepseek-v3`."""

import json

import hydra

from experiments.entry import fail_fast, plain
from roofline.analysis.predict import PredictRequest, run
from roofline.io.fields import from_dict
from roofline.model.config import ModelConfig
from roofline.model.presets import get_preset


@hydra.main(config_path="../conf", config_name="predict", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        c.pop("overrides")
        model = ModelConfig.from_dict(c.pop("model")) if c.get("model") else None
        draft = get_preset(c.pop("draft_model")) if c.get("draft_model") else None
        best, summary = run(from_dict(PredictRequest, c, "predict", lists_to_tuples=True, model=model,
                                      draft_model=draft))
        print(best.round(3).to_string(index=False))
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
