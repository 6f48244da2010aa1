#!/usr/bin/env bash
# Issue 31 item 4 on a GPU: the speculative loop end to end (docs/speculative.md) on the
# WebNN pages, one depth a call (a depth of 8192 fits in one 10-minute call of the H200
# machine; the weights and graphs are made by the first call and kept in $STATEBENCH_CACHE).
#
#   scripts/gpu_speculative.sh OUTDIR CONTEXT [PRESET]
#
# Env: STATEBENCH_SPEC_BACKENDS (default the three pages), STATEBENCH_SPEC_K (4,8),
# STATEBENCH_SPEC_ACCEPT (full,0.7,zero), STATEBENCH_SPEC_TOKENS (32),
# STATEBENCH_SPEC_OPTIONS (KEY=VALUE kernel knobs, space-separated: --kernel-option each),
# STATEBENCH_SPEC_READ (logits, or ids: the pages read their argmax ids, --read),
# STATEBENCH_GPU_BUDGET_S (540: the run is sent SIGTERM then and keeps every point its
# workers sent; their progress lines say where it was). Writes
# OUTDIR/spec-<preset>-d<CONTEXT>.json and .txt (the table and the progress).
set -euo pipefail
out=${1:?usage: scripts/gpu_speculative.sh OUTDIR CONTEXT [PRESET]}
ctx=${2:?usage: scripts/gpu_speculative.sh OUTDIR CONTEXT [PRESET]}
preset=${3:-llama-1b+q4f16}
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
mkdir -p "$out"
# the H200 machine returns no file whose name has characters outside [A-Za-z0-9._-]
name="spec-$(printf '%s' "$preset" | tr -c 'A-Za-z0-9._-' '_')-d$ctx"
opts=()
for o in ${STATEBENCH_SPEC_OPTIONS:-}; do opts+=(--kernel-option "$o"); done
COLUMNS=${COLUMNS:-160} timeout -s TERM "${STATEBENCH_GPU_BUDGET_S:-540}" \
  "$py" -m harness.cli speculative --preset "$preset" \
    --backends "${STATEBENCH_SPEC_BACKENDS:-wgpu:stateless,wgpu:reuse,wgpu:stateful}" \
    --k "${STATEBENCH_SPEC_K:-4,8}" --accept "${STATEBENCH_SPEC_ACCEPT:-full,0.7,zero}" \
    --contexts "$ctx" --tokens "${STATEBENCH_SPEC_TOKENS:-32}" --warm-s 1 ${opts[@]+"${opts[@]}"} \
    --read "${STATEBENCH_SPEC_READ:-logits}" \
    --out "$out/$name.json" --force 2>&1 | tee "$out/$name.txt"
