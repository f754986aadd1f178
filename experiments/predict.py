"""Predict speculative-decoding speedups: `python -m experiments.predict fit=<run>/fit.json preset=deepseek-v3`."""

import json
from pathlib import Path

import hydra
import pandas as pd

from experiments.entry import fail_fast, plain
from roofline.analysis import costmodel
from roofline.model.config import ConfigError
from roofline.analysis.predict import Drafter, alphas_from_vllm, plot_all, step_costs, table
from roofline.measure.devices import get_spec
from roofline.model.presets import get_preset
from roofline.parallel import whatif
from roofline.parallel.layout import Layout


@hydra.main(config_path="../conf", config_name="predict", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        if c.get("fit") in (None, "", "???") and c.get("device"):  # what-if: datasheet row + priors.yaml
            rows = whatif.speedup_table(get_preset(c["preset"] or "deepseek-v3"), get_spec(c["device"]), c["dtype"],
                                        Layout(tp=c["tp"], ep=c["ep"], dp_attention=c["dp_attention"]),
                                        c["alphas"], c["k"], c["B"], c["L"])
            print(pd.DataFrame(rows).round(3).to_string(index=False))
            return
        if c.get("fit") in (None, "", "???"):
            raise ConfigError("fit is required: a fit.json written by experiments.fit (or device=<datasheet row> "
                              "for a what-if from priors)")
        fit = costmodel.load_fit(c["fit"])
        target = get_preset(c["preset"]) if c["preset"] else costmodel.fitted_model(fit)
        drafter = Drafter(c["drafter"], get_preset(c["draft_model"]) if c["draft_model"] else None,
                          costmodel.load_fit(c["draft_fit"]) if c["draft_fit"] else None)
        alphas = {float(a): float(a) for a in c["alphas"]}
        if c["vllm_metrics"]:
            alphas.update(alphas_from_vllm(Path(c["vllm_metrics"]).read_text()))
        overhead = json.loads(Path(c["overhead"]).read_text()) if c["overhead"] else None
        out = Path(c["out_dir"] or Path(c["fit"]).parent / f"predict-{target.name}-{c['drafter']}")
        out.mkdir(parents=True, exist_ok=True)
        t = table(fit, alphas, c["k"], c["B"], c["L"], c["dtype"], drafter, target, c["mode"], c["overhead_share"],
                  overhead)
        t.to_csv(out / "predict.csv", index=False)
        costs = step_costs(fit, c["dtype"], drafter, target, c["mode"], c["overhead_share"], overhead)
        plot_all(costs, c["B"], c["L"], c["plot_B"], c["plot_L"], out / "figures",
                 f"{target.name} ({costs.source}, {fit['provenance']['device_name']})")
        best = t[t["k"] == t["k_star"]][["alpha", "B", "L", "k_star", "S", "throughput_tok_s", "extrapolated"]]
        print(best.round(3).to_string(index=False))
        print(json.dumps(dict(csv=str(out / "predict.csv"), rows=len(t), source=costs.source,
                              overhead_source=costs.overhead_source)))


if __name__ == "__main__":
    main()
