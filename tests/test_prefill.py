"""`statebench prefill` (issue 31 item 1, chunked prefill through the decode graph): bad input
refused in one line (exit 2) before anything slow; one point measured on lavapipe (tiny,
K = 4: the stateful page reaches depth by dispatching, then the next K tokens' logits
match the float64 reference's), and the same point against the wrong logits fails with the
verdict's reason. The command end to end: the slow tier's test_prefill_command."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from harness import prefill
from harness.cli import main
from harness.sources import PresetSource
from tests.page_marks import PAGE_OK, PAGE_WHY, needs_page  # noqa: F401


def cli(*args) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main([str(a) for a in args], console=Console(file=out, width=200),
              err_console=Console(file=err, width=200))
    return rc, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("args, says", [
    (["--contexts", "24", "--chunks", "1,16"], "context 24 is not a multiple of chunk 16"),
    (["--chunks", "0"], "bad chunk 0 in --chunks"),
    (["--chunks", "4,x"], "bad chunk 'x' in --chunks"),
    (["--chunks", ","], "--chunks is empty"),
    (["--chunks", str(prefill.MAX_CHUNK * 2)], f"a chunk is 1..{prefill.MAX_CHUNK} tokens"),
    (["--contexts", "0"], "contexts must be positive"),
    (["--backends", "nope:*"], "unknown backend 'nope:*'"),
    (["--preset", "huge"], "unknown preset 'huge'"),
    (["--reps", "0"], "is not a positive integer"),
])
def test_bad_input_is_one_line_exit_2(args, says):
    rc, out, err = cli("prefill", *args)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("statebench: error: ") and says in lines[0], lines[0]
    assert not out


def test_out_refused_before_anything_runs(tmp_path):
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    for out, says in ((tmp_path, "is a directory"), (taken, "exists")):
        rc, _, err = cli("prefill", "--contexts", "8", "--chunks", "4", "--out", out)
        assert rc == 2 and says in err, err
    assert taken.read_text() == "{}"




#: depth 20, K = 4: capacity 24, test_ktoken's (the same kernels, compiled once in a run)
DEPTH, K = 20, 4


@pytest.fixture(scope="module")
def at_depth():
    """tiny's tokens and the reference's logits of the K tokens after DEPTH."""
    src = PresetSource("tiny")
    walk = src.reference_walk(DEPTH + K, DEPTH + K)
    return src, walk.arrays_at(DEPTH, DEPTH + K, K)


@pytest.mark.skipif(not PAGE_OK, reason=PAGE_WHY)
def test_stateful_point_dispatches_to_depth_and_matches(at_depth):
    src, arrays = at_depth
    p = prefill.measure_point(src, "wgpu:stateful", K, DEPTH, arrays["tokens"],
                              arrays["ref_logits"], reps=2)
    assert p.status == "ok", p.reason
    assert (p.how, p.dispatches, p.capacity, p.is_stateful) == ("dispatched", 5, 24, True)
    assert len(p.wall_samples_ms) == 2 and p.wall_ms > 0
    assert p.tokens_per_s == pytest.approx(DEPTH / (p.wall_ms / 1e3))
    assert p.match["ok"] and p.match["max_rel"] < 1e-5
    assert (p.gpu_ms is None) == bool(p.gpu_time_reason)


@pytest.mark.skipif(not PAGE_OK, reason=PAGE_WHY)
def test_wrong_reference_fails_the_point(at_depth):
    """The check is real: the logits of other tokens (the reference's rows reversed) are
    not the page's, and the point says how they differ."""
    src, arrays = at_depth
    p = prefill.measure_point(src, "wgpu:stateful", K, DEPTH, arrays["tokens"],
                              np.ascontiguousarray(arrays["ref_logits"][::-1]), reps=1)
    assert p.status == "failed" and not p.match["ok"]
    assert p.reason.startswith("logits differ from the float64 reference"), p.reason
