"""The gate's exit codes: self → 0, doctored ratio → 1 naming the point, mismatch → 1,
bad input → 2; and the baseline command's refusal to overwrite."""

from __future__ import annotations

import copy
import json
from pathlib import Path

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


def test_a_slowdown_fails_only_where_every_run_shows_it(run_file, tmp_path):
    """Two runs gated together: one run's slow point passes (its smallest ratio is the other
    run's), the same slowdown in both fails, and a mismatch in either fails naming the run."""
    def slow(d):
        for p in d["points"]:
            if p["backend"] == "ort-cpu:shared" and p["context"] == 16:
                for k in ("median", "p10", "p90"):
                    p["step_ms"][k] *= 2

    def wrong(d):
        d["points"][0]["match"]["ok"] = False
    slow_path = doctored(run_file, tmp_path, slow)
    proc = statebench("gate", slow_path, run_file, "--baseline", run_file)
    assert proc.returncode == 0, proc.stdout
    other = tmp_path / "slow2.json"
    other.write_text(Path(slow_path).read_text())
    proc = statebench("gate", slow_path, other, "--baseline", run_file)
    assert proc.returncode == 1, proc.stdout
    assert "✗ ort-cpu:shared @ 16: step time / ort-cpu:copy" in proc.stdout
    assert "in every run" in proc.stdout
    bad = tmp_path / "wrong.json"
    bad.write_text(Path(doctored(run_file, tmp_path, wrong)).read_text())
    proc = statebench("gate", run_file, bad, "--baseline", run_file)
    assert proc.returncode == 1 and "logits no longer match" in proc.stdout
    assert "wrong.json:logitsnolongermatch" in "".join(proc.stdout.split())


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


def _set(*path, value):
    """A change to a results file: the field at `path` (points[0] unless it starts with a
    top-level key) set to `value`, written as Python's json writes it (NaN, Infinity)."""
    def change(d):
        node = d if path[0] in d else d["points"][_stateless(d)]
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return change


def _stateless(d) -> int:
    """The first point of the ratio's anchor (ort-cpu:copy): the gate divides by its time."""
    return next(i for i, p in enumerate(d["points"]) if p["backend"] == "ort-cpu:copy")


BAD_FIGURES = {
    "nan step time": (("step_ms", "median"), float("nan"), "step_ms.median is not finite"),
    "negative step time": (("step_ms", "p10"), -0.5, "step_ms.p10 is -0.5; it must be > 0"),
    "zero stateless time": (("step_ms", "median"), 0.0, "step_ms.median is 0.0; it must be > 0"),
    "string median": (("step_ms", "median"), "1.349", "step_ms.median is '1.349', not a number"),
    "inf bytes": (("bytes_per_step", "kernel"), float("inf"), "bytes_per_step.kernel is not finite"),
    "negative bytes": (("bytes_per_step", "h2d"), -8.0, "bytes_per_step.h2d is -8.0; it must be ≥ 0"),
    "string bytes": (("bytes_per_step", "d2h"), "12", "bytes_per_step.d2h is '12', not a number"),
    "nan gpu time": (("gpu_ms",), {"median": float("nan"), "p10": 1.0, "p90": 1.0},
                     "gpu_ms.median is not finite"),
    "nan max_rel": (("match", "max_rel"), float("nan"), "match.max_rel is not finite"),
    "string match": (("match", "ok"), "yes", "match.ok is 'yes', not true or false"),
    "agree above 1": (("match", "argmax_agree"), 2.0, "argmax_agree is 2.0; it is a fraction"),
    "negative context": (("context",), -16, "context is -16; it must be ≥ 0"),
    "inf build time": (("build_s",), float("-inf"), "build_s is not finite"),
    "string steps": (("workload", "steps"), "16", "workload.steps is '16', of the wrong type"),
    "negative warmup": (("workload", "warmup"), -1, "workload.warmup is -1; it must be ≥ 0"),
}


@pytest.mark.parametrize("case", BAD_FIGURES)
@pytest.mark.parametrize("side", ["run", "baseline"])
def test_gate_refuses_a_bad_figure_naming_file_and_field(case, side, run_file, tmp_path):
    path, value, says = BAD_FIGURES[case]
    bad = doctored(run_file, tmp_path, _set(*path, value=value))
    args = (bad, "--baseline", run_file) if side == "run" else (run_file, "--baseline", bad)
    msg = one_line_error(statebench("gate", *args))
    assert str(bad) in msg and says in msg, msg


