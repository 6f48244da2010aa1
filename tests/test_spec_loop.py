"""The end-to-end speculative loop (issue 31 item 4, docs/speculative.md), the quick part:
acceptance schedules and scripted drafts, the rollback contract (``Backend.accept``), the
flags refused in one line, and the loop on the stateful page for every m with its checks,
which a wrong rollback fails. Every page at every acceptance: tests/test_spec_e2e.py (slow)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console

from harness.speculative import e2e_sweep, loop
from harness.speculative.acceptance import Acceptance, ScriptedDrafts, parse_acceptances
from harness.speculative.e2e_sweep import Sweep, header
from harness.speculative.spec_results import SpecResults, load, validate
from model.errors import UserError
from tests.spec_workloads import WORKLOAD, config, needs_page, pages

# -- acceptance and drafts -------------------------------------------------------------------


def test_acceptance_words_and_rates():
    assert [a.label for a in parse_acceptances("full, partial,zero,0.7,full")] == [
        "full", "partial", "zero", "0.7"]
    for bad in ("most", "1.5", "-0.1", "nan", ""):
        with pytest.raises(UserError, match="--accept"):
            parse_acceptances(bad)


def test_targets_cover_every_m():
    rng = np.random.default_rng(0)
    k = 4
    assert [Acceptance("partial").target(i, k, rng) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert {Acceptance("full").target(i, k, rng) for i in range(5)} == {3}
    assert {Acceptance("zero").target(i, k, rng) for i in range(5)} == {0}
    assert {Acceptance("rate", 1.0).target(i, k, rng) for i in range(5)} == {3}
    assert {Acceptance("rate", 0.0).target(i, k, rng) for i in range(5)} == {0}
    # m = drafts before the first wrong one: E[m] = r + r^2 + r^3
    draws = [Acceptance("rate", 0.7).target(i, k, rng) for i in range(4000)]
    assert set(draws) == {0, 1, 2, 3}
    assert abs(np.mean(draws) - (0.7 + 0.49 + 0.343)) < 0.06


@pytest.mark.parametrize("label", ["full", "partial", "zero", "0.5"])
def test_scripted_drafts_are_accepted_exactly_m(label):
    """Against the greedy continuation's own tokens (the targets a correct backend gives),
    the loop's rule accepts exactly the m the drafts were made for."""
    greedy = np.random.default_rng(1).integers(0, 256, 64)
    k, n = 5, 0
    drafts = ScriptedDrafts(greedy, Acceptance.parse(label), k, 256, seed=3)
    while n < 40:
        proposed, m = drafts.propose(n)
        assert len(proposed) == k - 1
        assert loop.accepted(proposed, greedy[n:n + k]) == m
        n += m + 1


def _tie_runs(rng, plain_top: float, loop_top: float):
    """A loop of two verifies (kept 2, then 2) and a one-token decode of 4 tokens, parting at
    token 2: the one-token decode's row there has token 5 at ``plain_top`` above token 3,
    the loop's has token 3 at ``loop_top`` above token 5 (fresh random rows, scale ~1)."""
    rows = rng.uniform(-1, 1, (4, 8)).astype(np.float32)
    plain_rows, loop_rows = rows.copy(), rows.copy()
    plain_rows[2, [5, 3]] = [2.0, 2.0 - plain_top]
    loop_rows[2, [3, 5]] = [2.0, 2.0 - loop_top]
    plain = loop.GreedyRun(tokens=[1, 4, 5, 0], logits=list(plain_rows))
    ver = [loop.Verify(np.zeros(4, np.int64), 2, 1, 0.0, 0.0, None, None, None)] * 2
    run = loop.LoopRun(tokens=[1, 4, 3, 6], verifies=ver,
                       logits=[loop_rows[:2], loop_rows[2:]])
    return run, plain


