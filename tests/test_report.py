"""Reports: files produced, charts embedded, several files compared side by side."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

import pytest
from rich.console import Console
from test_cli import TINY, statebench

from harness import report, results


def changed(res: results.Results, p: results.Point, **changes) -> results.Point:
    """`p` with `changes`, in its place in `res` (a Point is frozen)."""
    new = replace(p, **changes)
    res.points[res.points.index(p)] = new
    return new


@pytest.fixture(scope="module")
def run_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    paths = []
    for name in ("a", "b"):
        proc = statebench("run", *TINY, "--out", d / f"{name}.json", "--inprocess", cwd=d)
        assert proc.returncode == 0, proc.stderr
        paths.append(d / f"{name}.json")
    return paths


def test_report_files(run_files, tmp_path):
    out = tmp_path / "rep"
    proc = statebench("report", run_files[0], "--out", out)
    assert proc.returncode == 0, proc.stderr
    for chart in ("step_time", "bytes_per_step", "speedup", "mbu"):
        assert (out / f"{chart}.png").stat().st_size > 1000
        assert (out / f"{chart}.svg").read_text().lstrip().startswith("<?xml")
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 4 and "ort-cpu:shared" in html and "✓" in html
    assert "src=\"http" not in html and "href=\"http" not in html.split("<svg")[0]  # offline
    md = (out / "report.md").read_text()
    assert "| context |" in md and "step_time.png" in md
    rows = list(csv.DictReader(io.StringIO((out / "report.csv").read_text())))
    assert len(rows) == 4 and {r["backend"] for r in rows} == {"ort-cpu:copy", "ort-cpu:shared"}
    assert json.loads((out / "report.json").read_text())["rows"][0]["status"] == "ok"


@pytest.mark.parametrize("fmt, marker", [("table", "context"), ("md", "| context |"),
                                         ("csv", "run,backend,context"), ("json", '"rows"'),
                                         ("html", "<table>")])
def test_formats_print(run_files, fmt, marker):
    proc = statebench("report", run_files[0], "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    assert marker in proc.stdout


def test_compare_two_files(run_files, tmp_path):
    runs = report.label_runs([results.load(p) for p in run_files], run_files)
    assert [r.label for r in runs] == ["a", "b"]
    text = report.to_markdown(runs)
    assert "a · ort-cpu:copy" in text and "b · ort-cpu:shared" in text
    assert len(report.rows(runs)) == 8
    console = Console(file=io.StringIO(), width=200)
    console.print(report.summary(runs))  # renders; reports themselves never print
    assert "b · ort-cpu:shared" in console.file.getvalue()
    proc = statebench("report", *run_files, "--out", tmp_path / "cmp")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cmp" / "step_time.svg").exists()


def test_repeat_two_through_the_cli_and_report(tmp_path):
    """A real tiny run, two worker processes a point, read back by every report format."""
    out = tmp_path / "r2.json"
    proc = statebench("run", "--preset", "tiny", "--backends", "ort-cpu:copy,ort-cpu:shared",
                      "--contexts", "8", "--steps", "6", "--warmup", "1", "--repeat", "2",
                      "--out", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    res = results.load(out)
    assert res.workload["repeat"] == 2
    assert all(len(p.repeats) == 2 and p.step_ms_ci for p in res.points)
    md = statebench("report", out, "--format", "md").stdout
    assert md.index("At 8, per step: ort-cpu:copy moved") < md.index("| context |")
    assert "cache 0 B" in md and "per-process medians" not in md  # the method is in the JSON
    row = json.loads(statebench("report", out, "--format", "json").stdout)["rows"][0]
    assert row["repeats"] == 2 and row["step_ms_low"] <= row["step_ms_median"] <= row["step_ms_high"]
    bad = statebench("run", *TINY, "--repeat", "0", "--out", tmp_path / "x.json", cwd=tmp_path)
    assert bad.returncode == 2 and "--repeat" in bad.stderr and not (tmp_path / "x.json").exists()


def test_mismatch_never_shown_faster(run_files):
    res = results.load(run_files[0])
    p = changed(res, res.point("ort-cpu:shared", 8), match=results.Match(False, 1.0, 1.0, 0.0))
    runs = report.label_runs([res])
    assert report.point_speedup(runs[0], p) is None
    console = Console(file=io.StringIO(), width=200)
    console.print(report.summary_table(runs))
    assert "✗ mismatch" in console.file.getvalue()
    assert [r["speedup"] for r in report.rows(runs) if r["backend"] == "ort-cpu:shared"][0] is None


def test_implausible_mbu_is_noted_not_charted():
    """An MBU above 1.05 says the calibration under-measured the device: noted, not plotted."""
    from harness import metrics

    assert metrics.plausible_mbu(0.8) == 0.8
    assert metrics.plausible_mbu(1.3) is None
    assert metrics.plausible_mbu(None) is None


def test_gpu_time_mbu_for_device_resident_points(run_files):
    """MBU over GPU time is the floor over the GPU time, for backends whose cache stays on
    the device; host-cache backends (floor counts the link) and points without GPU time
    have none. The markdown report tables it beside MBU over wall time, and host-cache
    points against their link floor."""
    from harness import metrics

    res = results.load(run_files[0])
    ctx = res.contexts[0]
    dev, host = res.point("ort-cpu:shared", ctx), res.point("ort-cpu:copy", ctx)  # GPU time set below
    dev, host = (changed(res, p, floor_ms=floor, gpu_ms=results.Stats.of([4.0, 4.0, 4.0]),
                         mbu=floor / p.step_ms.median)
                 for p, floor in ((dev, 2.0), (host, host.step_ms.median / 2)))
    assert metrics.gpu_mbu(dev) == pytest.approx(0.5)
    assert metrics.gpu_mbu(host) is None
    res.environment["calibration"] = {}  # nothing implausible to hide behind
    runs = report.label_runs([res])
    md = report.to_markdown(runs)
    from harness import html_report as report_html

    assert "<td>0.50</td>" in report_html.render(runs, {})
    row = next(line for line in md.splitlines() if line.startswith(f"| ort-cpu:shared | {ctx} |"))
    assert row.endswith(f"| {dev.mbu:.2f} | 0.50 |")
    bandwidth, link = md.split("## Bandwidth use")[1].split("## Host-link floors")
    assert "| ort-cpu:copy |" not in bandwidth
    # the host-cache point is tabled against its link floor instead: step over floor
    row = next(line for line in link.splitlines() if line.startswith(f"| ort-cpu:copy | {ctx} |"))
    assert row.endswith("| 2.00 | — |")  # no ort-cpu:stateful in the run to add the link to
    # with the family's stateful point: step / (floor - its device floor + its step)
    import copy

    peer = replace(copy.deepcopy(dev), backend="ort-cpu:stateful", floor_ms=0.01,
                   step_ms=results.Stats.of([0.05] * 3))
    res.points.append(peer)
    want = host.step_ms.median / (host.floor_ms - 0.01 + 0.05)
    assert report._over_link_and_stateful(report.label_runs([res])[0], host) == f"{want:.2f}"
    res.points.remove(peer)
    assert "| ort-cpu:shared |" not in link
    assert "<h2>Host-link floors</h2>" in report_html.render(runs, {})
    assert metrics.gpu_mbu(replace(dev, gpu_ms=None)) is None


def test_host_time_table(run_files):
    """Points with a host-time breakdown (WebNN pages, docs/measuring.md "Host time") get a
    row each in the markdown and HTML reports: step, GPU, wall − GPU and the parts, Python
    being the rest of the dispatch and the read; points without one get none."""
    from harness import html_report as report_html

    res = results.load(run_files[0])
    ctx = res.contexts[0]
    p = res.point("ort-cpu:shared", ctx)
    assert "## Host time" not in report.to_markdown(report.label_runs([res]))
    changed(res, p, gpu_ms=results.Stats.of([2.2, 2.2, 2.2]), details={**p.details, "host_breakdown_ms": {
        "write": 0.05, "write_device": 0.02, "encode": 0.0, "submit": 0.04,
        "record_ahead": 0.3, "dispatch_other": 0.02, "wait": 2.1, "copy": 0.06,
        "read_other": 0.03, "after": 0.005, "total": 2.6, "wall_minus_gpu": 0.25}})
    runs = report.label_runs([res])
    md = report.to_markdown(runs).split("## Host time")[1]
    row = next(line for line in md.splitlines() if line.startswith(f"| ort-cpu:shared | {ctx} |"))
    assert row.endswith("| 2.200 | 0.250 | 0.050 | 0.000 | 0.040 | 0.300 | 2.100 | 0.060 | 0.055 |")
    assert "| ort-cpu:copy |" not in md.split("##")[0]
    assert "<h2>Host time</h2>" in report_html.render(runs, {})


def test_points_timed_at_a_low_clock_are_noted(run_files):
    res = results.load(run_files[0])
    p = res.point("ort-cpu:shared", res.contexts[0])
    changed(res, p, details={**p.details, "sm_clock_mhz": {
        "min": 345.0, "median": 1095.0, "max": 1095.0, "samples": 4, "peak_seen": 1980.0}})
    lines = report.notes(report.label_runs([res]))
    assert any("ort-cpu:shared" in ln and "SM clock 1095 MHz" in ln for ln in lines), lines


def test_noise_is_one_summary_in_the_terminal_and_per_point_in_the_reports():
    """The committed CI baseline has a note or two per point for noise (unstable, transient
    steps): the table's summary counts them in two lines, the reports keep every one."""
    import html
    from pathlib import Path

    from harness import html_report, verdicts

    ci = Path(__file__).resolve().parent.parent / "results" / "baselines" / "ci.json"
    runs = report.label_runs([results.load(ci)])
    full = report.notes(runs)
    noisy = [n for n in full if ": unstable: " in n or ": transient" in n]
    assert len(noisy) >= 10
    short = report.notes(runs, noise=False, source="ci.json")
    assert not set(noisy) & set(short) and len(short) == len(full) - len(noisy) + 2
    unstable = sum(1 for p in runs[0].results.points if p.matches and verdicts.warning_of(p))
    transient = sum(1 for p in runs[0].results.points if p.matches and verdicts.transient_notes(p))
    head, todo = short[-2:]
    assert head.startswith(f"noise: {unstable} of 16 points unstable") and f"; {transient} had" in head
    assert "statebench report ci.json --out DIR" in todo and "--repeat" in todo
    console = Console(file=io.StringIO(), width=300)
    console.print(report.summary(runs, "ci.json"))
    shown = console.file.getvalue()
    assert "noise: " in shown and ": unstable: " not in shown
    md, page = report.to_markdown(runs), html_report.render(runs, {})
    assert all(n in md and html.escape(n) in page for n in noisy)
