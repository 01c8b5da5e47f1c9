#!/usr/bin/env bash
# One call on a lent, offline GPU machine (issue 36), highest value first, under a deadline, keeping what it measured
# under OUTDIR as it goes (a call cut short still returns it). Pack the bundle here first (`python -m
# benchmarks.gpu_bundle pack`), carry `.gpu`, and run there, in the project:
#
#     bash benchmarks/gpu_run.sh SECONDS OUTDIR [PARAMS]        (LOOP=0: without benchmarks.gpu_loop)
#
# 1. unpack the bundle; 2. benchmarks.gpu at the paper's shapes and at the preset's (each step eager and compiled, with
# its kernel profile) and benchmarks.gpu_loop (the pipeline's training loop under loader options and compiled, its host
# profile and a device trace); 3. the preset's general
# distillation (and what it needs); 4. its TinyBERT student on MRPC and on SQuAD, each with its teacher and direct
# baseline, the two tasks side by side on the one GPU; 5. their evaluate stages one at a time (latency is timed alone).
# OUTDIR gets env.txt, bench.log, profile.txt, loop.log, host_profile.txt, trace.json.gz, stages.log (the stages'
# console) and results.tgz (metrics/, reports/ and the models' small JSON/CSV files): 8 files, the most a call returns
# (unpack.log in place of env.txt when the unpack fails).
set -u
budget=${1:-520}
out=${2:-${OUT:-gpu-out}}
params=${3:-params/gpu.yaml}
mkdir -p "$out"
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
export PYTHONUNBUFFERED=1 DISTILLERY_TRACKING=off TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
py=python3

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$out/env.txt" 2>&1
$py -m benchmarks.gpu_bundle unpack > /tmp/unpack.log 2>&1 || { mv /tmp/unpack.log "$out/"; tail -20 "$out/unpack.log"; exit 1; }
timeout 240 $py -m benchmarks.gpu --profile "$out" 2>&1 | tee "$out/bench.log"
timeout 150 $py -m benchmarks.gpu --shapes preset --no-aug --profile "$out" 2>&1 | tee -a "$out/bench.log"
if [ "${LOOP:-1}" = 1 ]; then  # the loop's options, host profile, trace (LOOP=0 leaves it out)
  timeout 240 $py -m benchmarks.gpu_loop --out "$out" > "$out/loop.log" 2>&1
fi

save() {
  tar czf "$out/results.tgz" metrics reports \
    $(find models -maxdepth 5 \( -name '*.json' -o -name '*.csv' \) ! -name 'tokenizer*' -size -2M 2>/dev/null) 2>/dev/null
}
stage() {  # stage item: that stage after all it needs, unless under 30 s are left
  local s
  s=$(left)
  if [ "$s" -lt 30 ]; then echo "left out $1[$2]: ${s} s left" >> "$out/stages.log"; return 1; fi
  timeout "$s" $py -m flows.stage "$1" --item "$2" --upstream --params "$params" >> "$out/stages.log" 2>&1
}

stage general_distillation tinybert4 || { save; echo "general distillation did not finish" >> "$out/stages.log"; exit 1; }
save
for task in mrpc squad; do
  (stage task_distillation "tinybert4:$task" && stage baseline "tinybert4:$task") &
done
wait
save
for task in mrpc squad; do
  stage evaluate "$task"
  save
done
echo "done in $(($(date +%s) - t0)) s" >> "$out/stages.log"
grep -av $'\r' "$out/stages.log" | tail -40
