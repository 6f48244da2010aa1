"""`statebench report` over end-to-end speculative files (statebench-spec/2): the table the
speculative command prints, report.md/csv/json/html and the charts, from recorded files;
per-layer simulation files and a mix with run files refused in one line."""

from __future__ import annotations

import copy
import csv
import io
import json
import re

import pytest
from test_cli import ROOT, one_line_error, statebench

from harness.speculative import e2e_report
from harness.speculative.spec_results import SpecResults
from model.errors import UserError

H100 = ROOT / "results/h100/2026-12-05-5bde1d9/call3/spec-llama-1b_q4f16-d8192.json"
LAVAPIPE = ROOT / "results/lavapipe/2026-12-05-19ef3dd-spec-model/spec-genai-llama.json"
SPEC1 = ROOT / "results/h200/2026-11-29-1c7c5c8/spec-tiny-h200.json"
RUN = ROOT / "results/h100/2026-12-05-5bde1d9/call1/graph-d8192.json"


def md_row(md: str, p: dict) -> list[str]:
    """The cells of the report.md row of point `p` (depth, K, acceptance, backend lead)."""
    lead = f"| {p['depth']} | {p['k']} | {p['acceptance']} | {p['backend']} |"
    found = [line for line in md.splitlines() if line.startswith(lead)]
    assert len(found) == 1, (lead, found)
    return [c.strip() for c in found[0].strip("|").split("|")]


def expected_cells(p: dict) -> list[str]:
    """A measured point's numbers as the report formats them, read from the file."""
    rb = p["rollback"]
    return [f"{p['ms_per_token']:.3f}", f"{p['plain_ms_per_token']:.3f}", f"{p['speedup']:.2f}×",
            f"{p['verify_ms']['median']:.3f} ({p['verify_over_plain']:.2f}×)",
            f"{p['verify_gpu_ms']:.3f} ({p['verify_over_plain_gpu']:.2f}×)",
            f"{p['mean_accepted']:.2f}", f"{rb['ms']['median']:.4f} ({rb['strategy']})"]


