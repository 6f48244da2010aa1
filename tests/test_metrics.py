"""Logit agreement, floors, MBU inputs, speedups."""

from __future__ import annotations

import numpy as np

from harness import metrics
from harness.results import Match, Point, Stats
from model.workload import cache_specs, preset


def test_compare_logits_tolerance_and_argmax():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((3, 50))
    ok = metrics.compare_logits([r.astype(np.float32) for r in ref], ref)
    assert ok.ok and ok.argmax_agree == 1.0 and ok.max_rel < 1e-6
    off = metrics.compare_logits([r + 0.01 * np.abs(r).max() for r in ref], ref)
    assert not off.ok and off.max_rel > 1e-3
    # swap the top two where their gap is clear: argmax disagrees, within tolerance nowhere
    swapped = ref.copy()
    i, j = np.argsort(swapped[0])[-2:]
    swapped[0, [i, j]] = swapped[0, [j, i]]
    assert not metrics.compare_logits(list(swapped), ref).ok
    bad = metrics.compare_logits([np.full(50, np.nan)] * 3, ref)
    assert not bad.ok and bad.max_abs == metrics.NONFINITE


def test_float16_tolerance_is_the_ulp_budget_and_recorded():
    """float16 activations: sqrt(32·layers + 8) float16 ULPs (2^-10), recorded in the Match;
    float32 stays 1e-3. An error between the two passes only under the float16 one, and a
    clear argmax swap fails under both."""
    assert metrics.logits_tolerance(preset("tiny+q4")) == 1e-3
    tiny = metrics.logits_tolerance(preset("tiny+q4f16"))
    llama = metrics.logits_tolerance(preset("llama-1b+q4f16"))
    assert tiny == np.sqrt(32 * 2 + 8) * 2.0 ** -10
    assert abs(llama - np.sqrt(32 * 16 + 8) / 1024) < 1e-12 and 0.02 < llama < 0.025
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((3, 50))
    near = [r + 0.004 * np.abs(r).max() for r in ref]
    assert not metrics.compare_logits(near, ref).ok
    m = metrics.compare_logits(near, ref, tiny)
    assert m.ok and m.tolerance == tiny
    assert f"tolerance {tiny / 2:.1e}" in metrics.mismatch_reason(near, ref, tiny / 2)
    i, j = np.argsort(ref[0])[-2:]
    ref[0, j] = ref[0, i] + 2 * tiny * np.abs(ref[0]).max()  # a clear top-2 gap
    swapped = ref.copy()
    swapped[0, [i, j]] = swapped[0, [j, i]]
    assert not metrics.compare_logits(list(swapped), ref, tiny).ok


def test_argmax_tie_is_not_a_mismatch():
    ref = np.zeros((1, 10))
    ref[0, 3] = ref[0, 4] = 1.0
    got = ref.copy()
    got[0, 4] += 1e-7  # argmax flips between exactly tied logits
    m = metrics.compare_logits(list(got), ref)
    assert m.ok and m.argmax_agree == 0.0


def test_floor_counts_state_and_stateless_link():
    cfg = preset("tiny")
    written = metrics.written_state_bytes(cfg)
    kv_row = cfg.kv_heads * cfg.head_dim * 4
    gdn = cfg.gdn_v_heads * cfg.gdn_v_dim * cfg.gdn_qk_dim * 4
    # the conv window: q, k and v channels, kernel - 1 columns
    conv = (2 * cfg.gdn_qk_heads * cfg.gdn_qk_dim + cfg.gdn_v_heads * cfg.gdn_v_dim) * 3 * 4
    assert written == 2 * kv_row + gdn + conv
    assert metrics.full_cache_bytes(cfg, 10) == sum(s.nbytes for s in cache_specs(cfg, 10))
    cal = {"host": {"copy_gbps": 1.0}, "wgpu": {"stream_gbps": 2.0, "h2d_gbps": 1.0, "d2h_gbps": 1.0}}
    base = metrics.floor_bytes(cfg, 1000, 8)
    assert metrics.floor_ms("ort-cpu:shared", cfg, 1000, 8, 16, cal)[0] == base / 1e6
    assert metrics.floor_ms("wgpu:stateful", cfg, 1000, 8, 16, cal)[0] == base / 2e6
    full = metrics.full_cache_bytes(cfg, 16)
    assert np.isclose(metrics.floor_ms("wgpu:stateless", cfg, 1000, 8, 16, cal)[0],
                      base / 2e6 + 2 * full / 1e6)
    assert np.isclose(metrics.floor_ms("ort-cpu:copy", cfg, 1000, 8, 16, cal)[0],
                      (base + 2 * full) / 1e6)
    assert metrics.is_stateless("x:y", {"host_cache": True})
    ms, why = metrics.floor_ms("wgpu:reuse", cfg, 1000, 8, 16, {"wgpu": {"reason": "no adapter"}})
    assert ms is None and why == "no adapter"


