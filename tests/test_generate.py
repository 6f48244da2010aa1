"""`statebench generate` on models statebench did not write (``tests.decoder_graphs``, one
per exporter naming scheme): greedy tokens on the ORT backends equal a float64 NumPy
decoder's computed over the whole sequence without a cache; the ORT backends feed the
model's own inputs and pair caches by name; bad input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from backends.base import registry
from backends.ort import BACKENDS
from tests.decoder_graphs import (
    SCHEMES,
    decoder_model,
    oracle_greedy,
    oracle_logits,
    save_decoders,
)
from tests.test_cli import one_line_error, statebench

PROMPT, NEW = [3, 1, 4], 6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return save_decoders(tmp_path_factory.mktemp("decoders"))


@pytest.mark.parametrize("backend", ["ort-cpu:copy", "ort-cpu:iobinding"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_generate_gives_the_oracles_greedy_tokens(scheme, backend, models):
    want = oracle_greedy(scheme, PROMPT, NEW)
    assert len(set(want)) > 2  # a chain that could tell a wrong cache from a right one
    proc = statebench("generate", models[scheme], "--prompt", ",".join(map(str, PROMPT)),
                      "--max-new-tokens", NEW, "--backend", backend, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"prompt": PROMPT, "tokens": want, "backend": backend}


def test_the_text_output_ends_with_the_tokens(models):
    proc = statebench("generate", models["genai"], "--prompt", "3,1,4", "--max-new-tokens", NEW)
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last == "tokens: " + ",".join(map(str, oracle_greedy("genai", PROMPT, NEW)))


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_each_steps_logits_match_the_oracle(scheme, models):
    """Not only the argmax: every step's logits, and the caches grow one row a step."""
    b = BACKENDS["ort-cpu:copy"](model=models[scheme])
    b.prepare(None, 16)
    seq = [5, 2, 9, 0, 7]
    for i, t in enumerate(seq):
        got = b.step(t)
        np.testing.assert_allclose(got, oracle_logits(scheme, seq[:i + 1]), rtol=1e-4, atol=1e-4)
    (pk, _, _, _), _, _ = SCHEMES[scheme]
    assert b.past[pk].shape[2] == len(seq)
    assert b.kernel.per_token > 0 and b.kernel.base > 0
    assert b.counters.kernel == sum(b.kernel.at(i) for i in range(len(seq)))


def test_modes_needing_the_projects_graph_say_why(models):
    for name in ("ort-cpu:shared", "ort-cpu:standard"):
        b = BACKENDS[name](model=models["optimum"])
        with pytest.raises(RuntimeError, match="unavailable for .*optimum.onnx"):
            b.prepare(None, 8)


def test_bad_input_is_one_line_exit_2(models, tmp_path):
    m = models["optimum"]
    (tmp_path / "bad.onnx").write_bytes(b"\x00\xffnot onnx")
    cases = [
        (["generate", tmp_path / "missing.onnx", "--prompt", "1"], "no such file or folder"),
        (["generate", tmp_path / "bad.onnx", "--prompt", "1"], "not an ONNX model"),
        (["generate", m, "--prompt", "1,x"], "--prompt: '1,x' is not a comma-separated"),
        (["generate", m, "--prompt", "1,-2"], "negative token id"),
        (["generate", m, "--prompt", "1", "--backend", "nope"], "unknown backend 'nope'"),
        (["generate", m, "--prompt", "1", "--max-new-tokens", "0"], "at least 1"),
    ]
    for args, says in cases:
        assert says in one_line_error(statebench(*args)), args


GENAI = Path(__file__).parent / "models" / "genai-llama"  # GroupQueryAttention, 256 cos rows


@pytest.mark.parametrize("args, says", [
    (["generate", GENAI, "--prompt", "1,2,3", "--max-new-tokens", "255"],
     "--prompt (3 tokens) and --max-new-tokens (255) reach position 256, but the model has 256 "
     "positions (cos_cache of GroupQueryAttention '/model/layers.0/attn/GroupQueryAttention' has "
     "256 rows); ask for at most 254 new tokens after this prompt"),
    (["generate", GENAI, "--prompt", ",".join(["1"] * 300), "--max-new-tokens", "1"],
     "ask for a prompt of at most 256 tokens"),
    # run's greedy check decodes --prompt then --expect-tokens: refused before the sweep too
    (["run", "--model", GENAI, "--backends", "ort-cpu:copy", "--contexts", "16", "--steps", "2",
      "--prompt", ",".join(["1"] * 256), "--expect-tokens", "1,2"],
     "--prompt (256 tokens) and --expect-tokens (2) reach position 256"),
])
def test_past_the_rotary_cache_is_refused_before_ort_runs(args, says, tmp_path):
    """One line of ours, without ORT's own error line before it, naming the limit."""
    assert says in one_line_error(statebench(*args, cwd=tmp_path))
    assert not list(tmp_path.iterdir())


