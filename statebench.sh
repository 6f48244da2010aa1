#!/usr/bin/env bash
# statebench's two commands, each setting itself up first:
#
#   ./statebench.sh run  [statebench run flags...]   the default sweep (preset small, no GPU needed)
#   ./statebench.sh test [pytest flags...]           the test suite
#
# Setup (idempotent): create .venv, `pip install -e .[test,webgpu]`, and — as root, when wgpu
# finds no adapter or only an OpenGL one (no 'shader-f16', no subgroups) — `apt-get install -y
# mesa-vulkan-drivers` (lavapipe, a CPU Vulkan driver); where Dawn finds none on Debian 12,
# Mesa 25's lavapipe from bookworm-backports (setup_dawn).
set -euo pipefail
cd "$(dirname "$0")"

PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.statebench-installed

say() { printf 'statebench.sh: %s\n' "$*" >&2; }

setup_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PY" -m venv "$VENV"
  fi
  if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    say "installing statebench into $VENV"
    if ! { "$VENV/bin/python" -m pip install -q --upgrade pip &&
           "$VENV/bin/python" -m pip install -q -e '.[test,webgpu]'; } >"$VENV/pip.log" 2>&1; then
      cat "$VENV/pip.log" >&2
      say "pip install failed (log above, also in $VENV/pip.log)"
      exit 1
    fi
    touch "$STAMP"
  fi
}

# the backend API of wgpu's adapter (Vulkan, Metal, D3D12, OpenGL); nothing when there is none,
# or when the driver crashed while wgpu enumerated adapters (that ends only this child python)
adapter_backend() {
  "$VENV/bin/python" - <<'PY' 2>/dev/null || true
import wgpu
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
print(adapter.info["backend_type"] if adapter is not None else "")
PY
}

setup_vulkan() {
  local backend found="no WebGPU adapter" then="the wgpu backends will be marked unavailable"
  backend=$(adapter_backend)
  case "$backend" in
    Vulkan|Metal|D3D12) return ;;
    ?*) found="only an $backend WebGPU adapter"
        then="the wgpu backends run on $backend, without 'shader-f16' (float16 caches) or subgroups" ;;
  esac
  if dpkg -s mesa-vulkan-drivers >/dev/null 2>&1; then
    say "$found although mesa-vulkan-drivers is installed; $then"
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "$found: installing mesa-vulkan-drivers (lavapipe)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers
  else
    say "$found; run as root (apt-get install -y mesa-vulkan-drivers) to get lavapipe, or $then"
  fi
}

# Dawn (the dawn:* backends, wgpudawn) refuses Mesa 22's lavapipe, Debian 12's stock one; Mesa
# 25's from bookworm-backports works for it and for wgpu-native (docs/dawn.md). Installed as
# root on Debian 12 where Dawn finds no adapter; elsewhere only said.
setup_dawn() {
  if "$VENV/bin/python" -c 'import sys, wgpudawn
sys.exit(0 if wgpudawn.gpu.request_adapter_sync() is not None else 1)' >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null &&
     grep -qs 'VERSION_CODENAME=bookworm' /etc/os-release; then
    say "Dawn finds no adapter: installing mesa-vulkan-drivers from bookworm-backports (Mesa 25)"
    echo 'deb http://deb.debian.org/debian bookworm-backports main' \
      >/etc/apt/sources.list.d/bookworm-backports.list
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq -t bookworm-backports mesa-vulkan-drivers
  else
    say "Dawn (wgpudawn) finds no adapter; the dawn backends will be unavailable (on Debian 12," \
        "as root: mesa-vulkan-drivers from bookworm-backports)"
  fi
}

# the Vulkan loader complains without a runtime dir
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
  export XDG_RUNTIME_DIR="${TMPDIR:-/tmp}/statebench-xdg-$(id -u)"
  mkdir -p -m 700 "$XDG_RUNTIME_DIR"
fi

cmd=${1:-}
shift || true
case "$cmd" in
  run)
    setup_venv
    setup_vulkan
    setup_dawn
    exec "$VENV/bin/statebench" run "$@"
    ;;
  test)
    setup_venv
    setup_vulkan
    setup_dawn
    # one worker a core, at most 4 (pytest-xdist; "-n 0" after it runs them in this process);
    # the slow tier (tests/conftest.py SLOW_MODULES) only when asked: -m slow, or -m "" for all
    # (.ci/run runs both tiers)
    marks=(-m "not slow")
    for a in "$@"; do case "$a" in -m|-m*) marks=() ;; esac; done
    exec "$VENV/bin/python" -m pytest -q -n auto --maxprocesses 4 "${marks[@]}" "$@"
    ;;
  *)
    echo "usage: ./statebench.sh run [statebench run flags...] | ./statebench.sh test [pytest flags...]" >&2
    exit 2
    ;;
esac
