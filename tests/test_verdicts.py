"""The cell, cache traffic and sentences (harness/verdicts.py) on recorded and simulated runs."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest

from harness import html_report, report, results, stats, verdicts

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "results/h200/2026-11-29-c1a75bb/llama-1b-512-2048.json"


@pytest.fixture(scope="module")
def llama() -> results.Results:
    return results.load(LLAMA)


def test_cache_traffic_from_categories_and_specs(llama):
    cfg = verdicts.model_config(llama)
    # llama-1b at 512, capacity 522: 16 layers × K and V × 8 heads × 522 rows × 64 × 4 B
    full = 16 * 2 * 8 * 522 * 64 * 4
    assert full == 34209792
    stateless, reuse, stateful = (verdicts.cache_traffic(llama.point(b, 512), cfg)
                                  for b in ("wgpu:stateless", "wgpu:reuse", "wgpu:stateful"))
    # up: the cache and the 8-byte token id; down: the presents, less 128256 float32 logits
    assert stateless.link == 34209800 + 34722816 - 128256 * 4 == 2 * full + 8
    assert stateless.copied == full and stateless.in_place == 0
    assert (reuse.link, reuse.copied, reuse.in_place) == (0, full, 0)
    # in place: one K and V row per layer (16 × 2 × 8 × 64 × 4 B), nothing moved
    assert (stateful.link, stateful.copied, stateful.in_place) == (0, 0, 16 * 2 * 8 * 64 * 4)
    assert stateful.moved == 0 and reuse.moved == full


def test_old_file_intervals_from_details_samples(llama):
    p = llama.point("wgpu:reuse", 512)
    assert p.repeats is None and p.step_ms_ci is None
    iv = verdicts.interval_of(p)
    # 8 steps: no pair of order statistics reaches 95 %, so the range: the 6.129 ms first step
    assert (iv.low, iv.high) == (2.881907, 6.128996)
    # the old warning (stdev 26 %) was one transient: recomputed, the point is not noisy
    assert p.details["warning"].startswith("unstable") and verdicts.warning_of(p) == ""
    assert any("timed step 0 took 6.129 ms" in n for n in verdicts.transient_notes(p))


def test_cell_states_speedup_only_outside_the_noise(llama):
    cfg = verdicts.model_config(llama)
    cells = {b: verdicts.cell(llama, llama.point(b, 512), cfg)
             for b in ("wgpu:stateless", "wgpu:stateful", "ort-webgpu:captured",
                       "ort-webgpu:shared")}
    assert cells["wgpu:stateless"].verdict == ""  # the baseline itself
    assert cells["wgpu:stateful"].lines() == ["2.809 ms", "[2.740, 2.947]", "cache 0 B",
                                              "✓ 4.61× faster"]
    assert cells["ort-webgpu:captured"].verdict == "no difference"
    assert cells["ort-webgpu:shared"].verdict == "1.14× slower"


def _with_samples(r: results.Results, backend: str, ctx: int, reps: list[list[float]]) -> None:
    p = r.point(backend, ctx)
    r.points[r.points.index(p)] = replace(
        p, repeats=[{"step_ms": s, "gpu_ms": None, "wall_s": 1.0} for s in reps],
        step_ms=results.Stats.of([x for s in reps for x in s]),
        step_ms_ci=stats.interval(reps).to_dict())


def test_sentences_say_no_difference_where_intervals_overlap(llama):
    r = copy.deepcopy(llama)
    # stateful and reuse at 512 drawn from overlapping spreads, three processes each
    _with_samples(r, "wgpu:stateful", 512, [[2.8, 2.9, 3.0] * 4, [3.0, 3.1] * 6, [2.9] * 12])
    _with_samples(r, "wgpu:reuse", 512, [[2.95, 3.05] * 6, [3.1, 3.2] * 6, [2.85] * 12])
    said = " ".join(verdicts.sentences(r))
    assert "wgpu:stateful against wgpu:reuse: no difference" in said
    # and where they separate at every process, an ordering with its size
    _with_samples(r, "wgpu:reuse", 512, [[3.4, 3.5] * 6, [3.45] * 12, [3.5, 3.6] * 6])
    said = " ".join(verdicts.sentences(r))
    assert "wgpu:stateful against wgpu:reuse: 1.2" in said and "× faster" in said
    assert "wgpu:stateless moved 65.3 MiB of cache across the host link" in said


def test_reports_lead_with_the_same_sentences_and_cell(llama):
    runs = report.label_runs([llama])
    said = report.run_sentences(runs)
    md = report.to_markdown(runs)
    page = html_report.render(runs, {})
    assert md.index(said[0]) < md.index("| context |") < md.index("workload:")
    assert page.index(said[0].split(":")[0]) < page.index("<table>") < page.index("workload:")
    assert "2.809 ms<br>[2.740, 2.947]<br>cache 0 B<br>✓ 4.61× faster" in md
    assert "2.809 ms<br>[2.740, 2.947]<br>cache 0 B<br>✓ 4.61× faster" in page


def test_cpu_adapter_says_the_bytes_are_the_evidence():
    r = results.load(ROOT / "results/lavapipe/run-small-default.json")
    line = verdicts.cpu_adapter_sentence(r, verdicts.model_config(r))
    assert "(CPU)" in line and "the cache bytes are the evidence" in line
    assert "at 512 the cache is 2% of the bytes" in line


def test_genai_float32_logits_are_not_counted_as_cache():
    """genai hands float32 logits of a float16 graph: read as the graph's float16 ones, the
    other half looked like 250.5 KiB of cache crossing the link (recorded 2026-12-05 on an
    H100, before genai's points carried ``logits_bytes``)."""
    run = results.load(ROOT / "results/h100/2026-12-05-5bde1d9/call1/graph-d8192.json")
    state = verdicts.model_state(run)
    genai = run.point("ort-genai:webgpu", 8192)
    assert genai.bytes_per_step["d2h"] == 128256 * 4 == 2 * state.logits
    assert verdicts.cache_traffic(genai, state).link == 128256 * 2  # the old reading
    fixed = replace(genai, details={**genai.details, "logits_bytes": 128256 * 4})
    assert verdicts.cache_traffic(fixed, state).link == 0
    stateful = run.point("wgpu:stateful", 8192)  # float16 logits in the graph's own type
    assert verdicts.cache_traffic(stateful, state).link == 0
