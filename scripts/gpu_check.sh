#!/usr/bin/env bash
# The device check: one command on one H200, on a node with NO network, ordered by value and
# writing as it goes, so that a run cut short keeps everything it finished.
#
#   bash scripts/gpu_check.sh                                   # on the GPU node (its own python3 + CUDA torch)
#   ROOFLINE_CHECK_DRY=1 OUT=/tmp/x bash scripts/gpu_check.sh   # the same steps on the CPU, tiny model
#
# The exact device call, the budget and what is on disk when: docs/gpu-node.md.
#
# Runs with the node's own python3 (PY= to choose another): a new venv would not see the node's
# CUDA build of torch, and nothing can be downloaded there. What the node lacks (hydra-core,
# omegaconf, antlr4) comes from ./wheelhouse (`python3 dev.py wheels` on a connected machine;
# git-ignored, so the device call must carry it: carry: ["wheelhouse"]), installed with
# --no-index into a scratch folder put on PYTHONPATH. The project runs from this source tree.
#
# Every step runs under `timeout --foreground -s INT` (SIGINT: a sweep stopped at its limit writes
# what it finished and says how many points it saved; 10 s later SIGKILL; --foreground keeps the
# step in the check's process group), and a SIGTERM or SIGINT to the check is passed on to the
# step in flight, waited for, and then summary.md and the bundle are written. Its exit status is
# recorded in steps.tsv at once; a failed or timed-out step never stops the later ones (no
# `set -e`). The whole check has one budget, ROOFLINE_CHECK_BUDGET_S (default 480 s on the GPU):
# a step never runs past it minus the time kept for fit, predict and the summary, and a step
# left with under 5 s is skipped (exit 125). After every step summary.md (steps, failures with
# their last log lines) and logs.tar.gz (every log and run-folder file) are rewritten, so a
# cut leaves both. The exit status is 1 when any step failed, else 0.
#
# What comes back ($OUT, default results/<device>/; at most 8 files):
#   summary.md      steps; goals as ratios of this run; T(q)/T(1); rows by status; failures + last log lines
#   steps.tsv       step, exit status (124: time limit, 125: no budget left), seconds, limit
#   ceilings.json   the full ceilings if they ran, else the copy/read ceilings of the first step
#   sweep.csv       llama-3.1-8b bf16 rows: graph grid + compiled decode (corrections applied)
#   env.json        versions, device, L2 queried vs the datasheet table, attention backend per shape
#   fit.json        the cost model fitted to the graph sweep
#   predict.csv     speculative-decoding predictions from that fit (n-gram drafter)
#   logs.tar.gz     every step's log, the gpu tests' verbose report, each run folder's small files
# Run folders stay in $WORK (default /tmp/roofline-check on the GPU: the same command run again
# on the same machine resumes every sweep and reuses the ceilings measured).
#
# Budget of a cold H200 node (one GPU, 16 cores; the machine's own start, ~1-2 min, is before
# this command). ESTIMATED, not measured (no GPU has run this yet): ~5-8 s per step to start
# python and import torch (~15 s on the first, cold page cache); the 16 GB of bf16 weights
# generated on the GPU in ~2 s; per graph point ~1.5-2.5 s (cache fill, one eager call for the
# attention backend, capture, one profiled replay, the energy probe's >= 0.5 s, reps at a 0.3 s
# budget); Triton's first compile of each copy kernel ~3-5 s; one torch.compile of the 8B
# decode step ~50-90 s with 16 cores (the noise monitor does not re-measure it: noise.retries=0,
# a re-measurement would compile again). Step: expected [limit] -> on disk by (expected):
#   setup 3 s [20] · ceilings_copy 40 [60] · sweep_b1 55 [100]                -> ~1.7 min: copy roofs, 8B B=1 graph decode, T(q)/T(1)
#   sweep_compiled 100 [150]                                                 -> ~3.3 min: compiled decode at L=512
#   sweep_rest 75 [110] · sweep_moe 60 [90] · env 20 [40]                    -> ~6 min: the whole graph grid, the
#       Qwen3-30B-A3B graph rows (61 GB of bf16 weights generated on the GPU; 12 points), env.json
#   gpu_tests 70 [90] · ceilings_full 50 [75] · fit 8 [20] · fit_moe 8 [20] · predict 8 [20] · summary 8 [20]
# Expected ~505 s; the limits add up to 815 s and the 480 s budget clips the later steps
# (gpu_tests, ceilings_full first), always keeping 80 s for the two fits, predict and the summary.
# Worst case (every step at its limit): the key figures by 3.0 min, compiled decode by 5.5 min.

cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
PY=${PY:-python3}
DRY=${ROOFLINE_CHECK_DRY:-0}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
MIN_STEP_S=5
TAIL_S=80   # kept for fit, fit_moe, predict and summary

# Settings of the two branches: G_ the GPU's, D_ the dry run's. The steps' arguments are built
# from one prefix by `build` below, so the dry run can compose and validate the G_ ones exactly.
G_MODEL=(model=llama-3.1-8b device=cuda 'dtypes=[bfloat16]')
G_TIMER=(timer.warmup=2 timer.min_reps=10 timer.max_reps=100 timer.budget_s=0.3 timer.l2=cold)
G_GRAPH=graph; G_COMPILED=compiled
G_Q='[1,2,4,8,16,32,64,128]'; G_L='[512,4096]'; G_B='[1,8,32]'; G_CL='[512]'
G_CEIL_COPY=(device=cuda quick=true
  'kernels=[triton_copy_persistent,triton_copy_grid,torch_copy,triton_read_persistent,torch_read]'
  'l2_modes=[cold]' 'dtypes=[bfloat16]' 'bandwidth_dtypes=[bfloat16]'
  'working_sets=[268435456,1073741824,4294967296]' 'square_sizes=[8192]' 'decode_ms=[]' 'formats=[]')
G_CEIL_FULL=(device=cuda quick=true 'dtypes=[bfloat16]' 'bandwidth_dtypes=[bfloat16]')
# an MoE in graph mode: Qwen3-30B-A3B bf16 (61 GB) in graph mode, the grouped touched-expert path
G_MOE=(model=qwen3-30b-a3b device=cuda 'dtypes=[bfloat16]'); G_MOE_Q='[1,2,4]'; G_MOE_B='[1,2,8,32]'

D_MODEL=(model=tiny device=cpu 'dtypes=[bfloat16]')
D_TIMER=(timer.warmup=1 timer.min_reps=3 timer.max_reps=5 timer.budget_s=0.05)
D_GRAPH=eager; D_COMPILED=eager   # Inductor on a 2-core CPU takes minutes: the dry run checks the plumbing
D_Q='[1,2,4,8]'; D_L='[16,64]'; D_B='[1,2]'; D_CL='[16]'
D_CEIL_COPY=(device=cpu quick=true 'kernels=[torch_copy,torch_read]' 'l2_modes=[cold]'
  'working_sets=[262144,1048576]' 'square_sizes=[64]' 'decode_ms=[]' 'formats=[]')
D_CEIL_FULL=(device=cpu quick=true decode_model=tiny 'working_sets=[262144,1048576]' 'square_sizes=[64]'
  'decode_ms=[1]')
D_MOE=(model=tiny device=cpu 'dtypes=[bfloat16]' seed=1 model.mtp_layers=0 +model.experts=4
  +model.experts_per_token=2 +model.moe_ffn=64); D_MOE_Q='[1,2,4,8]'; D_MOE_B='[1,2,4]'

if [ "$DRY" = 1 ]; then
  R=D; SLUG=cpu-dry; DEVICE=cpu
  GPU_TESTS=${GPU_TESTS:-tests/test_model_gpu.py tests/test_timer.py}
  SHAPES="1,1,64 2,4,64"
  BUDGET_S=${ROOFLINE_CHECK_BUDGET_S:-1800}
  WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/roofline-check.XXXXXX")}
  declare -A LIMIT=([setup]=60 [compose_gpu]=240 [ceilings_copy]=120 [sweep_b1]=240 [sweep_compiled]=120
                    [sweep_rest]=240 [sweep_moe]=180 [env]=120 [gpu_tests]=120 [ceilings_full]=180 [fit]=60
                    [fit_moe]=60 [predict]=60 [summary]=60)
  TAIL_S=180
else
  R=G; DEVICE=cuda
  SLUG=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr 'A-Z' 'a-z' \
         | sed -e 's/^nvidia //' -e 's/[^a-z0-9]\+/-/g' -e 's/-$//')
  SLUG=${SLUG:-gpu}
  # the gpu-marked tests, less the two the steps already are (ceilings, the compiled decode)
  GPU_TESTS=${GPU_TESTS:-tests/test_model_gpu.py tests/test_timer.py tests/test_quant.py tests/test_devices.py \
tests/test_noise.py tests/test_collectives.py tests/test_moe_grouped.py}
  SHAPES="1,1,512 1,1,4096 8,1,4096 32,1,4096 1,4,512 8,4,4096 32,16,4096 1,128,512"
  BUDGET_S=${ROOFLINE_CHECK_BUDGET_S:-480}
  WORK=${WORK:-/tmp/roofline-check}
  declare -A LIMIT=([setup]=20 [ceilings_copy]=60 [sweep_b1]=100 [sweep_compiled]=150 [sweep_rest]=110
                    [sweep_moe]=90 [env]=40 [gpu_tests]=90 [ceilings_full]=75 [fit]=20 [fit_moe]=20 [predict]=20
                    [summary]=20)
