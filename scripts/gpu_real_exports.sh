#!/usr/bin/env bash
# Full-size real exports measured on the GPU box (issue 30 items 1 and 4), in one call:
#
#   STATEBENCH_GPU_TARBALL=$OUT/real.tgz scripts/gpu_real_exports.sh /tmp/real-out
#
# 1. builds a randomly initialised Llama-3.2-1B (its published configuration, written in
#    scripts/real_export.py; seed 0) and exports it with onnxruntime-genai's builder twice,
#    `-p int4 -e webgpu` (q4f16) without and with `--extra_options enable_webgpu_graph=true`
#    (graph capture), offline, into $STATEBENCH_REAL_WORK (default /tmp/statebench-real;
#    kept, so a second call on the same warm machine skips what is built);
# 2. at each context, ascending: the `llama-1b+q4f16` preset on wgpu:stateful, then each
#    export on wgpu:stateful, ort-webgpu:* and ort-genai:webgpu (`statebench run --model`),
#    --steps 32 --repeat 2 --warmup 2, one results file per run in OUTDIR;
# 3. with STATEBENCH_REAL_SPEC_K (e.g. 4), the speculative loop on each export as given
#    (`statebench speculative --model`, STATEBENCH_REAL_SPEC_BACKENDS, default wgpu:stateful;
#    STATEBENCH_SPEC_ACCEPT, default full,0.7,zero) at each context, after the runs;
# 4. packs OUTDIR into $STATEBENCH_GPU_TARBALL after every run, and prints a short summary
#    last (one line a point, the loop's too).
# Every run gets what is left of $STATEBENCH_GPU_BUDGET_S (default 540 s from the start; a run
# stopped at the limit keeps its points, SIGTERM); runs that no longer fit are named as
# skipped. A run that finished leaves NAME.json.done: a second call with the same OUTDIR
# runs only the rest. Needs, besides what scripts/gpu_env.sh installs, torch, transformers,
# onnx_ir and onnxruntime-genai (cp312) in .whl/, as a wheel
# (EXTRA_WHEELS="wgpudawn==0.32.0.4 onnxruntime-genai==0.18.0" ../shared/gpu/prepare.sh) or
# as onnxruntime_genai-*.tar.xz (the installed package tree, extracted into /tmp/site).
# STATEBENCH_REAL_EXPORTS (default "nograph graph") picks the exports built and run;
# STATEBENCH_REAL_PRESET= (empty) leaves the preset's runs out. STATEBENCH_REAL_KERNEL_OPTIONS
# (KEY=VALUE,...: the wgpu pages' knobs, `statebench run --kernel-option`) applies to the
# exports' runs, named with STATEBENCH_REAL_TAG appended (an A/B on the export a warm call
# made: the same call again with the options and a tag).
set -uo pipefail
out=${1:?usage: scripts/gpu_real_exports.sh OUTDIR}
start=$(date +%s)
budget=${STATEBENCH_GPU_BUDGET_S:-540}
cd "$(dirname "$0")/.."
. scripts/gpu_env.sh
# onnxruntime-genai travels as its cp312 wheel or as that wheel's package tree packed with
# tar (onnxruntime_genai-*.tar.xz, smaller for the 64 MiB carry); either goes into /tmp/site
if ! "$py" -c "import onnxruntime_genai" 2>/dev/null; then
  mkdir -p /tmp/site
  for w in .whl/onnxruntime_genai-*.whl; do
    [ -f "$w" ] && "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w"
  done
  for t in .whl/onnxruntime_genai-*.tar.xz; do [ -f "$t" ] && tar xJf "$t" -C /tmp/site; done
  export PYTHONPATH=/tmp/site:$PWD
fi
mkdir -p "$out"
work=${STATEBENCH_REAL_WORK:-/tmp/statebench-real}
model=${STATEBENCH_REAL_MODEL:-llama-3.2-1b}
ep=${STATEBENCH_REAL_EP:-webgpu}
backends=${STATEBENCH_REAL_BACKENDS:-'wgpu:stateful,ort-webgpu:*,ort-genai:webgpu'}
preset=${STATEBENCH_REAL_PRESET-llama-1b+q4f16}
exports=${STATEBENCH_REAL_EXPORTS:-nograph graph}
contexts=${STATEBENCH_GPU_CONTEXTS:-512,8192}
sweep=(--steps "${STATEBENCH_GPU_STEPS:-32}" --repeat "${STATEBENCH_GPU_REPEAT:-2}" --warmup 2)
[ "${STATEBENCH_GPU_CALIBRATE:-1}" = 0 ] && sweep+=(--no-calibrate)
left() { echo $((budget - ($(date +%s) - start))); }
pack() { if [ -n "${STATEBENCH_GPU_TARBALL:-}" ]; then tar czf "$STATEBENCH_GPU_TARBALL" -C "$out" .; fi; }
say() { echo "[gpu_real_exports $(date +%H:%M:%S) +$(($(date +%s) - start))s] $*" | tee -a "$out/log.txt"; }
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu \
    --format=csv -lms 250 > "$out/nvidia-smi.csv" 2>&1 &
  smi=$!
  trap 'kill $smi 2> /dev/null || true' EXIT
