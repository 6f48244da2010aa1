"""The results schema: round trip, validation of bad files as one-line user errors."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest

from harness import details
from harness.results import SCHEMA, Match, Point, Results, Stats, duplicate, load, validate
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


REPEAT_FIELDS = ("repeats", "step_ms_ci", "step_ms_max", "transients")


def test_schema_1_files_without_repeat_fields_still_load(tmp_path):
    """statebench/1 files made before --repeat lack the optional fields (and the match its
    tolerance); they load with them None. A statebench/2 file must have them."""
    d = sample().to_dict()
    for p in d["points"]:
        for k in REPEAT_FIELDS:
            p.pop(k)
    d["points"][0]["match"].pop("tolerance")
    (tmp_path / "new.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match=r"points\[0\] lacks 'repeats'"):
        load(tmp_path / "new.json")
    d["schema"] = "statebench/1"
    (tmp_path / "old.json").write_text(json.dumps(d))
    back = load(tmp_path / "old.json")
    assert back == sample() and back.points[0].repeats is None
    assert back.to_dict()["schema"] == SCHEMA == "statebench/2"


def schema_1_files() -> list[Path]:
    found = [f for f in sorted(RESULTS.rglob("*.json"))
             if json.loads(f.read_text()).get("schema") == "statebench/1"] if RESULTS.is_dir() else []
    return found


RESULTS = Path(__file__).resolve().parent.parent / "results"
#: a recorded run written as statebench/1 (the CI baseline was one until 2026-12-05)
SCHEMA_1_RUN = RESULTS / "lavapipe" / "genai-q4f16" / "llama-before.json"


def test_a_committed_schema_1_file_upgrades_in_memory(tmp_path):
    """A recorded statebench/1 run loads as statebench/2: every point has every field, it
    saves as /2 and reads back the same; the file is untouched."""
    before = SCHEMA_1_RUN.read_bytes()
    assert json.loads(before)["schema"] == "statebench/1"
    r = load(SCHEMA_1_RUN)
    assert SCHEMA_1_RUN.read_bytes() == before
    d = r.to_dict()
    assert d["schema"] == "statebench/2" and len(r.points) == 16
    assert all(set(REPEAT_FIELDS) <= set(p) for p in d["points"])
    assert all("tolerance" in p["match"] for p in d["points"] if p["status"] == "ok")
    assert r.point("wgpu:stateful", 64).details["is_stateful"] is True
    r.save(tmp_path / "up.json")
    assert load(tmp_path / "up.json") == r


def test_every_committed_results_file_loads():
    """Every statebench/1 file in results/ loads (its details keys are all registered)."""
    files = schema_1_files()
    assert len(files) > 40
    for f in files:
        r = load(f)
        validate(json.loads(json.dumps(r.to_dict())), str(f))


def test_a_point_is_frozen_and_its_details_read_only():
    p = sample().points[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.mbu = 0.5
    with pytest.raises(TypeError, match="read-only"):
        p.details["in_place"] = {}
    with pytest.raises(TypeError, match="read-only"):
        p.details.setdefault("wall_s", 1.0)
    q = dataclasses.replace(p, details={**p.details, "wall_s": 1.5})
    assert q.details["wall_s"] == 1.5 and "wall_s" not in p.details
    assert json.loads(json.dumps(q.to_dict()))["details"] == {"in_place": {"a": True}, "wall_s": 1.5}
    assert copy.deepcopy(q) == q


@pytest.mark.parametrize("bad, says", [
    ({"in_place": {}, "wal_s": 1.0}, "has unknown key 'wal_s'"),
    ({"wall_s": "slow"}, "wall_s is 'slow', not number"),
    ({"is_stateful": 1}, "is_stateful is 1, not true/false"),
    ({"baseline_runs": True}, "baseline_runs is True, not integer"),
])
def test_details_outside_the_registry_are_refused(tmp_path, bad, says):
    """Made in code: a programming error (UnknownDetail). Read from a file: that file's
    one-line error, naming the point and the key."""
    with pytest.raises(details.UnknownDetail, match=says):
        Point("ort-cpu:copy", 16, 32, 4, details=bad)
    d = sample().to_dict()
    d["points"][0]["details"] = bad
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(UserError, match=rf"points\[0\]\.details {says}"):
        load(tmp_path / "bad.json")


#: where a writer puts a literal key into details
_WRITES = (r'details\[\s*"(\w+)"\s*\]\s*=', r'details\.setdefault\(\s*"(\w+)"',
           r'details=\{[^}]*?"(\w+)":', r'"(\w+)": [^,]*?, \*\*(?:p|point|prev)\.details')


def test_the_registry_names_every_key_written_and_nothing_else():
    """Each key a module writes into a point's details literally (or as an update keyword)
    is registered, and each registered key that is not retired is written somewhere."""
    root = RESULTS.parent
    text = {f: f.read_text() for d in ("harness", "backends") for f in (root / d).rglob("*.py")}
    written = set()
    for src in text.values():
        for pattern in _WRITES:
            written |= set(re.findall(pattern, src))
        for call in re.findall(r"details\.update\((.*?)\)\n", src, re.S):
            written |= set(re.findall(r"(\w+)=", call))
    assert written - set(details.DETAILS) == set()
    every = "\n".join(text.values())
    unwritten = [k for k, d in details.DETAILS.items() if not d.retired
                 and f'"{k}"' not in every and f"{k}=" not in every]
    assert unwritten == []


def test_docs_list_the_registry():
    """docs/results.md carries harness/details.py's table as `python -m harness.details`
    prints it (one source: the registry)."""
    doc = (RESULTS.parent / "docs" / "results.md").read_text()
    assert details.markdown() in doc


def test_a_point_held_twice_is_refused(tmp_path):
    """(backend, context) is a point's identity: a file holding one twice is refused, even
    where the copies differ in capacity or in what they measured."""
    d = sample().to_dict()
    again = copy.deepcopy(d["points"][0])
    again.update(capacity=128, step_ms={"median": 99.0, "p10": 99.0, "p90": 99.0})
    d["points"].append(again)
    (tmp_path / "twice.json").write_text(json.dumps(d))
    with pytest.raises(UserError) as e:
        load(tmp_path / "twice.json")
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'twice.json'}: ort-cpu:copy at context 64 is in the file "
                          "twice (points[0] and points[3])") and "\n" not in msg
    assert duplicate(sample().points) is None
    assert duplicate([*sample().points, sample().points[1]]) == (("wgpu:stateful", 64), 1, 3)


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
    r.points[0] = dataclasses.replace(r.points[0], mbu=float("nan"))
    with pytest.raises(ValueError):
        r.save(tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
