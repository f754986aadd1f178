#!/usr/bin/env bash
# The prepared device check (one short run on a lent GPU; see README "GPU"). Writes small
# tables under $OUT (or results/gpu/ when unset): nvidia-smi's view of the device, the
# GPU-marked tests, and the llama-3.1-8b bf16 sweep with CUDA graphs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/gpu}
mkdir -p "$OUT"
python3 dev.py setup >/dev/null
PY=.venv/bin/python
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv | tee "$OUT/nvidia-smi.csv"
# 1. correctness: GPU-marked tests (bf16 model vs float32 CPU reference, timer, kernels)
$PY -m pytest -q -m gpu tests 2>&1 | tail -20 | tee "$OUT/gpu_tests.txt"
# 2. the sweep of issue 3: llama-3.1-8b bf16, CUDA graphs
$PY -m experiments.sweep model=llama-3.1-8b device=cuda modes=[graph] dtypes=[bfloat16] \
    'q=[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,32,64,128,256]' 'B=[1,8,32]' 'L=[512,4096]' \
    timer.budget_s=0.3 timer.min_reps=10 progress=false out_dir="$OUT/sweep-llama-3.1-8b" | tail -1
cp "$OUT/sweep-llama-3.1-8b/points.csv" "$OUT/llama-3.1-8b-bf16-graph.csv"
