#!/usr/bin/env python3
"""Two steps of scripts/gpu_check.sh (logic in roofline.report.devcheck):

    python3 scripts/devcheck.py env --device cuda --model llama-3.1-8b --shapes 1,1,512 8,4,4096 --out env.json
    python3 scripts/devcheck.py summary --work WORK --out OUT   # sweep.csv + summary.md (goals) into OUT
    python3 scripts/devcheck.py compose sweep model=llama-3.1-8b device=cuda 'modes=[graph]' ... :: ceilings ...
        # compose the GPU branch's overrides with Hydra and validate them (no GPU needed)
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
    c = sub.add_parser("compose", help="CONFIG OVERRIDES... [:: CONFIG OVERRIDES...]: several in one process")
    c.add_argument("words", nargs="+")
    a = ap.parse_args(argv)
    if a.cmd == "compose":
        groups, cur = [], []
        for w in a.words + ["::"]:
            if w == "::":
                if cur:
                    groups.append(cur)
                cur = []
            else:
                cur.append(w)
        bad = [g[0] for g in groups if g[0] not in COMPOSABLE]
        if bad:
            print(f"error: compose: configs {bad}: allowed {COMPOSABLE}", file=sys.stderr)
            return 2
        return max(compose(g[0], g[1:]) for g in groups)
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
    ceilings = devcheck.load_json(work / "ceilings-full" / "ceilings.json") or \
        devcheck.load_json(work / "ceilings-copy" / "ceilings.json")
    goal_rows = devcheck.goals(ceilings, rows, devcheck.load_json(work / "sweep" / "fit.json"),
                               (env or {}).get("datasheet_mem_bw_GBps"))
    text = devcheck.summary_markdown(devcheck.read_steps(out / "steps.tsv"), env, goal_rows, rows, work / "logs",
                                     moe_rows=devcheck.sweep_rows([work / "sweep-moe"]),
                                     moe_fit=devcheck.load_json(work / "sweep-moe" / "fit.json"))
    (out / "summary.md").write_text(text)
    print(text)
    return 0


COMPOSABLE = ("sweep", "ceilings", "fit", "predict")


def compose(config: str, overrides: list[str]) -> int:
    """Compose roofline/conf/<config>.yaml with `overrides` as the command would, and build the request it
    describes (the sweep's SweepRequest, the ceilings' CeilingsRequest): the GPU branch's exact
    settings checked on a machine without one. One line; exit 2 on the first problem."""
    from roofline.cli.entry import compose_config, hydra_error_line, plain
    from roofline.io.fields import ConfigError
    try:
        cfg = compose_config(config, overrides)  # registers the command's schema first, as its entry point does
        what = "composed"
        if config == "sweep":
            import torch

            from roofline.commands.sweep import build_request
            from roofline.measure import sweep
            assumed, real = "", sweep.grouped_moe_runs
            if not torch.cuda.is_available():  # every check but the one a machine without the GPU cannot pass:
                # that an MoE's grouped path captures there (bf16 on sm90 / sm100, decoder.grouped_capturable)
                def on_the_gpu(device, dtype):
                    p = sweep.parse_precision(dtype)
                    return (str(device).startswith("cuda") and p.is_plain and p.activations == "bfloat16"
                            or real(device, dtype))
                sweep.grouped_moe_runs = on_the_gpu
                assumed = " (an MoE's grouped graph path assumed to capture: bf16 on an sm90 GPU, checked there)"
            try:
                req = build_request(plain(cfg, device_as="torch"))
            finally:  # this composition only: the caller's process (a test's) keeps the real rule
                sweep.grouped_moe_runs = real
            what = (f"valid sweep: {req.model.name} on {req.device}, modes {list(req.modes)}, "
                    f"{len(req.q) * len(req.B) * len(req.L) * len(req.dtypes) * len(req.modes)} forward points"
                    + (assumed if req.model.is_moe else ""))
        elif config == "ceilings":
            import functools

            from roofline.measure import ceilings, devices
            from roofline.measure.ceilings import CeilingsRequest
            # every check but the one a machine without the device cannot pass: that it is here
            ceilings.parse_device = functools.partial(devices.parse_device, need_available=False)
            c = plain(cfg, device_as="torch")
            c.pop("out_dir"), c.pop("overrides", None)
            req = CeilingsRequest.from_dict(c)
            what = f"valid ceilings: {req.device}, kernels {list(req.kernels)}"
    except (ConfigError, ValueError, KeyError, TypeError) as e:
        print(f"error: {config} {' '.join(overrides)}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # Hydra's own composition errors
        print(f"error: {config}: {hydra_error_line(e)}", file=sys.stderr)
        return 2
    print(f"{config}: {what} ({len(overrides)} overrides)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
