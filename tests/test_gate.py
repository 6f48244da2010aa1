"""The gate's exit codes: self → 0, doctored ratio → 1 naming the point, mismatch → 1,
bad input → 2; and the baseline command's refusal to overwrite."""

from __future__ import annotations

import json

import pytest
from test_cli import TINY, one_line_error, statebench


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate")
    proc = statebench("run", *TINY, "--out", d / "run.json", "--inprocess", "--no-calibrate", cwd=d)
    assert proc.returncode == 0, proc.stderr
    return d / "run.json"


def doctored(run_file, tmp_path, change) -> str:
    data = json.loads(run_file.read_text())
    change(data)
    path = tmp_path / "doctored.json"
    path.write_text(json.dumps(data))
    return path


def test_self_passes(run_file):
    proc = statebench("gate", run_file, "--baseline", run_file, "--bytes-exact")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gate: passed" in proc.stdout and "✓" in proc.stdout


def test_doubled_ratio_fails_naming_the_point(run_file, tmp_path):
    def slow(d):
        for p in d["points"]:
            if p["backend"] == "ort-cpu:shared" and p["context"] == 16:
                for k in ("median", "p10", "p90"):
                    p["step_ms"][k] *= 2
    proc = statebench("gate", doctored(run_file, tmp_path, slow), "--baseline", run_file)
    assert proc.returncode == 1, proc.stdout
    assert "✗ ort-cpu:shared @ 16: step time / ort-cpu:copy" in proc.stdout
    assert "ort-cpu:shared @ 8" not in proc.stdout
    # within a generous threshold it passes
    proc = statebench("gate", doctored(run_file, tmp_path, slow), "--baseline", run_file,
                      "--max-slowdown", "1.5")
    assert proc.returncode == 0, proc.stdout


def test_mismatch_fails(run_file, tmp_path):
    def wrong(d):
        d["points"][0]["match"]["ok"] = False
    proc = statebench("gate", doctored(run_file, tmp_path, wrong), "--baseline", run_file)
    assert proc.returncode == 1
    assert "logits no longer match" in proc.stdout


def test_byte_change_fails(run_file, tmp_path):
    def more(d):
        d["points"][1]["bytes_per_step"]["kernel"] += 1
    path = doctored(run_file, tmp_path, more)
    assert statebench("gate", path, "--baseline", run_file, "--bytes-exact").returncode == 1
    # one byte is within the 1% tolerance without --bytes-exact
    assert statebench("gate", path, "--baseline", run_file).returncode == 0


def test_failed_point_fails(run_file, tmp_path):
    def fail(d):
        p = d["points"][3]
        p.update(status="failed", reason="device lost", step_ms=None, match=None)
    proc = statebench("gate", doctored(run_file, tmp_path, fail), "--baseline", run_file)
    assert proc.returncode == 1 and "failed: device lost" in proc.stdout


def test_bad_input_exit_2(run_file, tmp_path):
    one_line_error(statebench("gate", tmp_path / "nope.json", "--baseline", run_file))
    (tmp_path / "bad.json").write_text("{")
    one_line_error(statebench("gate", run_file, "--baseline", tmp_path / "bad.json"))

    def other(d):
        d["workload"]["preset"] = "small"
    msg = one_line_error(statebench("gate", doctored(run_file, tmp_path, other), "--baseline", run_file))
    assert "preset" in msg


def test_baseline_refuses_overwrite(run_file, tmp_path):
    ok = statebench("baseline", run_file, "--name", "ci", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "results" / "baselines" / "ci.json").exists()
    assert "exists; pass --force" in one_line_error(
        statebench("baseline", run_file, "--name", "ci", cwd=tmp_path))
    assert statebench("baseline", run_file, "--name", "ci", "--force", cwd=tmp_path).returncode == 0
    one_line_error(statebench("baseline", run_file, "--name", "../evil", cwd=tmp_path))


def test_baseline_of_several_runs_keeps_per_point_medians(run_file, tmp_path):
    """Several runs of one sweep make one baseline whose step times are per-point medians
    (an outlier run moves nothing); runs of different sweeps are refused in one line."""
    def scaled(factor, name):
        data = json.loads(run_file.read_text())
        for p in data["points"]:
            if p["step_ms"]:
                for k in ("median", "p10", "p90"):
                    p["step_ms"][k] *= factor
        path = tmp_path / name
        path.write_text(json.dumps(data))
        return path

    fast, slow = scaled(0.5, "fast.json"), scaled(3.0, "slow.json")
    proc = statebench("baseline", run_file, slow, fast, "--name", "ci", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    kept = json.loads((tmp_path / "results" / "baselines" / "ci.json").read_text())
    orig = {(p["backend"], p["context"]): p for p in json.loads(run_file.read_text())["points"]}
    measured = [p for p in kept["points"] if p["step_ms"]]
    assert measured
    for p in measured:
        want = orig[(p["backend"], p["context"])]["step_ms"]
        assert p["step_ms"] == pytest.approx(want)
        assert p["details"]["baseline_runs"] == 3

    def more_bytes(d):
        d["points"][0]["bytes_per_step"]["h2d"] += 8
    msg = one_line_error(statebench("baseline", run_file, doctored(run_file, tmp_path, more_bytes),
                                    "--name", "x", cwd=tmp_path))
    assert "not one sweep" in msg
