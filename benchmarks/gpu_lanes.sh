#!/usr/bin/env bash
# Pipeline stages side by side on one lent, offline GPU under a deadline, keeping what they measured under OUTDIR as
# they go (a call cut short still returns it). Small students leave most of an H200 idle, so independent chains share
# it. Pack the bundle here first (`python -m benchmarks.gpu_bundle pack --params PARAMS`), carry `.gpu`, and run there:
#
#     bash benchmarks/gpu_lanes.sh SECONDS OUTDIR PARAMS PHASE...
#
# A PHASE is lanes separated by ';', a lane is `stage/item` (or `stage`) steps separated by ',' (run one after another, each with
# `flows.stage --upstream`, so what a step needs and is not yet fresh runs first); the lanes of a phase run side by
# side, the phases one after another. Lanes of one phase must not share a stale upstream stage (two processes would
# build it at once): put it in an earlier phase. Run again on the same machine, it goes on from the fresh stages.
# OUTDIR gets env.txt, unpack.log, stages.log (every step's console, prefixed by its lane) and results.tgz (metrics/,
# reports/ and the models' small JSON/CSV files).
set -u
budget=$1 out=$2 params=$3
shift 3
mkdir -p "$out"
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
export PYTHONUNBUFFERED=1 DISTILLERY_TRACKING=off TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  grep -m1 'model name' /proc/cpuinfo; grep -o -m1 -w -E 'amx_bf16|avx512_bf16|avx512_vnni' /proc/cpuinfo | sort -u
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$out/env.txt" 2>&1
python3 -m benchmarks.gpu_bundle unpack > "$out/unpack.log" 2>&1 || { tail -20 "$out/unpack.log"; exit 1; }

save() {
  tar czf "$out/results.tgz" metrics reports \
    $(find models -maxdepth 5 \( -name '*.json' -o -name '*.csv' \) ! -name 'tokenizer*' -size -2M 2>/dev/null) 2>/dev/null
}
lane() {  # lane NAME STEPS: the steps one after another, until one fails or under 30 s are left
  local name=$1 step s item
  IFS=',' read -ra steps <<< "$2"
  for step in "${steps[@]}"; do
    s=$(left)
    if [ "$s" -lt 30 ]; then echo "[$name] left out $step: ${s} s left" >> "$out/stages.log"; return 1; fi
    echo "[$name] $step at $(( $(date +%s) - t0 )) s" >> "$out/stages.log"
    item=(); [ "${step#*/}" = "$step" ] || item=(--item "${step#*/}")  # `stage` alone: a stage without items
    timeout "$s" python3 -m flows.stage "${step%%/*}" "${item[@]}" --upstream --params "$params" 2>&1 \
      | grep -av $'\r' | sed -u "s/^/[$name] /" >> "$out/stages.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "[$name] $step failed" >> "$out/stages.log"; return 1; }
    echo "[$name] $step done at $(( $(date +%s) - t0 )) s" >> "$out/stages.log"
  done
}

p=0
for phase in "$@"; do
  p=$((p + 1))
  IFS=';' read -ra lanes <<< "$phase"
  i=0
  for steps in "${lanes[@]}"; do
    i=$((i + 1))
    lane "$p.$i" "$steps" &
  done
  wait
  save
done
echo "done in $(( $(date +%s) - t0 )) s" >> "$out/stages.log"
grep -a -E '^\[[0-9.]+\] (.* (done at|failed|left out)|.*(error|Error|F1|f1))' "$out/stages.log" | tail -60
