"""Fixtures shared by the WebNN test modules."""

import pytest


@pytest.fixture(scope="module")
def ctx():
    """One WebNN context per test module; skipped with the reason where wgpu has no adapter."""
    from backends.webnn import ml

    try:
        c = ml.create_context()
    except Exception as e:  # noqa: BLE001 - any driver failure means "no adapter here"
        pytest.skip(f"no WebGPU adapter: {e}")
    c.record_ahead = True  # the GPU's dispatch path (a CPU adapter's default is off)
    yield c
    c.destroy()