def test_report_on_a_recorded_spec_file(tmp_path):
    out = tmp_path / "rep"
    proc = statebench("report", H100, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "statebench speculative · llama-1b+q4f16 · 32 tokens" in proc.stdout
    for chart in ("spec_ms_per_token", "spec_verify_ratio"):
        assert (out / f"{chart}.png").stat().st_size > 1000
        assert (out / f"{chart}.svg").read_text().lstrip().startswith("<?xml")
    points = json.loads(H100.read_text())["points"]
    md = (out / "report.md").read_text()
    for p in points:
        cells = md_row(md, p)
        assert cells[4:11] == expected_cells(p), p["acceptance"]
        assert cells[11].startswith("✓ tokens ✓, logits ✓")
    env = json.loads(H100.read_text())["environment"]
    assert env["git_commit"] in md and env["source_digest"] in md
    assert env["wgpu"]["adapter"] in md and "spec_ms_per_token.png" in md
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 2 and "wgpu:stateful" in html
    rows = list(csv.DictReader(io.StringIO((out / "report.csv").read_text())))
    assert [float(r["ms_per_token"]) for r in rows] == [p["ms_per_token"] for p in points]
    assert len(json.loads((out / "report.json").read_text())["rows"]) == len(points)


def test_several_files_side_by_side():
    """Every point of two files a row, under each file's own heading."""
    runs = e2e_report.load([str(H100), str(LAVAPIPE)])
    md = e2e_report.to_markdown(runs)
    assert "## spec-llama-1b_q4f16-d8192 · llama-1b+q4f16" in md
    assert "## spec-genai-llama · model-genai-llama" in md
    n = sum(len(r.results.points) for r in runs)
    assert sum(1 for line in md.splitlines() if re.match(r"\| \d+ \| \d+ \|", line)) == n
    lava = json.loads(LAVAPIPE.read_text())["points"]
    p = next(p for p in lava if p["backend"] == "ort-cpu:copy")  # no GPU time recorded
    assert md_row(e2e_report.to_markdown(runs[1:]), p)[8] == "—"


def test_failed_checks_and_unmeasured_points_are_shown():
    d = json.loads(H100.read_text())
    bad, gone = copy.deepcopy(d["points"][0]), copy.deepcopy(d["points"][1])
    bad.update(tokens_match_greedy=False, first_mismatch=5, greedy_margin_at_mismatch=0.01)
    gone = {k: gone[k] for k in ("backend", "k", "acceptance", "depth", "capacity", "tokens")}
    gone.update(status="unavailable", reason="no adapter")
    res = SpecResults(d["created"], d["command"], d["environment"], d["workload"], [bad, gone])
    md = e2e_report.to_markdown([e2e_report.SpecRun("", res)])
    assert md_row(md, bad)[11].startswith("✗ tokens ✗ at 5, logits ✓")
    assert md_row(md, gone)[4] == "unavailable"
    assert "unavailable: no adapter" in md and "tokens differ from the one-token decode's" in md


def test_a_point_that_read_ids_shows_its_logits_not_compared(tmp_path):
    """A point of `--read ids` (the page read its argmax ids): its logits check not made,
    neither ✓ nor ✗, said once in the notes; None is refused where the point read logits."""
    from harness.speculative.spec_results import load

    d = json.loads(H100.read_text())
    ids = copy.deepcopy(d["points"][0])
    ids.update(read="ids", logits_match_plain=None, greedy_margin_at_mismatch=None,
               logits_check={"rows": 0, "max_rel": None, "tolerance": 0.01, "ok": None,
                             "why": "the page read ids, not logits"})
    out = tmp_path / "spec.json"
    SpecResults(d["created"], d["command"], d["environment"], d["workload"], [ids]).save(out)
    run = e2e_report.SpecRun("", load(out))
    assert md_row(e2e_report.to_markdown([run]), ids)[11] == (
        "✓† tokens ✓, logits — (not read: ids), state ✓")
    (row,) = e2e_report.rows([run])
    assert row["read"] == "ids" and row["check"] == "✓†" and row["logits_match_plain"] is None
    assert [n for n in e2e_report.notes([run]) if "logits not compared" in n] != []
    wrong = {**ids, "read": "logits"}
    SpecResults(d["created"], d["command"], d["environment"], d["workload"], [wrong]).save(out)
    with pytest.raises(UserError, match="logits_match_plain: None, but the point read logits"):
        load(out)


@pytest.mark.parametrize("files, says", [
    ([SPEC1], "schema 'statebench-spec/1', the per-layer simulation's"),
    ([H100, RUN], "is a speculative results file (statebench-spec/2) and "),
])
def test_spec1_and_a_mix_are_one_line(files, says):
    assert says in one_line_error(statebench("report", *files))


def test_out_holding_files_needs_force(tmp_path):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert "already holds files" in one_line_error(statebench("report", H100, "--out", out))
    assert not (out / "report.md").exists()
    proc = statebench("report", H100, "--out", out, "--force", "--format", "md")
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.md").exists() and (out / "mine.txt").read_text() == "keep"


def test_tokens_parted_at_a_certified_near_tie_pass_with_a_mark():
    """A point whose tokens part from the one-token decode's at a near-tie both graphs'
    logits agree on (``near_tie.certified``) passes, marked ≈ and said in the notes; one
    whose parting is not certified stays ✗."""
    from harness.speculative import e2e_render

    d = json.loads(H100.read_text())
    tie = {"at": 26, "loop_token": 7, "plain_token": 9, "gap": 0.002, "loop_gap": 0.001,
           "bound": 0.06, "certified": True}
    near = copy.deepcopy(d["points"][0])
    near.update(tokens_match_greedy=False, first_mismatch=26, near_tie=tie)
    far = {**copy.deepcopy(near), "near_tie": {**tie, "gap": 0.5, "certified": False}}
    far["depth"] += 1  # its own key
    assert e2e_render.passed(near) and e2e_render.mark(near).endswith("≈")
    assert not e2e_render.passed(far) and e2e_render.mark(far) == "✗"
    res = SpecResults(d["created"], d["command"], d["environment"], d["workload"], [near, far])
    md = e2e_report.to_markdown([e2e_report.SpecRun("", res)])
    assert md_row(md, near)[11].startswith("✓≈ tokens ✓ at 26 (a near-tie: checked up to it)")
    assert md_row(md, far)[11].startswith("✗ tokens ✗ at 26,")
    notes = e2e_render.notes(res)
    assert any(n.startswith("≈ ") and "a near-tie" in n for n in notes), notes
    assert any(n.startswith("✗ ") and "tokens differ" in n for n in notes), notes
