#!/usr/bin/env python3
"""Two steps of scripts/gpu_check.sh (logic in roofline.report.devcheck):

    python3 scripts/devcheck.py env --device cuda --model llama-3.1-8b --shapes 1,1,512 8,4,4096 --out env.json
    python3 scripts/devcheck.py summary --work WORK --out OUT   # sweep.csv + summary.md (goals) into OUT
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree, whatever the cwd

from roofline.model.dtypes import torch_dtype  # noqa: E402
from roofline.model.presets import get_preset  # noqa: E402
from roofline.report import devcheck  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("env")
    e.add_argument("--device", default="cuda")
    e.add_argument("--model", default="llama-3.1-8b")
    e.add_argument("--dtype", default="bfloat16")
    e.add_argument("--shapes", nargs="+", default=["1,1,512"], help="B,q,L of the sweep points to probe")
    e.add_argument("--out", required=True)
    s = sub.add_parser("summary")
    s.add_argument("--work", required=True)
    s.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "env":
        shapes = [tuple(int(x) for x in sh.split(",")) for sh in a.shapes]
        env = devcheck.environment(a.device, get_preset(a.model), torch_dtype(a.dtype), shapes)
        Path(a.out).write_text(json.dumps(env, indent=1, default=str))
        print(json.dumps({k: env.get(k) for k in ("device_name", "torch", "triton", "l2_bytes_queried",
                                                   "datasheet_l2_bytes", "TRITON_INTERPRET")}))
        print(json.dumps(env["attention"]))
        return 0
    work, out = Path(a.work), Path(a.out)
    rows = devcheck.sweep_rows([work / "sweep", work / "sweep-compiled"])
    if not rows.empty:
        rows.to_csv(out / "sweep.csv", index=False)
    env = devcheck.load_json(out / "env.json")
    goal_rows = devcheck.goals(devcheck.load_json(work / "ceilings" / "ceilings.json"), rows,
                               devcheck.load_json(work / "sweep" / "fit.json"), (env or {}).get("datasheet_mem_bw_GBps"))
    text = devcheck.summary_markdown(devcheck.read_steps(out / "steps.tsv"), env, goal_rows, rows)
    (out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
