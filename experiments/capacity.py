"""Capacity plan: `python -m experiments.capacity preset=llama-3.1-8b device=h200_sxm` (datasheet what-if)
or `fit=<run>/fit.json memory_gb=64` (measured device parameters)."""

import json
from pathlib import Path

import hydra
import pandas as pd

from experiments.entry import fail_fast, plain
from roofline.analysis import capacity
from roofline.analysis import costmodel
from roofline.model.config import ConfigError
from roofline.analysis.predict import Drafter
from roofline.model.presets import get_preset
from roofline.measure.devices import detect, get_spec
from roofline.parallel import whatif


@hydra.main(config_path="../conf", config_name="capacity", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        model = get_preset(c["preset"])
        if c["layouts"]:  # how many devices, which layout: datasheet row + sourced priors (an interval)
            rows = pd.DataFrame(whatif.capacity(
                model, get_spec(c["device"]), c["dtype"], c["context"], c["output"], c["itl_target_ms"],
                c["target_tok_s"], c["price_per_device_hour"], c["alpha"] if c["speculative"] else None, c["k"]))
            print(rows.round(3).to_string(index=False) if not rows.empty else "no layout meets the ITL target")
            return
        if c["fit"]:
            fit, extrapolated = costmodel.load_fit(c["fit"]), False
            sheet = detect(fit["provenance"]["device_name"])
        else:
            sheet = get_spec(c["device"])
            fit = capacity.datasheet_fit(sheet, model, c["dtype"], c["bw_efficiency"], c["flops_efficiency"],
                                         c["t0_ms"] / 1e3)
            extrapolated = True
        mem = c["memory_gb"] * 1e9 if c["memory_gb"] else (sheet.mem_bytes if sheet is not None else None)
        if not mem:
            raise ConfigError("memory_gb is required: the device has no datasheet memory size (a CPU)")
        spec = None
        if c["speculative"]:
            spec = capacity.Speculation(c["alpha"], c["k"], Drafter(
                c["drafter"], get_preset(c["draft_model"]) if c["draft_model"] else None))
        work = capacity.Workload(c["context"], c["output"], c["itl_target_ms"], c["target_tok_s"])
        table, summary = capacity.plan(fit, model, c["dtype"], work, mem, c["B"], spec, extrapolated)
        out = Path(c["out_dir"]) / f"{model.name}-{summary['device'].replace(' ', '_')}-{c['dtype']}"
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "capacity.csv", index=False)
        (out / "capacity.json").write_text(json.dumps(summary, indent=1, default=str))
        capacity.plot(table, summary, out / "throughput_vs_latency.png")
        print(table.round(3).to_string(index=False))
        print(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
