"""test_ktoken_gdn's check on more pages and shapes (slow tier: each a lavapipe build):
the stateless page (the pairs bound, the state not in place), K = 8, and float16
activations (tiny+q4f16: 4-bit weights, float16 caches, the gated delta part in float32)."""

from __future__ import annotations

import pytest

from model.workload import Workload, preset
from tests.ktoken_gdn_cases import (  # noqa: F401  (fresh_cache: the module's autouse fixture)
    HYBRID,
    assert_one_capture_per_gdn_layer,
    check_k_steps,
    fresh_cache,
    needs_page,
    page,
)


@needs_page
@pytest.mark.parametrize("name,k", [("wgpu:stateful", 8), ("wgpu:stateless", 4)])
def test_k_tokens_one_launch_per_gdn_layer(name, k):
    b = page(name, HYBRID, k)
    try:
        assert_one_capture_per_gdn_layer(b, HYBRID)
        check_k_steps(b, HYBRID, k)
    finally:
        b.close()


@needs_page
@pytest.mark.adapter_feature("shader-f16")
def test_float16_activations_k_tokens_one_launch():
    """The logits within the float16 tolerance of the one-at-a-time float64 reference."""
    w = Workload.build(preset("tiny+q4f16"))
    b = page("wgpu:stateful", w, 4)
    try:
        assert_one_capture_per_gdn_layer(b, w)
        check_k_steps(b, w, 4)
    finally:
        b.close()
