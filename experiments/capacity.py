"""Capacity plan: `python -m experiments.capacity model=llama-3.1-8b device=h200_sxm` (datasheet what-if)
or `fit=<run>/fit.json memory_gb=64` (measured device parameters); `layouts=true` plans devices and
layouts (tp / ep / dp-attention / pp) from the datasheet row + roofline/data/priors.yaml."""

import json

import pandas as pd

from experiments.entry import command, fail_fast, plain
from roofline.analysis.capacity import CapacityRequest, Speculation, Workload, run
from roofline.analysis.predict import DraftCost
from roofline.io.fields import from_dict
from roofline.measure.devices import get_spec
from roofline.model.config import ModelConfig
from roofline.model.formats import with_overrides
from roofline.model.presets import get_preset
from roofline.parallel import whatif


@command("capacity")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg, device_as="datasheet")
        c.pop("overrides")
        if c.pop("layouts"):  # how many devices, which layout: an interval from the priors
            price = c.pop("price_per_device_hour")
            rows = pd.DataFrame(whatif.capacity(
                ModelConfig.from_dict(c["model"]), get_spec(c["device"]), c["dtype"], c["context"], c["output"],
                c["itl_target_ms"], c["target_tok_s"], price, c["alpha"] if c["speculative"] else None, c["k"]))
            print(rows.round(3).to_string(index=False) if not rows.empty else "no layout meets the ITL target")
            return
        c.pop("price_per_device_hour")
        work = Workload(*(c.pop(f) for f in ("context", "output", "itl_target_ms", "target_tok_s")))
        alpha, k, drafter, draft = (c.pop(f) for f in ("alpha", "k", "drafter", "draft_model"))
        spec = Speculation(alpha, k, DraftCost(drafter, get_preset(draft) if draft else None)) \
            if c.pop("speculative") else None
        model = ModelConfig.from_dict(c["model"])
        c["dtype"] = with_overrides([c["dtype"]], c.pop("weights"), c.pop("kv"), c.pop("lm_head"), model.native_weights)[0]
        req = from_dict(CapacityRequest, c, "capacity", lists_to_tuples=True,
                        model=ModelConfig.from_dict(c["model"]), work=work, speculation=spec)
        table, summary, _ = run(req)
        print(table.round(3).to_string(index=False))
        print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
