"""`statebench prefill` end to end on tiny (slow tier: several lavapipe builds): the stateful
page (dispatched) and ORT's CPU EP (stepped) at K = 1 and 4 to two depths, every point's
next K tokens matching the reference; the table and the statebench-prefill/1 file."""

from __future__ import annotations

import json

import pytest

from harness import prefill
from tests.stop_run import stop_once_saved
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
    assert data["complete"] is True
    assert "statebench prefill · tiny" in text and f"results: {out}" in text
    assert err.count("prefill: ") == len(pts)


def test_a_model_as_given_prefills_through_its_k_token_graphs(tmp_path):
    """`prefill --model` on genai's export: its K-token graphs from an empty cache on ORT's
    copy mode and the stateful page, the next K tokens' logits checked against ORT's CPU EP
    walked one token a run on the reference's graph; the standard mode, which runs
    statebench's own export only, unavailable with why."""
    from tests.test_cli import ROOT

    MODELS = ROOT / "tests" / "models"  # the committed exports (not a held-out set)

    out = tmp_path / "prefill.json"
    backends = "ort-cpu:copy,ort-cpu:standard" + (",wgpu:stateful" if PAGE_OK else "")
    rc, _, err = cli("prefill", "--model", MODELS / "genai-llama", "--backends", backends,
                     "--chunks", "1,4", "--contexts", "8", "--reps", "1", "--out", out)
    assert rc == 0, err[-2000:]
    data = json.loads(out.read_text())
    assert data["workload"]["model"]["path"].endswith("model.onnx")
    for p in data["points"]:
        if p["backend"] == "ort-cpu:standard":
            assert p["status"] == "unavailable" and "not a model as given" in p["reason"]
        else:
            assert p["status"] == "ok" and p["match"]["ok"], p


def test_prefill_model_and_preset_together_are_one_line():
    from tests.test_cli import ROOT, one_line_error, statebench

    MODELS = ROOT / "tests" / "models"  # the committed exports (not a held-out set)

    says = one_line_error(statebench("prefill", "--model", MODELS / "genai-llama", "--preset",
                                     "tiny"))
    assert "--model and --preset" in says


def test_a_terminated_prefill_keeps_its_points(tmp_path):
    """SIGTERM (a device call's time limit) part way: the points measured so far are in the
    file, each whole, marked incomplete; the exit status is 143 and no lock is left."""
    pytest.importorskip("onnxruntime")
    out = tmp_path / "prefill.json"
    rc, stderr = stop_once_saved(
        ["prefill", "--preset", "tiny", "--backends", "ort-cpu:standard,ort-cpu:copy",
         "--chunks", "1,2,4", "--contexts", ",".join(str(8 * i) for i in range(1, 33)),
         "--reps", "20", "--out", out], out, lambda f: bool(json.loads(f.read_text())["points"]))
    assert rc == 143, stderr
    data = json.loads(out.read_text())
    assert data["schema"] == prefill.SCHEMA and data["complete"] is False
    assert 1 <= len(data["points"]) < 32 * 2 * 3
    assert all(p["status"] == "ok" and p["match"]["ok"] for p in data["points"])
    kept = stderr.split("terminated; ")[1].split(" points kept")[0]
    assert int(kept) >= len(data["points"])  # a point may end between its save and the stop
    assert not (tmp_path / f".{out.name}.lock").exists()
