"""The results schema: round trip, validation of bad files as one-line user errors."""

from __future__ import annotations

import copy
import json

import pytest

from harness.results import SCHEMA, Match, Point, Results, Stats, load
from model.errors import UserError


def sample() -> Results:
    ok = Point("ort-cpu:copy", 64, 82, 16, step_ms=Stats(1.0, 0.9, 1.2), gpu_ms=None,
               gpu_reason="backend has no GPU timer", build_s=0.5, time_to_depth_s=0.01,
               bytes_per_step={"h2d": 10.0, "d2h": 20.0, "d2d": 0.0, "kernel": 1e6},
               cache_bytes=1000, weights_bytes=900_000, floor_ms=0.1, mbu=0.1,
               peak_rss_bytes=10**8, device_bytes=None,
               match=Match(True, 1e-6, 1e-7, 1.0), details={"in_place": {"a": True}})
    return Results(created="2025-01-01T00:00:00+00:00", command="statebench run",
                   environment={"python": "3.11", "calibration": {}},
                   workload={"preset": "tiny", "steps": 16},
                   points=[ok, Point.unavailable("wgpu:stateful", 64, 82, 16, "no adapter"),
                           Point.failed("wgpu:reuse", 64, 82, 16, "OperationError:\n lost")])


def test_round_trip(tmp_path):
    r = sample()
    r.save(tmp_path / "r.json")
    back = load(tmp_path / "r.json")
    assert back == r
    assert back.to_dict()["schema"] == SCHEMA
    assert back.points[2].reason == "OperationError: lost"
    assert back.point("ort-cpu:copy", 64).bytes_total == 1e6 + 30
    assert back.backends == ["ort-cpu:copy", "wgpu:stateful", "wgpu:reuse"]


@pytest.mark.parametrize("doctor, message", [
    (lambda d: d.update(schema="statebench/0"), "schema"),
    (lambda d: d.pop("points"), "points"),
    (lambda d: d["points"][0].pop("match"), "lacks 'match'"),
    (lambda d: d["points"][0].update(status="great"), "status"),
    (lambda d: d["points"][0].update(context="64"), "context"),
    (lambda d: d["points"][0].update(context=True), "context"),
    (lambda d: d["points"][0].update(extra=1), "unknown field"),
    (lambda d: d["points"][0]["bytes_per_step"].pop("d2d"), "bytes_per_step"),
    (lambda d: d["points"][0].update(step_ms=None), "lacks step_ms"),
    (lambda d: d["points"][0]["step_ms"].pop("p90"), "step_ms"),
    (lambda d: d["points"][0].update(repeats=[{"step_ms": [1.0, -2.0]}]), "repeats"),
    (lambda d: d["points"][0].update(repeats=[{"gpu_ms": [1.0]}]), "repeats"),
    (lambda d: d["points"][0].update(step_ms_ci={"low": 2.0, "high": 1.0, "coverage": 0.9,
                                                 "method": ""}), "step_ms_ci"),
    (lambda d: d["points"][0].update(transients=[{"ms": 3.0, "repeat": 0}]), "transients"),
    (lambda d: d["points"][0].update(step_ms_max={"ms": "slow", "repeat": 0, "step": 1}),
     "step_ms_max"),
])
def test_validation(tmp_path, doctor, message):
    d = copy.deepcopy(sample().to_dict())
    doctor(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(UserError, match=message) as e:
        load(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_files_without_repeat_fields_still_load(tmp_path):
    """Files made before --repeat lack the optional fields; they load with them None."""
    d = sample().to_dict()
    for p in d["points"]:
        for k in ("repeats", "step_ms_ci", "step_ms_max", "transients"):
            p.pop(k)
    (tmp_path / "old.json").write_text(json.dumps(d))
    back = load(tmp_path / "old.json")
    assert back == sample() and back.points[0].repeats is None


def test_missing_and_not_json(tmp_path):
    with pytest.raises(UserError, match="no such results file"):
        load(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(UserError, match="not JSON"):
        load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("[]")
    with pytest.raises(UserError, match="top level"):
        load(tmp_path / "y.json")


def test_no_nan_in_files(tmp_path):
    r = sample()
    r.points[0].mbu = float("nan")
    with pytest.raises(ValueError):
        r.save(tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
