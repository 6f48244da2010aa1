#!/usr/bin/env bash
# Issue 31 in one device call: the K-token verify's kernel variants A/B'd on one machine
# (scripts/gpu_verify_ab.sh), then the speculative loop at CONTEXT on the variant whose
# verify had the least GPU time (scripts/gpu_speculative.sh), so the loop's figure is the
# best verify's without a second call to flip a default.
#
#   scripts/gpu_verify_then_loop.sh OUTDIR [CONTEXT]
#
# Env: STATEBENCH_VERIFY_VARIANTS (the A/B's entries, as gpu_verify_ab.sh; default cols,
# lanes, quad, quad with lanes), STATEBENCH_AB_BUDGET_S (210), STATEBENCH_SPEC_* as
# gpu_speculative.sh (default here: K 4, acceptance 0.7,full,zero, the stateful page, ids
# read, STATEBENCH_GPU_BUDGET_S 200). Writes OUTDIR/ab/ (the A/B), OUTDIR/best.txt (the
# knobs picked, "" for the defaults) and OUTDIR/loop/ (the loop's results and table).
# STATEBENCH_GPU_TARBALL=FILE packs OUTDIR into FILE after each half (a device call returns
# at most 8 files from $OUT: docs/gpu.md), so a run stopped in the loop keeps the A/B.
set -uo pipefail
out=${1:?usage: scripts/gpu_verify_then_loop.sh OUTDIR [CONTEXT]}
ctx=${2:-8192}
cd "$(dirname "$0")/.."
mkdir -p "$out"
pack() { if [ -n "${STATEBENCH_GPU_TARBALL:-}" ]; then tar czf "$STATEBENCH_GPU_TARBALL" -C "$out" .; fi; }
trap pack EXIT
STATEBENCH_VERIFY_PRODUCTS= \
STATEBENCH_VERIFY_VARIANTS=${STATEBENCH_VERIFY_VARIANTS:-"q4_rows=cols attention_rows=lanes q4_rows=quad q4_rows=quad,attention_rows=lanes"} \
STATEBENCH_GPU_BUDGET_S=${STATEBENCH_AB_BUDGET_S:-210} scripts/gpu_verify_ab.sh "$out/ab"
. scripts/gpu_env.sh
pack
best=$("$py" scripts/fastest_verify.py "$out"/ab/verify-*.json)
echo "$best" > "$out/best.txt"
echo "[gpu_verify_then_loop] the loop on: ${best:-the defaults}"
STATEBENCH_SPEC_OPTIONS="$best" STATEBENCH_SPEC_READ=${STATEBENCH_SPEC_READ:-ids} \
STATEBENCH_SPEC_K=${STATEBENCH_SPEC_K:-4} STATEBENCH_SPEC_ACCEPT=${STATEBENCH_SPEC_ACCEPT:-0.7,full,zero} \
STATEBENCH_SPEC_BACKENDS=${STATEBENCH_SPEC_BACKENDS:-wgpu:stateful} \
STATEBENCH_GPU_BUDGET_S=${STATEBENCH_GPU_BUDGET_S:-200} scripts/gpu_speculative.sh "$out/loop" "$ctx"
