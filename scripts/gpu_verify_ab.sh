#!/usr/bin/env bash
# Issue 31's verify kernels on a GPU, in one call (the same host for every variant):
#
#   scripts/gpu_verify_ab.sh OUTDIR [PRESET:CAPACITY] [K]
#
# 1. the K-row 4-bit products alone (llama-1b's shapes) per `q4_rows` variant (rows, cols,
#    cols2, cols4): OUTDIR/products-<variant>.json;
# 2. one K-token verify step of PRESET (default llama-1b+q4f16:8200, K 4) launch by launch
#    (`kernel_bench.py --step ... --tokens K --profile`) once per entry of
#    STATEBENCH_VERIFY_VARIANTS (space-separated; each entry KEY=VALUE knobs joined by commas;
#    default: q4_rows=cols, q4_rows=cols4, and cols4 with the verify's q rows in one
#    workgroup a split as before the q-row groups, attention_q_rows=16):
#    OUTDIR/verify-<entry>.json (`=` and `,` as `-` and `_`).
# STATEBENCH_VERIFY_PRODUCTS (default "rows cols cols2 cols4") picks step 1's variants ("" skips).
# Each measurement runs under a timeout within STATEBENCH_GPU_BUDGET_S (540 s in all).
set -uo pipefail
out=${1:?usage: scripts/gpu_verify_ab.sh OUTDIR [PRESET:CAPACITY] [K]}
step=${2:-llama-1b+q4f16:8200}
k=${3:-4}
start=$(date +%s)
budget=${STATEBENCH_GPU_BUDGET_S:-540}
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
mkdir -p "$out"
left() { echo $((budget - ($(date +%s) - start))); }
say() { echo "[gpu_verify_ab $(date +%H:%M:%S) +$(($(date +%s) - start))s] $*" | tee -a "$out/log.txt"; }
for v in ${STATEBENCH_VERIFY_PRODUCTS-rows cols cols2 cols4}; do
  say "products, q4_rows=$v, $k rows"
  timeout "$(( $(left) < 60 ? $(left) : 60 ))" "$py" scripts/kernel_bench.py --gemv none --attn none \
    --gemv-q4 all --q4-rows "$k" --q4-variants auto --option "q4_rows=$v" --step none \
    --budget 0.5 --reps 10 > "$out/products-$v.json" 2>> "$out/log.txt" || say "products $v: exit $?"
done
for v in ${STATEBENCH_VERIFY_VARIANTS:-q4_rows=cols q4_rows=cols4 q4_rows=cols4,attention_q_rows=16}; do
  name=$(echo "$v" | tr '=,' '-_')
  [ "$(left)" -gt 30 ] || { say "verify $v: skipped, budget spent"; continue; }
  opts=()
  for o in ${v//,/ }; do opts+=(--option "$o"); done
  say "verify step $step, K=$k, $v"
  timeout "$(left)" "$py" scripts/kernel_bench.py --gemv none --attn none --step "$step" \
    --tokens "$k" --steps 8 --warm 2 --profile "${opts[@]}" \
    > "$out/verify-$name.json" 2>> "$out/log.txt" || say "verify $v: exit $?"
done
say done
