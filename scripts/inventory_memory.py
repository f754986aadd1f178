"""Peak memory of an inventory run over a multi-GB sharded checkpoint, next to the checkpoint's size.

    python scripts/inventory_memory.py /tmp/inv-mem [--gb 2.2] [--shards 5] [--keep]

Writes a bf16 DeepSeek-V3-like checkpoint (MTP layer included, one 256 MB tensor bigger than
the hash chunk) shard by shard into DIR/before, copies it to DIR/after, then runs
`python -m roofline.cli.inventory` on the pair in a child process twice: on a tiny checkpoint
(the cost of importing torch, safetensors and hydra) and on the big one. Peak RSS is the
child's own ru_maxrss (os.wait4). The checkpoints are written by a separate child too: a
forked child starts with its parent's high-water mark, so this process stays small (no torch).
Prints one JSON line; deletes DIR unless --keep. Not part of the test run (minutes, GBs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
D = 4096


def generate(folder: Path, total_bytes: float, shards: int) -> int:
    """Write ~total_bytes of bf16 tensors over `shards` files plus the index; returns the tensor count."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    per = D * D * 2  # one bf16 D x D matrix
    fixed = (8 + 2 + 4) * per  # embedding, eh_proj, lm_head
    layers = 1 + max(1, round((total_bytes - fixed) / (3 * per)))
    names = {"model.embed_tokens.weight": (8 * D, D)}  # 256 MB: larger than one hash chunk
    for i in range(layers - 1):
        names |= {f"model.layers.{i}.{p}.weight": (D, D)
                  for p in ("self_attn.q_proj", "mlp.gate_proj", "mlp.down_proj")}
        names[f"model.layers.{i}.input_layernorm.weight"] = (D,)
    mtp = layers - 1
    names |= {f"model.layers.{mtp}.{p}.weight": (D,) for p in ("enorm", "hnorm", "shared_head.norm")}
    names |= {f"model.layers.{mtp}.eh_proj.weight": (D, 2 * D), "lm_head.weight": (4 * D, D)}
    order = list(names)
    weight_map = {}
    g = torch.Generator().manual_seed(0)
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: torch.randint(-2**15, 2**15, names[n], dtype=torch.int16, generator=g).view(torch.bfloat16)
                for n in order[s::shards]}
        save_file(part, str(folder / fname))
        weight_map |= {n: fname for n in part}
        del part
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(dict(num_hidden_layers=mtp, num_nextn_predict_layers=1)))
    return len(order)


def measured_run(before: Path, after: Path, log: Path) -> tuple[int, int, float]:
    """(exit code, peak RSS in bytes, seconds) of one inventory run in a child process."""
    t0 = time.perf_counter()
    with log.open("w") as out:
        p = subprocess.Popen([sys.executable, "-m", "roofline.cli.inventory", f"before={before}", f"after={after}"],
                             cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_maxrss * 1024, time.perf_counter() - t0  # ru_maxrss is KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="scratch folder (created; must not exist)")
    ap.add_argument("--gb", type=float, default=2.2, help="checkpoint size in GB (1e9 B)")
    ap.add_argument("--shards", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    ap.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.generate:  # the child that writes the data
        n = generate(args.dir / "before", args.gb * 1e9, args.shards)
        shutil.copytree(args.dir / "before", args.dir / "after")
        import torch
        from safetensors.torch import save_file
        (args.dir / "tiny").mkdir()
        save_file({"w": torch.zeros(4, dtype=torch.bfloat16)}, str(args.dir / "tiny" / "model.safetensors"))
        print(n)
        return
    if args.dir.exists():
        sys.exit(f"dir={args.dir}: exists; give a fresh folder (it is deleted afterwards)")
    try:
        gen = subprocess.run([sys.executable, __file__, str(args.dir), "--generate", "--gb", str(args.gb),
                              "--shards", str(args.shards)], check=True, capture_output=True, text=True)
        n = int(gen.stdout.split()[-1])
        tiny = args.dir / "tiny"
        rc0, base, _ = measured_run(tiny, tiny, args.dir / "tiny.log")
        rc, peak, secs = measured_run(args.dir / "before", args.dir / "after", args.dir / "big.log")
        size = sum(f.stat().st_size for f in (args.dir / "before").glob("*.safetensors"))
        largest = max(f.stat().st_size for f in (args.dir / "before").glob("*.safetensors"))
        last = (args.dir / "big.log").read_text().strip().splitlines()[-1]
        print(json.dumps(dict(checkpoint_bytes=size, checkpoint_gb=round(size / 1e9, 3), shards=args.shards,
                              tensors=n, largest_shard_bytes=largest, pair_bytes_hashed=2 * size,
                              peak_rss_bytes=peak, peak_rss_mb=round(peak / 1e6, 1),
                              baseline_peak_rss_mb=round(base / 1e6, 1),
                              peak_rss_over_baseline_mb=round((peak - base) / 1e6, 1),
                              peak_rss_fraction_of_checkpoint=round(peak / size, 4), seconds=round(secs, 1),
                              hash_gb_per_s=round(2 * size / secs / 1e9, 2), exit_code=rc, baseline_exit_code=rc0,
                              inventory=json.loads(last))))
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
