"""onnxruntime-genai's own loop (`ort-genai:*`, backends/genai.py) on the committed genai
exports: its greedy tokens are the source model's (tests/models/manifest.json), each step's
logits are ORT's CPU EP's on the same graph (`ort-cpu:copy`, which shares no code with
genai's loop), a sweep's points match the reference, and what it cannot run is refused in
one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from backends.base import DepthState, registry
from backends.ort import webgpu_devices
from harness.model_run import backend_for
from harness.sources import PresetSource
from tests.test_cli import one_line_error, statebench

MODELS = Path(__file__).parent / "models"
MANIFEST = {m["name"]: m for m in json.loads((MODELS / "manifest.json").read_text())["models"]}
EXPORTS = ["genai-llama", "genai-q4f16-llama", "genai-qwen35"]
SWEEP = ["--contexts", "16", "--steps", "4", "--warmup", "1", "--warm-s", "0", "--no-calibrate",
         "--inprocess"]

pytest.importorskip("onnxruntime_genai")


def _model(name: str) -> Path:
    path = MODELS / MANIFEST[name]["path"]
    return path if path.suffix == ".onnx" else path / "model.onnx"


def _logits_tolerance(name: str) -> float:
    """ORT's CPU EP multiplies the q4f16 export's 4-bit products in int8 (accuracy_level 4)
    where genai's CPU session does the same: the two agree to rounding, not to float32."""
    return 1e-2 if "q4f16" in name else 1e-4


@pytest.mark.parametrize("name", EXPORTS)
def test_its_greedy_steps_are_the_source_models_tokens(name):
    """The prompt reached as a depth, then each step fed genai's own greedy pick (the
    `generate_next_token()` path): the source's greedy tokens, every step one, and each
    step's logits those of ORT's CPU EP fed the same tokens."""
    m = MANIFEST[name]
    prompt, want = m["prompt"], m["greedy_tokens"]
    cap = len(prompt) + len(want)
    genai = backend_for(registry()["ort-genai:cpu"], _model(name), None)
    oracle = backend_for(registry()["ort-cpu:copy"], _model(name), None)
    genai.prepare(None, cap)
    oracle.prepare(None, cap)
    try:
        genai.reach_depth(DepthState(tokens=np.array(prompt), cache={}))
        ref = None
        for t in prompt:
            ref = np.array(oracle.step(t), np.float64)
        got: list[int] = []
        for _ in want:
            got.append(int(np.argmax(ref)))
            logits = np.array(genai.step(got[-1]), np.float64)
            ref = np.array(oracle.step(got[-1]), np.float64)
            scale = np.abs(ref).max()
            assert np.abs(logits - ref).max() <= _logits_tolerance(name) * scale
        assert got == want
        loop = genai.details["genai"]
        assert (loop["greedy_steps"], loop["forced_steps"]) == (len(want), 0)
    finally:
        genai.close()
        oracle.close()


@pytest.mark.parametrize("name", ["genai-llama", "genai-qwen35"])
def test_a_sweep_point_matches_and_records_the_loop(name, tmp_path):
    """`statebench run --model` with the manifest's prompt and tokens: the reference gives
    the source's tokens, the point matches the reference, and the loop's configuration is
    the export's genai_config.json's. (Not the q4f16 export: on the CPU EP genai, like
    `ort-cpu:*`, multiplies its MatMulNBits in int8, against float32 products of the
    reference: docs/byom.md.)"""
    m = MANIFEST[name]
    out = tmp_path / "out.json"
    proc = statebench("run", "--model", _model(name), "--backends", "ort-genai:cpu", *SWEEP,
                      "--prompt", ",".join(map(str, m["prompt"])),
                      "--expect-tokens", ",".join(map(str, m["greedy_tokens"][:4])),
                      "--out", out)
    assert proc.returncode == 0, proc.stderr
    (point,) = json.loads(out.read_text())["points"]
    assert point["status"] == "ok", point["reason"]
    assert point["match"]["ok"] and point["match"]["argmax_agree"] == 1.0
    config = json.loads((_model(name).parent / "genai_config.json").read_text())
    loop = point["details"]["genai"]
    assert loop["provider"] == "cpu" and loop["graph_capture"] is False
    assert loop["past_present_share_buffer"] == config["search"]["past_present_share_buffer"]
    # the sweep's steps are the reference's greedy tokens: genai's own loop picks each one
    assert (loop["greedy_steps"], loop["forced_steps"]) == (5, 0) and "diverged" not in loop
    # what crosses each step is the token up and the logits genai hands down (float32)
    assert point["details"]["logits_bytes"] == point["bytes_per_step"]["d2h"] > 0


