"""time collectives (all-reduce, all-gather, ...) as nccl-tests reports them

`python -m roofline.cli.collectives world=2` (gloo on the CPU, NCCL with device=cuda). Under
torchrun or srun every rank runs this same command; rank 0 writes the results and prints."""

from dataclasses import dataclass
from pathlib import Path

from roofline.io import files
from roofline.io.fields import option
from roofline.io.results import RUNS_ROOT
from roofline.measure.devices import detect
from roofline.parallel.collectives import CollectiveRequest, run_collectives, table
from roofline.parallel.whatif import load_priors


# what the `device` entry (roofline/conf/device/) means to this command: the torch device to run on
DEVICE_AS = "torch"


@dataclass(frozen=True)
class CollectivesKeys:
    """The keys that are not fields of the request: the device the ranks run on, where the results go."""

    device: dict | None = option(None, "roofline/conf/device/: cpu (gloo, 1 thread per rank) | cuda or a GPU row "
                                       "(NCCL, one GPU per rank)")
    out_dir: str | None = option(None, "default: results/runs/collectives-<device>-<world>")


# the command's keys (their defaults and help): its structured config, roofline/cli/schema.py
CONFIG = (CollectiveRequest, CollectivesKeys)


def run(c: dict) -> None:
    req = CollectiveRequest(kinds=tuple(c["kinds"]), min_bytes=c["min_bytes"], max_bytes=c["max_bytes"],
                          factor=c["factor"], dtype=c["dtype"], reps=c["reps"], device=c["device"], world=c["world"],
                          flush_bytes=c["flush_bytes"])
    out = Path(c["out_dir"]) if c["out_dir"] else req.default_out_dir(RUNS_ROOT)
    doc = run_collectives(req, out)
    if doc:  # rank 0 (the others of a torchrun / srun launch return nothing)
        print(summary_text(doc))
        print(files.json_text(dict(out_dir=str(out), fit=doc["fit"])))


def summary_text(doc: dict) -> str:
    """The console summary: the nccl-tests table, each collective's latency + bandwidth fit, and
    what to read the bus bandwidth against."""
    lines = [table(doc["rows"])]
    for kind, f in doc["fit"].items():
        lines.append(f"{kind:>15}: latency {f['latency_us']:.1f} us + S / {f['algbw_GBps']:.2f} GB/s "
                     f"(busbw {f['busbw_GBps']:.2f} GB/s, factor {f['bus_factor']:.2f}, n={f['ranks']}; "
                     f"median |fit error| {f['median_abs_err_pct']:.1f}%)")
    lines.append("beside: " + link_reference(doc["device_name"]))
    return "\n".join(lines)


def link_reference(device_name: str) -> str:
    """What the measured busbw should be read against: the device's link from priors.yaml (a GPU
    with a datasheet row), else a note that ranks on one CPU exchange through shared memory."""
    sheet = detect(device_name)
    priors = load_priors()
    link = priors["device_links"].get(sheet.key) if sheet is not None else None
    if link is None:
        return (f"{device_name}: ranks exchange through shared memory (gloo); compare busbw with the DRAM "
                "bandwidth of python -m roofline.cli.ceilings (no link datasheet)")
    p = priors["interconnects"][link]
    return (f"{device_name}: {link} prior busbw {p['busbw_GBps'][0]}/{p['busbw_GBps'][1]}/{p['busbw_GBps'][2]} GB/s, "
            f"latency {p['latency_us'][0]}/{p['latency_us'][1]}/{p['latency_us'][2]} us "
            "(optimistic/typical/pessimistic, roofline/data/priors.yaml)")
