"""What the K-token gated delta tests share (tests/test_ktoken_gdn*.py): a hybrid with two
GDN layers and an attention layer at tiny's shapes, its graphs exported into a fresh cache,
the float64 reference fed one token at a time, the pages built for K tokens a step."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends.base import DepthState
from harness import metrics
from model.reference import Reference
from model.workload import ATTENTION, GDN, Workload, preset, token_stream
from tests.page_marks import PAGE_OK, PAGE_WHY, needs_page  # noqa: F401

#: two GDN layers (their captures counted apart) and one attention layer, tiny's shapes
HYBRID = Workload.build(replace(preset("tiny"), name="tiny-gdn2", layers=(GDN, GDN, ATTENTION)))
CAPACITY = 24  # test_ktoken's: the same kernels, compiled once in a run
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
    activations' tolerance (``metrics.compare_logits``); float32 within 1e-5."""
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




def page(name: str, w: Workload, k: int):
    from backends.base import registry

    b = registry()[name](tokens_per_step=k)
    b.prepare(w, CAPACITY)
    return b


def kernels(b) -> list[str]:
    return [la.kernel.name for la in b.converted.graph._plan.launches
            if getattr(la, "kernel", None) is not None]


def assert_one_capture_per_gdn_layer(b, w: Workload) -> None:
    """One capture launch per GDN layer; neither the one-token kernel nor a launch per
    token (the generic matmuls of the state's (Hk, rep, Dv, ...) shapes) is left."""
    names = kernels(b)
    assert names.count("gdn_capture") == len(w.config.gdn_layers), names
    assert "gated_delta" not in names, names