def test_a_near_tie_is_certified_only_where_both_rows_agree_within_the_tolerance():
    """``near_tie``: where the loop's token parts from the one-token decode's, both graphs'
    rows put the two tokens within the logits tolerance's size (tolerance · max|row|) of
    each other, or it is not certified (a wrong token the rows do not explain)."""
    rng = np.random.default_rng(7)
    assert loop.first_mismatch([1, 4, 3, 6], [1, 4, 5, 0]) == 2
    assert loop.first_mismatch([1, 4], [1, 4, 5]) is None
    run, plain = _tie_runs(rng, 0.002, 0.001)
    tie = loop.near_tie(run, plain, 2, 0.01)  # bound 0.01 · 2.0
    assert tie["certified"] and (tie["loop_token"], tie["plain_token"]) == (3, 5)
    assert tie["gap"] == pytest.approx(0.002, abs=1e-6) and tie["bound"] == pytest.approx(0.02)
    run, plain = _tie_runs(rng, 0.5, 0.001)  # the one-token decode's top far above
    assert not loop.near_tie(run, plain, 2, 0.01)["certified"]
    run, plain = _tie_runs(rng, 0.002, 0.5)  # the loop's own row far from a tie
    assert not loop.near_tie(run, plain, 2, 0.01)["certified"]
    assert loop.near_tie(loop.LoopRun(tokens=run.tokens, verifies=run.verifies), plain, 2,
                         0.01) is None  # ids read: no rows to certify with


# -- the rollback contract --------------------------------------------------------------------

def test_a_backend_without_rollback_keeps_all_k_only():
    pytest.importorskip("onnxruntime")
    from backends.ort import BACKENDS

    b = BACKENDS["ort-cpu:iobinding"](tokens_per_step=2)
    b.prepare(WORKLOAD, 16)
    try:
        b.step_tokens(np.array([1, 2]))
        b.accept(2)
        with pytest.raises(NotImplementedError, match="cannot roll back"):
            b.accept(1)
        for bad in (3, -1, True):
            with pytest.raises(ValueError, match="kept"):
                b.accept(bad)
    finally:
        b.close()


# -- bad flags: one line, exit 2 ---------------------------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["--backends", "wgpu:stateful", "--k", "1"], "--k 1: a verify takes the newest token"),
    (["--backends", "wgpu:stateful", "--k", "4,99"], "--k 99"),
    (["--backends", "wgpu:stateful", "--accept", "most"], "--accept 'most'"),
    (["--backends", "wgpu:stateful", "--reps", "2"], "--reps is for the per-layer simulation"),
    (["--backends", "nosuch:page"], "unknown backend 'nosuch:page'"),
    (["--backends", "wgpu:stateful", "--contexts", "0"], "bad context 0"),
    (["--backends", "wgpu:stateful", "--preset", "huge"], "unknown preset 'huge'"),
    (["--accept", "full"], "--accept needs --backends"),
    (["--tokens", "8"], "--tokens needs --backends"),
    (["--k", "4,8"], "--k 4,8: without --backends one draft length"),
    (["--backends", "wgpu:stateful", "--read", "argmax"], "--read: invalid choice: 'argmax'"),
    (["--read", "ids"], "--read needs --backends"),
])
def test_bad_flags_are_one_line(args, says):
    from harness.cli import main

    err = io.StringIO()
    rc = main(["speculative", *args], Console(file=io.StringIO()), Console(file=err, width=400))
    lines = err.getvalue().strip().splitlines()
    assert rc == 2 and len(lines) == 1 and says in lines[0], err.getvalue()


def test_read_ids_is_a_flag_of_the_loop():
    """`--read ids` reaches the sweep's settings; logits where it is not given."""
    from harness.cli import make_parser
    from harness.speculative.e2e_command import config_from

    parser = make_parser()
    base = ["speculative", "--backends", "wgpu:stateful"]
    assert config_from(parser.parse_args([*base, "--read", "ids"]), "x").read == "ids"
    assert config_from(parser.parse_args(base), "x").read == "logits"


# -- the loop on a page ------------------------------------------------------------------------

