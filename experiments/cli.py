"""One command, `roofline <subcommand> [key=value ...]`, Hydra underneath each subcommand.

    roofline sweep model=cpu-demo 'q=[1,2,4]'     # = python -m experiments.sweep ...
    roofline sweep --help                         # every key with its comment
    eval "$(roofline sweep -sc install=bash)"     # tab completion of subcommands, keys and groups

Shell completion: Hydra's bash hook calls `roofline -sc query=bash` with the line typed so
far in COMP_LINE; the subcommand is read from that line and removed from it, so Hydra
completes the subcommand's own config.
"""

from __future__ import annotations

import os
import runpy
import sys

COMMANDS = {
    "sweep": "time forward passes over a grid (q, B, L, dtypes, modes)",
    "ceilings": "measure this device's memory and matmul roofs",
    "card": "the cost card of a preset or checkpoint",
    "fit": "fit the step-time cost model to a run folder",
    "report": "report.md + report.html of a run folder",
    "plots": "figures of a run folder",
    "compare": "two runs point by point: ratio and whether it exceeds the noise",
    "predict": "speculative-decoding speedups from a fit",
    "capacity": "batch and devices for a latency and throughput target",
    "slicing": "check layer-sliced extrapolation against a full-depth run",
    "specdec": "plain vs speculative decoding, measured against the cost model",
    "acceptance": "real per-position acceptance on chat prompts",
    "inventory": "did a checkpoint conversion lose tensors?",
    "train": "train the small MTP model, its tokenizer and draft model on the CPU",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    return "usage: roofline <command> [key=value ...] [--help]\n\ncommands:\n" + "\n".join(
        f"  {name:<{width}}  {what}" for name, what in COMMANDS.items())


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    line = os.environ.get("COMP_LINE")
    if argv[:1] == ["-sc"] or (argv and argv[0].startswith("-sc")):  # shell completion, no subcommand given
        words = (line or "").split()
        typed = len(words) > 1 and words[1] in COMMANDS and (line or "").endswith(" ") or len(words) > 2
        if not typed:
            if line is not None and any(a.startswith("query") for a in argv):
                prefix = words[1] if len(words) > 1 else ""
                print(" ".join(c for c in COMMANDS if c.startswith(prefix)))
                return
            argv = ["sweep"] + argv  # install/uninstall: any subcommand writes the same hook
        else:
            os.environ["COMP_LINE"] = " ".join([words[0]] + words[2:]) + (" " if line.endswith(" ") else "")
            argv = [words[1]] + argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return
    cmd = argv[0]
    if cmd not in COMMANDS:
        print(f"error: command {cmd!r}: allowed {list(COMMANDS)}", file=sys.stderr)
        sys.exit(2)
    sys.argv = ["roofline", *argv[1:]]
    # as `python -m experiments.<cmd>` does: Hydra then finds conf/ beside the file, in a checkout or a wheel
    runpy.run_module(f"experiments.{cmd}", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
