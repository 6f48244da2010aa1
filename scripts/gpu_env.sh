# Sourced by the GPU scripts: on an offline box (the project's H200), unpack the Vulkan loader
# from .gl/ and install the wheels from .whl/ (../shared/gpu/prepare.sh fills both on a
# connected machine); point the loader at the NVIDIA ICD where there is one. Sets $py.
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
# (wgpudawn: the dawn:* backends; prepare.sh needs EXTRA_WHEELS=wgpudawn==0.32.0.4 for it)
if [ -d .whl ] && ! "$py" -c "import wgpu, wgpudawn, onnxruntime_ep_webgpu" 2>/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  # a wheel repacked as its installed tree (*.tar.xz, smaller for the 64 MiB a call carries)
  for t in .whl/*.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C /tmp/site; done
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 STATEBENCH_CACHE=${STATEBENCH_CACHE:-/tmp/statebench-cache}