def sweep(cfg, classes, tmp_path, workload=WORKLOAD) -> SpecResults:
    out = tmp_path / "spec.json"
    results = header(cfg, workload, {})
    e2e_sweep.run(cfg, Sweep(classes, workload=workload, out=out), results)
    assert load(out).points == results.points  # saved, and valid statebench-spec/2
    return results


@needs_page
def test_every_m_on_the_stateful_page(tmp_path):
    """Partial acceptance (m = 0, 1, 2, 3 in turn) on the stateful page: the tokens are the
    one-token decode's, every kept logits row within float32 rounding of its step, the KV
    rows bitwise those of a replay whose dropped drafts were other tokens."""
    cfg = config(backends=("wgpu:stateful",), accept="partial")
    (p,) = sweep(cfg, {"wgpu:stateful": pages()["wgpu:stateful"]}, tmp_path).points
    assert p["status"] == "ok", p["reason"]
    assert p["tokens_match_greedy"] and p["logits_match_plain"] and p["state_ok"], p
    assert set(p["accepted_hist"]) == {"0", "1", "2", "3"} and p["scripted_as_run"]
    assert p["state"]["vs_replay"]["bitwise"] and p["state"]["vs_replay"]["max_rel"] == 0
    assert p["generated"] >= 12 and p["logits_check"]["rows"] == p["generated"]
    assert p["rollback"]["rollbacks"] > 0 and p["rollback"]["bytes"]["h2d"] == 0
    # a page reading logits has no next_ids to chain: no chained baseline, and why
    assert p["plain_chained_ms_per_token"] is None and p["speedup_vs_chained"] is None
    assert "read_ids" in p["plain_chained_why"] and p["plain_chained_matches"] is None


@needs_page
def test_every_m_reading_ids_on_the_pages(tmp_path):
    """``--read ids``: the one-token decode and the loop both on pages built with
    ``read_ids`` (the argmax on the device): the tokens the one-token decode's (and the
    float64 reference's), the state as feeding only the accepted tokens, the logits check
    recorded as not made; a verify reads K ids back, not K rows of logits."""
    from backends.webnn.dtypes import DTYPES
    from harness.speculative import e2e_render

    names = ("wgpu:stateful", "wgpu:reuse")
    cfg = config(backends=names, accept="full,partial,zero", read="ids")
    results = sweep(cfg, {n: pages()[n] for n in names}, tmp_path)
    k, vocab = 4, WORKLOAD.config.vocab
    ids_bytes = k * DTYPES["int64"].itemsize  # int64 ids, i32 on the device
    assert len(results.points) == 6 and results.workload["read"] == "ids"
    for p in results.points:
        where = (p["backend"], p["acceptance"])
        assert p["status"] == "ok", (where, p["reason"])
        assert p["read"] == "ids" and p["tokens_match_greedy"] and p["state_ok"], where
        assert p["greedy_matches_reference"] and p["state_compared"], where
        assert p["state"]["vs_replay"]["bitwise"] and p["state"]["position"]["ok"], where
        assert p["logits_check"]["ok"] is None and p["logits_match_plain"] is None, where
        assert p["logits_check"]["rows"] == 0 and p["greedy_margin_at_mismatch"] is None
        assert e2e_render.passed(p) and e2e_render.mark(p) == "✓†", where
        d2h = p["bytes_per_verify"]["d2h"]
        assert d2h < k * vocab * 2, (where, d2h)  # a logits read is k * vocab * 4
        if p["backend"] == "wgpu:reuse":  # the ids and nothing else
            assert d2h == ids_bytes, (where, d2h)
        # the fairest plain baseline: the same one-token graph chained on the device, its
        # ids the one-token decode's, timed apart (the speedup over it beside the other)
        assert p["plain_chained_matches"] is True and p["plain_chained_why"] == "", where
        assert p["plain_chained_ms_per_token"] > 0, where
        assert p["speedup_vs_chained"] == pytest.approx(
            p["plain_chained_ms_per_token"] / p["ms_per_token"]), where
    want_m = {"full": {"3"}, "zero": {"0"}, "partial": {"0", "1", "2", "3"}}
    assert all(set(p["accepted_hist"]) == want_m[p["acceptance"]] for p in results.points)
    notes = e2e_render.notes(results)
    assert len(notes) == 1 and "the logits not compared" in notes[0], notes
    e2e_render.table(results)  # renders


