"""The deferred-commit export (issue 31, ``export(..., rollback="deferred")``) on the WebNN
library's stateful graph, converted as the stateful page converts it (``onnx_converter``,
every pair hidden): verifies accepting full, partial and zero counts give the float64
reference's logits after only the accepted tokens and leave the state (read through the
implementation) the reference's; count K every step gives the ordinary K-token export's
tokens; every GDN layer's capture and replay are one launch each, every pair in place."""

from __future__ import annotations

import numpy as np
import pytest

from model import export as E
from model import rollback_feeds as RF
from model.workload import Workload, preset, token_stream
from tests.rollback_runs import CAPACITY, SEED, deferred, rel, speculate

pytest.importorskip("wgpu")

TINY = Workload.build(preset("tiny"), seed=SEED)


class WgpuRun:
    """One converted graph with its pairs hidden; ``state()`` peeks them (tests only)."""

    def __init__(self, ctx, path, specs: list | None = None) -> None:
        from backends.webnn.onnx_converter import convert, list_kv_pairs

        self.ctx, self.specs = ctx, specs or []
        self.cg = convert(path, ctx, use_stateful=True, kv_cache_pairs=list_kv_pairs(path))
        self.graph = self.cg.graph
        fed = ("input_ids", "position_ids", RF.ACCEPTED)
        self.ins = {n: ctx.create_tensor(data_type=d.data_type, shape=list(d.shape), writable=True)
                    for n, d in self.cg.inputs.items() if n in fed}
        d = self.cg.outputs["logits"]
        self.logits = ctx.create_tensor(data_type=d.data_type, shape=list(d.shape), readable=True)

    def launches(self) -> list[str]:
        return [la.kernel.name for la in self.graph._plan.launches if hasattr(la, "kernel")]

    def __call__(self, ids: np.ndarray, pos: int, acc: int) -> np.ndarray:
        k, ctx = len(ids), self.ctx
        ctx.write_tensor(self.ins["input_ids"], ids.reshape(1, k))
        ctx.write_tensor(self.ins["position_ids"], (pos + np.arange(k, dtype=np.int64)).reshape(1, k))
        if RF.ACCEPTED in self.ins:
            ctx.write_tensor(self.ins[RF.ACCEPTED], RF.feeds(RF.ACCEPTED, pos, k, acc))
        ctx.dispatch(self.graph, self.ins, {"logits": self.logits})
        return np.asarray(ctx.read_tensor(self.logits)).reshape(k, -1)

    def state(self) -> dict[str, np.ndarray]:
        return {s.input: np.asarray(self.ctx._peek_state(self.graph, s.input)).reshape(s.shape)
                for s in self.specs}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("rollback-export-wgpu")


@pytest.fixture(scope="module")
def runs(ctx, cache):
    return {k: WgpuRun(ctx, *deferred(TINY, k, cache)) for k in (2, 4)}


@pytest.mark.parametrize("k", [2, 4])
def test_stateful_full_partial_zero(ctx, runs, k):
    run = runs[k]
    ctx.reset_kv_cache(run.graph)
    speculate(TINY, k, run, run.state, seed=10 + k)


def test_every_count_k_gives_the_ordinary_tokens(ctx, runs, cache):
    k = 4
    run = runs[k]
    ctx.reset_kv_cache(run.graph)
    plain = WgpuRun(ctx, E.export(TINY, "standard", CAPACITY, cache, tokens=k))
    toks = token_stream(TINY.config, CAPACITY, seed=3)
    for j in range(0, CAPACITY - k + 1, k):
        ids = toks[j:j + k]
        want, got = plain(ids, j, 0), run(ids, j, k if j else 0)
        assert np.array_equal(got.argmax(-1), want.argmax(-1)), j
        assert rel(got, want) < 1e-5, (j, rel(got, want))


def test_float16_model_full_partial_zero(ctx, cache):
    """q4f16 (float16 activations, the gated delta in float32): within its tolerance."""
    from harness.metrics import logits_tolerance

    w = Workload.build(preset("tiny+q4f16"), seed=SEED)
    run = WgpuRun(ctx, *deferred(w, 4, cache))
    speculate(w, 4, run, None, seed=4, tol=logits_tolerance(w.config))


@pytest.mark.parametrize("name,k", [("tiny", 1), ("tiny", 2), ("tiny", 4), ("small", 4),
                                    ("tiny+q4f16", 4)])
def test_capture_and_replay_in_one_launch(ctx, runs, cache, name, k):
    if name == "tiny" and k in runs:
        run, w = runs[k], TINY
    else:
        w = Workload.build(preset(name), seed=SEED)
        run = WgpuRun(ctx, *deferred(w, k, cache))
    names = run.launches()
    layers = len(w.config.gdn_layers)
    # each layer's replay of the last verify is computed by its capture's launch
    # (KernelOptions.gdn_replay "fused", the default)
    assert names.count("gdn_capture") == layers and names.count("gdn_replay") == 0, names
    assert all(run.graph.in_place.values()), run.graph.in_place
