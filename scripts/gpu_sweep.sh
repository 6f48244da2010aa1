#!/usr/bin/env bash
# The recorded GPU sweep, as run on the project's H200 machine (results/h200/).
#
#   scripts/gpu_sweep.sh OUTDIR [PRESET...]
#
# On a box with network: `pip install -e .[webgpu]` first. On an offline box (the H200 here),
# run `../shared/gpu/prepare.sh` on a connected machine and send `.whl/` and `.gl/` with the
# checkout: this script installs them into /tmp/site. Writes one results JSON per preset into
# OUTDIR with its charts and HTML report in OUTDIR/PRESET-report/, and prints a short summary
# last; `statebench report` remakes the charts anywhere.
set -euo pipefail
out=${1:?usage: scripts/gpu_sweep.sh OUTDIR [PRESET...]}
shift || true
presets=("${@:-llama-1b hybrid-1b}")
presets=(${presets[@]})
cd "$(dirname "$0")/.."
if [ -d .gl ] && ! ldconfig -p | grep -q libvulkan.so.1; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -f "$icd" ]; then
  export VK_DRIVER_FILES=$icd
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
py=${PYTHON:-python3}
if [ -d .whl ] && ! "$py" -c "import wgpu, onnxruntime_ep_webgpu" 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 STATEBENCH_CACHE=${STATEBENCH_CACHE:-/tmp/statebench-cache}
mkdir -p "$out"
"$py" -m harness.cli backends | tee "$out/backends.txt"
backends=${STATEBENCH_GPU_BACKENDS:-'wgpu:stateless,wgpu:reuse,wgpu:stateful,wgpu:fallback,ort-webgpu:*'}
contexts=${STATEBENCH_GPU_CONTEXTS:-512,2048,8192,16384}
for p in "${presets[@]}"; do
  "$py" -m harness.cli run --preset "$p" --backends "$backends" --contexts "$contexts" \
    --steps "${STATEBENCH_GPU_STEPS:-8}" --warmup 2 --out "$out/$p.json" || echo "run $p exited $?"
done
for p in "${presets[@]}"; do
  [ -f "$out/$p.json" ] || continue
  # charts and the HTML report beside the results (STATEBENCH_GPU_REPORT=0: the summary only,
  # e.g. where only a few files may come back from the machine)
  if [ "${STATEBENCH_GPU_REPORT:-1}" != 0 ]; then
    "$py" -m harness.cli report "$out/$p.json" --out "$out/$p-report" > /dev/null || true
  fi
  "$py" -m harness.cli report "$out/$p.json" --format md || true
done