def test_a_backend_that_reads_logits_only_is_unavailable_for_ids():
    """ORT's backends have no ``read_ids``: every point unavailable with that one reason,
    before anything is built."""
    pytest.importorskip("onnxruntime")
    from backends.ort import BACKENDS
    from harness.speculative.e2e_point import IDS_REFUSAL, GroupRequest, measure_group

    req = GroupRequest(backend="ort-cpu:copy", preset=WORKLOAD.config.name, depth=8,
                       capacity=24, tokens=8, ks=[2, 4], acceptances=["full", "zero"],
                       depth_file="/nonexistent.npz", warmup=0, read="ids")
    points = measure_group(req, WORKLOAD, BACKENDS["ort-cpu:copy"])
    assert len(points) == 4
    assert all(p["status"] == "unavailable" and p["reason"] == IDS_REFUSAL for p in points)
    assert IDS_REFUSAL == "reads logits only: no read_ids"


def test_a_request_of_old_json_reads_logits():
    from harness.speculative.e2e_point import GroupRequest

    req = GroupRequest(backend="wgpu:stateful", preset="tiny", depth=8, capacity=24,
                       tokens=8, ks=[4], acceptances=["full"], depth_file="d.npz")
    old = json.loads(req.to_json())
    del old["read"]
    assert GroupRequest.from_json(json.dumps(old)).read == "logits"
    with pytest.raises(ValueError, match="read 'argmax'"):
        GroupRequest.from_json(json.dumps({**old, "read": "argmax"}))


def wrong_rollbacks() -> dict[str, type]:
    """Stateful pages whose rollback is wrong: one keeps a token too many (the dropped
    draft's row left among the valid rows), one a token too few."""
    base = pages()["wgpu:stateful"]

    class KeepsOneMore(base):
        name = "wgpu:keeps-one-more"

        def accept(self, kept: int) -> None:
            super().accept(min(kept + 1, self.tokens_per_step))

    class KeepsOneLess(base):
        name = "wgpu:keeps-one-less"

        def accept(self, kept: int) -> None:
            super().accept(max(kept - 1, 0))

    return {c.name: c for c in (KeepsOneMore, KeepsOneLess)}


def assert_wrong_rollback_fails(tmp_path, cls: type, accept: str) -> None:
    """The loop on ``cls`` fails the logits and the state checks (the tiny random model's
    greedy tokens repeat one token whatever the context, so the tokens alone would not
    tell)."""
    from harness.sources import NumpyReferenceWalk
    from harness.speculative.e2e_point import GroupRequest, measure_group

    depth, tokens, k = 8, 8, 4
    cap = depth + tokens + k - 1 + 2 * tokens  # room for the rows kept too many
    walk = NumpyReferenceWalk(WORKLOAD.config, WORKLOAD.weights, 0, depth + 1, cap)
    path = tmp_path / "depth.npz"
    np.savez(path, **e2e_sweep.depth_arrays(walk, depth, cap, tokens + k - 1))
    req = GroupRequest(backend=cls.name, preset=WORKLOAD.config.name, depth=depth,
                       capacity=cap, tokens=tokens, ks=[k], acceptances=[accept],
                       depth_file=str(path), warmup=0)
    (p,) = measure_group(req, WORKLOAD, cls)
    assert p["status"] == "ok", p["reason"]
    assert not p["logits_match_plain"] and not p["state_ok"], cls.name
    assert p["logits_check"]["max_rel"] > 100 * p["logits_check"]["tolerance"], cls.name


@needs_page
def test_a_rollback_that_keeps_a_dropped_draft_fails_the_checks(tmp_path):
    """The checks can fail: a page that keeps one token more than it was told (the others
    in tests/test_spec_e2e.py)."""
    assert_wrong_rollback_fails(tmp_path, wrong_rollbacks()["wgpu:keeps-one-more"], "partial")


