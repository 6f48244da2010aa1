#!/usr/bin/env bash
# Issue 31 items 3 and 5 on a GPU: the four rollback ways on the WebNN library (wgpu) at
# hybrid-1b's shapes (one GDN layer: Hk 16, Hv 32, 128 x 128, its conv inputs; one
# attention layer's KV rows), K = 2, 4, 8, acceptance 0, K/2, K: deferred, extension,
# snapshot and cpu_replay (genai's ReplayStateUpdates: the state to the host, NumPy replay,
# the state back), with the device replay speedup (cpu_replay time / deferred time) per
# step, and for the replays alone: the deferred way's replay launches timed alone by GPU
# timestamps (wall-time slope where there are none) against cpu_replay's host round trip
# timed alone (replay_only). Bytes and launches are as on a CPU adapter; the times are the GPU's.
#
#   scripts/gpu_rollback.sh [OUTDIR]
#
# Writes OUTDIR/rollback.json and OUTDIR/rollback.txt (the table, and any error). OUTDIR
# defaults to results/h200/rollback-<date>-<commit>. Env: STATEBENCH_GPU_BUDGET_S (540: the
# run is sent SIGTERM then).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/h200/rollback-$(date +%F)-$(git rev-parse --short HEAD 2>/dev/null || echo tree)}"
if [ -x .venv/bin/python ]; then
  # a development checkout: the venv has the packages. gpu_env.sh is the offline GPU box's
  # (it unpacks .gl/*.deb into / wherever ld's cache has no libvulkan.so.1).
  py=.venv/bin/python
  export PYTHONUNBUFFERED=1
else
  . scripts/gpu_env.sh  # sets $py
fi
mkdir -p "$out"
timeout -s TERM "${STATEBENCH_GPU_BUDGET_S:-540}" \
  "$py" -m harness.speculative.webnn_rollback --preset hybrid-1b --k 2 4 8 \
    --capacity 8192 --reps 20 --out "$out/rollback.json" 2>&1 | tee "$out/rollback.txt"
echo "results: $out/rollback.json"