fi
OUT=${OUT:-results/$SLUG}
mkdir -p "$OUT" "$WORK/logs"
OUT=$(cd "$OUT" && pwd)
WORK=$(cd "$WORK" && pwd)
printf 'step\trc\tseconds\tlimit_s\n' > "$OUT/steps.tsv"
FAILED=0
CHILD=
echo "device check: dry=$DRY out=$OUT work=$WORK budget=${BUDGET_S}s" >&2

partial_summary() {  # summary.md from steps.tsv and the logs alone (bash: no python needed)
  {
    echo "# Device check (partial: written after step $1; the summary step rewrites it with the goals)"
    echo
    echo "| step | exit | seconds | limit s |"
    echo "| --- | --- | --- | --- |"
    tail -n +2 "$OUT/steps.tsv" | awk -F'\t' '{printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}'
    echo
    echo "## Failures"
    tail -n +2 "$OUT/steps.tsv" | while IFS=$'\t' read -r name rc _ _; do
      [ "$rc" = 0 ] && continue
      echo; echo "### $name (exit $rc)"; echo; echo '```'
      tail -n 8 "$WORK/logs/$name.log" 2>/dev/null; echo '```'
    done
  } > "$OUT/summary.md"
}

bundle() {  # logs.tar.gz: every log and each run folder's small files (no wheels, no samples over 5 MB)
  (cd "$WORK" && find . -path ./site -prune -o -type f \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' \
     -o -name '*.csv' -o -name '*.md' -o -name '*.txt' \) -size -5M -print0 \
   | tar --null -czf "$OUT/logs.tar.gz.tmp" -T - 2>/dev/null) && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}

step() {  # step NAME RESERVE_S COMMAND...: time-limited, recorded at once, never stops the check
  local name=$1 reserve=$2 limit left t0 rc ms
  shift 2
  limit=${LIMIT[$name]}
  left=$(( BUDGET_S - ($(date +%s) - T0) - reserve ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt "$MIN_STEP_S" ]; then
    echo "== $name: skipped, ${left}s of the budget left" >&2
    echo "skipped: the check's budget (${BUDGET_S}s) was spent" > "$WORK/logs/$name.log"
    printf '%s\t125\t0.0\t%s\n' "$name" "${LIMIT[$name]}" >> "$OUT/steps.tsv"
    FAILED=1; partial_summary "$name"; return
  fi
  echo "== $name (limit ${limit}s, $(( $(date +%s) - T0 ))s into the check)" >&2
  t0=$(date +%s%N)
  # In the background and waited for, so that a signal to the check runs its handler at once
  # (on_signal waits for the step, which saves what it finished). A background command starts
  # with SIGINT ignored: `env --default-signal=INT` gives it back, so `timeout -s INT` reaches it.
  if declare -F "$1" >/dev/null; then  # a function of this script: timeout runs it in a bash of its own
    timeout --foreground -s INT --kill-after=10 "$limit" env --default-signal=INT \
      bash -c "$(declare -f "$1" roof with_roof); $(declare -p SWEEP PY); \"\$@\"" _ "$@" > "$WORK/logs/$name.log" 2>&1 &
  else
    timeout --foreground -s INT --kill-after=10 "$limit" env --default-signal=INT "$@" > "$WORK/logs/$name.log" 2>&1 &
  fi
  CHILD=$! CUR_STEP=$name STEP_T0=$t0
  wait "$CHILD"
  rc=$?
  CHILD=
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s\t%s\t%d.%d\t%s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000 / 100)) "$limit" >> "$OUT/steps.tsv"
  [ "$rc" = 0 ] || FAILED=1
  tail -n 3 "$WORK/logs/$name.log" >&2
  echo "   -> exit $rc after ${ms} ms" >&2
  [ "$name" = summary ] && [ "$rc" = 0 ] || partial_summary "$name"  # the summary step wrote the full one
  bundle
}

on_signal() {  # SIGTERM/SIGINT to the check (its process group): the step in flight saves what it
  # finished (the sweep's own handler), then the summary and the bundle are written as they stand
  echo "device check stopped by a signal after $(( $(date +%s) - T0 ))s" >&2
  if [ -n "$CHILD" ]; then  # the step in flight: pass the signal on (timeout forwards it) and let it save
    kill -TERM "$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
    printf '%s\t143\t%s\t%s\n' "$CUR_STEP" "$(( ($(date +%s%N) - STEP_T0) / 1000000000 ))" "${LIMIT[$CUR_STEP]}" \
      >> "$OUT/steps.tsv"
  fi
  partial_summary "a signal (the check was stopped)"
  echo "The check was stopped by a signal $(( $(date +%s) - T0 ))s in; every step above ran." >> "$OUT/summary.md"
  bundle
  exit 143
}
trap on_signal TERM INT

ceilings_once() {  # ceilings_once ARGS... out_dir=DIR: measure unless a previous run of the check did
  local dir=${*: -1}; dir=${dir#out_dir=}
  if [ -f "$dir/ceilings.json" ]; then echo "reusing $dir/ceilings.json"; return 0; fi
  exec "$PY" -m roofline.cli.ceilings "$@"
}

# 0. what the node lacks, from the carried wheelhouse (never from the network)
step setup "$TAIL_S" bash -c '
  if "$0" -c "import hydra, omegaconf" 2>/dev/null; then echo "hydra-core and omegaconf already importable"; exit 0; fi
  ls wheelhouse/*.whl >/dev/null 2>&1 || { echo "no ./wheelhouse: run python3 dev.py wheels and carry it"; exit 3; }
  "$0" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$1/site" wheelhouse/*.whl' \
  "$PY" "$WORK"
export PYTHONPATH="$WORK/site:$REPO${PYTHONPATH:+:$PYTHONPATH}"

build() {  # build P: each step's arguments from the settings P_* (G_: the GPU branch, D_: the dry run)
  local -n m=${1}_MODEL t=${1}_TIMER cc=${1}_CEIL_COPY cf=${1}_CEIL_FULL mm=${1}_MOE
  local g=${1}_GRAPH c=${1}_COMPILED q=${1}_Q l=${1}_L b=${1}_B cl=${1}_CL mq=${1}_MOE_Q mb=${1}_MOE_B
  local roof="ceilings=$WORK/ceilings-copy/ceilings.json"
  A_CEIL_COPY=("${cc[@]}" "out_dir=$WORK/ceilings-copy")
  A_SWEEP_B1=("${m[@]}" "modes=[${!g}]" "q=${!q}" "B=[1]" "L=${!l}" "${t[@]}" progress=false "$roof"
              "out_dir=$WORK/sweep")
  A_SWEEP_COMPILED=("${m[@]}" "modes=[${!c}]" "q=[1]" "B=[1]" "L=${!cl}" "${t[@]}" noise.retries=0 progress=false
                    "$roof" "out_dir=$WORK/sweep-compiled")
  A_SWEEP_REST=("${m[@]}" "modes=[${!g}]" "q=${!q}" "B=${!b}" "L=${!l}" "${t[@]}" extend=true progress=false
                "$roof" "out_dir=$WORK/sweep")
  A_SWEEP_MOE=("${mm[@]}" "modes=[${!g}]" "q=${!mq}" "B=${!mb}" "L=${!cl}" "${t[@]}" progress=false "$roof"
               "out_dir=$WORK/sweep-moe")
  A_CEIL_FULL=("${cf[@]}" "out_dir=$WORK/ceilings-full")
  A_PREDICT=("fit=$WORK/sweep/fit.json" drafter=ngram 'alphas=[0.6,0.8]' 'k=[0,1,2,3,4]' "B=${!b}" "L=${!l}"
             plot_B=1 "plot_L=$(echo "${!l}" | tr -d '[]' | cut -d, -f1)" "out_dir=$WORK/predict")
}

# (dry run only) the GPU branch's exact arguments, composed by Hydra and validated by the library
if [ "$DRY" = 1 ]; then
  build G
  {  # one python for all six (each start costs seconds); `::` separates them
    printf '%q ' "$PY" scripts/devcheck.py compose ceilings "${A_CEIL_COPY[@]}" :: sweep "${A_SWEEP_B1[@]}" \
      :: sweep "${A_SWEEP_COMPILED[@]}" :: sweep "${A_SWEEP_REST[@]}" :: sweep "${A_SWEEP_MOE[@]}" \
      :: ceilings "${A_CEIL_FULL[@]}" \
      :: predict "${A_PREDICT[@]}"; echo
  } > "$WORK/compose_gpu.sh"
  step compose_gpu "$TAIL_S" env TRITON_INTERPRET=1 bash "$WORK/compose_gpu.sh"
fi
build "$R"
SWEEP=("$PY" -m roofline.cli.sweep)
roof() {  # the sweep arguments, less the ceilings= one while there is no ceilings file to give
  local a; for a in "$@"; do
    [[ $a == ceilings=* && ! -f ${a#ceilings=} ]] || printf '%s\0' "$a"
  done
}
# exec: the step's process is the sweep itself, which saves its rows on a signal (a bash between
# timeout and python would die at once and let the check bundle before the sweep had finished)
with_roof() { local -a args; mapfile -d '' args < <(roof "$@"); exec "${SWEEP[@]}" "${args[@]}"; }

# 1. the copy and read roofs (Triton and torch, cold L2, working sets >= 4x L2) and one bf16 matmul
step ceilings_copy "$TAIL_S" ceilings_once "${A_CEIL_COPY[@]}"
cp "$WORK/ceilings-copy/ceilings.json" "$OUT/ceilings.json" 2>/dev/null

# 2. the headline: llama-3.1-8b bf16, B=1, every q, CUDA-graph replay, rows against those roofs
step sweep_b1 "$TAIL_S" with_roof "${A_SWEEP_B1[@]}"

# 3. compiled decode (torch.compile + CUDA graphs) at one context: the forward that should reach the roof
step sweep_compiled "$TAIL_S" with_roof "${A_SWEEP_COMPILED[@]}"

# 4. the rest of the graph grid (B > 1), added to the same run folder
step sweep_rest "$TAIL_S" with_roof "${A_SWEEP_REST[@]}"

# 4b. an MoE in graph mode: Qwen3-30B-A3B, its touched experts as one grouped GEMM
#     per projection captured in the CUDA graph (decoder.grouped_capturable on sm90); T(B)/T(1) > 1
step sweep_moe "$TAIL_S" with_roof "${A_SWEEP_MOE[@]}"

# 5. environment and probe: versions, L2, the attention backend the sweep's shapes select
declare -n RUN_MODEL=${R}_MODEL
step env "$TAIL_S" "$PY" scripts/devcheck.py env --device "$DEVICE" --model "${RUN_MODEL[0]#model=}" \
  --shapes $SHAPES --out "$OUT/env.json"

# 6. the gpu-marked tests, verbose (each test named as it starts; SIGINT at the limit prints where it was)
step gpu_tests "$TAIL_S" "$PY" -m pytest -v -rA --durations=10 -m gpu -p no:cacheprovider \
  -k "not compiled_decode" $GPU_TESTS

# 7. the full quick ceilings (every kernel, warm and cold L2, matmuls, decode GEMMs)
step ceilings_full "$TAIL_S" ceilings_once "${A_CEIL_FULL[@]}"
cp "$WORK/ceilings-full/ceilings.json" "$OUT/ceilings.json" 2>/dev/null

# 8. the cost model, fitted with the measured ceilings beside the run
[ -f "$WORK/sweep/ceilings.json" ] || cp "$WORK/ceilings-copy/ceilings.json" "$WORK/sweep/" 2>/dev/null
step fit 60 "$PY" -m roofline.cli.fit "results_dir=$WORK/sweep"
cp "$WORK/sweep/fit.json" "$OUT/fit.json" 2>/dev/null

# 8b. the MoE run's fit (its group records moe_impl: the experts it ran); it comes back in the bundle
[ -f "$WORK/sweep-moe/ceilings.json" ] || cp "$WORK/ceilings-copy/ceilings.json" "$WORK/sweep-moe/" 2>/dev/null
step fit_moe 40 "$PY" -m roofline.cli.fit "results_dir=$WORK/sweep-moe"

# 9. a prediction from the fit
step predict 20 "$PY" -m roofline.cli.predict "${A_PREDICT[@]}"
cp "$WORK/predict/predict.csv" "$OUT/predict.csv" 2>/dev/null

# 10. the goals, T(q)/T(1), failures: summary.md and sweep.csv
step summary 0 "$PY" scripts/devcheck.py summary --work "$WORK" --out "$OUT"
bundle
cat "$OUT/summary.md" 2>/dev/null
echo "outputs: $(ls "$OUT" | tr '\n' ' ') ($(( $(date +%s) - T0 ))s)" >&2
exit $FAILED