@pytest.mark.parametrize("name", ["ort-cpu:copy", "ort-cpu:standard"])
def test_every_m_on_ort_host_arrays(tmp_path, name):
    """ORT's CPU EP on the same K-token graphs: the growing past (copy, the ORT flavour's
    GroupQueryAttention) cut to its kept rows, the fixed one (standard) by position."""
    pytest.importorskip("onnxruntime")
    from backends.ort import BACKENDS

    cfg = config(backends=(name,), ks=(4,), accept="partial,0.7")
    for p in sweep(cfg, {name: BACKENDS[name]}, tmp_path).points:
        assert p["status"] == "ok", p["reason"]
        assert p["tokens_match_greedy"] and p["logits_match_plain"] and p["state_ok"], p
        assert p["state_compared"] and p["state"]["vs_replay"]["bitwise"]


def test_every_m_on_ort_shared_by_position_and_a_hybrid_refused(tmp_path):
    """ORT's `shared` mode (one capacity-sized buffer a cache, bound as past and present;
    its lengths fed from the position): the KV rows roll back by position, every m's tokens,
    logits and state as the one-token decode's (the buffers read back); a hybrid's
    overwritten state is refused by name (no deferred commit in this mode)."""
    pytest.importorskip("onnxruntime")
    import dataclasses
    from dataclasses import replace

    from backends.ort import BACKENDS, PROVIDERS, backend_class
    from model.workload import PRESETS, Workload

    name = "ort-cpu:shared"
    # `captured`'s fixed-address feeds, written in place, on the CPU EP (nothing captured)
    captured = backend_class(dataclasses.replace(PROVIDERS["cpu"], key="cpu-device",
                                                 logits_on_host=False), "captured")
    modes = {name: BACKENDS[name], captured.name: captured}
    cfg = config(backends=tuple(modes), ks=(2, 4), accept="partial,zero")
    points = sweep(cfg, modes, tmp_path).points
    assert {p["backend"] for p in points} == set(modes) and len(points) == 8
    for p in points:
        assert p["status"] == "ok", p["reason"]
        assert p["tokens_match_greedy"] and p["logits_match_plain"], p
        assert p["rollback"]["strategy"] == "position" and p["rollback"]["rollbacks"] > 0
        assert p["state_ok"] and p["state_compared"] and p["state"]["vs_replay"]["bitwise"], p
    hybrid = replace(config(backends=(name,), ks=(2,), accept="zero"), preset="tiny")
    (p,) = sweep(hybrid, {name: BACKENDS[name]}, tmp_path / "h",
                 Workload.build(PRESETS["tiny"])).points
    assert p["status"] == "unavailable" and "overwritten by every token" in p["reason"], p


def test_every_m_on_ort_standard_for_a_hybrid(tmp_path):
    """ORT's CPU EP on a hybrid's K-token graph (tiny: a GDN layer, then attention): the
    standard mode builds the deferred-commit export as the pages do, so every m rolls back
    (the GDN state and conv window committed from ``accepted_count``, KV rows by position),
    tokens, logits and state as the one-token decode's; the copy mode (LinearAttention,
    state overwritten) still refuses a partial rollback with its pairs named."""
    pytest.importorskip("onnxruntime")
    from dataclasses import replace

    from backends.ort import BACKENDS
    from model.workload import PRESETS, Workload

    hybrid = Workload.build(PRESETS["tiny"])
    cfg = replace(config(backends=("ort-cpu:standard", "ort-cpu:copy"), ks=(2, 4),
                         accept="partial,zero,0.7"), preset="tiny")
    points = sweep(cfg, {n: BACKENDS[n] for n in cfg.backends}, tmp_path, hybrid).points
    for p in points:
        if p["backend"] == "ort-cpu:copy":
            assert p["status"] == "unavailable" and "overwritten" in p["reason"], p
            continue
        assert p["status"] == "ok", p["reason"]
        assert p["tokens_match_greedy"] and p["logits_match_plain"] and p["state_ok"], p
        assert p["state_compared"], p
        assert p["rollback"]["rollbacks"] > 0 or p["acceptance"] == "0.7", p
        assert p["details"]["rollback"] == "deferred commit (accepted_count)"
    assert sum(p["status"] == "ok" for p in points) == 6


