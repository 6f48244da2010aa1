"""Rollback on the proposal's stateful graph, four ways (issue 31 items 3 and 5,
``backends/webnn/rollback.py``), at one hybrid layer on the WebNN library: after verifies
accepting all, some and none of K = 2, 4 drafted tokens, the recurrent state, the conv rows
and the attention over the KV rows equal float64 NumPy feeding only the accepted tokens
(written here, sharing no code with the library); the capture and replay run as one
launch each; and ``cpu_replay`` (genai's ``ReplayStateUpdates``) moves the state and the
capsule down and the state up at a rollback, nothing else."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn.rollback import WAYS, Layer, Session, replay_host
from harness.speculative.webnn_rollback import random_draft

pytest.importorskip("wgpu")
pytest.importorskip("onnx")

SH = Layer(hk=1, hv=2, dk=16, dv=8, conv_dim=6, kernel=4, kv_width=8, capacity=24)


def draft(rng, k: int) -> dict[str, np.ndarray]:
    """Fresh random inputs of K tokens (none zero)."""
    return random_draft(rng, SH, k)


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
    s.reset()
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
    if way in ("deferred", "extension"):  # the commit is made by the next dispatch
        s.verify(draft(rng, k))
    peek = s.peek()
    want = gdn64(accepted)
    err = np.max(np.abs(peek["state"].reshape(want.shape) - want)) / np.max(np.abs(want))
    assert err <= 2e-6, err
    p, r = len(accepted), SH.ring(k)
    for back in range(1, SH.kernel):  # the conv rows the next token's window reads
        np.testing.assert_array_equal(peek["conv"][(p - back) % r], accepted[p - back]["conv_x"])


def test_capture_and_replay_one_launch(sessions):
    """The deferred and extension ways' replay is computed by the verify's capture launch
    (``KernelOptions.gdn_replay`` "fused", the default): one launch for both."""
    for s in sessions.values():
        names = [la.kernel.name for la in s.graph._plan.launches if hasattr(la, "kernel")]
        assert names.count("gdn_capture") == 1, names
        assert names.count("gdn_replay") == 0, names
        assert all(s.graph.in_place.values()), s.graph.in_place


@pytest.mark.parametrize("way", ["deferred", "extension"])
def test_the_fused_replay_equals_its_own_launch(ctx_with, way):
    """The replay inside the capture and the replay as a launch of its own leave the same
    state and outputs (bitwise: the same fma in the same order) over full, partial and zero
    acceptance, from fresh random drafts."""
    k = 4
    runs = {}
    for how in ("fused", "launch"):
        s = Session(ctx_with(gdn_replay=how), SH, k, way)
        names = [la.kernel.name for la in s.graph._plan.launches if hasattr(la, "kernel")]
        assert names.count("gdn_replay") == (how == "launch"), (how, names)
        rng = np.random.default_rng(7)
        outs = []
        for m in (k, 2, 0, 3, 1):
            got = s.verify(draft(rng, k))
            outs += [got["output"].copy(), got["attn_out"].copy()]
            s.accept(m)
        s.verify(draft(rng, k))
        runs[how] = (outs, s.peek()["state"].copy())
        s.graph.destroy()
    for a, b in zip(runs["fused"][0], runs["launch"][0], strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(runs["fused"][1], runs["launch"][1])


def test_bad_acceptance_refused(sessions):
    s = sessions[(2, "deferred")]
    with pytest.raises(ValueError, match="accept"):
        s.accept(3)


@pytest.mark.parametrize("k", [2, 4])
def test_cpu_replay_moves_state_and_capsule_down_state_up(sessions, ctx, k):
    """Per accept: a rollback to 0 < m < K reads the pre-verify state and the capsule back
    and writes the state once (no kernel, no device copy); m = K and m = 0 pick a bank."""
    s = sessions[(k, "cpu_replay")]
    s.reset()
    rng = np.random.default_rng(200 + k)
    state, capsule = 4 * SH.hv * SH.dv * SH.dk, 4 * k * SH.row
    assert (s.state_bytes, s.capsule_bytes) == (state, capsule)
    for m in (k, 1, 0, k - 1):
        s.verify(draft(rng, k))
        before = ctx.counters.snapshot()
        s.accept(m)
        got = ctx.counters.since(before).as_dict()
        rolled = 0 < m < k
        assert got == {"h2d": state * rolled, "d2h": (state + capsule) * rolled, "d2d": 0,
                       "kernel": 0}, (m, got)
        assert (s.split is not None) or not rolled


def test_replay_host_layout_and_valid_count():
    """``replay_host`` reads ORT's capsule row (decays, keys, deltas; C rows each) and
    refuses transitions past min(count, capacity, tokens)."""
    rng = np.random.default_rng(7)
    c, sh = 3, Layer(hk=1, hv=2, dk=4, dv=3, conv_dim=1, kernel=2, kv_width=1, capacity=1)
    decay = rng.uniform(0.5, 1.0, (c, sh.hv))
    key = rng.standard_normal((c, sh.hk, sh.dk))
    delta = rng.standard_normal((c, sh.hv, sh.dv))
    cap = np.concatenate([decay.ravel(), key.ravel(), delta.ravel()]).astype(np.float32)
    s0 = rng.standard_normal((sh.hv, sh.dv, sh.dk))
    want = s0.copy()
    for t in range(2):
        for h in range(sh.hv):
            want[h] = decay[t, h] * want[h] + np.outer(delta[t, h], key[t, h * sh.hk // sh.hv])
    got = replay_host(s0.astype(np.float32), cap, 2, sh, c)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="valid"):
        replay_host(s0, cap, 2, sh, c, count=1)
    with pytest.raises(ValueError, match="valid"):
        replay_host(s0, cap, 3, sh, c, tokens=2)
