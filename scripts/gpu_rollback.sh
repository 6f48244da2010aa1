#!/usr/bin/env bash
# Issue 31 item 3 on a GPU: the three rollback ways on the WebNN library (wgpu) at
# hybrid-1b's shapes (one GDN layer: Hk 16, Hv 32, 128 x 128, its conv inputs; one
# attention layer's KV rows), K = 2, 4, 8, acceptance 0, K/2, K. Bytes and launches are
# as on lavapipe; the times are the GPU's. Usage: scripts/gpu_rollback.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/h200/rollback-$(date +%F)-$(git rev-parse --short HEAD)}"
mkdir -p "$out"
.venv/bin/python -m harness.speculative.webnn_rollback --preset hybrid-1b --k 2 4 8 \
    --capacity 8192 --reps 20 --out "$out/rollback.json" | tee "$out/rollback.txt"
echo "results: $out/rollback.json"