def test_a_fed_token_that_is_not_its_pick_is_recorded_and_the_steps_stay_on_the_prefix():
    """A step whose token is not genai's greedy pick: the first such step recorded (genai's
    pick, the token, genai's margin between them in its own logits), the token fed, and the
    later steps genai's own picks again, every step's logits ORT's CPU EP's on the same
    tokens."""
    name = "genai-llama"
    prompt = MANIFEST[name]["prompt"]
    genai = backend_for(registry()["ort-genai:cpu"], _model(name), None)
    oracle = backend_for(registry()["ort-cpu:copy"], _model(name), None)
    genai.prepare(None, len(prompt) + 4)
    oracle.prepare(None, len(prompt) + 4)
    try:
        genai.reach_depth(DepthState(tokens=np.array(prompt), cache={}))
        for t in prompt:
            ref = np.array(oracle.step(t), np.float64)
        first = ref  # the logits genai picks its first token from
        pick = int(np.argmax(ref))
        other = int(np.argsort(ref)[-2])  # the runner-up: a near-tie, as a GPU's logits give
        fed = [other, None, None]
        for i, t in enumerate(fed):
            t = int(np.argmax(ref)) if t is None else t
            logits = np.array(genai.step(t), np.float64)
            ref = np.array(oracle.step(t), np.float64)
            assert np.abs(logits - ref).max() <= _logits_tolerance(name) * np.abs(ref).max(), i
        loop = genai.details["genai"]
        assert (loop["greedy_steps"], loop["forced_steps"]) == (2, 1)
        d = loop["diverged"]
        assert (d["step"], d["token"], d["reference_token"]) == (0, pick, other)
        scale = np.abs(first).max()
        slack = 2 * _logits_tolerance(name) * scale
        assert 0 < d["margin"] == pytest.approx(first[pick] - first[other], abs=slack)
        assert d["margin_rel"] == pytest.approx(d["margin"] / scale, rel=1e-3)
    finally:
        genai.close()
        oracle.close()


def test_a_model_without_genai_config_and_a_preset_are_refused(tmp_path):
    """A model with no genai_config.json beside it: unavailable in a sweep, one line from
    generate; a preset: refused before any worker."""
    optimum = _model("optimum-llama")
    out = tmp_path / "out.json"
    proc = statebench("run", "--model", optimum, "--backends", "ort-genai:cpu", *SWEEP,
                      "--out", out)
    assert proc.returncode == 0, proc.stderr
    (point,) = json.loads(out.read_text())["points"]
    assert point["status"] == "unavailable"
    assert "no genai_config.json beside" in point["reason"]
    line = one_line_error(statebench("generate", optimum, "--prompt", "1,2",
                                     "--backend", "ort-genai:cpu"))
    assert "genai_config.json" in line
    for name in ("ort-genai:cpu", "ort-genai:webgpu"):
        why = PresetSource("tiny").refusal(registry()[name])
        assert why.startswith(f"{name} runs onnxruntime-genai's own loop") and "not a preset" in why


def test_backends_lists_both_and_says_why_webgpu_cannot_run_here():
    proc = statebench("backends")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("│")[1].strip(): line for line in proc.stdout.splitlines()
            if line.startswith("│") and "ort-genai:" in line}
    assert set(rows) == {"ort-genai:cpu", "ort-genai:webgpu"}
    assert "│ yes" in rows["ort-genai:cpu"] and "onnxruntime-genai" in rows["ort-genai:cpu"]
    devices, why = webgpu_devices()
    if devices:
        pytest.skip("a WebGPU device is present")
    assert "│ no" in rows["ort-genai:webgpu"]
    assert registry()["ort-genai:webgpu"].available() == (False, why)
