"""Predict speculative-decoding speedups: `python -m experiments.predict fit=<run>/fit.json model=deepseek-v3`,
or without a fit for a device never measured: `python -m experiments.predict model=deepseek-v3 device=h200_sxm tp=8`
(datasheet row + roofline/data/priors.yaml, an interval)."""

import json

import hydra
import pandas as pd

from experiments.entry import fail_fast, plain
from roofline.analysis.predict import PredictRequest, run
from roofline.io.fields import ConfigError, from_dict
from roofline.measure.devices import get_spec
from roofline.model.config import ModelConfig
from roofline.model.formats import with_overrides
from roofline.model.presets import get_preset
from roofline.parallel import whatif
from roofline.parallel.layout import Layout


@hydra.main(config_path="../conf", config_name="predict", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        c.pop("overrides")
        device, layout = c.pop("device"), Layout(tp=c.pop("tp"), ep=c.pop("ep"), dp_attention=c.pop("dp_attention"))
        model = ModelConfig.from_dict(c.pop("model")) if c.get("model") else None
        if c.get("fit") in (None, "", "???") and device:  # what-if: datasheet row + priors.yaml
            if model is None:
                raise ConfigError("model is required for a what-if (device=... without fit=...)")
            rows = whatif.speedup_table(model, get_spec(device), c["dtype"], layout, c["alphas"], c["k"], c["B"], c["L"])
            print(pd.DataFrame(rows).round(3).to_string(index=False))
            return
        draft = get_preset(c.pop("draft_model")) if c.get("draft_model") else None
        native = model.native_weights if model else ""  # weights=native needs the target: model=
        c["dtype"] = with_overrides([c["dtype"]], c.pop("weights"), c.pop("kv"), c.pop("lm_head"), native)[0]
        best, summary = run(from_dict(PredictRequest, c, "predict", lists_to_tuples=True, model=model,
                                      draft_model=draft))
        print(best.round(3).to_string(index=False))
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
