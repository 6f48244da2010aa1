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
def test_the_command_on_a_hybrid_refuses_its_rollback(tmp_path):
    """tiny (a GDN layer and an attention layer), through the worker processes: a verify
    that keeps all K runs and passes (the GDN state checked where both fed the same
    tokens); a rollback is refused per point, naming the pairs and the missing input."""
    out = tmp_path / "spec.json"
    proc = statebench("speculative", "--preset", "tiny", "--backends", "wgpu:stateful", "--k", "2",
                      "--accept", "full,zero", "--contexts", "4", "--tokens", "4", "--warm-s", "0",
                      "--out", out)
    assert proc.returncode == 0, proc.stderr
    full, zero = sorted(load(out).points, key=lambda p: p["acceptance"])
    assert full["status"] == "ok" and e2e_render.passed(full), full
    assert zero["status"] == "unavailable"
    assert "past_state.0" in zero["reason"] and "accepted_count" in zero["reason"]
    assert "statebench speculative · tiny" in proc.stdout and "✓" in proc.stdout
    assert json.loads(out.read_text())["schema"] == "statebench-spec/2"
