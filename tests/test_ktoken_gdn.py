"""The standard K-token export's gated delta layers (issue 31 item 1): each layer's K tokens
run as one launch on the WebNN pages (``match_gdn_capsule``'s capture with no capsule, the
op shape ``convert_gdn`` builds ORT's GatedDeltaNet in), not five generic launches a token;
the plan's length does not grow with K; and the K-token logits agree with the float64
reference fed the same tokens one at a time (``Reference.step``), on lavapipe (float32 and
float16 activations) and on ORT's CPU EP (the same standard graph), for a hybrid with two
GDN layers and an attention layer."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends.base import DepthState
from harness import metrics
from model.reference import Reference
from model.workload import ATTENTION, GDN, Workload, preset, token_stream

#: two GDN layers (their captures counted apart) and one attention layer, tiny's shapes
HYBRID = Workload.build(replace(preset("tiny"), name="tiny-gdn2", layers=(GDN, GDN, ATTENTION)))
CAPACITY = 32
DEPTH = 8
TOKENS = token_stream(HYBRID.config, CAPACITY, seed=31)


@pytest.fixture(autouse=True, scope="module")
def fresh_cache(tmp_path_factory):
    """Graphs exported by this tree (a shared cache may hold K-token graphs of an older
    exporter under the same name)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STATEBENCH_CACHE", str(tmp_path_factory.mktemp("ktoken-gdn")))
        yield


def one_at_a_time(w: Workload, depth: int, n: int) -> tuple[DepthState, np.ndarray]:
    """The state at ``depth`` and the reference's logits of the ``n`` tokens after it,
    each fed alone (float64)."""
    ref = Reference(w.config, w.weights, CAPACITY)
    ref.prefill(TOKENS[:depth], logits=False)
    state = DepthState(tokens=TOKENS[:depth].copy(), cache=ref.cache_arrays())
    return state, np.stack([ref.step(int(t)) for t in TOKENS[depth:depth + n]])


def check_k_steps(b, w: Workload, k: int, steps: int = 2) -> None:
    """``steps`` K-token steps from DEPTH against the one-at-a-time reference, within the
    activations' tolerance (``metrics.compare_logits``)."""
    state, want = one_at_a_time(w, DEPTH, k * steps)
    b.reach_depth(state)
    # a copy of each step's logits: a backend returns its own array, refilled next step
    got = [row for j in range(steps)
           for row in np.array(b.step_tokens(TOKENS[DEPTH + j * k:DEPTH + (j + 1) * k]))]
    tol = metrics.logits_tolerance(w.config)
    m = metrics.compare_logits(got, want, tol)
    assert m.ok, f"{b.name} K={k}: " + metrics.mismatch_reason(got, want, tol)
    if w.config.dtype == "float32":
        assert m.max_rel < 1e-5, f"{b.name} K={k}: max rel {m.max_rel:.2e}"


# -- the wgpu pages (lavapipe in CI) ---------------------------------------------------------

def _page_ok() -> tuple[bool, str]:
    try:
        from backends.pages import StatelessCopy
    except ImportError as exc:
        return False, str(exc)
    return StatelessCopy.available()


PAGE_OK, PAGE_WHY = _page_ok()
needs_page = pytest.mark.skipif(not PAGE_OK, reason=PAGE_WHY)


def page(name: str, w: Workload, k: int):
    from backends.base import registry

    b = registry()[name](tokens_per_step=k)
    b.prepare(w, CAPACITY)
    return b


def kernels(b) -> list[str]:
    return [la.kernel.name for la in b.converted.graph._plan.launches
            if getattr(la, "kernel", None) is not None]


@needs_page
@pytest.mark.parametrize("name,k", [("wgpu:stateful", 4), ("wgpu:stateful", 8),
                                    ("wgpu:stateless", 4)])
def test_k_tokens_one_launch_per_gdn_layer(name, k):
    """One capture launch per GDN layer (the one-token kernel and the generic per-token
    matmuls gone), the state written in place on the stateful page, and the logits of
    two K-token steps those of the reference fed one token at a time."""
    b = page(name, HYBRID, k)
    try:
        names = kernels(b)
        assert names.count("gdn_capture") == len(HYBRID.config.gdn_layers), names
        assert "gated_delta" not in names, names
        if name == "wgpu:stateful":
            assert b.details["is_stateful"] and all(b.details["in_place"].values())
        check_k_steps(b, HYBRID, k)
    finally:
        b.close()


@needs_page
def test_plan_length_does_not_grow_with_k():
    """K = 2 and K = 8 compile to as many launches: every part of the step takes its K
    tokens in the launches one token's would (no launch per token anywhere)."""
    lengths = {}
    for k in (2, 8):
        b = page("wgpu:stateful", HYBRID, k)
        try:
            lengths[k] = len(kernels(b))
        finally:
            b.close()
    assert lengths[2] == lengths[8], lengths


@needs_page
@pytest.mark.adapter_feature("shader-f16")
def test_float16_activations_k_tokens_one_launch():
    """tiny+q4f16 (float16 activations and caches, 4-bit weights; the gated delta part
    in float32): its GDN layer one capture launch, the logits within the float16
    tolerance of the one-at-a-time reference."""
    w = Workload.build(preset("tiny+q4f16"))
    b = page("wgpu:stateful", w, 4)
    try:
        assert kernels(b).count("gdn_capture") == len(w.config.gdn_layers)
        check_k_steps(b, w, 4)
    finally:
        b.close()


# -- ORT's CPU EP on the same standard graph -----------------------------------------------

@pytest.mark.parametrize("k", [4, 8])
def test_ort_cpu_standard_k_tokens_match_one_at_a_time(k):
    pytest.importorskip("onnxruntime")
    from backends.ort import BACKENDS

    b = BACKENDS["ort-cpu:standard"](tokens_per_step=k)
    b.prepare(HYBRID, CAPACITY)
    try:
        check_k_steps(b, HYBRID, k)
    finally:
        b.close()
