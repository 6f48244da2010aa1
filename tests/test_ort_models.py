"""ORT runs every model it can run (issue 30 item 3), on the committed real exports
(tests/models): each mode's points match the reference (ORT's CPU EP, float32 products) by
the harness's own verdict, in the model's own types (the genai q4f16 export's float16
logits and caches), and what a mode cannot run is refused in one line.

The WebGPU EP finds no device on a machine without a GPU, so the GPU's code paths are run
on the CPU EP here (``backend_class`` on a provider record of the test's own): its logits
in a device value bound as an output, as the WebGPU EP's are (the float32 buffer bound for
float16 logits that ORT refused on the H200 fails here too), and `captured`'s fixed-shape,
fixed-address feeds (the capacity-sized attention_mask) with nothing captured. On the CPU
EP the q4f16 export's MatMulNBits at accuracy_level 4 multiply in int8 (docs/byom.md), so
it runs here as the reference's copy at level 1 (``reference_graph``): the modes' binding is
what is tested, not ORT's int8 error.

The sweep's look-ahead is the reference's greedy walk (``harness.sources``): each step's
token is what a greedy decode gives after the prefix."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from backends.ort import PROVIDERS, backend_class, webgpu_devices
from harness import runner
from harness.greedy import generate
from harness.model_run import UserModel, reference_graph
from harness.sources import ModelSource

MODELS = Path(__file__).parent / "models"
MANIFEST = {m["name"]: m for m in json.loads((MODELS / "manifest.json").read_text())["models"]}
#: the CPU EP, its logits in a device value as the WebGPU EP's (not the page's host array)
DEVICE_CPU = dataclasses.replace(PROVIDERS["cpu"], key="cpu-device", logits_on_host=False)
DEVICE_MODES = {c.name: c for c in (backend_class(DEVICE_CPU, m)
                                    for m in ("copy", "iobinding", "shared", "captured"))}
REGISTERED = ["ort-cpu:copy", "ort-cpu:iobinding", "ort-cpu:shared"]
CONTEXTS, STEPS, WARMUP = [5, 20], 3, 1
#: the exports whose every cache is a GroupQueryAttention past (shared and captured run)
GQA = ["genai-llama", "genai-q4f16-llama", "genai-int4-llama", "genai-qwen35",
       "genai-int4-qwen35"]
#: the exports whose caches grow by plain ops (shared and captured refuse them)
PLAIN = ["optimum-llama", "transformers-llama"]


def _model(name: str, tmp_path: Path) -> Path:
    """The export's model file; the q4f16 one as its float32-products copy (module doc)."""
    path = MODELS / MANIFEST[name]["path"]
    path = path if path.suffix == ".onnx" else next(p for p in (path / "model.onnx",
                                                                path / "decode.onnx")
                                                    if p.is_file())
    if "q4f16" in name:
        path = reference_graph(UserModel.load(path), tmp_path)
    return path


def _sweep(model: Path | None, backends: list[str], tmp_path: Path,
           preset: str = "model") -> dict:
    rc = runner.RunConfig(preset=preset, model=model and str(model), pairs={}, backends=backends,
                          contexts=CONTEXTS, steps=STEPS, warmup=WARMUP, warm_s=0, repeat=1,
                          capacity=None, seed=0, inprocess=True, calibrate=False,
                          timeout_s=300.0)
    res = runner.run_sweep(rc, tmp_path / "out.json", extra_backends=DEVICE_MODES)
    return {(p.backend, p.context): p for p in res.points}


@pytest.mark.parametrize("name", GQA)
def test_every_mode_matches_the_reference_on_a_gqa_export(name, tmp_path):
    """copy, iobinding, shared and captured, with the logits in the page's array and in a
    device value: every point ok and matching, captured's inputs one shape every step."""
    model = _model(name, tmp_path)
    points = _sweep(model, REGISTERED + list(DEVICE_MODES), tmp_path)
    assert len(points) == len(CONTEXTS) * (len(REGISTERED) + len(DEVICE_MODES))
    for (backend, ctx), p in points.items():
        assert p.status == "ok", (backend, ctx, p.reason)
        assert p.match.ok and p.match.argmax_agree == 1.0, (backend, ctx, p.reason)
        if backend.endswith(":captured"):
            cap = ctx + WARMUP + STEPS
            assert p.details["static_feeds"]["attention_mask"] == [1, cap]
            assert p.details["static_feeds"]["input_ids"] == [1, 1]
            # the mask crosses whole each step (int64), beside the ids and positions
            assert p.bytes_per_step["h2d"] >= cap * 8


@pytest.mark.parametrize("preset", ["tiny", "tiny+q4f16"])
def test_the_device_logits_modes_match_on_a_preset_too(preset, tmp_path):
    """statebench's own export (seqlens_k and total_sequence_length fed, float16 logits on
    +q4f16): the same modes against the float64 reference."""
    points = _sweep(None, list(DEVICE_MODES), tmp_path, preset=preset)
    for (backend, ctx), p in points.items():
        assert p.status == "ok" and p.match.ok, (backend, ctx, p.reason)
    assert set(points[("ort-cpu-device:captured", CONTEXTS[0])].details["static_feeds"]) == {
        "input_ids", "seqlens_k", "total_sequence_length"}


@pytest.mark.parametrize("name", PLAIN)
def test_shared_and_captured_refuse_a_cache_grown_by_plain_ops(name, tmp_path):
    points = _sweep(_model(name, tmp_path), ["ort-cpu:copy", "ort-cpu:shared",
                                             "ort-cpu-device:captured"], tmp_path)
    for ctx in CONTEXTS:
        assert points[("ort-cpu:copy", ctx)].match.ok
        for backend in ("ort-cpu:shared", "ort-cpu-device:captured"):
            p = points[(backend, ctx)]
            assert p.status == "unavailable"
            assert "grows through Concat, not GroupQueryAttention: one buffer" in p.reason


def test_the_look_ahead_is_the_reference_greedy_walk():
    """The depth's tokens: the seed's random prefix, then what a greedy decode after that
    prefix gives (onnxruntime-genai's own loop, sharing no code with the reference's
    backend); each look-ahead token is the argmax of the reference's logits before it."""
    pytest.importorskip("onnxruntime_genai")
    model = MODELS / "genai-llama" / "model.onnx"
    ctx, ahead = 7, 5
    arrays = ModelSource.load(model, seed=4).depth_arrays(ctx, ctx + ahead, ahead)
    tokens, ref = [int(t) for t in arrays["tokens"]], arrays["ref_logits"]
    assert len(tokens) == ctx + ahead and ref.shape[0] == ahead
    assert [int(np.argmax(r)) for r in ref[:-1]] == tokens[ctx + 1:]
    assert generate(model, tokens[:ctx], ahead, "ort-genai:cpu") == tokens[ctx:]


def test_webgpu_modes_say_why_they_cannot_run_here():
    devices, why = webgpu_devices()
    if devices:
        pytest.skip("a WebGPU device is present: scripts/gpu_real_exports.sh runs them")
    for mode in ("copy", "iobinding", "shared", "captured"):
        assert backend_class(PROVIDERS["webgpu"], mode).available() == (False, why)
