"""The standard K-token export's gated delta layers (issue 31 item 1): each layer's K tokens
run as one launch on the WebNN pages (``match_gdn_capsule``'s capture with no capsule, the
op shape ``convert_gdn`` builds ORT's GatedDeltaNet in), not five generic launches a token;
the plan's length does not grow with K; the K-token logits agree with the float64
reference fed the same tokens one at a time (``Reference.step``) on lavapipe and on ORT's
CPU EP (the same standard graph), for a hybrid with two GDN layers and an attention layer
(``ktoken_gdn_cases``). More pages, K = 8 and float16 activations: the slow tier's
test_ktoken_gdn_variants."""

from __future__ import annotations

import pytest

from tests.ktoken_gdn_cases import (  # noqa: F401  (fresh_cache: the module's autouse fixture)
    CAPACITY,
    HYBRID,
    assert_one_capture_per_gdn_layer,
    check_k_steps,
    fresh_cache,
    kernels,
    needs_page,
    page,
)


@needs_page
def test_stateful_k_tokens_one_launch_per_gdn_layer():
    """One capture launch per GDN layer, the state written in place, and the logits of two
    K-token steps those of the reference fed one token at a time."""
    b = page("wgpu:stateful", HYBRID, 4)
    try:
        assert_one_capture_per_gdn_layer(b, HYBRID)
        assert b.details["is_stateful"] and all(b.details["in_place"].values())
        check_k_steps(b, HYBRID, 4)
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
