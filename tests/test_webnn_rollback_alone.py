"""The deferred replay alone (issue 31 item 5's "device-side replay" against genai's host
round trip; ``Session.replay_launches`` / ``encode_replay`` / ``replay_now`` in
``backends/webnn/rollback.py``, timed by ``harness/speculative/webnn_rollback.py``): the
launches run alone are the way's own replay, their result equals float64 NumPy (written
here: the transitions of the accepted tokens from the pre-verify state, replayed), also
after the timing path has run them over and over in place, and the timing returns positive
finite times (or, below resolution, none and why) with the method per row."""

from __future__ import annotations

import math

import numpy as np
import pytest

from backends.webnn.rollback import WAYS, Layer, Session
from harness.speculative.webnn_rollback import random_draft

pytest.importorskip("wgpu")
pytest.importorskip("onnx")

SH = Layer(hk=2, hv=4, dk=16, dv=8, conv_dim=6, kernel=4, kv_width=8, capacity=24)


draft = random_draft  # fresh random inputs of K tokens at layer shapes


def transitions64(s: np.ndarray, x: dict, m: int, sh: Layer) -> list[tuple]:
    """float64: the first m tokens' transitions (decay, key, delta) from state s, each delta
    from the state the token meets (what the capture records)."""
    s = s.copy()
    out = []
    for j in range(m):
        k = x["key"][j].astype(np.float64)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-12)
        kh = k[np.arange(sh.hv) * sh.hk // sh.hv]  # [Hv, Dk]
        a = np.exp(x["decay"][j].astype(np.float64))  # [Hv]
        sd = a[:, None, None] * s
        delta = x["beta"][j][:, None] * (x["value"][j] - np.einsum("hvd,hd->hv", sd, kh))
        out.append((a, kh, delta))
        s = sd + delta[:, :, None] * kh[:, None, :]
    return out


def replay64(s: np.ndarray, steps: list[tuple], times: int = 1) -> np.ndarray:
    """float64: ``S = decay S + outer(delta, key)`` over ``steps``, ``times`` over."""
    s = s.copy()
    for _ in range(times):
        for a, kh, delta in steps:
            s = a[:, None, None] * s + delta[:, :, None] * kh[:, None, :]
    return s


def feed64(tokens: list[tuple[dict, int]], sh: Layer) -> np.ndarray:
    """float64: the state after the first m tokens of each (draft, m), in order."""
    s = np.zeros((sh.hv, sh.dv, sh.dk))
    for x, m in tokens:
        s = replay64(s, transitions64(s, x, m, sh))
    return s


def close(got: np.ndarray, want: np.ndarray, tol: float = 2e-6) -> None:
    err = np.max(np.abs(got.reshape(want.shape) - want)) / np.max(np.abs(want))
    assert err <= tol, err


@pytest.fixture(scope="module")
def lctx(ctx_with):
    """The replay with a launch of its own (by default the capture computes it)."""
    return ctx_with(gdn_replay="launch")


def test_a_fused_replay_has_no_launch_to_time(ctx_with):
    """By default the verify's capture computes the replay: nothing to time alone, said."""
    s = Session(ctx_with(), SH, 2, "deferred")
    with pytest.raises(NotImplementedError, match="gdn_replay='launch'"):
        s.replay_launches()
    s.graph.destroy()


def test_replay_launches_are_the_ways_replay(lctx):
    """The mask and the replay kernel, in the graph's order, for the two device ways."""
    for way in WAYS:
        s = Session(lctx, SH, 2, way)
        idx = s.replay_launches()
        names = [s.graph._plan.launches[i].kernel.name for i in idx]
        if way in ("deferred", "extension"):
            assert len(names) == 2 and names[-1] == "gdn_replay", names
            assert "where" in names[0], names
            assert idx == sorted(idx)
        else:
            assert idx == [], names
            with pytest.raises(ValueError, match="no device replay"):
                s.begin_replay()
        s.graph.destroy()


@pytest.mark.parametrize("way", ["deferred", "extension"])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_replay_now_equals_float64(lctx, way, m):
    """From a non-zero pre-verify state, the replay alone of m of K = 4 leaves the state of
    float64 fed only those; the next dispatch then replays nothing, and the session goes on."""
    k, rng = 4, np.random.default_rng(300 + m)
    s = Session(lctx, SH, k, way)
    x0, x1, x2 = (draft(rng, SH, k) for _ in range(3))
    s.verify(x0)
    s.accept(k)
    s.verify(x1)  # commits x0: the pre-verify state of x1
    s.accept(m)
    s.replay_now()
    close(s.peek()["state"], feed64([(x0, k), (x1, m)], SH))
    s.verify(x2)  # replays nothing (count 0)
    s.accept(k)
    s.verify(draft(rng, SH, k))
    close(s.peek()["state"], feed64([(x0, k), (x1, m), (x2, k)], SH))
    s.graph.destroy()


@pytest.fixture(scope="module")
def tctx():
    """A context with GPU timestamps where the adapter has them (as the harness times on)."""
    from conftest import ENGINE

    from backends.webnn import ml
    from backends.webnn.wgpu_impl.options import KernelOptions

    try:
        c = ml.create_context(engine=ENGINE, timing=True,
                              options=KernelOptions(gdn_replay="launch"))
    except Exception as e:  # noqa: BLE001 - any driver failure means "no adapter here"
        pytest.skip(f"no WebGPU adapter ({ENGINE}): {e}")
    yield c
    c.destroy()


@pytest.mark.parametrize("timestamps", [True, False])
def test_device_replay_timing_runs_the_replay(tctx, timestamps):
    """The timing path replays in place ``runs`` times: the state is then float64's
    pre-verify state with the accepted transitions applied ``runs`` times over; its time
    is positive and finite (or, for the slope, none with its resolution and why)."""
    from harness.speculative.webnn_rollback import device_replay

    k, m, rng = 2, 1, np.random.default_rng(400)
    s = Session(tctx, SH, k, "deferred")
    x0, x1 = draft(rng, SH, k), draft(rng, SH, k)
    s.verify(x0)
    s.accept(k)
    s.verify(x1)
    s.accept(m)
    got = device_replay(tctx, s, trials=3, timestamps=timestamps, n=4)
    pre = feed64([(x0, k)], SH)
    assert got["runs"] >= 4 and got["launches"] == 2, got
    close(s.peek()["state"], replay64(pre, transitions64(pre, x1, m, SH), got["runs"]), 1e-5)
    if timestamps and "timestamp-query" in tctx._device.features:
        assert got["method"].startswith("GPU timestamps"), got
        assert got["ms"] > 0 and math.isfinite(got["ms"]), got
    else:
        assert got["method"].startswith("wall-time slope"), got
        assert got["resolution_ms"] >= 0, got
        if got["ms"] is None:
            assert "resolution" in got["reason"], got
        else:
            assert got["ms"] > got["resolution_ms"] and math.isfinite(got["ms"]), got
    s.graph.destroy()


def test_replays_alone_rows(tctx):
    """hybrid-1b's shapes at capacity 64, K = 2: one row at m = 1, the host round trip
    and the device replay each timed alone, the method named, a ratio only of positive
    times."""
    from harness.speculative.webnn_rollback import layer_of, replays_alone

    rows = replays_alone(tctx, layer_of("hybrid-1b", 64), 2, trials=2)
    assert list(rows) == [1]
    r = rows[1]
    assert (r["k"], r["m"]) == (2, 1)
    host = r["host"]
    assert set(host["parts"]) == {"read", "replay", "write", "land"}, host
    assert r["host_round_trip_ms"] == host["ms"] > 0 and math.isfinite(host["ms"])
    assert set(r["device"]) == {"deferred", "extension"}
    for d in r["device"].values():
        assert d["launches"] == 2 and d["method"], d
        assert d["ms"] is None or (d["ms"] > 0 and math.isfinite(d["ms"])), d
    assert r["method"].startswith("device: ") and "host: " in r["method"]
    if r["device_replay_ms"] is None:
        assert r["speedup"] is None and "resolution" in r["reason"]
    else:
        assert r["speedup"] == pytest.approx(host["ms"] / r["device_replay_ms"])
