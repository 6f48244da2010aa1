#!/usr/bin/env bash
# A/B of compiler options on one decode step, as run on the project's H200 machine
# (results/h200/*/kernels-ab-*/, backends/webnn/PERFORMANCE.md):
#
#   scripts/gpu_kernel_ab.sh OUTDIR [PRESET:CAPACITY] [KEY=VALUE ...]
#
# One `scripts/kernel_bench.py --profile` run with the defaults, then one per KEY=VALUE
# (several knobs of one variant joined by '+': attention=tile_t128+attention_loads=first)
# (a knob of backends/webnn/wgpu_impl/options.py's KernelOptions; for a bad one kernel_bench
# exits 2 with one line in OUTDIR/ab.log), all in one call so the GPU and host are the same; writes
# OUTDIR/ab-<name>.json and prints wall / GPU time and launches per variant last. Each variant
# steps for 3 s before it is timed (kernel_bench --warm) so the clocks ramp; still, compare the
# variants with each other rather than with sweep files. STATEBENCH_AB_MODE picks the page
# (default wgpu:stateful; e.g. wgpu:reuse with cache_copy=identity for FINDINGS 18);
# STATEBENCH_AB_ARGS adds kernel_bench flags to every variant (e.g. '--depth 8192' with
# llama-1b:8202: the steps timed at that depth over random caches, as a sweep's are;
# '--launch-costs 24': what each kind of launch costs the step, without timestamps within it).
set -euo pipefail
out=${1:?usage: scripts/gpu_kernel_ab.sh OUTDIR [PRESET:CAPACITY] [KEY=VALUE ...]}
step=${2:-llama-1b:8192}
shift 2 || shift $#
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
mkdir -p "$out"
run() {  # name, options...
  local name=$1; shift
  "$py" scripts/kernel_bench.py --gemv none --attn none --step "$step" --profile \
    --mode "${STATEBENCH_AB_MODE:-wgpu:stateful}" ${STATEBENCH_AB_ARGS:-} "$@" \
    > "$out/ab-$name.json" 2>> "$out/ab.log" || echo "variant $name exited $?"
}
run default
for kv in "$@"; do  # KEY=VALUE, or several joined by '+' for one variant
  opts=()
  IFS='+' read -ra parts <<< "$kv"
  for p in "${parts[@]}"; do opts+=(--option "$p"); done
  run "$(echo "$kv" | sed 's/=/-/g; s/+/__/g')" "${opts[@]}"
done
"$py" - "$out" <<'PY'
import glob, json, os, sys
for f in sorted(glob.glob(os.path.join(sys.argv[1], "ab-*.json"))):
    try:
        s = json.load(open(f))["step"][0]
    except (ValueError, KeyError, IndexError) as exc:
        print(f"{os.path.basename(f)}: no result ({exc!r})")
        continue
    print(f"{os.path.basename(f)[3:-5]:32s} launches {s.get('launches')}  wall {s.get('wall_ms', 0):.2f} ms"
          f"  GPU {s.get('gpu_ms', float('nan')):.2f} ms  submits/maps per step"
          f" {s.get('submits_per_step')}/{s.get('maps_per_step')}  {s.get('error', '')}")
    lc = s.get("launch_costs")
    if lc:  # kernel_bench --launch-costs: what leaving each kind out saves, per launch
        print(f"  one pass {lc['step_ms']:.3f} ms; left out saves: " + ", ".join(
            f"{k} {v['drop_us_each']:.1f} us x{v['n']}" for k, v in list(lc["kinds"].items())[:6]))
        tw = lc.get("read_twins", {}).get("kinds", {})
        if tw:  # a pure read of each kind's bytes at its grid and at 132 / 264 workgroups
            print("  read twins: " + ", ".join(
                f"{k} {lc['kinds'][k]['drop_us_each']:.1f} us vs read "
                + "/".join(f"{v[g]:.1f}" for g in v if g.startswith("us_at_"))
                for k, v in tw.items()))
        e = lc["empty_launch"]
        print("  an empty launch: " + ", ".join(f"{g} {v['us_a_launch']:.2f} us"
                                                 for g, v in e.items() if g.startswith("grid")))
PY
