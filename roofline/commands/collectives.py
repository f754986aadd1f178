"""time collectives (all-reduce, all-gather, ...) as nccl-tests reports them

`python -m experiments.collectives world=2` (gloo on the CPU, NCCL with device=cuda). Under
torchrun or srun every rank runs this same command; rank 0 writes the results and prints."""

import json
from pathlib import Path

from roofline.io.results import RUNS_ROOT
from roofline.parallel.collectives import CollectiveSpec, run_collectives, summary_text


def run(c: dict) -> None:
    spec = CollectiveSpec(kinds=tuple(c["kinds"]), min_bytes=c["min_bytes"], max_bytes=c["max_bytes"],
                          factor=c["factor"], dtype=c["dtype"], reps=c["reps"], device=c["device"], world=c["world"],
                          flush_bytes=c["flush_bytes"])
    out = Path(c["out_dir"]) if c["out_dir"] else spec.default_out_dir(RUNS_ROOT)
    doc = run_collectives(spec, out)
    if doc:  # rank 0 (the others of a torchrun / srun launch return nothing)
        print(summary_text(doc))
        print(json.dumps(dict(out_dir=str(out), fit=doc["fit"])))
