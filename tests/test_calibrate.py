"""Bandwidth calibration: the plausibility guard, the timestamp helper, and a real run."""

from __future__ import annotations

import math

import pytest

from harness import bandwidth, calibrate


@pytest.mark.parametrize("value", [0, 0.0, -3.5, float("nan"), float("inf"), -float("inf"),
                                   939524096.0, 20_001.0, None, "fast", [1.0]])
def test_guard_rejects_absurd_device_bandwidths(value):
    v, why = bandwidth.checked_gbps(value, bandwidth.MEMORY_MAX_GBPS)
    assert v is None and why


def test_guard_keeps_plausible_figures_and_bounds_the_link():
    assert bandwidth.checked_gbps(4000.0, bandwidth.MEMORY_MAX_GBPS) == (4000.0, "")
    assert bandwidth.checked_gbps(1.0004, bandwidth.MEMORY_MAX_GBPS) == (1.0, "")
    assert bandwidth.checked_gbps(3e-5, bandwidth.LINK_MAX_GBPS) == (3e-5, "")  # tiny, not 0
    assert bandwidth.checked_gbps(939.5, bandwidth.LINK_MAX_GBPS)[0] is None  # no host link
    assert bandwidth.checked_gbps(939.5, bandwidth.MEMORY_MAX_GBPS) == (939.5, "")


def test_record_writes_none_with_reason_and_method():
    out: dict = {}
    bandwidth.record(out, "d2d", 939524096.0, bandwidth.MEMORY_MAX_GBPS, "wall slope")
    assert out["d2d_gbps"] is None and out["d2d_method"] == "wall slope"
    assert "above the physical bound" in out["d2d_reason"]
    bandwidth.record(out, "stream", None, bandwidth.MEMORY_MAX_GBPS, "wall slope", "lost in noise")
    assert out["stream_gbps"] is None and "lost in noise" in out["stream_reason"]
    bandwidth.record(out, "h2d", 4.218, bandwidth.LINK_MAX_GBPS, "wall slope")
    assert out["h2d_gbps"] == 4.218 and "h2d_reason" not in out


def test_timestamp_helper_takes_the_best_trial_and_drops_bad_ones():
    # (gpu ns, wall ns) per call; the first call is the warm-up
    runs = iter([(10, 10), (4_000, 5_000), (2_000, 3_000), (0, 1_000), (3_000, 3_500)])
    gbps, why = bandwidth._timestamp_gbps(8_000, lambda: next(runs), trials=4)
    assert gbps == 4.0 and why == ""
    # ticks that are not nanoseconds: an interval longer than the submit's own wall time
    runs = iter([(1, 1)] + [(50_000, 1_000)] * 3)
    gbps, why = bandwidth._timestamp_gbps(8_000, lambda: next(runs), trials=3)
    assert gbps is None and "wall time" in why
    runs = iter([(1, 1)] + [(-5, 1_000)] * 2)
    gbps, why = bandwidth._timestamp_gbps(8_000, lambda: next(runs), trials=2)
    assert gbps is None and "did not advance" in why


def test_slope_lost_in_noise_is_none(monkeypatch):
    """Work far shorter than the submit overhead (the H200's 9.4e8 GB/s): t(8) - t(1) is
    noise, not a bandwidth; work that dominates it gives its rate."""
    clock = [0]
    jitter = iter([0, 30, 0, 10, 5, 20, 0] * 2)

    def fake_run(per_rep_ns):
        def run(k):  # 100 µs of submit overhead, some jitter, then k repetitions
            clock[0] += 100_000 + 1_000 * next(jitter) + k * per_rep_ns
        return run

    monkeypatch.setattr(bandwidth.time, "perf_counter_ns", lambda: clock[0])
    gbps, why = bandwidth._slope_gbps(64 << 20, fake_run(0))
    assert gbps is None and "noise" in why
    gbps, why = bandwidth._slope_gbps(1_000_000, fake_run(1_000_000))  # 1 ms a repetition
    assert why == "" and gbps == pytest.approx(1.0)  # 7 MB over the 7 ms t(8) - t(1)


def _check(gpu: dict, name: str, bound: float) -> None:
    v = gpu[f"{name}_gbps"]
    assert gpu[f"{name}_method"] in ("timestamps", "wall slope", "wall best-of")
    if v is None:
        assert gpu[f"{name}_reason"]
    else:
        assert isinstance(v, float) and math.isfinite(v) and 0 < v <= bound


