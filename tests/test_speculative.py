"""Speculative rollback strategies (DESIGN §8): final states vs the float64 oracle for every m,
ORT's capsule replayed, byte counters against their closed forms, the CLI's bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness import speculative as sp

ROOT = Path(__file__).resolve().parents[1]
K = 4
SHAPES = [sp.GdnShape(hk=2, hv=4, dk=16, dv=16), sp.GdnShape(hk=1, hv=3, dk=8, dv=5)]
NUMPY_STRATEGIES = {"snapshot_recompute": sp.snapshot_recompute,
                    "dense_checkpoints": sp.dense_checkpoints,
                    "compact_replay": sp.compact_replay}


@pytest.fixture(params=SHAPES, ids=lambda s: s.label().replace(" ", ","))
def draft(request):
    seed = int(np.random.default_rng().integers(1 << 31))  # fresh inputs every run
    return sp.make_draft(request.param, K, seed)


@pytest.mark.parametrize("name", NUMPY_STRATEGIES)
def test_every_strategy_matches_the_oracle_for_every_m(draft, name):
    for m in range(K + 1):
        state, _ = NUMPY_STRATEGIES[name](draft, m)
        assert state.dtype == np.float32
        assert sp.rel_err(state, sp.oracle_state(draft, m)) < sp.TOLERANCE, (name, m)


def test_ort_strategy_matches_the_oracle_for_every_m(draft):
    strategy = sp.compact_replay_ort(sp.OrtVerify(draft.shape, K))
    for m in range(K + 1):
        state, _ = strategy(draft, m)
        assert sp.rel_err(state, sp.oracle_state(draft, m)) < sp.TOLERANCE, m


def test_ort_capsule_replayed_reproduces_ort_and_the_oracle(draft):
    final, capsule = sp.OrtVerify(draft.shape, K).run(draft.state0, draft, K, sp.SpecBytes())
    assert capsule.size == K * draft.shape.capsule_row_floats
    assert sp.rel_err(final, sp.oracle_state(draft, K)) < sp.TOLERANCE
    for m in range(K + 1):
        replayed = sp.replay_numpy(draft.state0, capsule, draft.shape, K, m, sp.SpecBytes())
        if m == K:  # the replay of every captured transition is ORT's own final state
            np.testing.assert_allclose(replayed, final, rtol=0, atol=1e-5 * np.abs(final).max())
        assert sp.rel_err(replayed, sp.oracle_state(draft, m)) < sp.TOLERANCE, m


def test_ort_capsule_equals_the_numpy_capture(draft):
    _, _, ours = sp.gdn_verify(draft.state0, draft, K, sp.SpecBytes(), capture=True)
    _, theirs = sp.OrtVerify(draft.shape, K).run(draft.state0, draft, K, sp.SpecBytes())
    np.testing.assert_allclose(theirs, ours, atol=1e-5)


def test_replay_reads_only_the_kept_prefix(draft):
    _, _, capsule = sp.gdn_verify(draft.state0, draft, K, sp.SpecBytes(), capture=True)
    poisoned = capsule.copy()
    decay, key, delta = sp.capsule_views(poisoned, draft.shape, K)
    decay[2:], key[2:], delta[2:] = np.nan, np.nan, np.nan  # "unspecified" tail entries
    out = sp.replay_numpy(draft.state0, poisoned, draft.shape, K, 2, sp.SpecBytes())
    assert sp.rel_err(out, sp.oracle_state(draft, 2)) < sp.TOLERANCE


def closed_form(name: str, sh: sp.GdnShape, k: int, m: int) -> dict[str, int]:
    s, r, tok = sh.state_bytes, sh.capsule_row_floats * 4, sh.token_input_bytes
    partial = 0 < m < k
    if name == "snapshot_recompute":
        return {"state_read": s + s * partial, "state_written": s + s * partial,
                "state_copied": s + s * (m == 0), "capsule_written": 0, "capsule_read": 0,
                "inputs_read": (k + m * partial) * tok, "h2d": 0, "d2h": 0}
    if name == "dense_checkpoints":
        return {"state_read": s, "state_written": k * s, "state_copied": s * (m > 0),
                "capsule_written": 0, "capsule_read": 0, "inputs_read": k * tok, "h2d": 0, "d2h": 0}
    # compact: two state rows, no copy; replay only for 0 < m < K
    return {"state_read": s + s * partial, "state_written": s + s * partial, "state_copied": 0,
            "capsule_written": k * r, "capsule_read": m * r * partial, "inputs_read": k * tok,
            "h2d": 4 + 88 * partial, "d2h": 0}


@pytest.mark.parametrize("sh", SHAPES, ids=lambda s: s.label().replace(" ", ","))
def test_byte_counters_equal_the_closed_forms(sh):
    d = sp.make_draft(sh, K, 0)
    strategies = dict(NUMPY_STRATEGIES, compact_replay_ort_cpu=sp.compact_replay_ort(sp.OrtVerify(sh, K)))
    for name, fn in strategies.items():
        for m in range(K + 1):
            form = closed_form(name.replace("_ort_cpu", ""), sh, K, m)
            _, b = fn(d, m)
            got = b.to_dict()
            assert got.pop("traffic") == sum(form.values()) + form["state_copied"] - form["h2d"]
            assert got == form, (name, m)


def test_compact_moves_transitions_not_states():
    sh = sp.GdnShape(hk=16, hv=32, dk=128, dv=128)  # hybrid-1b's GDN heads
    assert sh.capsule_row_floats == sh.hv + sh.hk * sh.dk + sh.hv * sh.dv
    assert K * sh.capsule_row_floats * 4 < sh.state_bytes / 16


@pytest.mark.parametrize("name", sp.ATTENTION_STRATEGIES)
def test_attention_rollback(name):
    sh = sp.AttentionShape(kv_heads=2, head_dim=8)
    d = sp.make_attention_draft(sh, K, depth=5, seed=1)
    row = sh.row_bytes
    for m in range(K + 1):
        cache, b = sp.attention_strategy(name)(d, m)
        ok_k, ok_v = sp.attention_oracle(d, m)
        assert cache.length == 5 + m
        np.testing.assert_array_equal(cache.k[:, :cache.length], ok_k)
        np.testing.assert_array_equal(cache.v[:, :cache.length], ok_v)
        refeed = name == "snapshot_recompute" and 0 < m < K
        # verify writes K rows and reads P + K; only a re-feed moves more (m rows, P + m read)
        assert b.state_written == (K + m * refeed) * row
        assert b.state_read == (5 + K + (5 + m) * refeed) * row
        assert b.state_copied == 0


def test_measure_reports_every_m_and_marks_webgpu():
    data = sp.measure("tiny", k=2, reps=1)
    gdn = [lr for lr in data["layers"] if lr["kind"] == "gdn"]
    assert [r["m"] for r in gdn[0]["rows"]] == [0, 1, 2]
    for r in gdn[0]["rows"]:
        for name, cell in r["strategies"].items():
            if cell["status"] == "ok":
                assert cell["ok"], (name, r["m"])
            else:
                assert name == "compact_replay_ort_webgpu" and cell["reason"]
    json.dumps(data, allow_nan=False)


def statebench(*args, preexec_fn=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, preexec_fn=preexec_fn)


@pytest.mark.parametrize("args, says", [
    (["spec", "--k", "9"], "--k 9: draft length must be in 1..8"),
    (["spec", "--k", "0"], "--k 0: draft length must be in 1..8"),
    (["spec", "--preset", "huge"], "unknown preset 'huge'; accepted: tiny"),
    (["spec", "--k", "x"], "invalid int value"),
    (["spec", "--seed", "-1"], "--seed: -1 is not ≥ 0"),
    (["speculative", "--depth", str(10**10)], f"--depth {10**10}: the measurement would hold about"),
    (["spec", "--out", "."], "--out .: is a directory; name a file"),
    (["spec", "--out", "no/such/folder/spec.json"], "the folder no/such/folder does not exist"),
    (["spec", "--out", "/proc/spec.json"], "--out /proc/spec.json: cannot write in /proc"),
])
def test_cli_bad_input_is_one_line(args, says):
    proc = statebench(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("statebench: error: ") and says in lines[0], lines[0]
    assert not proc.stdout, "refused before anything was measured"


def test_cli_writes_json(tmp_path):
    out = tmp_path / "spec.json"
    proc = statebench("spec", "--preset", "tiny", "--k", "2", "--reps", "1", "--out", out)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["schema"] == sp.SCHEMA and data["k"] == 2
    assert "snapshot+recompute" in proc.stdout and "✓" in proc.stdout and "✗" not in proc.stdout


def test_cli_keeps_an_existing_file_unless_forced(tmp_path):
    out = tmp_path / "spec.json"
    out.write_text("an earlier run\n")
    args = ["speculative", "--k", "1", "--reps", "1", "--depth", "8", "--out", out]
    proc = statebench(*args)
    assert proc.returncode == 2 and not proc.stdout, proc.stderr
    assert proc.stderr.strip() == (f"statebench: error: --out {out}: the file exists; "
                                   "pass --force to replace it")
    assert out.read_text() == "an earlier run\n"
    proc = statebench(*args, "--force")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["k"] == 1


def test_cli_save_failure_is_one_line_naming_the_file(tmp_path):
    """A file-size limit makes the save fail as a full disk would, after the measurement."""
    import resource

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    out = tmp_path / "spec.json"
    proc = statebench("spec", "--k", "1", "--reps", "1", "--depth", "8", "--out", out,
                      preexec_fn=small_files)
    assert proc.returncode == 2, proc.stderr
    assert "snapshot+recompute" in proc.stdout  # measured, and the tables were printed
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"statebench: error: could not save {out}: File too large"), lines[0]
    assert list(tmp_path.iterdir()) == [], "no file, and no temporary file, is left"


def test_an_impossible_depth_is_refused_before_anything_is_allocated():
    import io
    import tracemalloc

    from rich.console import Console

    from harness.cli import main

    err = io.StringIO()
    tracemalloc.start()
    try:
        rc = main(["speculative", "--depth", str(10**10)], Console(file=io.StringIO()),
                  Console(file=err, width=400))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rc == 2 and "--depth 10000000000" in err.getvalue()
    assert peak < 64 * 2**20, peak


def test_the_memory_estimate_covers_what_the_attention_measurement_holds():
    """numpy reports its buffers to tracemalloc: the estimate must be an upper bound, and a
    close one (within 2x), or it would refuse depths that fit."""
    import tracemalloc

    from harness.speculative.limits import attention_peak_bytes

    sh, k, depth = sp.AttentionShape(kv_heads=4, head_dim=64), 4, 20_000
    tracemalloc.start()
    try:
        sp.measure_attention(sh, [0], k, depth, reps=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = attention_peak_bytes(sh.row_bytes, k, depth)
    assert estimate / 2 <= peak <= estimate, (peak, estimate)


def test_speculative_and_its_alias_spec_run_the_same_command():
    from harness.cli import make_parser

    parser = make_parser()
    for word in ("speculative", "spec"):
        args = parser.parse_args([word, "--k", "2"])
        assert args.func.__self__.name == "speculative" and args.k == 2