@pytest.mark.parametrize("case", ["string median", "nan step time", "inf bytes"])
def test_baseline_refuses_a_bad_figure_and_keeps_nothing(case, run_file, tmp_path):
    path, value, says = BAD_FIGURES[case]
    bad = doctored(run_file, tmp_path, _set(*path, value=value))
    for runs in ([bad], [run_file, bad]):
        msg = one_line_error(statebench("baseline", *runs, "--name", "ci", cwd=tmp_path))
        assert str(bad) in msg and says in msg, msg
    assert not (tmp_path / "results").exists()


UNLIKE = {
    "steps": (("workload", "steps"), 8, "steps 8 where the baseline has 3"),
    "warmup": (("workload", "warmup"), 4, "warmup 4 where the baseline has 1"),
    "capacity": (("workload", "capacity"), 64, "capacity 64 where the baseline has None"),
    "seed": (("workload", "seed"), 7, "seed 7 where the baseline has 0"),
    "dtype": (("workload", "dtype"), "float16", "dtype 'float16' where the baseline has 'float32'"),
    "weights": (("workload", "config", "weights"), "float16",
                "model weights 'float16' where the baseline has 'float32'"),
    "kv_cache": (("workload", "config", "kv_cache"), "float16",
                 "model kv_cache 'float16' where the baseline has 'float32'"),
    "shapes": (("workload", "config", "hidden"), 128, "model hidden 128 where the baseline has 64"),
}


@pytest.mark.parametrize("case", UNLIKE)
def test_gate_refuses_a_run_of_another_workload(case, run_file, tmp_path):
    """Beyond the preset, a different sweep is exit 2 "not like for like", never a byte or
    time regression (exit 1)."""
    path, value, says = UNLIKE[case]
    other = doctored(run_file, tmp_path, _set(*path, value=value))
    msg = one_line_error(statebench("gate", other, "--baseline", run_file))
    assert f"{other} is not like for like with {run_file}: its " in msg and says in msg, msg


def test_gate_reads_an_older_baseline_without_the_newer_model_fields(run_file, tmp_path):
    """The committed CI baseline predates `weights`/`kv_cache` and `warm_s`: their absence is
    their old default, not a difference."""
    def older(d):
        for k in ("weights", "kv_cache"):
            d["workload"]["config"].pop(k, None)
        d["workload"].pop("warm_s", None)
    proc = statebench("gate", run_file, "--baseline", doctored(run_file, tmp_path, older),
                      "--bytes-exact")
    assert proc.returncode == 0, proc.stdout + proc.stderr


CI_BASELINE = Path(__file__).resolve().parent.parent / "results" / "baselines" / "ci.json"


@pytest.fixture(scope="module")
def twice(tmp_path_factory) -> Path:
    """The committed CI baseline with its wgpu:stateful point at 64 in it again, the second
    copy a 99 ms mismatch (issue 29: the gate read the first and passed)."""
    data = json.loads(CI_BASELINE.read_text())
    again = copy.deepcopy(next(p for p in data["points"] if p["backend"] == "wgpu:stateful"
                               and p["context"] == 64))
    again["step_ms"] = {"median": 99.0, "p10": 99.0, "p90": 99.0}
    again["match"]["ok"] = False
    data["points"].append(again)
    path = tmp_path_factory.mktemp("twice") / "twice.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("command", [
    ["gate", "{twice}", "--baseline", "{ci}"],
    ["gate", "{ci}", "--baseline", "{twice}"],
    ["baseline", "{twice}", "--name", "ci"],
    ["baseline", "{ci}", "{twice}", "--name", "ci"],
    ["report", "{twice}"],
    ["report", "{ci}", "{twice}", "--merge"],
])
def test_a_file_holding_a_point_twice_is_refused(command, twice, tmp_path):
    """report, baseline, gate and report --merge refuse it: one line naming the file, the
    point and both copies; exit 2; no baseline written."""
    args = [a.format(twice=twice, ci=CI_BASELINE) for a in command]
    line = one_line_error(statebench(*args, cwd=tmp_path))
    assert (f"{twice}: wgpu:stateful at context 64 is in the file twice (points[14] and "
            "points[16])") in line
    assert not (tmp_path / "results").exists()


def test_the_committed_ci_baseline_still_gates(tmp_path):
    """results/baselines/ci.json, as .ci/run reads it, loads and gates itself."""
    proc = statebench("gate", CI_BASELINE, "--baseline", CI_BASELINE, "--bytes-exact", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gate: passed — 16/16 points ok" in proc.stdout
