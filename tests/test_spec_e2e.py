"""The end-to-end speculative loop on every page (issue 31 item 4, docs/speculative.md),
the slow tier: every page at K = 2 and 4 for full, partial, zero and a rate, tokens equal
to greedy, logits and state as feeding only the accepted tokens; the other wrong
rollbacks failing; a hybrid's rollback refused with its reason; and the command through
its worker processes. The quick part: tests/test_spec_loop.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.speculative import e2e_render
from harness.speculative.spec_results import load
from tests.spec_workloads import WORKLOAD, config, needs_page, pages
from tests.stop_run import stop_once_saved
from tests.test_spec_loop import assert_wrong_rollback_fails, sweep, wrong_rollbacks

ROOT = Path(__file__).resolve().parents[1]
EVERY_PAGE = ("wgpu:stateless", "wgpu:reuse", "wgpu:stateful", "wgpu:fallback")


@needs_page
def test_every_page_every_acceptance_matches_greedy(tmp_path):
    cfg = config(backends=EVERY_PAGE, ks=(2, 4), accept="full,partial,zero,0.7", tokens=12)
    classes = {n: c for n, c in pages().items() if n in EVERY_PAGE}
    results = sweep(cfg, classes, tmp_path)
    assert len(results.points) == len(EVERY_PAGE) * 2 * 4
    for p in results.points:
        where = (p["backend"], p["k"], p["acceptance"])
        assert p["status"] == "ok", (where, p["reason"])
        assert e2e_render.passed(p), (where, p["state"], p["logits_check"])
        assert p["state"]["vs_replay"]["bitwise"] and p["state"]["position"]["ok"], where
        want_m = {"full": {p["k"] - 1}, "zero": {0}, "partial": set(range(p["k"]))}
        if p["acceptance"] in want_m:
            assert {int(m) for m in p["accepted_hist"]} == want_m[p["acceptance"]], where
    assert e2e_render.notes(results) == []
    e2e_render.table(results)  # renders


@needs_page
@pytest.mark.parametrize("name, accept", [("wgpu:keeps-one-more", "zero"),
                                          ("wgpu:keeps-one-less", "zero"),
                                          ("wgpu:keeps-one-less", "partial")])
def test_other_wrong_rollbacks_fail_the_checks(tmp_path, name, accept):
    assert_wrong_rollback_fails(tmp_path, wrong_rollbacks()[name], accept)


@needs_page
def test_the_page_rolls_back_by_position_once_per_step():
    b = pages()["wgpu:stateful"](tokens_per_step=4)
    b.prepare(WORKLOAD, 24)
    try:
        assert b.rollback_refusal() == ""
        with pytest.raises(ValueError, match="no step"):
            b.accept(4)
        b.step_tokens(np.arange(4))
        with pytest.raises(ValueError, match="kept"):
            b.accept(5)
        b.accept(1)
        assert b.position == 1
        with pytest.raises(ValueError, match="no step"):
            b.accept(1)
        b.step_tokens(np.arange(4))
        b.accept(4)
        assert b.position == 5
    finally:
        b.close()


def statebench(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


@needs_page
def test_a_hybrid_on_every_page_through_the_command(tmp_path):
    """tiny (a GDN layer and an attention layer) through the command and its worker
    processes: the K-token graph is the deferred-commit export, so every acceptance rolls
    back (the KV rows by position, the GDN state and conv window by ``accepted_count``),
    the GDN state checked against the one-token decode's at the same count of tokens."""
    out = tmp_path / "spec.json"
    proc = statebench("speculative", "--preset", "tiny", "--backends", ",".join(EVERY_PAGE),
                      "--k", "2,4", "--accept", "full,partial,zero,0.6", "--contexts", "8",
                      "--tokens", "10", "--warm-s", "0", "--out", out)
    assert proc.returncode == 0, proc.stderr
    points = load(out).points
    assert len(points) == len(EVERY_PAGE) * 2 * 4
    for p in points:
        where = (p["backend"], p["k"], p["acceptance"])
        assert p["status"] == "ok" and e2e_render.passed(p), (where, p["reason"], p.get("state"))
        assert p["rollback"]["strategy"] == "position + accepted_count", where
        assert not p["state"]["vs_plain"]["skipped"], where  # the GDN state was compared
    assert "statebench speculative · tiny" in proc.stdout and "✗" not in proc.stdout
    assert json.loads(out.read_text())["schema"] == "statebench-spec/2"


