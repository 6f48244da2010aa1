#!/usr/bin/env bash
# The recorded GPU sweep, as run on the project's H200 machine (results/h200/).
#
#   scripts/gpu_sweep.sh OUTDIR [PRESET...]
#
# On a box with network: `pip install -e .[webgpu]` first. On an offline box (the H200 here),
# run `../shared/gpu/prepare.sh` on a connected machine and send `.whl/` and `.gl/` with the
# checkout: this script installs them into /tmp/site. Writes one results JSON per preset into
# OUTDIR with its charts and HTML report in OUTDIR/PRESET-report/, and prints a short summary
# last; `statebench report` remakes the charts anywhere. STATEBENCH_GPU_TARBALL=FILE: OUTDIR
# packed into FILE (tar.gz) after each preset and at the end, for a machine that returns only a
# few files a call (OUTDIR elsewhere, FILE in $OUT).
set -euo pipefail
out=${1:?usage: scripts/gpu_sweep.sh OUTDIR [PRESET...]}
shift || true
presets=("${@:-llama-1b hybrid-1b}")
presets=(${presets[@]})
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
mkdir -p "$out"
# the GPU's clocks, power and load for the whole call, every 250 ms (FINDINGS 16); each point
# also records its own clock during its timed steps (details.sm_clock_mhz)
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu \
    --format=csv -lms 250 > "$out/nvidia-smi.csv" 2>&1 &
  smi=$!
  trap 'kill $smi 2> /dev/null || true' EXIT
fi
"$py" -m harness.cli backends | tee "$out/backends.txt"
# wgpu:fallback is left out: its counters and kernels equal wgpu:reuse's by construction
backends=${STATEBENCH_GPU_BACKENDS:-'wgpu:stateless,wgpu:reuse,wgpu:stateful,ort-webgpu:*'}
contexts=${STATEBENCH_GPU_CONTEXTS:-512,2048,8192,16384}
# file names from preset names with only [A-Za-z0-9._-] ('llama-1b+f16kv' -> 'llama-1b_f16kv'):
# the H200 machine returns no file whose name has other characters
safe() { printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_'; }
# 32 timed steps a process: the median's 95 % interval is then [x_10, x_23] of the sorted
# steps, so nine slow steps on either side (a cold first step, a stall) cannot move it, where
# 8 steps give the full range; 3 fresh processes a point, so the interval takes in the spread
# between processes (README "Intervals and orderings")
pack() { if [ -n "${STATEBENCH_GPU_TARBALL:-}" ]; then tar czf "$STATEBENCH_GPU_TARBALL" -C "$out" .; fi; }
for p in "${presets[@]}"; do
  "$py" -m harness.cli run --preset "$p" --backends "$backends" --contexts "$contexts" \
    --steps "${STATEBENCH_GPU_STEPS:-32}" --repeat "${STATEBENCH_GPU_REPEAT:-3}" --warmup 2 \
    --out "$out/$(safe "$p").json" || echo "run $p exited $?"
  pack
done
for p in "${presets[@]}"; do
  f="$out/$(safe "$p").json"
  [ -f "$f" ] || continue
  # charts and the HTML report beside the results (STATEBENCH_GPU_REPORT=0: the summary only,
  # e.g. where only a few files may come back from the machine)
  if [ "${STATEBENCH_GPU_REPORT:-1}" != 0 ]; then
    "$py" -m harness.cli report "$f" --out "${f%.json}-report" > /dev/null || true
  fi
  "$py" -m harness.cli report "$f" --format md || true
done
pack