def test_no_floor_from_a_rejected_bandwidth():
    """A bandwidth the calibration rejected is None with a reason: no floor (so no MBU), and
    the reason travels; a non-finite or non-positive figure gives no floor either."""
    cfg = preset("tiny")
    ok = {"stream_gbps": 2.0, "h2d_gbps": 1.0, "d2h_gbps": 1.0}
    for gpu, backend, reason in [
        ({**ok, "stream_gbps": None, "stream_reason": "9.395e+08 GB/s is above the bound"},
         "wgpu:stateful", "9.395e+08 GB/s is above the bound"),
        ({**ok, "h2d_gbps": None, "h2d_reason": "lost in timer noise"},
         "wgpu:stateless", "lost in timer noise"),
        ({**ok, "stream_gbps": float("inf")}, "wgpu:stateful", "no device bandwidth calibrated"),
        ({**ok, "stream_gbps": float("nan")}, "wgpu:stateful", "no device bandwidth calibrated"),
        ({**ok, "d2h_gbps": -1.0}, "wgpu:stateless", "no host link bandwidth calibrated"),
    ]:
        assert metrics.floor_ms(backend, cfg, 1000, 8, 16, {"wgpu": gpu}) == (None, reason)
    host = {"copy_gbps": None, "copy_reason": "not finite (inf)"}
    assert metrics.floor_ms("ort-cpu:shared", cfg, 1000, 8, 16, {"host": host}) == (
        None, "not finite (inf)")
    # the stateful floor needs only the stream figure: a rejected link figure does not block it
    gpu = {**ok, "h2d_gbps": None, "h2d_reason": "x"}
    assert metrics.floor_ms("wgpu:stateful", cfg, 1000, 8, 16, {"wgpu": gpu})[0] is not None


def _pt(backend, ms, ok=True):
    return Point(backend, 8, 12, 3, step_ms=Stats(ms, ms, ms), match=Match(ok, 0, 0, 1.0),
                 bytes_per_step={"h2d": 0, "d2h": 0, "d2d": 0, "kernel": 0})


def test_speedup_never_for_a_mismatch():
    base = _pt("wgpu:stateless", 2.0)
    assert metrics.speedup(_pt("wgpu:stateful", 1.0), base) == 2.0
    assert metrics.speedup(_pt("wgpu:stateful", 1.0, ok=False), base) is None
    assert metrics.ratio(_pt("wgpu:stateful", 1.0, ok=False), base) == 0.5
    pts = [_pt("ort-cpu:copy", 1.0), _pt("wgpu:stateless", 1.0, ok=False)]
    assert metrics.stateless_baseline(pts) == "ort-cpu:copy"
    assert metrics.stateless_baseline(pts + [_pt("wgpu:stateless", 1.0)]) == "wgpu:stateless"


def test_human_bytes():
    assert metrics.human_bytes(512) == "512 B"
    assert metrics.human_bytes(3 * 2**20) == "3.0 MiB"
    assert metrics.human_bytes(512, short=True) == "512"
    assert metrics.human_bytes(1536, short=True) == "1.5K"
    assert metrics.human_bytes(5 * 2**40) == "5.0 TiB"
    assert metrics.human_bytes(None) == "—"


def test_recorded_lavapipe_run_has_plausible_mbu():
    """On the committed lavapipe run every measured point's MBU is in (0, 1.05]: the floors
    are calibrated on the same machine, in the same process, for the same kind of work."""
    from pathlib import Path

    from harness.results import load

    run = load(Path(__file__).resolve().parents[1] / "results/lavapipe/run-small-1024.json")
    mbus = [p.mbu for p in run.points if p.status == "ok"]
    assert len(mbus) == len(run.points) and mbus
    assert all(m is not None and 0 < m <= metrics.MBU_PLAUSIBLE_MAX for m in mbus), mbus


def test_calibration_problems_name_implausible_device_figures():
    """A run recorded before the calibration checked itself (the H200's 9.4e8 GB/s copy
    slope) is named, so its floors and MBU are not charted; sane figures pass."""
    from harness.metrics import calibration_problems

    bad = {"wgpu": {"h2d_gbps": 3.8, "d2h_gbps": 1.5, "d2d_gbps": 939524096.0, "stream_gbps": 1072.3}}
    assert [p.split()[0] for p in calibration_problems(bad)] == ["d2d"]
    good = {"wgpu": {"h2d_gbps": 3.8, "d2h_gbps": 1.5, "d2d_gbps": 545.5, "stream_gbps": 2500.0}}
    assert calibration_problems(good) == []
    assert calibration_problems({}) == []
    assert calibration_problems({"wgpu": {"stream_gbps": None, "stream_reason": "x"}}) == []
