"""The runner and worker, with small honest backends defined here (never registered)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from backends.base import Backend, DepthState
from harness import results, runner, worker
from harness.sources import NumpyReferenceWalk, PresetSource
from harness.wire import WorkerReply, WorkerRequest
from model import checksum
from model.errors import UserError
from model.reference import Reference
from model.workload import Workload, preset, valid_cache_bytes

TESTS = str(Path(__file__).resolve().parent)


class NumpyF32(Backend):
    """Test double: the model in float32 NumPy with a page-owned cache (not an oracle)."""

    name = "test:numpy"

    @classmethod
    def available(cls):
        return True, ""

    def prepare(self, workload: Workload, capacity: int) -> None:
        self.cfg = workload.config
        self.model = Reference(workload.config, workload.weights, capacity, dtype=np.float32)
        self.weights_bytes = workload.weights_bytes

    def reach_depth(self, depth: DepthState) -> None:
        self.model.reset()
        for name, arr in depth.cache.items():
            self.model.state[name] = np.array(arr[0], np.float32)
        self.model.position = depth.depth

    def step(self, token: int) -> np.ndarray:
        self.counters.h2d += 8
        logits = self.model.step(token).astype(np.float32)
        self.counters.d2h += logits.nbytes
        self.counters.kernel += self.weights_bytes
        return logits

    def reset(self) -> None:
        self.model.reset()


class Stateless(NumpyF32):
    name = "test:stateless"


class Unavailable(NumpyF32):
    name = "test:unavailable"

    @classmethod
    def available(cls):
        return False, "no such device here"


class Failing(NumpyF32):
    name = "test:failing"

    def step(self, token: int) -> np.ndarray:
        raise RuntimeError("device lost\nsecond line")


class Wrong(NumpyF32):
    name = "test:wrong"

    def step(self, token: int) -> np.ndarray:
        out = super().step(token)
        return out + np.float32(0.5) * np.abs(out).max()


class Crash(NumpyF32):
    name = "test:crash"

    def step(self, token: int) -> np.ndarray:
        os._exit(3)


class Interrupt(NumpyF32):
    """Interrupts the sweep (as Ctrl-C would) at its second context."""

    name = "test:interrupt"

    def reach_depth(self, depth: DepthState) -> None:
        if depth.depth > 4:
            raise KeyboardInterrupt
        super().reach_depth(depth)


DOUBLES = {c.name: c for c in (NumpyF32, Stateless, Unavailable, Failing, Wrong, Crash, Interrupt)}


def config(backends, contexts=(4, 8), inprocess=True, **kw) -> runner.RunConfig:
    kw.setdefault("warm_s", 0.0)
    return runner.RunConfig(preset="tiny", backends=list(backends), contexts=list(contexts), steps=3,
                            warmup=1, inprocess=inprocess, calibrate=False, **kw)


def sweep(tmp_path, backends, **kw):
    out = tmp_path / "run.json"
    res = runner.run_sweep(config(backends, **kw), out, extra_backends=DOUBLES)
    return res, out


def test_sweep_measures_and_matches(tmp_path):
    res, out = sweep(tmp_path, ["test:numpy"])
    assert [p.context for p in res.points] == [4, 8]
    for p in res.points:
        assert p.status == "ok" and p.matches, p
        assert p.capacity == p.context + 1 + 3
        assert p.bytes_per_step["h2d"] == 8 and p.bytes_per_step["d2h"] == 256 * 4
        assert p.match.argmax_agree == 1.0 and p.match.max_rel < 1e-4
        assert p.step_ms.p10 <= p.step_ms.median <= p.step_ms.p90
        assert p.build_s >= 0 and p.time_to_depth_s >= 0 and p.peak_rss_bytes > 0
    assert results.load(out).to_dict() == res.to_dict()


def test_failed_unavailable_and_mismatch_recorded_sweep_goes_on(tmp_path):
    res, _ = sweep(tmp_path, ["test:unavailable", "test:failing", "test:wrong", "test:numpy"])
    by = {p.key: p for p in res.points}
    assert by["test:unavailable", 4].status == "unavailable"
    assert by["test:unavailable", 4].reason == "no such device here"
    f = by["test:failing", 8]
    assert f.status == "failed" and f.reason == "RuntimeError: device lost second line"
    w = by["test:wrong", 4]
    assert w.status == "ok" and not w.matches and not w.match.ok
    # a mismatch is never blank: the worst error, its size and where it is
    assert w.reason.startswith("logits differ from the float64 reference: max abs "), w.reason
    assert f"max rel {w.match.max_rel:.2e}" in w.reason and " at step " in w.reason
    assert "vocab index" in w.reason and by["test:numpy", 8].reason == ""
    assert by["test:numpy", 8].matches
    assert len(res.points) == 8


class SlowFirst(NumpyF32):
    """A step that stalls once per process (the first timed one: step 2, after a warm-up)."""

    name = "test:slowfirst"

    def step(self, token: int) -> np.ndarray:
        self.n = getattr(self, "n", 0) + 1
        if self.n == 2:
            time.sleep(0.2)
        return super().step(token)


class FailsSecond(NumpyF32):
    """Fails in the second worker of a point (a file marks the first)."""

    name = "test:failssecond"

    def prepare(self, workload: Workload, capacity: int) -> None:
        mark = Path(os.environ["STATEBENCH_TEST_MARK"]) / f"seen-{capacity}"
        if mark.exists():
            raise RuntimeError("second process fails")
        mark.touch()
        super().prepare(workload, capacity)


DOUBLES.update({c.name: c for c in (SlowFirst, FailsSecond)})


def test_repeats_kept_per_process_with_interval_and_transients(tmp_path):
    res, out = sweep(tmp_path, ["test:numpy", "test:slowfirst"], repeat=3,
                     contexts=(4,))
    assert res.workload["repeat"] == 3 and len(res.points) == 2
    for p in res.points:
        assert p.matches and len(p.repeats) == 3
        assert all(len(r["step_ms"]) == 3 and r["wall_s"] > 0 for r in p.repeats)
        pooled = sorted(x for r in p.repeats for x in r["step_ms"])
        assert p.step_ms.median == pytest.approx(pooled[4])
        ci = p.step_ms_ci
        assert ci["low"] <= p.step_ms.median <= ci["high"] and "3 per-process" in ci["method"]
        assert "step_ms_samples" not in p.details
    slow = res.point("test:slowfirst", 4)
    assert slow.step_ms_max["step"] == 0 and slow.step_ms_max["ms"] >= 200
    assert [(t["repeat"], t["step"]) for t in slow.transients] == [(0, 0), (1, 0), (2, 0)]
    assert results.load(out).to_dict() == res.to_dict()


def test_a_failing_repeat_fails_the_point_and_is_not_retried(tmp_path, monkeypatch):
    monkeypatch.setenv("STATEBENCH_TEST_MARK", str(tmp_path))
    res, _ = sweep(tmp_path, ["test:failssecond"], repeat=3, contexts=(4,))
    (p,) = res.points
    assert p.status == "failed" and p.reason.startswith("repeat 2 of 3: RuntimeError")
    assert len(p.repeats) == 1  # the first process's samples are kept


def test_repeats_fold_worst_match_and_mean_bytes():
    """repeats.add: the worst match, the median build, the mean bytes with a note where the
    processes counted differently (a GPU run keeps the point)."""
    from harness import repeats

    def one(ms, kernel, ok, build):
        return results.Point(
            "x", 4, 8, 3, step_ms=results.Stats.of(ms), build_s=build, time_to_depth_s=0.0,
            bytes_per_step={"h2d": 8.0, "d2h": 16.0, "d2d": 0.0, "kernel": kernel},
            match=results.Match(ok, 1e-6 if ok else 1.0, 1e-7, 1.0 if ok else 0.5),
            peak_rss_bytes=10, details={"step_ms_samples": ms, "wall_s": 1.0})

    p = repeats.first(one([1.0, 1.1, 1.2], 100.0, True, 2.0))
    p = repeats.add(p, one([1.0, 1.0, 1.3], 100.0, True, 4.0), 2, 3)
    assert "bytes_differ" not in p.details and p.bytes_per_step["kernel"] == 100.0
    p = repeats.add(p, one([2.0, 2.1, 2.2], 130.0, False, 3.0), 3, 3)
    assert not p.match.ok and p.match.max_abs == 1.0 and p.match.argmax_agree == 0.5
    assert p.bytes_per_step["kernel"] == 110.0 and "differ" in p.details["bytes_differ"]
    assert p.build_s == 3.0 and p.details["wall_s"] == 3.0 and len(p.repeats) == 3
    assert p.step_ms.median == 1.2  # pooled over the nine steps


def test_repeats_keep_each_process_host_time_and_cpus():
    """repeats.add: each repeat keeps its own host-time breakdown and CPUs; the point's
    breakdown is each part's median over the repeats, not the first process's."""
    from harness import repeats

    def one(ms, record, cpu):
        return results.Point(
            "wgpu:stateful", 4, 8, 2, step_ms=results.Stats.of(ms), build_s=1.0,
            time_to_depth_s=0.0, bytes_per_step={"h2d": 8.0}, match=results.Match(True, 0, 0, 1),
            details={"step_ms_samples": ms, "wall_s": 1.0,
                     "host_breakdown_ms": {"record_ahead": record, "wait": 1.0},
                     "host_cpus": {"allowed": 16, "last": cpu, "threads": 9, "on_cpu": 0.99}})

    p = repeats.first(one([1.5, 1.6], 0.7, 3))
    assert "host_cpus" not in p.details and p.repeats[0]["host_cpus"]["last"] == 3
    p = repeats.add(p, one([2.0, 2.1], 1.4, 5), 2, 3)
    p = repeats.add(p, one([1.5, 1.5], 0.8, 3), 3, 3)
    assert [r["host_breakdown_ms"]["record_ahead"] for r in p.repeats] == [0.7, 1.4, 0.8]
    assert [r["host_cpus"]["last"] for r in p.repeats] == [3, 5, 3]
    assert p.details["host_breakdown_ms"] == {"record_ahead": 0.8, "wait": 1.0}


def test_repeat_two_real_workers(tmp_path):
    """A real tiny sweep, two fresh worker processes per point (ORT's CPU EP)."""
    pytest.importorskip("onnxruntime")
    res, out = sweep(tmp_path, ["ort-cpu:copy", "ort-cpu:shared"], repeat=2, contexts=(8,),
                     inprocess=False)
    for p in res.points:
        assert p.matches, p.reason
        assert len(p.repeats) == 2 and all(len(r["step_ms"]) == 3 for r in p.repeats)
        assert p.step_ms_ci["low"] <= p.step_ms.median <= p.step_ms_ci["high"]
        # each process froze what its setup made and counted the timed steps' collections
        for r in p.repeats:
            gc_seen = r["gc_timed"]
            assert gc_seen["frozen"] > 1000 and len(gc_seen["collections"]) == 3
            assert gc_seen["ms"] >= gc_seen["max_ms"] >= 0
        assert "gc_timed" not in p.details
    assert results.load(out).points[0].repeats == res.points[0].repeats


def test_interrupted_sweep_keeps_points(tmp_path):
    out = tmp_path / "run.json"
    with pytest.raises(KeyboardInterrupt):
        runner.run_sweep(config(["test:numpy", "test:interrupt"]), out, extra_backends=DOUBLES)
    kept = results.load(out)
    assert [(p.backend, p.context) for p in kept.points] == [
        ("test:numpy", 4), ("test:interrupt", 4), ("test:numpy", 8)]
    assert not list(tmp_path.glob(".*tmp")), "a temp file was left behind"


def test_results_written_atomically_after_each_point(tmp_path, monkeypatch):
    seen = []
    real = results.write_json_atomic

    def spy(path, data, **kw):
        real(path, data, **kw)
        seen.append(len(json.loads(Path(path).read_text())["points"]))

    monkeypatch.setattr(results, "write_json_atomic", spy)
    sweep(tmp_path, ["test:numpy", "test:stateless"])
    assert seen == [1, 2, 3, 4]  # nothing before the first point (no 0-point header)


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    path = tmp_path / "r.json"
    results.write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        results.write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_subprocess_worker_and_crash_isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    res, _ = sweep(tmp_path, ["test:numpy", "test:crash"], contexts=(4,), inprocess=False)
    ok, crash = res.points
    assert ok.matches and "peak_rss_scope" not in ok.details
    assert crash.status == "failed" and "status 3" in crash.reason


def test_the_runner_keeps_what_its_workers_found_whole(tmp_path, monkeypatch):
    """A worker hands back the cache files it verified, so the next point's worker is not
    made to hash the same (multi-GB, on the big presets) weights.bin again."""
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("STATEBENCH_CACHE", str(tmp_path / "cache"))
    sweep(tmp_path, ["ort-cpu:copy"], contexts=(8,), inprocess=False)
    (weights,) = (tmp_path / "cache").rglob("weights.bin")
    before = checksum.hash_counts[str(weights.resolve())]
    assert checksum.problem(weights) is None  # whole, on the worker's word: not hashed here
    assert checksum.hash_counts[str(weights.resolve())] == before == 0


def test_worker_main_protocol(tmp_path):
    """One WorkerRequest in, one WorkerReply out (a JSON line each): the point, and the cache
    files the worker found whole."""
    cfg = config(["test:numpy"])
    source = PresetSource("tiny", 0)
    wl = source.workload()
    arrays = source.depth_arrays(4, 8, cfg.warmup + cfg.steps)
    np.savez(tmp_path / "d.npz", **arrays)
    req = WorkerRequest(backend="test:numpy", backend_path="test_runner:NumpyF32",
                        source=source, context=4, capacity=8, steps=3, warmup=1,
                        depth_file=str(tmp_path / "d.npz"))
    assert WorkerRequest.from_json(req.to_json()) == req
    env = dict(os.environ, PYTHONPATH=TESTS + os.pathsep + os.getcwd())
    proc = subprocess.run([sys.executable, "-m", "harness.worker"], input=req.to_json(),
                          capture_output=True, text=True, env=env, check=True)
    (line,) = proc.stdout.splitlines()
    reply = WorkerReply.from_json(line)
    point = reply.point
    assert point.matches and point.context == 4
    # cache_bytes is the valid cache at depth 4 (4 KV rows + whole GDN states), not capacity 8
    assert point.cache_bytes == valid_cache_bytes(wl.config, 4)
    assert point.cache_bytes < sum(int(a.nbytes) for k, a in arrays.items() if k.startswith("cache:"))


def test_depth_state_continues_the_reference():
    wl = Workload.build(preset("tiny"))
    a = PresetSource("tiny", 0).depth_arrays(5, 9, 4)
    ref = Reference(wl.config, wl.weights, 9)
    full = ref.prefill(a["tokens"])
    np.testing.assert_allclose(a["ref_logits"], full[5:], rtol=1e-9, atol=1e-9)
    assert a["tokens"].shape == (9,)


def test_capacity_and_contexts_checked():
    with pytest.raises(UserError, match="too small"):
        config(["test:numpy"], capacity=5).capacity_for(4)
    assert runner.parse_contexts("64, 256,64") == [64, 256]
    for bad in ("a,2", "0", "-3", ",", "1.5"):
        with pytest.raises(UserError):
            runner.parse_contexts(bad)


def test_worker_reports_unknown_backend_as_failed(tmp_path):
    p = worker.measure(WorkerRequest(backend="nope:nope", source=PresetSource("tiny"), context=1,
                                     capacity=4, steps=1, warmup=0,
                                     depth_file=str(tmp_path / "x.npz")))
    assert p.status == "failed" and "nope:nope" in p.reason


def test_reference_walk_equals_fresh_reference_at_each_depth():
    """Walking up contexts (one prefill, look-ahead rolled back) == a fresh reference per point."""
    wl = Workload.build(preset("tiny"))
    walk = NumpyReferenceWalk(wl.config, wl.weights, 0, 20 + 4, 24)
    for ctx, cap in ((5, 9), (12, 16), (20, 24)):
        a = walk.arrays_at(ctx, cap, 4)
        b = PresetSource("tiny", 0).depth_arrays(ctx, cap, 4)
        assert set(a) == set(b)
        for k in a:
            assert a[k].shape == b[k].shape, k
            np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-12, err_msg=k)


