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


@pytest.fixture
def queue_calls(monkeypatch):
    """Call it to start counting every queue submit and buffer map wgpu-py makes (its own
    empty submits before read maps included); returns the live counts. An oracle for a
    context's ``queue_counts`` that shares no code with it."""
    from wgpu.backends.wgpu_native import _api

    def start() -> dict[str, int]:
        n = {"submits": 0, "maps": 0}
        submit, map_async = _api.GPUQueue.submit, _api.GPUBuffer.map_async

        def counted_submit(self, *a, **k):
            n["submits"] += 1
            return submit(self, *a, **k)

        def counted_map(self, *a, **k):
            n["maps"] += 1
            return map_async(self, *a, **k)

        monkeypatch.setattr(_api.GPUQueue, "submit", counted_submit)
        monkeypatch.setattr(_api.GPUBuffer, "map_async", counted_map)
        return n

    return start
