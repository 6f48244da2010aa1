"""Rollback on the proposal's stateful graph, three ways (issue 31 item 3,
``backends/webnn/rollback.py``), at one hybrid layer on the WebNN library: after verifies
accepting all, some and none of K = 2, 4 drafted tokens, the recurrent state, the conv rows
and the attention over the KV rows equal float64 NumPy feeding only the accepted tokens
(written here, sharing no code with the library); and the capture and replay run as one
launch each."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn.rollback import WAYS, Layer, Session

pytest.importorskip("wgpu")
pytest.importorskip("onnx")

SH = Layer(hk=1, hv=2, dk=16, dv=8, conv_dim=6, kernel=4, kv_width=8, capacity=24)


def draft(rng, k: int) -> dict[str, np.ndarray]:
    """Fresh random inputs of K tokens (none zero)."""
    f = np.float32
    return {"query": rng.standard_normal((k, SH.hk, SH.dk)).astype(f),
            "key": rng.standard_normal((k, SH.hk, SH.dk)).astype(f),
            "value": rng.standard_normal((k, SH.hv, SH.dv)).astype(f),
            "decay": -rng.uniform(0.01, 1.0, (k, SH.hv)).astype(f),
            "beta": rng.uniform(0.1, 0.9, (k, SH.hv)).astype(f),
            "conv_x": rng.standard_normal((k, SH.conv_dim)).astype(f),
            "new_k": rng.standard_normal((k, SH.kv_width)).astype(f),
            "new_v": rng.standard_normal((k, SH.kv_width)).astype(f),
            "attn_q": rng.standard_normal((k, SH.kv_width)).astype(f)}


def gdn64(tokens: list[dict]) -> np.ndarray:
    """float64: the recurrent state after the given tokens, one at a time."""
    s = np.zeros((SH.hv, SH.dv, SH.dk))
    for x in tokens:
        k = x["key"].astype(np.float64)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-12)
        for h in range(SH.hv):
            kh = k[h * SH.hk // SH.hv]
            sd = np.exp(float(x["decay"][h])) * s[h]
            delta = float(x["beta"][h]) * (x["value"][h].astype(np.float64) - sd @ kh)
            s[h] = sd + np.outer(delta, kh)
    return s


def attention64(rows_k, rows_v, q) -> np.ndarray:
    """float64 causal attention of the K new queries over the accepted rows + the new ones."""
    kk, vv = np.asarray(rows_k, np.float64), np.asarray(rows_v, np.float64)
    p0 = len(kk) - len(q)
    out = []
    for j, qj in enumerate(q.astype(np.float64)):
        sc = kk[:p0 + j + 1] @ qj / np.sqrt(SH.kv_width)
        w = np.exp(sc - sc.max())
        out.append((w / w.sum()) @ vv[:p0 + j + 1])
    return np.array(out)


def token(x: dict, j: int) -> dict:
    return {n: a[j] for n, a in x.items()}


@pytest.fixture(scope="module")
def sessions(ctx):
    return {(k, way): Session(ctx, SH, k, way) for k in (2, 4) for way in WAYS}


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("k", [2, 4])
def test_state_after_full_partial_zero_acceptance(sessions, ctx, k, way):
    s = sessions[(k, way)]
    ctx.reset_kv_cache(s.graph)
    s.position, s.accepted, s._acc = 0, k, None
    rng = np.random.default_rng(100 + k)
    accepted: list[dict] = []
    for m in (k, 1, 0, k - 1):  # full, partial, zero, partial
        x = draft(rng, k)
        got = s.verify(x)
        rows = accepted + [token(x, j) for j in range(k)]
        want = attention64([t["new_k"] for t in rows], [t["new_v"] for t in rows], x["attn_q"])
        np.testing.assert_allclose(got["attn_out"].reshape(k, -1), want, rtol=1e-4, atol=1e-5)
        s.accept(m)
        accepted += [token(x, j) for j in range(m)]
    if way != "snapshot":  # the commit is made by the next dispatch
        s.verify(draft(rng, k))
    peek = s.peek()
    want = gdn64(accepted)
    err = np.max(np.abs(peek["state"].reshape(want.shape) - want)) / np.max(np.abs(want))
    assert err <= 2e-6, err
    p, r = len(accepted), SH.ring(k)
    for back in range(1, SH.kernel):  # the conv rows the next token's window reads
        np.testing.assert_array_equal(peek["conv"][(p - back) % r], accepted[p - back]["conv_x"])


def test_capture_and_replay_one_launch_each(sessions):
    for (_k, way), s in sessions.items():
        names = [la.kernel.name for la in s.graph._plan.launches if hasattr(la, "kernel")]
        assert names.count("gdn_capture") == 1, names
        assert names.count("gdn_replay") == (way != "snapshot"), names
        assert all(s.graph.in_place.values()), s.graph.in_place


def test_bad_acceptance_refused(sessions):
    s = sessions[(2, "deferred")]
    with pytest.raises(ValueError, match="accept"):
        s.accept(3)