def test_a_spec_1_file_is_not_taken_for_an_end_to_end_one():
    with pytest.raises(UserError, match="per-layer simulation file"):
        validate({"schema": "statebench-spec/1"})
    good = header(config(), WORKLOAD, {}).to_dict()
    validate(good)
    bad = {**good, "points": [{"backend": "wgpu:stateful", "k": "4"}]}
    with pytest.raises(UserError, match="points\\[0\\]"):
        validate(bad)


# -- a model as given (--model) ----------------------------------------------------------------

def test_the_loop_on_a_real_export_every_m(tmp_path):
    """`statebench speculative --model` on genai's export (its K-token graphs: GQA's K rows,
    rollback by position), ORT's CPU EP its reference: every m on ORT's copy mode and the
    stateful page, tokens, logits and state as the one-token decode's; a mode that runs
    statebench's own export only is unavailable with why; the results file names the model."""
    from tests.test_cli import ROOT, statebench

    MODELS = ROOT / "tests" / "models"  # the committed exports (not a held-out set)

    out = tmp_path / "spec.json"
    proc = statebench("speculative", "--model", MODELS / "genai-llama", "--backends",
                      "ort-cpu:copy,ort-cpu:standard,wgpu:stateful", "--k", "3",
                      "--accept", "partial,zero", "--contexts", "6", "--tokens", "6",
                      "--inprocess", "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = load(out)
    assert res.workload["model"]["path"].endswith("model.onnx")
    assert res.workload["preset"] == "model-genai-llama"
    by = {}
    for p in res.points:
        by.setdefault(p["backend"], []).append(p)
    assert all(p["status"] == "unavailable" and "not a model as given" in p["reason"]
               for p in by["ort-cpu:standard"])
    for name in ("ort-cpu:copy", "wgpu:stateful"):
        for p in by[name]:
            if p["status"] == "unavailable" and name.startswith("wgpu:"):
                pytest.skip(p["reason"])
            assert p["status"] == "ok", (name, p["reason"])
            assert p["tokens_match_greedy"] and p["logits_match_plain"] and p["state_ok"], p
            assert p["state"]["vs_replay"]["bitwise"] and p["rollback"]["rollbacks"] > 0


def test_a_real_export_reading_ids(tmp_path):
    """`--read ids` on a model as given: its graph's ``logits`` gets the argmax output, the
    vocabulary (for the drafts' wrong tokens) is the reference's, and tokens and state
    check as with logits."""
    from tests.test_cli import ROOT, statebench

    out = tmp_path / "spec.json"
    proc = statebench("speculative", "--model", ROOT / "tests" / "models" / "genai-llama",
                      "--backends", "wgpu:stateful", "--k", "3", "--accept", "partial",
                      "--contexts", "6", "--tokens", "6", "--inprocess", "--read", "ids",
                      "--out", out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (p,) = load(out).points
    if p["status"] == "unavailable":
        pytest.skip(p["reason"])
    assert p["status"] == "ok" and p["read"] == "ids", p["reason"]
    assert p["tokens_match_greedy"] and p["state_ok"] and p["logits_match_plain"] is None, p
    assert p["rollback"]["rollbacks"] > 0 and "✓†" in proc.stdout
    assert p["plain_chained_matches"] is True, p["plain_chained_why"]


def test_model_and_preset_together_are_one_line():
    from tests.test_cli import ROOT, one_line_error, statebench

    MODELS = ROOT / "tests" / "models"  # the committed exports (not a held-out set)

    says = one_line_error(statebench("speculative", "--model", MODELS / "genai-llama",
                                     "--preset", "tiny", "--backends", "ort-cpu:copy"))
    assert "--model and --preset" in says
    says = one_line_error(statebench("speculative", "--model", MODELS / "genai-llama"))
    assert "--model needs --backends" in says
