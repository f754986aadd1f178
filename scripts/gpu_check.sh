#!/usr/bin/env bash
# The device check: one command, at most 8 minutes on one H200, on a node with NO network.
#
#   bash scripts/gpu_check.sh                       # on the GPU node (its own python3 + CUDA torch)
#   ROOFLINE_CHECK_DRY=1 OUT=/tmp/x bash scripts/gpu_check.sh   # the same steps on the CPU, tiny model
#
# Runs with the node's own python3 (PY= to choose another): a new venv would not see the node's
# CUDA build of torch, and nothing can be downloaded there. What the node lacks (hydra-core,
# omegaconf, antlr4) comes from ./wheelhouse, built beforehand on a connected machine with
# `python3 dev.py wheels` and carried with the repository; it is installed with --no-index into
# a scratch folder put on PYTHONPATH. The project runs from this source tree.
#
# Every step has its own time limit (timeout) and its exit status is recorded in steps.tsv; a
# failed or timed-out step never stops the later ones (no `set -e`). At most 8 small files go
# to $OUT (default results/<device>/, e.g. results/h200/):
#   env.json        versions, device, L2 queried vs the datasheet table, attention backend of the sweep's shapes
#   steps.tsv       step, exit status (124: time limit), seconds, limit
#   gpu_tests.txt   the gpu-marked tests (tail of pytest's report)
#   ceilings.json   Triton and torch read/write/copy/triad, cold and warm L2; bf16 matmuls and decode GEMMs
#   sweep.csv       llama-3.1-8b bf16: CUDA-graph grid + compiled decode points (attention backend, kernels per forward)
#   fit.json        the cost model fitted to the graph sweep, rows put against the measured ceilings
#   predict.csv     speculative-decoding predictions from that fit (n-gram drafter)
#   summary.md      steps, and the GPU goals as ratios measured in this run
# Full run folders and logs stay in $WORK (a temporary folder unless set).
#
# Estimated time on one H200 (limits in brackets). Estimated, not measured: from the work each
# step does (the 16 GB of weights and up to 17 GB of cache at ~4 TB/s; ~1 s per sweep point for
# cache fill, graph capture, one profiled forward and the reps at a 0.3 s budget; an assumed
# ~50 s per torch.compile of the 8B forward with 16 CPU cores; ~5 s per step to start python
# and import torch):
#   setup 2 s [15] · env 20 s [45] · gpu tests 60 s [75] · ceilings 45 s [60] ·
#   sweep (graph, 48 points) 70 s [90] · sweep (compiled decode, 2 points) 115 s [140] ·
#   fit 10 s [20] · predict 10 s [20] · summary 6 s [15]
#   = about 5.6 min expected; the limits add up to 8.0 min, the most it can take.

cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
PY=${PY:-python3}
DRY=${ROOFLINE_CHECK_DRY:-0}
export PYTHONUNBUFFERED=1

if [ "$DRY" = 1 ]; then
  DEVICE=cpu; MODEL=tiny; SLUG=cpu-dry
  GRAPH_MODE=eager; COMPILED_MODE=eager   # Inductor on a CPU takes minutes: the dry run checks the plumbing
  Q='[1,2,4,8]'; B='[1,2]'; L='[16,64]'; CL='[16,64]'
  TIMER='timer.warmup=1 timer.min_reps=3 timer.max_reps=5 timer.budget_s=0.05'
  CEIL="device=cpu quick=true decode_model=tiny working_sets=[262144,1048576] square_sizes=[64] decode_ms=[1]"
  GPU_TESTS=${GPU_TESTS:-tests/test_model_gpu.py}
  SHAPES="1,1,64 2,4,64"
  LIMITS=(60 120 120 120 120 120 60 60 30)
else
  DEVICE=cuda; MODEL=llama-3.1-8b   # conf/device/cuda.yaml: the running GPU, its datasheet row detected by name
  SLUG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr 'A-Z' 'a-z' \
         | sed -e 's/^nvidia //' -e 's/[^a-z0-9]\+/-/g' -e 's/-$//')
  SLUG=${SLUG:-gpu}
  GRAPH_MODE=graph; COMPILED_MODE=compiled
  Q='[1,2,4,8,16,32,64,128]'; B='[1,8,32]'; L='[512,4096]'; CL='[512,4096]'
  TIMER='timer.warmup=2 timer.min_reps=10 timer.max_reps=100 timer.budget_s=0.3 timer.l2=cold'
  CEIL="device=cuda quick=true dtypes=[bfloat16] bandwidth_dtypes=[bfloat16]"
  GPU_TESTS=${GPU_TESTS:-tests}
  SHAPES="1,1,512 1,1,4096 8,1,4096 32,1,4096 1,4,512 8,4,4096 32,16,4096 1,128,512"
  LIMITS=(15 45 75 60 90 140 20 20 15)