def test_the_last_position_the_rotary_cache_holds_still_decodes():
    proc = statebench("generate", GENAI, "--prompt", "1,2,3", "--max-new-tokens", "254",
                      "--format", "json")
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    assert len(json.loads(proc.stdout)["tokens"]) == 254


@pytest.mark.parametrize("backend", ["ort-cpu:copy", "wgpu:stateful"])
def test_a_graph_whose_types_disagree_is_one_line_exit_2(models, tmp_path, backend):
    """A graph that parses but is not valid (an add of a float32 and a float16 tensor, as a
    careless float16 conversion leaves one): ORT will not load it and the WebNN builder
    refuses the add; either way one line naming the backend and the model, exit 2."""
    proto = onnx.load(str(models["optimum"]))
    add = next(n for n in proto.graph.node if n.op_type == "Add")
    half = onnx.helper.make_tensor("half_one", onnx.TensorProto.FLOAT16, [], [1.0])
    proto.graph.initializer.append(half)
    add.input[1] = "half_one"
    path = tmp_path / "mixed.onnx"
    onnx.save(proto, str(path))
    line = one_line_error(statebench("generate", path, "--prompt", "1,2", "--backend", backend))
    assert f"{backend} cannot run {path}" in line or "data type" in line, line


@pytest.mark.parametrize("name", ["ort-cpu:copy", "ort-cpu:iobinding"])
def test_a_grouped_query_attention_graph_as_a_users_model(name, tmp_path):
    """statebench's own ORT-flavour export (GroupQueryAttention fed seqlens_k and
    total_sequence_length, GatedDeltaNet states) handed over as a model file: fed from its
    own inputs and names, its logits follow the float64 reference step by step."""
    from model.export import export_ort
    from model.reference import Reference
    from model.workload import Workload, preset, token_stream

    wl = Workload.build(preset("tiny"), seed=1)
    path = export_ort(wl, tmp_path / "own.onnx", 64)
    b = BACKENDS[name](model=path)
    b.prepare(None, 16)
    ref = Reference(wl.config, wl.weights, 16)
    for t in token_stream(wl.config, 6, seed=2):
        got, want = b.step(int(t)), ref.step(int(t))
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4
        assert got.argmax() == want.argmax()
    assert set(b.feed_inputs) == {"input_ids", "seqlens_k", "total_sequence_length"}


@pytest.mark.parametrize("backend", ["wgpu:stateless", "wgpu:reuse", "wgpu:stateful",
                                     "ort-cpu:copy"])
def test_state_only_overwritten_runs_on_the_wgpu_pages(backend, tmp_path):
    """Where no cache grows (the transformers-named hybrid state: conv window and recurrent
    state, positions [3, B, S]), the converter takes the model and every page gives the
    oracle's greedy tokens."""
    from backends.base import registry

    ok, why = registry()[backend].available()
    if not ok:
        pytest.skip(why)
    path = tmp_path / "states.onnx"
    onnx.save(decoder_model("transformers", seed=26, attention=False), str(path))
    want = oracle_greedy("transformers", PROMPT, NEW, seed=26, attention=False)
    assert len(set(want)) > 2
    proc = statebench("generate", path, "--prompt", ",".join(map(str, PROMPT)),
                      "--max-new-tokens", NEW, "--backend", backend, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens"] == want


def test_an_input_nobody_feeds_is_named(tmp_path):
    model = decoder_model("optimum")
    for vi in model.graph.input:
        if vi.name == "position_ids":
            vi.name = "token_type_ids"
    for node in model.graph.node:
        node.input[:] = ["token_type_ids" if i == "position_ids" else i for i in node.input]
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    for backend in ("ort-cpu:copy", "ort-cpu:iobinding"):
        line = one_line_error(statebench("generate", path, "--prompt", "1", "--backend", backend))
        assert "does not know what to feed input 'token_type_ids'" in line
    if registry()["wgpu:stateful"].available()[0]:
        line = one_line_error(statebench("generate", path, "--prompt", "1",
                                         "--backend", "wgpu:stateful"))
        assert line.endswith("not 'token_type_ids'"), line
