"""`statebench run --model` on models statebench did not write (``tests.decoder_graphs``, fresh
random weights per test module): the reference (ORT's CPU EP, growing cache) follows a float64
NumPy decoder that shares no code with it; every ORT backend that can run the model matches the
reference at every point, starting from its depth; the ones that cannot are unavailable with
why and the sweep goes on; the results record the model; bad input is one line, exit 2,
nothing written; `--expect-tokens` is a greedy check on generate and run."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import onnx
import pytest

from backends.webnn.dims import default_dims, past_head_sizes
from harness.model_info import inspect_model
from harness.model_run import REFERENCE
from harness.sources import ModelSource
from tests.decoder_graphs import (
    GDH,
    MAX_POS,
    SCHEMES,
    decoder_model,
    gqa_decoder_model,
    gqa_oracle_logits,
    oracle_greedy,
    oracle_logits,
    save_decoders,
)
from tests.test_cli import one_line_error, statebench

SEED = int(np.random.default_rng().integers(1000))  # fresh weights each session
SWEEP = ["--contexts", "3,7", "--steps", "3", "--warmup", "1", "--warm-s", "0",
         "--no-calibrate"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_decoders(tmp_path_factory.mktemp("models"), SEED)


def oracle(name: str, tokens: list[int]) -> np.ndarray:
    if name == "gqa":
        return gqa_oracle_logits(tokens, seed=SEED)
    return oracle_logits(name, tokens, seed=SEED)


@pytest.mark.parametrize("name", [*SCHEMES, "gqa"])
def test_the_reference_follows_the_float64_decoder(name, models):
    """The reference's state at a depth and its logits after it, against NumPy over the
    whole sequence (no cache): the oracle of every point of a model sweep."""
    walk = ModelSource.load(models[name], seed=3).reference_walk(length=12, capacity=12)
    for ctx in (2, 6):  # ascending, the look-ahead rolled back in between
        arrays = walk.arrays_at(ctx, 12, 4)
        tokens = [int(t) for t in arrays["tokens"]]
        for i, got in enumerate(arrays["ref_logits"]):
            want = oracle(name, tokens[:ctx + i + 1])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        grown = [v for k, v in arrays.items() if k.startswith("cache:past_key_values")]
        assert all(v.shape[2] == ctx for v in grown)  # each growing cache holds its valid rows
    walk.close()


def test_a_gqa_past_takes_its_head_size_from_its_projection():
    """genai names every layer's head dim kv_cache_dim; no name rule pins it (the capacity
    would be wrong), the value projection feeding GroupQueryAttention gives it."""
    model = gqa_decoder_model(seed=SEED)
    pinned = default_dims(model, 64)["kv_cache_dim"]
    assert (pinned.value, pinned.how) == (GDH, "GroupQueryAttention head size")
    assert past_head_sizes(model) == {"past_key_values.0.key": GDH,
                                      "past_key_values.0.value": GDH}


def _run(tmp_path, model, *args, out_name="out.json"):
    out = tmp_path / out_name
    proc = statebench("run", "--model", model, *SWEEP, "--out", out, *args)
    return proc, out


@pytest.mark.parametrize("name, backends", [
    ("optimum", "ort-cpu:copy,ort-cpu:iobinding"),
    ("genai", "ort-cpu:copy,ort-cpu:iobinding"),
    ("transformers", "ort-cpu:copy,ort-cpu:iobinding"),
    ("gqa", "ort-cpu:copy,ort-cpu:iobinding,ort-cpu:shared"),
])
def test_every_point_matches_the_reference(name, backends, models, tmp_path):
    proc, out = _run(tmp_path, models[name], "--backends", backends, "--inprocess")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    points = results["points"]
    assert {(p["backend"], p["context"]) for p in points} == {
        (b, c) for b in backends.split(",") for c in (3, 7)}
    for p in points:
        assert p["status"] == "ok", (p["backend"], p["reason"])
        assert p["match"]["ok"], (p["backend"], p["context"], p["match"])
        assert p["cache_bytes"] > 0 and p["bytes_per_step"]["kernel"] > 0
        # the model's bytes are known (tests/test_model_bytes.py): only --no-calibrate stops a floor
        assert p["details"]["floor_reason"] == "no host memory bandwidth calibrated"
    model = results["workload"]["model"]
    assert "preset" not in results["workload"]
    assert model["sha256"] == hashlib.sha256(models[name].read_bytes()).hexdigest()
    assert model["size"] == models[name].stat().st_size
    assert model["pairs"] == inspect_model(models[name], backends=False)["pairs"]
    assert model["reference"] == REFERENCE
    assert model["dims"]["batch_size"] == {"value": 1, "how": "batch 1"}
    assert "statebench · " in proc.stdout and f"{name}.onnx" in proc.stdout


def test_in_worker_processes_too(models, tmp_path):
    proc, out = _run(tmp_path, models["genai"], "--backends", "ort-cpu:iobinding",
                     "--contexts", "5")
    assert proc.returncode == 0, proc.stderr
    (p,) = json.loads(out.read_text())["points"]
    assert p["status"] == "ok" and p["match"]["ok"], p


def test_backends_that_cannot_run_it_are_unavailable_and_the_sweep_goes_on(models, tmp_path):
    """ORT modes that need statebench's graph or a shareable cache are unavailable; the WebNN
    page runs the growing cache made fixed-capacity (backends.webnn.fixed_capacity) and
    matches, or, with no adapter, says so."""
    backends = "ort-cpu:shared,ort-cpu:standard,wgpu:stateless,ort-cpu:copy"
    proc, out = _run(tmp_path, models["optimum"], "--backends", backends, "--inprocess")
    assert proc.returncode == 0, proc.stderr
    by = {(p["backend"], p["context"]): p for p in json.loads(out.read_text())["points"]}
    for c in (3, 7):
        assert by["ort-cpu:copy", c]["match"]["ok"]
        for b in ("ort-cpu:shared", "ort-cpu:standard"):
            assert by[b, c]["status"] == "unavailable", by[b, c]
            assert "\n" not in by[b, c]["reason"]
        assert "grows through Concat, not GroupQueryAttention" in by["ort-cpu:shared", c]["reason"]
        page = by["wgpu:stateless", c]
        assert page["match"]["ok"] if page["status"] == "ok" else "adapter" in page["reason"], page


def test_pairs_named_by_hand(models, tmp_path):
    """Caches under names no rule knows run once --pairs names them."""
    model = decoder_model("optimum", seed=SEED)
    rename = {"past_key_values.0.key": "k_in", "present.0.key": "k_out",
              "past_key_values.0.value": "v_in", "present.0.value": "v_out",
              "past_state.1": "s_in", "present_state.1": "s_out"}
    for vi in [*model.graph.input, *model.graph.output]:
        vi.name = rename.get(vi.name, vi.name)
    for node in model.graph.node:
        node.input[:] = [rename.get(i, i) for i in node.input]
        node.output[:] = [rename.get(o, o) for o in node.output]
    path = tmp_path / "renamed.onnx"
    onnx.save(model, str(path))
    assert "no cache pairs" in one_line_error(statebench("run", "--model", path, *SWEEP))
    proc, out = _run(tmp_path, path, "--backends", "ort-cpu:copy,ort-cpu:iobinding",
                     "--inprocess", "--pairs", "k_in=k_out,v_in=v_out,s_in=s_out")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert all(p["match"]["ok"] for p in results["points"])
    assert results["workload"]["model"]["hand_pairs"] == {"k_in": "k_out", "v_in": "v_out",
                                                          "s_in": "s_out"}


def _sweep_beside(args: list) -> list[str]:
    """SWEEP without its --contexts where ``args`` give their own."""
    if "--contexts" not in args:
        return SWEEP
    i = SWEEP.index("--contexts")
    return SWEEP[:i] + SWEEP[i + 2:]


def test_bad_input_is_one_line_exit_2_and_nothing_written(models, tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"\x00\xffnot onnx")
    (tmp_path / "empty").mkdir()
    small = tmp_path / "short.onnx"
    onnx.save(gqa_decoder_model(seed=SEED, rows=8), str(small))
    m = models["optimum"]
    cases = [
        ([tmp_path / "missing.onnx"], "no such file or folder"),
        ([tmp_path / "bad.onnx"], "not an ONNX model"),
        ([tmp_path / "empty"], "a folder with no model.onnx or decode.onnx"),
        ([m, "--pairs", "nope=present.0.key"], "--pairs: 'nope' is not an input of the graph"),
        ([m, "--pairs", "past_key_values.0.key"], "is not INPUT=OUTPUT"),
        ([m, "--contexts", str(MAX_POS)],
         f"the model has {MAX_POS} positions (the position table pos gathered by position_ids"),
        ([small, "--contexts", "5"], "cos_cache of GroupQueryAttention"),
        ([models["transformers"], "--contexts", str(MAX_POS - 3)],  # positions [3, B, S]
         f"reaches position {MAX_POS} but the model has {MAX_POS} positions"),
        ([m, "--preset", "tiny"], "--model and --preset name two workloads"),
        ([m, "--prompt", "1"], "--prompt and --expect-tokens go together"),
    ]
    for args, says in cases:
        out = tmp_path / "out.json"
        proc = statebench("run", "--model", *args, *_sweep_beside(args), "--out", out)
        assert says in one_line_error(proc), args
        assert not out.exists(), args
    assert "--pairs needs --model" in one_line_error(statebench("run", "--pairs", "a=b"))


def test_expect_tokens_on_generate(models):
    prompt, want = [3, 1, 4], oracle_greedy("genai", [3, 1, 4], 5, seed=SEED)
    args = ["generate", models["genai"], "--prompt", "3,1,4", "--backend", "ort-cpu:iobinding"]
    ok = statebench(*args, "--expect-tokens", ",".join(map(str, want)))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().splitlines()[-1] == "tokens: " + ",".join(map(str, want))
    wrong = [*want[:2], (want[2] + 1) % 11, *want[3:]]
    bad = statebench(*args, "--expect-tokens", ",".join(map(str, wrong)))
    assert bad.returncode == 1
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("statebench: tokens differ from --expect-tokens at new token 2")
    assert "3 tokens but --max-new-tokens is 5" in one_line_error(
        statebench(*args, "--expect-tokens", "1,2,3", "--max-new-tokens", "5"))
    assert len(prompt) == 3


def test_expect_tokens_on_run(models, tmp_path):
    want = oracle_greedy("transformers", [2, 7], 4, seed=SEED)
    wrong = [(want[0] + 1) % 11, *want[1:]]
    base = ["--backends", "ort-cpu:copy", "--inprocess", "--prompt", "2,7"]
    proc, out = _run(tmp_path, models["transformers"], *base, "--expect-tokens",
                     ",".join(map(str, wrong)))
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "tokens differ from --expect-tokens at new token 0" in line
    assert not out.exists()
    proc, out = _run(tmp_path, models["transformers"], *base, "--expect-tokens",
                     ",".join(map(str, want)))
    assert proc.returncode == 0, proc.stderr
    assert all(p["match"]["ok"] for p in json.loads(out.read_text())["points"])


def test_the_gate_tells_two_models_apart(models, tmp_path):
    runs = []
    for name in ("optimum", "genai"):
        proc, out = _run(tmp_path, models[name], "--backends", "ort-cpu:copy", "--inprocess",
                         out_name=f"{name}.json")
        assert proc.returncode == 0, proc.stderr
        runs.append(out)
    assert "model sha256" in one_line_error(statebench("gate", runs[0], "--baseline", runs[1]))
    same = statebench("gate", runs[0], "--baseline", runs[0])
    assert same.returncode == 0, same.stderr


def test_the_wgpu_pages_on_state_that_is_only_overwritten(tmp_path):
    """No cache grows (conv window and recurrent state): every page runs the model, a page
    that owns its state starting from the reference's, the stateful one by dispatching the
    prefix, and matches the reference at every point."""
    from backends.base import registry

    ok, why = registry()["wgpu:stateless"].available()
    if not ok:
        pytest.skip(why)
    path = tmp_path / "states.onnx"
    onnx.save(decoder_model("transformers", seed=SEED, attention=False), str(path))
    backends = "wgpu:stateless,wgpu:reuse,wgpu:stateful,ort-cpu:copy"
    proc, out = _run(tmp_path, path, "--backends", backends, "--inprocess")
    assert proc.returncode == 0, proc.stderr
    points = json.loads(out.read_text())["points"]
    assert len(points) == 8
    for p in points:
        assert p["status"] == "ok" and p["match"]["ok"], (p["backend"], p["context"], p["reason"])