def test_heater_loads_the_gpu_and_leaves_cpu_adapters_alone(monkeypatch):
    """The clock warm-up runs a streaming kernel for the time asked on a GPU (here forced on
    lavapipe), and nothing on a CPU adapter by default or when no time is asked; a failing
    heater is a reason, not an error."""
    from harness import heater
    from harness.heater import heat

    got, why = heat(0.2, on_cpu_adapter=True)
    assert why == "" and 0.2 <= got < 5
    assert heat(0.2) == (0.0, "a CPU adapter has no GPU clock to raise")
    assert heat(0.0, on_cpu_adapter=True) == (0.0, "no time asked")

    def broken(*_a):
        raise RuntimeError("device lost\n  (driver)")

    monkeypatch.setattr(heater, "_run", broken)
    assert heat(0.2, on_cpu_adapter=True) == (0.0, "heater failed: device lost (driver)")


def test_sweep_points_say_whether_the_gpu_was_heated(tmp_path):
    res, _ = sweep(tmp_path, ["test:numpy"], contexts=(4,), warm_s=0.5)
    (p,) = res.points
    assert p.matches and p.details["heated_s"] == 0.0
    assert p.details["not_heated"].startswith(("a CPU adapter has no GPU clock", "wgpu"))


def test_host_breakdown_is_the_median_of_each_part():
    """A point's host-time breakdown (docs/measuring.md, "Host time"): each part's median
    over the timed steps, and wall minus GPU time only where every step has a GPU time."""
    from harness.worker import host_breakdown

    host = [{"wait": 1.0, "copy": 0.1}, {"wait": 3.0, "copy": 0.3}, {"wait": 2.0, "copy": 0.2}]
    assert host_breakdown(host, [4.0, 5.0, 9.0], [3.0, 4.5, 7.0]) == {
        "wait": 2.0, "copy": 0.2, "wall_minus_gpu": 1.0}
    assert "wall_minus_gpu" not in host_breakdown(host, [4.0, 5.0, 9.0], [3.0])
