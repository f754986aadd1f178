"""Measure collectives: `python -m experiments.collectives world=2` (gloo on the CPU, NCCL with device=cuda).

Under torchrun or srun every rank runs this same command; rank 0 writes the results.
"""

import json
from pathlib import Path

import hydra

from experiments.entry import fail_fast, plain
from roofline.io.results import RUNS_ROOT
from roofline.parallel.collectives import CollectiveSpec, link_reference, run_collectives, table


@hydra.main(config_path="../conf", config_name="collectives", version_base="1.3")
def main(cfg) -> None:
    with fail_fast():
        c = plain(cfg)
        spec = CollectiveSpec(kinds=tuple(c["kinds"]), min_bytes=c["min_bytes"], max_bytes=c["max_bytes"],
                              factor=c["factor"], dtype=c["dtype"], reps=c["reps"], device=c["device"], world=c["world"])
        out = Path(c["out_dir"]) if c["out_dir"] else RUNS_ROOT / f"collectives-{spec.device}-{spec.world}"
        doc = run_collectives(spec, out)
        if doc:
            print(table(doc["rows"]))
            for kind, f in doc["fit"].items():
                print(f"{kind:>15}: latency {f['latency_us']:.1f} us + S / {f['algbw_GBps']:.2f} GB/s "
                      f"(busbw {f['busbw_GBps']:.2f} GB/s, factor {f['bus_factor']:.2f}, n={f['ranks']}; "
                      f"median |fit error| {f['median_abs_err_pct']:.1f}%)")
            print("beside:", link_reference(doc["device_name"]))
            print(json.dumps(dict(out_dir=str(out), fit=doc["fit"])))


if __name__ == "__main__":
    main()
