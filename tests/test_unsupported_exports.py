"""Real exports statebench cannot run, refused in one line each (tests/models-unsupported/).

genai 0.18's one export with compact state updates (``state_update_capacity``, the verify
graph issue 31 names) is a CUDA float16 paged-attention graph: the builder allows
GatedDeltaNet for the CUDA EP only, ``state_update_capacity`` only with
``use_paged_attention``, and paged attention only in float16/bfloat16
(``scripts/make_test_models.py --exporters genai-gdn --out tests/models-unsupported``).
Its KV is a block pool (``num_blocks``), which WebNN's static shapes cannot take and ORT's
CPU EP cannot run (no PagedAttention kernel), so neither a page nor the reference runs it."""

from __future__ import annotations

import json
from pathlib import Path

from harness.model_info import inspect_model
from tests.test_cli import statebench

MODELS = Path(__file__).parent / "models-unsupported"
GDN = MODELS / "genai-gdn-qwen35"


def test_the_manifest_says_what_made_the_export():
    (entry,) = json.loads((MODELS / "manifest.json").read_text())["models"]
    assert entry["name"] == "genai-gdn-qwen35"
    assert "state_update_capacity=4" in entry["exporter"]
    assert "use_paged_attention=true" in entry["exporter"] and "-e cuda" in entry["exporter"]


def test_inspect_names_why_each_family_cannot_run_it():
    report = inspect_model(GDN, capacity=64)
    outputs = {o["name"] for o in report["outputs"]}
    assert {"state_update.0.recurrent_capsule", "state_update.0.conv_value"} <= outputs
    why = report["backends"]
    assert "num_blocks" in why["webnn-stateful"]["why_not"]
    assert "PagedAttention" in why["ort-cpu"]["why_not"]
    assert not any(b["runs"] for b in why.values())


def test_run_and_speculative_refuse_it_in_one_line(tmp_path):
    for cmd in (("run", "--steps", "2"), ("speculative", "--k", "4", "--tokens", "2")):
        proc = statebench(*cmd, "--model", GDN, "--backends", "ort-cpu:copy",
                          "--contexts", "8", "--warm-s", "0", "--out", tmp_path / "x.json")
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "num_blocks" in lines[0], proc.stderr
        assert not (tmp_path / "x.json").exists()
