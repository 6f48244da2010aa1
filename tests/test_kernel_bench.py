"""scripts/kernel_bench.py, as the GPU A/B script runs it: one subprocess on a tiny preset
with an option, checked for results the measurement can trust (errors against the oracle,
finite logits, the profile); an unknown option is one line and a non-zero exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from model.workload import preset

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "kernel_bench.py"


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_kernel_bench_runs_with_an_option():
    proc = bench("--gemv", "64x40", "--gemv-variants", "auto,rows_u8", "--attn", "96",
                 "--attn-variants", "auto,s8", "--step", "tiny:32", "--steps", "2", "--warm",
                 "0.2", "--profile", "--option", "gemv_prologue=off", "--reps", "2",
                 "--budget", "0.2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert [g["variant"] for g in out["gemv"]] == ["auto", "rows_u8"]
    assert all(g["max_abs_err"] < 1e-4 for g in out["gemv"])
    assert all(a["max_abs_err"] < 1e-5 for a in out["attention"]), out["attention"]
    step = out["step"][0]
    assert "error" not in step, step.get("trace")
    assert step["logits_finite"] and step["launches"] > 0
    assert step["options"]["gemv_prologue"] == "off"
    assert 0 < step["warm_steps"] <= 32 - 2 - 1
    assert sum(k["n"] for name, k in step["profile"].items() if not name.startswith("_")) \
        == step["launches"]
    assert sum(k["n"] for k in step["profile"]["_by_grid"].values()) == step["launches"]
    assert out["provenance"]["source_digest"] and out["provenance"]["argv"][0] == "--gemv"


def test_kernel_bench_costs_each_kind_of_launch():
    """--launch-costs: every launch of the step falls in one kind (kernel and grid), each
    kind left out and doubled against the step beside it, an empty launch's cost at
    each grid from passes of two lengths, and a pure-read twin of each kind that moves
    enough bytes, at its grid and the twins' own."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from launch_costs import (
        EMPTY_COUNTS,
        EMPTY_GRIDS,
        TWIN_GRIDS,
        TWIN_MAX_BYTES,
        TWIN_MIN_BYTES,
    )

    proc = bench("--gemv", "none", "--attn", "none", "--step", "tiny:32", "--steps", "2",
                 "--warm", "0", "--launch-costs", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = json.loads(proc.stdout)["step"][0]
    assert "error" not in step, step.get("trace")
    costs = step["launch_costs"]
    assert costs["_rounds"] == 2 and costs["step_ms"] > 0
    assert sum(k["n"] for k in costs["kinds"].values()) == step["launches"]
    assert all({"drop_ms", "twice_ms", "drop_us_each", "twice_us_each"} <= set(k)
               for k in costs["kinds"].values())
    empty = costs["empty_launch"]
    assert all(len(empty[f"grid {x}"]["pass_ms"]) == len(EMPTY_COUNTS) for x in EMPTY_GRIDS)
    twins = costs["read_twins"]["kinds"]  # tiny's products: a pure read at their grids
    assert twins and set(twins) <= set(costs["kinds"])
    for t in twins.values():
        assert TWIN_MIN_BYTES <= t["bytes"] <= TWIN_MAX_BYTES
        assert all(t[f"us_at_{g}"] > 0 for g in (t["grid"], *TWIN_GRIDS))


def test_kernel_bench_steps_a_model_file():
    """--step PATH.onnx:CAPACITY: a real export's step, as statebench run --model builds it
    (its ids read, launches costed), with no preset's byte figures."""
    model = ROOT / "tests" / "models" / "genai-q4f16-llama" / "model.onnx"
    proc = bench("--gemv", "none", "--attn", "none", "--step", f"{model}:32", "--steps", "2",
                 "--warm", "0", "--read", "ids", "--launch-costs", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = json.loads(proc.stdout)["step"][0]
    assert "error" not in step, step.get("trace")
    assert step["launches"] > 0 and step["weights_bytes"] is None and step["read"] == "ids"
    assert sum(k["n"] for k in step["launch_costs"]["kinds"].values()) == step["launches"]


def test_kernel_bench_profiles_another_page():
    """--mode times and profiles a page that binds its caches (reuse), here with the vec4
    cache copy of FINDINGS 18's A/B: the copies show in the profile; --host-profile says
    where the host spent the steps (the read-back among them)."""
    proc = bench("--gemv", "none", "--attn", "none", "--step", "tiny:32", "--steps", "2",
                 "--warm", "0", "--profile", "--mode", "wgpu:reuse", "--option",
                 "cache_copy=vec4", "--host-profile")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = json.loads(proc.stdout)["step"][0]
    assert "error" not in step, step.get("trace")
    assert step["mode"] == "wgpu:reuse" and step["logits_finite"]
    assert step["profile"]["copy_vec4"]["n"] == step["kernels"]["copy_vec4"] > 0
    fns = {r["function"].rsplit(":", 1)[-1]: r for r in step["host_profile"]}
    assert fns["step"]["calls_per_step"] == 1 and fns["_read_tensors"]["cumulative_ms"] > 0


def test_kernel_bench_profiles_buffer_copies():
    """A plan's buffer-to-buffer copies (reuse with `cache_copy=buffer`) are timed too, each
    between two passes, with the bytes it reads and writes: every launch is in the profile."""
    proc = bench("--gemv", "none", "--attn", "none", "--step", "tiny:32", "--steps", "2",
                 "--warm", "0", "--profile", "--mode", "wgpu:reuse", "--option",
                 "cache_copy=buffer")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = json.loads(proc.stdout)["step"][0]
    assert "error" not in step, step.get("trace")
    copies = step["profile"]["copy_buffer_to_buffer"]
    assert copies["n"] == step["kernels"]["copy_buffer_to_buffer"] > 0
    cfg = preset("tiny")  # K and V of each attention layer, capacity 32, float32, read + written
    kv_bytes = 2 * len(cfg.attention_layers) * cfg.kv_heads * 32 * cfg.head_dim * 4
    assert copies["bytes"] == 2 * kv_bytes and copies["ms"] >= 0
    assert sum(k["n"] for name, k in step["profile"].items() if not name.startswith("_")) \
        == step["launches"]


def test_kernel_bench_counts_submits_and_maps():
    """The step result says how many queue submits and buffer maps each timed step made
    (with its GPU-time read): one of each with the read copy, and with
    ``read_copy=separate`` a submit and a map more (the read's copy, the timestamps)."""
    for option, want in (("read_copy=", (1, 1)), ("read_copy=separate", (2, 2))):
        proc = bench("--gemv", "none", "--attn", "none", "--step", "tiny:24", "--steps", "3",
                     "--warm", "0", "--option", option)
        assert proc.returncode == 0, proc.stderr[-2000:]
        step = json.loads(proc.stdout)["step"][0]
        assert "error" not in step, step.get("trace")
        assert (step["submits_per_step"], step["maps_per_step"]) == want, option


def test_kernel_bench_reads_ids():
    """--read ids: the page reads each row's argmax id, not the logits, still one submit
    and one map a step (the ids ride in the dispatch's read copy), for a verify's K rows
    too."""
    proc = bench("--gemv", "none", "--attn", "none", "--step", "tiny:24", "--steps", "3",
                 "--warm", "0", "--tokens", "2", "--read", "ids")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = json.loads(proc.stdout)["step"][0]
    assert "error" not in step, step.get("trace")
    assert step["read"] == "ids" and step["kernels"]["arg_max"] == 1, step["kernels"]
    assert (step["submits_per_step"], step["maps_per_step"]) == (1, 1)


def test_kernel_bench_times_the_chained_decode():
    """--read chain: the ids steps, then the chained decode (each step's ids fed to the next
    on the device) timed as wall per token, one submit and one map a token, its GPU time
    labelled as the un-chained ids steps' of the same graph; --tokens > 1 is an error."""
    proc = bench("--gemv", "none", "--attn", "none", "--step", "tiny:24", "--steps", "3",
                 "--warm", "0", "--read", "chain")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = json.loads(proc.stdout)["step"][0]
    assert "error" not in step, step.get("trace")
    chain = step["read"] == "chain" and step["chain"]
    assert chain["tokens"] == 3 and chain["wall_ms_per_token"] > 0 and chain["ids_in_vocab"]
    assert (chain["submits_per_token"], chain["maps_per_token"]) == (1, 1)
    assert chain["gpu_ms"] is None and chain["gpu_ms_unchained_ids"] == step.get("gpu_ms")
    proc = bench("--gemv", "none", "--attn", "none", "--step", "tiny:24", "--steps", "2",
                 "--warm", "0", "--read", "chain", "--tokens", "2")
    assert "--tokens 1" in json.loads(proc.stdout)["step"][0]["error"]


def test_kernel_bench_steps_at_a_depth():
    """--depth reaches the depth as a sweep does (random cache values written into the page's
    caches; no steps before the timed ones) and times the steps there; a depth that leaves
    no room for the steps is an error in the result."""
    proc = bench("--gemv", "none", "--attn", "none", "--step", "tiny:24", "--steps", "2",
                 "--warm", "0.3", "--depth", "16", "--mode", "wgpu:reuse")
    assert proc.returncode == 0, proc.stderr[-2000:]
    step = json.loads(proc.stdout)["step"][0]
    assert "error" not in step, step.get("trace")
    assert step["depth"] == 16 and step["logits_finite"] and step["warm_steps"] == 0
    proc = bench("--gemv", "none", "--attn", "none", "--step", "tiny:24", "--steps", "8",
                 "--warm", "0", "--depth", "16")
    assert "does not fit capacity 24" in json.loads(proc.stdout)["step"][0]["error"]


def test_unknown_option_is_one_line():
    proc = bench("--gemv", "none", "--attn", "none", "--step", "none", "--option", "nope=1")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown option 'nope'" in lines[0], proc.stderr


def test_bad_option_values_are_one_line_before_anything_runs():
    """A value KernelOptions refuses, given as an option or as a variant, stops the run
    before any context is made: one line naming the knob, exit 2, nothing on stdout."""
    for args, knob in ((("--option", "gdn=fused3"), "gdn"),
                       (("--gemv", "8x8", "--gemv-variants", "auto,fastest"), "gemv"),
                       (("--attn", "96", "--attn-variants", "s0"), "attention_splits")):
        proc = bench("--gemv", "none", "--attn", "none", "--step", "none", *args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and not proc.stdout, proc.stderr
        assert len(lines) == 1 and f"KernelOptions.{knob} =" in lines[0], proc.stderr


def test_attention_bench_float16_cache_and_one_launch():
    """--attn-cache float16 with the two- and one-launch kernels (flash1:sN): each row
    checked against float64 NumPy over the float16 values, its bytes 2 an element, its
    kernels the variant's; a cache type outside float32/float16 is one line, exit 2."""
    proc = bench("--gemv", "none", "--step", "none", "--attn", "300", "--attn-cache",
                 "float16,float32", "--attn-variants", "flash,flash1:s8", "--reps", "2",
                 "--budget", "0.2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["attention"]
    assert [(r["variant"], r["cache"]) for r in rows] == [
        (v, c) for v in ("flash", "flash1:s8") for c in ("float16", "float32")]
    for r in rows:
        assert "error" not in r, r.get("trace")
        assert r["max_abs_err"] < 1e-5, r
        assert r["bytes"] == (2 if r["cache"] == "float16" else 4) * 2 * 8 * 300 * 64
        one = r["variant"].startswith("flash1")
        assert r["kernels"] == (["attention_flash1"] if one else
                                ["attention_flash", "attention_combine"]), r
    proc = bench("--gemv", "none", "--step", "none", "--attn", "96", "--attn-cache", "bfloat16")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and not proc.stdout and len(lines) == 1, proc.stderr


def test_kernel_bench_times_4bit_variants():
    """--gemv-q4 with --q4-variants: each 4-bit variant per shape (K and N off the tiles),
    checked against float64, the kernel it ran, GB/s over the bytes it must move (alike
    for every variant); the step profiled under a pinned q4_gemv."""
    proc = bench("--gemv", "none", "--attn", "none", "--gemv-q4", "96x77,64x40",
                 "--q4-variants", "fused,multi,multi2_l8_u2,wide_h", "--step", "tiny+q4:32",
                 "--steps", "2", "--warm", "0", "--profile", "--option", "q4_gemv=multi",
                 "--reps", "2", "--budget", "0.2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    runs = out["gemv_q4"]
    assert [(r["variant"], r["shape"]) for r in runs] == [
        (v, s) for s in ("96x77", "64x40") for v in ("fused", "multi", "multi2_l8_u2", "wide_h")]
    for r in runs:  # float16 products (wide_h, where the adapter has them) within 2e-3
        assert "error" not in r, r.get("trace")
        assert r["max_rel_err"] < (2e-3 if r["variant"] == "wide_h" else 1e-5) and r["GBps"] > 0
        assert r["kernel"] == [{"fused": "gemv_q4", "wide_h": "gemv_q4_wide"}.get(
            r["variant"], "gemv_q4_multi")]
    assert runs[0]["bytes"] == runs[1]["bytes"] == runs[2]["bytes"]
    step = out["step"][0]
    assert "error" not in step, step.get("trace")
    assert step["options"]["q4_gemv"] == "multi" and step["profile"]["gemv_q4_multi"]["n"] > 0


def test_kernel_bench_times_a_verifys_half_products_by_column():
    """``--gemv-q4 --q4-rows 4 --option q4_rows=cols_h`` (``gpu_verify_ab.sh``'s per-shape
    A/B): the K-row product by column with float16 products on the benchmark's float16
    weights (a +q4f16 model's), within their random-data bound of float64; with
    ``--q4-weights float32`` the same variant multiplies in float32."""
    from backends.webnn.adapter import wgpu_adapter

    adapter, _ = wgpu_adapter("wgpu")  # the script's engine
    f16 = adapter is not None and "shader-f16" in adapter.features
    for weights in ("float16", "float32"):
        proc = bench("--gemv", "none", "--attn", "none", "--step", "none", "--gemv-q4",
                     "256x77", "--q4-rows", "4", "--q4-variants", "auto", "--option",
                     "q4_rows=cols_h", "--q4-weights", weights, "--reps", "2", "--budget",
                     "0.2")
        assert proc.returncode == 0, proc.stderr[-2000:]
        (r,) = json.loads(proc.stdout)["gemv_q4"]
        assert "error" not in r, r.get("trace")
        assert r["kernel"] == ["gemm_q4_cols"] and r["rows"] == 4 and r["weights"] == weights
        half = weights == "float16" and f16
        assert r["half_products"] == half
        assert r["max_rel_err"] < (3e-3 if half else 1e-5)


def test_host_profile_breaks_down_a_page_step():
    """scripts/host_profile.py times a page's steps and splits the host's share into its
    parts (write, submit, wait, copy, ...), whose sum is the step; the output names the code
    that ran."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "host_profile.py"), "--points",
                           "tiny:32", "--pages", "wgpu:stateful", "--steps", "4",
                           "--warm-steps", "2", "--encode-reps", "3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    point = out["points"][0]
    assert "error" not in point, point.get("trace")
    parts = point["host_breakdown_ms"]
    assert point["wall_ms"] > 0 and parts["wait"] >= 0 and parts["total"] > 0
    assert out["provenance"]["source_digest"]


def test_fastest_verify_picks_the_least_gpu_time_and_passes_over_untimed(tmp_path):
    """scripts/fastest_verify.py (the loop's knobs in gpu_verify_then_loop.sh): the knobs of
    the step with the least GPU time; a file cut by its timeout is passed over; the defaults
    (no knob set) print as an empty line."""
    def step(name: str, gpu: float | None, **options) -> str:
        path = tmp_path / f"verify-{name}.json"
        body = {"step": [] if gpu is None else
                [{"gpu_ms": gpu, "options": {"q4_rows": None, **options}}]}
        path.write_text(json.dumps(body))
        return str(path)

    def pick(*paths: str) -> str:
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "fastest_verify.py"),
                               *paths], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    cut = step("cut", None)
    (tmp_path / "verify-empty.json").write_text("")
    quad = step("quad", 2.1, q4_rows="quad", attention_rows="lanes")
    default = step("default", 2.9)
    assert pick(default, cut, quad, str(tmp_path / "verify-empty.json")) == \
        "attention_rows=lanes q4_rows=quad"
    assert pick(default, cut) == ""
    assert pick(cut) == ""