def _adapter():
    from backends.webnn.adapter import wgpu_adapter

    adapter, why = wgpu_adapter()
    if adapter is None:
        pytest.skip(f"no WebGPU adapter: {why}")
    return adapter


@pytest.mark.parametrize("timestamps,copies", [(True, "auto"), (True, "passes"), (False, "auto")],
                         ids=["timestamps", "copies-between-passes", "wall"])
def test_real_calibration(timestamps, copies):
    """On the machine's adapter (lavapipe in CI), small buffers: every figure is a positive
    finite number under its bound, or None with a reason; each says how it was measured."""
    adapter = _adapter()
    gpu = bandwidth.wgpu_bandwidth(size=8 << 20, gpu_size=8 << 20, timestamps=timestamps,
                                   copy_timestamps=copies)
    assert "reason" not in gpu, gpu
    for name in ("stream", "d2d"):
        _check(gpu, name, bandwidth.MEMORY_MAX_GBPS)
    for name in ("h2d", "d2h"):
        _check(gpu, name, bandwidth.LINK_MAX_GBPS)
    assert gpu["d2h_method"] == gpu["h2d_method"] == "wall slope"
    if timestamps and "timestamp-query" in adapter.features:
        # the device figures come from the GPU's clock, or say why they could not
        for name in ("stream", "d2d"):
            assert gpu[f"{name}_method"] == "timestamps" or gpu.get(f"{name}_timestamp_reason")
    if not timestamps:
        assert gpu["stream_method"] == gpu["d2d_method"] == "wall slope"


def test_real_calibration_rejects_past_the_bound(monkeypatch):
    """With an absurdly low bound every figure is rejected: None with a reason, never a
    number; a rejected timestamped figure records why and falls back to the slope."""
    adapter = _adapter()
    monkeypatch.setattr(bandwidth, "MEMORY_MAX_GBPS", 1e-9)
    monkeypatch.setattr(bandwidth, "LINK_MAX_GBPS", 1e-9)
    for name in bandwidth.WGPU_BOUNDS:
        monkeypatch.setitem(bandwidth.WGPU_BOUNDS, name, 1e-9)
    gpu = bandwidth.wgpu_bandwidth(size=4 << 20, gpu_size=4 << 20)
    for name in ("stream", "d2d", "h2d", "d2h"):
        assert gpu[f"{name}_gbps"] is None and gpu[f"{name}_reason"], gpu
    if "timestamp-query" in adapter.features:
        assert "above the physical bound" in gpu["stream_timestamp_reason"]
        assert gpu["stream_method"] == "wall slope"
    cal = calibrate.calibrate(need_gpu=False, size=4 << 20)
    assert cal["host"]["copy_gbps"] is None and "bound" in cal["host"]["copy_reason"]


@pytest.mark.parametrize("ends", ["measuring", "failing"])
def test_bandwidth_probe_frees_what_it_made(monkeypatch, ends):
    """Every buffer the probe made (its own, and the host link's staging) is destroyed or
    let go of (collected), whether the measurement finished or raised midway."""
    import gc
    import weakref

    from wgpu.backends.wgpu_native import _api

    adapter = _adapter()
    made, destroyed = [], set()

    def counted(cls, maker):
        orig = getattr(cls, maker)

        def make(self, *a, **k):
            obj = orig(self, *a, **k)
            made.append((obj.size, id(obj), weakref.ref(obj)))
            return obj

        monkeypatch.setattr(cls, maker, make)

    counted(_api.GPUDevice, "create_buffer")
    orig_destroy = _api.GPUBuffer.destroy

    def destroy(self):
        destroyed.add(id(self))
        return orig_destroy(self)

    monkeypatch.setattr(_api.GPUBuffer, "destroy", destroy)
    probe = bandwidth.WgpuBandwidthProbe(adapter, size=4 << 20, gpu_size=4 << 20)
    if ends == "measuring":
        with probe:
            out = probe.measure()
        assert out["h2d_method"] == "wall slope"
    else:
        with pytest.raises(RuntimeError, match="midway"), probe:
            probe.upload()
            probe.download()  # the host link's read staging exists too
            raise RuntimeError("a device lost midway")
    assert len(made) >= 5, made  # two buffers, the fence, write and read staging
    gc.collect()
    held = [size for size, key, ref in made if key not in destroyed and ref() is not None]
    assert not held, held
