"""`statebench report --merge`: one sweep split over runs (as the H200's ten-minute calls
make it) shown as one run; files that are not one sweep are refused in one line."""

from __future__ import annotations

import json

import pytest
from test_cli import TINY, one_line_error, statebench

from harness import results
from harness.merge import merge
from model.errors import UserError


def tiny_run(d, name: str, contexts: str, steps: str = "3"):
    args = list(TINY)
    args[args.index("--contexts") + 1] = contexts
    args[args.index("--steps") + 1] = steps
    path = d / f"{name}.json"
    proc = statebench("run", *args, "--out", path, "--inprocess", cwd=d)
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("merge")
    return tiny_run(d, "long", "16"), tiny_run(d, "short", "8")


def test_merged_parts_read_as_one_sweep(parts, tmp_path):
    proc = statebench("report", *parts, "--merge", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert len(out["runs"]) == 1 and out["runs"][0]["label"] == ""
    rows = [(r["backend"], r["context"]) for r in out["rows"]]
    assert rows == [("ort-cpu:copy", 8), ("ort-cpu:shared", 8),
                    ("ort-cpu:copy", 16), ("ort-cpu:shared", 16)]
    md = statebench("report", *parts, "--merge", "--format", "md").stdout
    assert "| context | ort-cpu:copy | ort-cpu:shared |" in md  # one column per backend
    assert "merged from long.json" in md and "merged from short.json" in md
    # every point keeps what it was given against its own file's calibration
    loaded = [results.load(p) for p in parts]
    merged = merge(loaded, ["long.json", "short.json"])
    for r in loaded:
        for p in r.points:
            assert merged.point(*p.key).to_dict() == p.to_dict()
    assert merged.workload["contexts"] == [8, 16]


def test_not_one_sweep_is_refused(parts, tmp_path):
    line = one_line_error(statebench("report", parts[0], parts[0], "--merge"))
    assert "ort-cpu:copy at 16 is also in long.json" in line
    other = tiny_run(tmp_path, "other", "32", steps="2")
    line = one_line_error(statebench("report", parts[0], other, "--merge"))
    assert "cannot merge other.json: its steps is 2 where long.json has 3" in line
    loaded = results.load(parts[1])
    loaded.environment = dict(loaded.environment, source_digest="0" * 16)
    with pytest.raises(UserError, match="its sources"):
        merge([results.load(parts[0]), loaded], ["long.json", "edited.json"])
