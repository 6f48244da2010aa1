"""`statebench prefill` end to end on tiny (slow tier: several lavapipe builds): the stateful
page (dispatched) and ORT's CPU EP (stepped) at K = 1 and 4 to two depths, every point's
next K tokens matching the reference; the table and the statebench-prefill/1 file."""

from __future__ import annotations

import json

import pytest

from harness import prefill
from tests.test_prefill import PAGE_OK, PAGE_WHY, cli


@pytest.mark.skipif(not PAGE_OK, reason=PAGE_WHY)
def test_command_writes_the_table_and_the_file(tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "prefill.json"
    rc, text, err = cli("prefill", "--preset", "tiny", "--backends", "wgpu:stateful,ort-cpu:standard",
                        "--chunks", "1,4", "--contexts", "8,16", "--reps", "1", "--out", out)
    assert rc == 0, err + text
    data = json.loads(out.read_text())
    assert data["schema"] == prefill.SCHEMA and data["workload"]["preset"] == "tiny"
    pts = data["points"]
    assert [(p["context"], p["backend"], p["chunk"]) for p in pts] == [
        (d, b, k) for d in (8, 16) for b in ("wgpu:stateful", "ort-cpu:standard") for k in (1, 4)]
    for p in pts:
        assert p["status"] == "ok" and p["match"]["ok"], p
        assert p["dispatches"] == p["context"] // p["chunk"]
        assert p["how"] == ("dispatched" if p["backend"] == "wgpu:stateful" else "stepped")
        assert p["wall_ms"] > 0 and p["tokens_per_s"] > 0
    assert "statebench prefill · tiny" in text and f"results: {out}" in text
    assert err.count("prefill: ") == len(pts)