fi
OUT=${OUT:-results/$SLUG}
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/roofline-check.XXXXXX")}
mkdir -p "$OUT" "$WORK/logs"
OUT=$(cd "$OUT" && pwd)
printf 'step\trc\tseconds\tlimit_s\n' > "$OUT/steps.tsv"
echo "device check: device=$DEVICE model=$MODEL out=$OUT work=$WORK" >&2

step() {  # step NAME LIMIT_S COMMAND...: run with a time limit, record the exit status, never stop
  local name=$1 limit=$2 t0 rc ms
  shift 2
  echo "== $name (limit ${limit}s)" >&2
  t0=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" > "$WORK/logs/$name.log" 2>&1
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s\t%s\t%d.%d\t%s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$limit" >> "$OUT/steps.tsv"
  tail -n 4 "$WORK/logs/$name.log" >&2
  echo "   -> exit $rc after ${ms} ms" >&2
}

# 0. what the node lacks, from the carried wheelhouse (never from the network)
step setup "${LIMITS[0]}" bash -c '
  if "$0" -c "import hydra, omegaconf" 2>/dev/null; then echo "hydra-core and omegaconf already importable"; exit 0; fi
  ls wheelhouse/*.whl >/dev/null 2>&1 || { echo "no ./wheelhouse: run python3 dev.py wheels on a connected machine"; exit 3; }
  "$0" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$1/site" wheelhouse/*.whl' \
  "$PY" "$WORK"
export PYTHONPATH="$WORK/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"

# 1. environment and probe: versions, L2, the attention backend the sweep's shapes select
step env "${LIMITS[1]}" "$PY" scripts/devcheck.py env --device "$DEVICE" --model "$MODEL" --shapes $SHAPES \
  --out "$OUT/env.json"

# 2. the gpu-marked tests (on the CPU they are all skipped)
step gpu_tests "${LIMITS[2]}" "$PY" -m pytest -q -m gpu -p no:cacheprovider $GPU_TESTS
tail -n 40 "$WORK/logs/gpu_tests.log" > "$OUT/gpu_tests.txt"

# 3. ceilings: Triton and torch read/write/copy/triad, cold and warm L2; matmuls; decode GEMMs
step ceilings "${LIMITS[3]}" "$PY" -m experiments.ceilings $CEIL "out_dir=$WORK/ceilings"
cp "$WORK/ceilings/ceilings.json" "$OUT/ceilings.json" 2>/dev/null
CEILINGS="ceilings=$WORK/ceilings/ceilings.json"
[ -f "$WORK/ceilings/ceilings.json" ] || CEILINGS=

# 4. the sweep: CUDA-graph replay over the grid (rows against the measured ceilings)
step sweep_graph "${LIMITS[4]}" "$PY" -m experiments.sweep "model=$MODEL" "device=$DEVICE" "modes=[$GRAPH_MODE]" \
  'dtypes=[bfloat16]' "q=$Q" "B=$B" "L=$L" $TIMER $CEILINGS progress=false "out_dir=$WORK/sweep"

# 5. compiled decode (torch.compile + CUDA graphs): the forward that should reach the roof
step sweep_compiled "${LIMITS[5]}" "$PY" -m experiments.sweep "model=$MODEL" "device=$DEVICE" \
  "modes=[$COMPILED_MODE]" 'dtypes=[bfloat16]' 'q=[1]' 'B=[1]' "L=$CL" $TIMER $CEILINGS progress=false \
  "out_dir=$WORK/sweep-compiled"

# 6. the cost model, fitted with the measured ceilings beside the run
cp "$WORK/ceilings/ceilings.json" "$WORK/sweep/" 2>/dev/null
step fit "${LIMITS[6]}" "$PY" -m experiments.fit "results_dir=$WORK/sweep"
cp "$WORK/sweep/fit.json" "$OUT/fit.json" 2>/dev/null

# 7. a prediction from the fit
step predict "${LIMITS[7]}" "$PY" -m experiments.predict "fit=$WORK/sweep/fit.json" drafter=ngram \
  'alphas=[0.6,0.8]' 'k=[0,1,2,3,4]' "B=$B" "L=$L" "plot_B=1" "plot_L=$(echo "$L" | tr -d '[]' | cut -d, -f1)" \
  "out_dir=$WORK/predict"
cp "$WORK/predict/predict.csv" "$OUT/predict.csv" 2>/dev/null

# 8. the sweep table and the goals
step summary "${LIMITS[8]}" "$PY" scripts/devcheck.py summary --work "$WORK" --out "$OUT"
cat "$OUT/summary.md" 2>/dev/null
echo "outputs: $(ls "$OUT" | tr '\n' ' ')" >&2
exit 0
