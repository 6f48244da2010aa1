"""Growing caches on the WebNN pages (``backends.webnn.fixed_capacity``) and the attention
ops of real exports (``backends.webnn.convert_attention``), against ORT's CPU EP on the
same ONNX graph with its growing cache (``tests.attention_graphs``): every step's logits
and the greedy tokens, on each page."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from backends.base import registry
from backends.pages import StatelessCopy
from tests.attention_graphs import (
    LAYERS,
    genai_model,
    onnx_attention_model,
    optimum_model,
    ort_greedy,
    ort_oracle,
)
from tests.test_cli import statebench
from tests.test_onnx_converter import run_graph

ok, why = StatelessCopy.available()
pytestmark = pytest.mark.skipif(not ok, reason=why)

PAGES = ["wgpu:stateless", "wgpu:reuse", "wgpu:stateful"]
#: the generate command end to end: the proposal's page in the fast tier, the others (whose
#: every step ``test_each_steps_logits_match_ort_on_the_growing_graph`` checks there) in the
#: slow tier
GENERATE_PAGES = [p if p == "wgpu:stateful" else pytest.param(p, marks=pytest.mark.slow)
                  for p in PAGES]
MODELS = {"genai": genai_model, "optimum": optimum_model, "onnx-attention": onnx_attention_model,
          "genai-interleaved": lambda: genai_model(seed=9, interleaved=True)}
SEQ, PROMPT, NEW = [5, 2, 9, 0, 7, 3, 11], [3, 1, 4], 6


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("growing")
    out = {}
    for name, make in MODELS.items():
        out[name] = d / f"{name}.onnx"
        onnx.save(make(), str(out[name]))
    return out


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("name", list(MODELS))
def test_each_steps_logits_match_ort_on_the_growing_graph(name, page, models):
    want = ort_oracle(models[name], SEQ)
    b = registry()[page](onnx_path=models[name])
    try:
        b.prepare(None, 12)
        for i, t in enumerate(SEQ):
            got = b.step(t)
            assert np.abs(got - want[i]).max() / np.abs(want[i]).max() < 1e-4, (i, page)
        assert len(b.details["fixed_capacity"]) == 2 * LAYERS  # every pair rewritten
        if page == "wgpu:stateful":  # written in place, attention fused
            assert all(b.details["in_place"].values()), b.details["in_place"]
            launches = Counter(la.kernel.name for la in b.converted.graph._plan.launches
                               if hasattr(la, "kernel"))
            assert launches["attention_flash"] == LAYERS, launches
    finally:
        b.close()


@pytest.mark.parametrize("page", GENERATE_PAGES)
@pytest.mark.parametrize("name", ["genai", "optimum", "onnx-attention"])
def test_generate_gives_orts_greedy_tokens(name, page, models):
    want = ort_greedy(models[name], PROMPT, NEW)
    assert len(set(want)) > 2
    proc = statebench("generate", models[name], "--prompt", ",".join(map(str, PROMPT)),
                      "--max-new-tokens", NEW, "--backend", page, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens"] == want


@pytest.mark.parametrize("page", GENERATE_PAGES)
@pytest.mark.parametrize("scheme", ["optimum", "genai", "transformers"])
def test_each_naming_scheme_gives_the_float64_oracles_tokens(scheme, page, tmp_path):
    """``tests.decoder_graphs``: masked by attention_mask (optimum, genai), or with no mask
    but position_ids (transformers: rows beyond the position masked before the softmax)."""
    from tests.decoder_graphs import decoder_model, oracle_greedy

    path = tmp_path / f"{scheme}.onnx"
    onnx.save(decoder_model(scheme), str(path))
    proc = statebench("generate", path, "--prompt", ",".join(map(str, PROMPT)),
                      "--max-new-tokens", NEW, "--backend", page, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["tokens"] == oracle_greedy(scheme, PROMPT, NEW)


def test_a_growing_cache_nothing_masks_is_unavailable_in_one_line(tmp_path, monkeypatch):
    """Neither attention_mask nor position_ids: the rows beyond the position could not be
    masked, so the rewrite refuses and says why, in one line, exit 2."""
    from tests import decoder_graphs

    monkeypatch.setitem(decoder_graphs.FEEDS, "transformers", (False, 0))
    path = tmp_path / "nomask.onnx"
    onnx.save(decoder_graphs.decoder_model("transformers"), str(path))
    proc = statebench("generate", path, "--prompt", "1,2", "--backend", "wgpu:stateful")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "neither an 'attention_mask' input nor position_ids" in lines[0], \
        proc.stderr


# --- single ops against ORT ------------------------------------------------------------------

rng = np.random.default_rng(3)


def _ort(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def _single(node, inputs: dict, outputs: dict, inits: dict, opset: int = 21) -> onnx.ModelProto:
    vi = lambda n, a: helper.make_tensor_value_info(  # noqa: E731
        n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
    g = helper.make_graph([node], "t", [vi(n, a) for n, a in inputs.items()],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                           for n, s in outputs.items()],
                          [onnx.numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset),
                                               helper.make_opsetid("com.microsoft", 1)])


@pytest.fixture(scope="module")
def context():
    from backends.webnn import ml

    ctx = ml.create_context(state_support=True)
    yield ctx
    ctx.destroy()


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("form", ["contrib-3d", "contrib-4d", "onnx23-3d", "onnx23-4d"])
def test_rotary_embedding_matches_ort(context, form, interleaved):
    """Both domains, both layouts, halves or interleaved, partial rotary (12 of 16)."""
    B, S, N, H, rot, maxpos = 1, 3, 2, 16, 12, 10
    x = rng.standard_normal((B, S, N * H) if form.endswith("3d") else (B, N, S, H)).astype(np.float32)
    pos = np.array([[4, 1, 7]], np.int64)
    cos = rng.standard_normal((maxpos, rot // 2)).astype(np.float32)
    sin = rng.standard_normal((maxpos, rot // 2)).astype(np.float32)
    attrs = dict(interleaved=interleaved, rotary_embedding_dim=rot, num_heads=N)
    if form.startswith("contrib"):
        node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"],
                                domain="com.microsoft", **attrs)
    else:
        node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin", "pos"], ["y"], **attrs)
    model = _single(node, {"x": x, "pos": pos}, {"y": list(x.shape)}, {"cos": cos, "sin": sin},
                    opset=23)
    want = _ort(model, {"x": x, "pos": pos})["y"]
    got = run_graph(context, model, {"x": x, "pos": pos})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout, sections", [(0, [2, 3, 3]), (1, [2, 3, 3]), (1, [4, 2, 2])])
@pytest.mark.parametrize("rank", [3, 4])
def test_m_rotary_embedding_matches_ort(context, layout, sections, rank):
    """Qwen's multimodal rotary with three different position rows (not the text case,
    where they are alike), contiguous and interleaved sections, partial rotary."""
    B, S, N, H, rot, maxpos = 1, 2, 2, 20, 16, 12
    x = rng.standard_normal((B, S, N * H) if rank == 3 else (B, N, S, H)).astype(np.float32)
    pos = np.array([[[3, 9]], [[1, 4]], [[7, 0]]], np.int64)
    cos = rng.standard_normal((maxpos, rot // 2)).astype(np.float32)
    sin = rng.standard_normal((maxpos, rot // 2)).astype(np.float32)
    node = helper.make_node("MRotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"],
                            domain="com.microsoft", interleaved=0, rotary_embedding_dim=rot,
                            num_heads=N, mrope_section=sections, mrope_layout=layout)
    model = _single(node, {"x": x, "pos": pos}, {"y": list(x.shape)}, {"cos": cos, "sin": sin})
    want = _ort(model, {"x": x, "pos": pos})["y"]
    got = run_graph(context, model, {"x": x, "pos": pos})["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


ATTENTION_CASES = {
    # name: (rank, q rows, past rows, q heads, kv heads, mask kind, is_causal, softcap)
    "3d-past-gqa-bool-causal": (3, 1, 5, 4, 2, "bool", 1, 0.0),
    "4d-prefill-causal": (4, 3, 0, 2, 2, None, 1, 0.0),
    "3d-past-float-mask": (3, 2, 4, 2, 1, "float", 0, 0.0),
    "4d-past-softcap-causal": (4, 2, 3, 4, 4, None, 1, 2.0),
    # opset 24: a static cache of 6 rows, nonpad_kv_seqlen of them valid (no past input)
    "3d-nonpad-causal": (3, 1, -6, 4, 2, None, 1, 0.0),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_onnx_attention_matches_ort(context, case):
    """ai.onnx Attention (opset 23): every output, against ORT's CPU EP."""
    rank, sq, past, hq, hkv, mask, causal, cap = ATTENTION_CASES[case]
    B, D = 1, 8
    static = -past if past < 0 else 0
    past = max(past, 0)
    T = past + sq

    def x(heads, s):
        a = rng.standard_normal((B, heads, s, D) if rank == 4 else (B, s, heads * D))
        return a.astype(np.float32)

    feeds = {"q": x(hq, sq), "k": x(hkv, static or sq), "v": x(hkv, static or sq)}
    names = ["q", "k", "v", ""]
    if mask == "bool":
        feeds["m"] = rng.random((sq, T)) > 0.3
        feeds["m"][:, 0] = True
        names[3] = "m"
    elif mask == "float":
        feeds["m"] = rng.standard_normal((B, 1, sq, T)).astype(np.float32)
        names[3] = "m"
    outs = {"y": [B, hq, sq, D] if rank == 4 else [B, sq, hq * D]}
    if past:
        feeds["pk"] = rng.standard_normal((B, hkv, past, D)).astype(np.float32)
        feeds["pv"] = rng.standard_normal((B, hkv, past, D)).astype(np.float32)
        names += ["pk", "pv"]
        outs |= {"ok": [B, hkv, T, D], "ov": [B, hkv, T, D]}
    if static:
        feeds["n"] = np.array([4], np.int64)
        names += ["", "", "n"]
    attrs = dict(is_causal=causal, softcap=cap)
    if rank == 3:
        attrs |= dict(q_num_heads=hq, kv_num_heads=hkv)
    node = helper.make_node("Attention", names, list(outs), **attrs)
    model = _single(node, feeds, outs, {}, opset=24 if static else 23)
    want = _ort(model, feeds)
    got = run_graph(context, model, {k: v.astype(np.uint8) if v.dtype == bool else v
                                     for k, v in feeds.items()})
    for k in outs:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("bias", [False, True])
