"""Running a WebNN graph of the conformance tests once: its feeds written, every output
read back (``run_graph``), and the module fixtures that build a test module's graph once per
data type (``dtype_results``), shared by the per-op conformance modules."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

Feed = np.ndarray | tuple[str, list[int], np.ndarray]


def run_graph(ctx, b, outputs: dict, feeds: dict[str, Feed]) -> dict[str, np.ndarray]:
    """Build ``outputs`` on builder ``b``, dispatch it once with ``feeds`` (host arrays by
    input name, or (data type, shape, the page's data) where the array's own type and shape
    are not the tensor's: an int4/uint4 tensor's packed buffer) and read every output back;
    the graph is destroyed after."""
    g = b.build(outputs)
    tin = {}
    for name, a in feeds.items():
        dt, shape, data = a if isinstance(a, tuple) else (str(a.dtype), list(a.shape), a)
        t = ctx.create_tensor(data_type=dt, shape=shape, writable=True)
        ctx.write_tensor(t, data)
        tin[name] = t
    tout = {k: ctx.create_tensor(data_type=v.data_type, shape=v.shape, readable=True)
            for k, v in outputs.items()}
    ctx.dispatch(g, tin, tout)
    got = dict(zip(tout, ctx.read_tensors(list(tout.values())), strict=True))
    g.destroy()
    return got


def dtype_results(graph: Callable[[object, str], object]) -> tuple[object, object]:
    """Module fixtures ``float32_results`` and ``float16_results``: ``graph(ctx, dtype)``,
    once a module; the float16 one skipped where the adapter lacks 'shader-f16'. Assign both
    at module level: ``float32_results, float16_results = dtype_results(_graph)``."""

    @pytest.fixture(scope="module", name="float32_results")
    def float32(ctx):
        return graph(ctx, "float32")

    @pytest.fixture(scope="module", name="float16_results")
    def float16(ctx):
        from conftest import missing_adapter_features

        why = missing_adapter_features("shader-f16")
        if why:
            pytest.skip(why)
        return graph(ctx, "float16")

    return float32, float16