fi
missing=$("$py" -c "
import importlib.util as u
print(' '.join(m for m in ('torch', 'transformers', 'tokenizers', 'onnx', 'onnx_ir', 'tqdm',
                           'onnxruntime', 'onnxruntime_genai', 'onnxruntime_ep_webgpu', 'wgpu')
               if u.find_spec(m) is None))")
[ -n "$missing" ] && say "missing Python modules: $missing (the builder or a backend will fail)"
"$py" -m harness.cli backends > "$out/backends.txt" 2>&1
grep -E "ort-genai|ort-webgpu:shared|wgpu:stateful" "$out/backends.txt" | tee -a "$out/log.txt"

say "building and exporting $model ($ep, int4) into $work"
specs=()
for x in $exports; do
  case $x in
    nograph) specs+=(--export "nograph:int4:$ep") ;;
    graph) specs+=(--export "graph:int4:$ep:enable_webgpu_graph=true") ;;
    *) say "STATEBENCH_REAL_EXPORTS: unknown export $x (nograph, graph)"; exit 2 ;;
  esac
done
timeout -s TERM "$(left)" "$py" scripts/real_export.py --model "$model" --work "$work" "${specs[@]}" \
  > "$out/export.log" 2>&1 || say "real_export.py exited $? (tail of export.log follows)"
grep -v "matmul_nbits_quantizer" "$out/export.log" | tail -n 8 | tee -a "$out/log.txt"
cp "$work/$model.json" "$out/" 2>/dev/null
for x in $exports; do cp "$work/$model-$x/genai_config.json" "$out/genai_config-$x.json" 2>/dev/null; done
pack

# one run: NAME, then statebench run's own arguments (the context is the loop's)
run() {
  local name=$1 f="$out/$1.json" t
  shift
  if [ -f "$f.done" ]; then say "$name: done in an earlier call, kept"; return; fi
  t=$(left)
  if [ "$t" -lt 45 ]; then say "$name: skipped, ${t}s of the budget left"; return; fi
  say "$name: statebench run $* (limit $((t - 10))s)"
  timeout -s TERM $((t - 10)) "$py" -m harness.cli run "$@" "${sweep[@]}" --out "$f" --force \
    > "$out/$name.log" 2>&1
  local rc=$?
  if [ $rc = 0 ]; then touch "$f.done"; else say "$name: exited $rc (log: $name.log)"; fi
  pack
}
knobs=()
knob_list=${STATEBENCH_REAL_KERNEL_OPTIONS:-}  # unset: none (set -u)
for kv in ${knob_list//,/ }; do knobs+=(--kernel-option "$kv"); done
tag=${STATEBENCH_REAL_TAG:+-$STATEBENCH_REAL_TAG}
for ctx in ${contexts//,/ }; do
  [ -n "$preset" ] && run "preset-d$ctx" --preset "$preset" --backends wgpu:stateful --contexts "$ctx"
  for x in $exports; do
    m="$work/$model-$x/model.onnx"
    if [ -f "$m" ]; then
      run "$x-d$ctx$tag" --model "$m" --backends "$backends" --contexts "$ctx" "${knobs[@]}"
    else
      say "$x-d$ctx: no export at $m"
    fi
  done
done
# the speculative loop on each export as given (STATEBENCH_REAL_SPEC_K, e.g. "4": off where
# empty), at each depth, on STATEBENCH_REAL_SPEC_BACKENDS (default the stateful page)
spec_k=${STATEBENCH_REAL_SPEC_K:-}
if [ -n "$spec_k" ]; then
  for ctx in ${contexts//,/ }; do
    for x in $exports; do
      m="$work/$model-$x/model.onnx" f="$out/spec-$x-d$ctx.json"
      t=$(left)
      if [ -f "$f.done" ] || [ ! -f "$m" ]; then continue; fi
      if [ "$t" -lt 60 ]; then say "spec-$x-d$ctx: skipped, ${t}s of the budget left"; continue; fi
      say "spec-$x-d$ctx: statebench speculative --model $m --k $spec_k (limit $((t - 10))s)"
      timeout -s TERM $((t - 10)) "$py" -m harness.cli speculative --model "$m" \
        --backends "${STATEBENCH_REAL_SPEC_BACKENDS:-wgpu:stateful}" --k "$spec_k" \
        --accept "${STATEBENCH_SPEC_ACCEPT:-full,0.7,zero}" --contexts "$ctx" \
        --tokens "${STATEBENCH_SPEC_TOKENS:-32}" --warm-s 1 --out "$f" --force \
        > "$out/spec-$x-d$ctx.log" 2>&1 && touch "$f.done" || say "spec-$x-d$ctx: exited $?"
      tail -n 20 "$out/spec-$x-d$ctx.log" | grep -v "^  " >> "$out/log.txt"
      pack
    done
  done
fi
say "done"
"$py" scripts/real_export.py --summary "$out"/*.json | tee "$out/summary.txt"
pack