def test_skip_simplified_layer_norm_all_outputs_match_ort(context, bias):
    x, skip = (rng.standard_normal((1, 2, 24)).astype(np.float32) for _ in range(2))
    inits = {"gamma": rng.standard_normal(24).astype(np.float32)}
    if bias:
        inits["beta"] = rng.standard_normal(24).astype(np.float32)
    node = helper.make_node("SkipSimplifiedLayerNormalization",
                            ["x", "skip", "gamma", *(["beta"] if bias else [])],
                            ["y", "", "inv", "sum"], domain="com.microsoft", epsilon=1e-4)
    model = _single(node, {"x": x, "skip": skip},
                    {"y": [1, 2, 24], "inv": [1, 2, 1], "sum": [1, 2, 24]}, inits)
    want = _ort(model, {"x": x, "skip": skip})
    got = run_graph(context, model, {"x": x, "skip": skip})
    for k in ("y", "inv", "sum"):
        np.testing.assert_allclose(got[k], want[k].reshape(got[k].shape), rtol=1e-5, atol=1e-5)


def test_simplified_layer_norm_matches_ort(context):
    x = rng.standard_normal((1, 3, 20)).astype(np.float32)
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1,
                            epsilon=1e-5)
    model = _single(node, {"x": x}, {"y": [1, 3, 20]},
                    {"g": rng.standard_normal(20).astype(np.float32)})
    np.testing.assert_allclose(run_graph(context, model, {"x": x})["y"],
                               _ort(model, {"x": x})["y"], rtol=1e-5, atol=1e-5)