@needs_page
def test_a_real_hybrid_export_on_every_page_through_the_command(tmp_path):
    """onnxruntime-genai's Qwen3.5 export (LinearAttention, CausalConvWithState) through
    ``speculative --model``: its K-token graph made deferred-commit
    (``backends/webnn/deferred_commit.py``), so every acceptance rolls back on the pages;
    tokens as greedy, logits and state (the GDN and conv pairs included) as the one-token
    decode's, which ORT's CPU EP walk is the reference of. ORT's copy mode runs the same
    rewritten graph."""
    out = tmp_path / "spec.json"
    pages_ = (*EVERY_PAGE[:3], "ort-cpu:copy")
    proc = statebench("speculative", "--model", ROOT / "tests" / "models" / "genai-qwen35",
                      "--backends", ",".join(pages_), "--k", "2,4",
                      "--accept", "full,partial,zero,0.7", "--contexts", "8", "--tokens", "8",
                      "--warm-s", "0", "--inprocess", "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    points = load(out).points
    assert len(points) == len(pages_) * 2 * 4
    for p in points:
        where = (p["backend"], p["k"], p["acceptance"])
        assert p["status"] == "ok" and e2e_render.passed(p), (where, p["reason"], p.get("state"))
        assert p["tokens_match_greedy"] and p["logits_match_plain"] and p["state_ok"], where
        assert p["state_compared"] and not p["state"]["vs_plain"]["skipped"], where
        assert p["rollback"]["strategy"] == "position + accepted_count", where
        assert p["details"]["deferred_commit"]["conv"] == ["past.0.conv", "past.2.conv"], where
    assert any(p["rollback"]["rollbacks"] for p in points)
    assert "✗" not in proc.stdout


@needs_page
def test_a_hybrid_graph_without_the_deferred_commit_refuses_to_roll_back():
    """The ordinary K-token graph of a hybrid (``speculative`` not set): its GDN pairs are
    overwritten by every token, so keeping fewer than K is refused, naming them."""
    from model.workload import Workload, preset

    b = pages()["wgpu:stateful"](tokens_per_step=2)
    b.prepare(Workload.build(preset("tiny")), 16)
    try:
        why = b.rollback_refusal()
        assert "past_state.0" in why and "accepted_count" in why
        b.step_tokens(np.arange(2))
        with pytest.raises(NotImplementedError, match="cannot roll back"):
            b.accept(1)
        b.accept(2)
    finally:
        b.close()


@needs_page
def test_a_terminated_run_keeps_the_points_its_worker_sent(tmp_path):
    """SIGTERM (a device call's time limit) while the worker is still at work: the points
    it sent are in the file, each whole, and the exit status is 143."""

    out = tmp_path / "spec.json"
    rc, stderr = stop_once_saved(
        ["speculative", "--preset", "tiny", "--backends", "wgpu:stateful", "--k", "2,4,8",
         "--accept", "full,zero", "--contexts", "8,16", "--tokens", "10", "--warm-s", "0",
         "--out", out], out, lambda f: bool(load(f).points))
    assert rc == 143, stderr
    points = load(out).points
    assert 1 <= len(points) < 12
    assert all(p["status"] == "ok" for p in points), [p["reason"] for p in points]
    assert "terminated" in stderr
    assert "building the one-token graph" in stderr  # the worker's phases are said


@needs_page
@pytest.mark.parametrize("variant", ["cols", "cols4"])
def test_the_gpus_verify_kernels_roll_back_as_the_cpus(tmp_path, variant):
    """The GPU's several-row 4-bit kernels (``q4_rows`` cols, cols4: the H200's verify
    products) in the whole loop on a q4f16 hybrid: every acceptance on the stateful and
    reuse pages as greedy, its logits and state as feeding only the accepted tokens."""
    out = tmp_path / "spec.json"
    proc = statebench("speculative", "--preset", "tiny+q4f16", "--backends",
                      "wgpu:stateful,wgpu:reuse", "--k", "4,8", "--accept", "full,partial,zero",
                      "--contexts", "16", "--tokens", "10", "--warm-s", "0",
                      "--kernel-option", f"q4_rows={variant}", "--out", out)
    assert proc.returncode == 0, proc.stderr
    points = load(out).points
    assert len(points) == 12
    for p in points:
        assert p["details"]["kernel_options"]["q4_rows"] == variant
        assert p["status"] == "ok" and e2e_render.passed(p), (p["backend"], p["k"], p["reason"])