# --- dims real exports leave symbolic ---------------------------------------------------------


def test_genais_kv_cache_dim_is_the_head_size_not_the_capacity():
    from backends.webnn.dims import default_dims
    from tests.attention_graphs import HEAD_DIM

    model = genai_model()
    for vi in [*model.graph.input, *model.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if vi.name.startswith(("past_key_values.", "present.")):
            dims[-1].dim_param = "kv_cache_dim"
    got = default_dims(model, 12)
    assert got["kv_cache_dim"].value == HEAD_DIM, got["kv_cache_dim"]
    assert got["past_sequence_length"].value == 12


def test_a_conv_states_window_is_the_kernel_of_the_conv_reading_it():
    """transformers' Qwen3.5: conv state [B, C, s84], Concat(state, new) read by a
    depthwise Conv of kernel 4, the present its last s84 columns."""
    from backends.webnn.dims import default_dims

    n = helper.make_node
    nodes = [n("Concat", ["state", "new"], ["cat"], axis=-1),
             n("Conv", ["cat", "w"], ["y"], group=3, kernel_shape=[4]),
             n("Slice", ["cat", "start", "end", "axis"], ["present"])]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        nodes, "conv", [vi("state", TensorProto.FLOAT, [1, 3, "s84"]),
                        vi("new", TensorProto.FLOAT, [1, 3, 1])],
        [vi("y", TensorProto.FLOAT, [1, 3, None]), vi("present", TensorProto.FLOAT, [1, 3, "s84"])],
        [onnx.numpy_helper.from_array(np.ones((3, 1, 4), np.float32), "w"),
         *(onnx.numpy_helper.from_array(np.array([v], np.int64), k)
           for k, v in (("start", -4), ("end", 2**31), ("axis", 2)))])
    got = default_dims(helper.make_model(g), 12)
    assert got["s84"].value == 4, got
