"""Tables and text reports over one or more results files (DESIGN §9).

Everything here builds and returns (rich renderables, strings, rows); only the CLI prints.
Several files are compared side by side: one column (or line) per file × backend.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from harness import metrics, stats, verdicts
from harness.results import BYTE_CATEGORIES, Point, Results, check_writable
from model.errors import UserError

OK_MARK, BAD_MARK = "✓", "✗"


@dataclass(frozen=True)
class LabelledResults:
    """A results file with the label it is shown under."""

    label: str
    results: Results

    @property
    def calibration_problems(self) -> list[str]:
        return metrics.calibration_problems(self.results.environment.get("calibration", {}))

    def baseline_for(self, backend: str) -> str | None:
        return metrics.stateless_baseline(self.results.points, backend)

    @property
    def baselines(self) -> list[str]:
        """The stateless baselines this run's speedups are over (one per backend family)."""
        found = (self.baseline_for(b) for b in self.results.backends)
        return list(dict.fromkeys(b for b in found if b))

    @property
    def baseline(self) -> str | None:
        """The baselines as one phrase, for titles."""
        return ", ".join(self.baselines) or None


def _under_load(wl: dict) -> str:
    """The clock warm-up before the warm-up steps; absent from runs made before it existed."""
    w = wl.get("warm_s")
    return "no time under load, " if w is None else f"{w:g} s under load (GPU clocks), "


def label_runs(results: list[Results], paths: list[str | Path] | None = None) -> list[LabelledResults]:
    """Label runs by file stem when there are several, else by nothing."""
    if len(results) == 1:
        return [LabelledResults("", results[0])]
    names = [Path(p).stem for p in paths] if paths else [f"run{i + 1}" for i in range(len(results))]
    if len(set(names)) < len(names):
        names = [f"{i + 1}:{n}" for i, n in enumerate(names)]
    return [LabelledResults(n, r) for n, r in zip(names, results, strict=True)]


def series(runs: list[LabelledResults]) -> list[tuple[LabelledResults, str]]:
    """Every (run, backend) pair, in file then backend order: a column or a chart line each."""
    return [(run, b) for run in runs for b in run.results.backends]


def series_name(run: LabelledResults, backend: str) -> str:
    return f"{run.label} · {backend}" if run.label else backend


def point_speedup(run: LabelledResults, p: Point) -> float | None:
    return metrics.speedup(p, verdicts.baseline_point(run.results, p))


def _cell(run: LabelledResults, p: Point | None) -> Text:
    if p is None:
        return Text("—", style="dim")
    if p.status != "ok":
        return Text(p.status, style="yellow" if p.status == "unavailable" else "bold red")
    c = verdicts.cell(run.results, p, verdicts.model_config(run.results))
    t = Text()
    t.append(f"{c.time}\n")
    t.append(f"{c.interval}\n", style="dim")
    t.append(f"{c.cache}\n", style="cyan")
    if c.matches:
        t.append(OK_MARK, style="green")
        if c.verdict:
            t.append(f" {c.verdict}", style="bold green" if c.faster else "")
    else:
        # a point that does not match is never shown as faster
        t.append(f"{BAD_MARK} mismatch", style="bold red")
    if c.noisy:
        t.append(" ⚠", style="yellow")
    return t


def summary_table(runs: list[LabelledResults], title: str | None = None) -> Table:
    """Rows: context. A column per file × backend: step ms, bytes/step, match, speedup."""
    first = runs[0]
    if title is None:
        base = first.baseline
        title = f"statebench · {first.results.label}"
        if base:
            title += f"\nspeedup over {base}"
    table = Table(title=title, show_lines=True, caption=verdicts.CELL_CAPTION)
    table.add_column("context", justify="right", style="bold", no_wrap=True)
    cols = series(runs)
    for run, b in cols:
        name = series_name(run, b)
        table.add_column(name, justify="right", min_width=max(len(name), 10), no_wrap=True)
    contexts = sorted({c for run in runs for c in run.results.contexts})
    for ctx in contexts:
        table.add_row(str(ctx), *[_cell(run, run.results.point(b, ctx)) for run, b in cols])
    return table


def notes(runs: list[LabelledResults], noise: bool = True, source: str | None = None) -> list[str]:
    """One line per point that was not measured or did not match, per noisy point, and per
    point timed at a low GPU clock. `noise` False: the noisy points (unstable, transient
    steps) are one summary line (`noise_summary`) instead of a line or two each, as the
    terminal shows them; the reports keep every point's."""
    lines = []
    for run in runs:
        bad = run.calibration_problems
        if bad:
            name = run.label or run.results.workload.get("preset")
            lines.append(f"{name}: bandwidth calibration implausible ({'; '.join(bad)}): "
                         "floors and MBU of this run are not charted")
        for p in run.results.points:
            where = f"{series_name(run, p.backend)} @ {p.context}"
            if p.status != "ok":
                lines.append(f"{where}: {p.status}: {p.reason}")
            elif not p.matches:
                m = p.match
                lines.append(f"{where}: {p.reason or 'logits do not match the reference'} "
                             f"(max rel {m.max_rel:.2e}, argmax agree {m.argmax_agree:.0%})")
            elif verdicts.warning_of(p) and noise:
                lines.append(f"{where}: {verdicts.warning_of(p)}")
            if noise:
                lines += [f"{where}: {t}" for t in verdicts.transient_notes(p)]
            if p.details.get("bytes_differ"):
                lines.append(f"{where}: {p.details['bytes_differ']}")
            clock = metrics.low_clock(p.details) if p.status == "ok" else ""
            if clock:
                lines.append(f"{where}: {clock}")
            if (p.status == "ok" and p.mbu is not None and not bad
                    and metrics.plausible_mbu(p.mbu) is None):
                lines.append(f"{where}: MBU {p.mbu:.2f} > {metrics.MBU_PLAUSIBLE_MAX}: the floor's "
                             "bandwidth calibration is below what the step achieved; MBU not charted")
    return lines if noise else lines + noise_summary(runs, source)


def noise_summary(runs: list[LabelledResults], source: str | None = None) -> list[str]:
    """How many points are unstable or had transient steps, and what to do, in one or two
    lines ([] where none): the terminal's stand-in for their per-point notes, which the
    reports (`source`'s report.md and report.html) keep."""
    points = [p for run in runs for p in run.results.points if p.matches]
    unstable = sum(1 for p in points if verdicts.warning_of(p))
    transient = sum(1 for p in points if verdicts.transient_notes(p))
    if not unstable and not transient:
        return []
    of = f" of {len(points)} points"
    said = [f"{unstable}{of} unstable (⚠: stdev ≥ {stats.UNSTABLE_CV:.0%} of the mean, "
            "transients left out)"] if unstable else []
    if transient:
        said.append(f"{transient}{'' if said else of} had transient steps (kept: the median is "
                    "robust to them)")
    todo = (f"per point in report.md and report.html: statebench report {source or 'FILE'} "
            "--out DIR")
    if unstable:
        todo += "; steadier: more --steps, --repeat 3 or more, a quieter machine"
    return [f"noise: {'; '.join(said)}.", f"  {todo}."]


def run_sentences(runs: list[LabelledResults]) -> list[str]:
    """The plain sentences under the table (verdicts.sentences), per run."""
    return [f"{run.label}: {s}" if run.label else s
            for run in runs for s in verdicts.sentences(run.results)]


def summary(runs: list[LabelledResults], source: str | None = None) -> Group:
    """The table, the sentences under it and its notes, as one renderable; noisy points are
    counted in one or two lines (`noise_summary`; `source`: the files, for its hint)."""
    parts: list = [summary_table(runs)]
    said = run_sentences(runs)
    if said:
        parts.append(Text("\n".join(said)))
    ns = notes(runs, noise=False, source=source)
    if ns:
        parts.append(Text("\n".join(ns), style="dim"))
    return Group(*parts)


# -- flat rows: CSV, JSON, Markdown ---------------------------------------------------------

COLUMNS = ["run", "backend", "context", "capacity", "status", "step_ms_median", "step_ms_p10",
           "step_ms_p90", "step_ms_low", "step_ms_high", "step_ms_max", "step_ms_max_at",
           "repeats", "transients", "gpu_ms_median", *[f"bytes_{k}" for k in BYTE_CATEGORIES], "bytes_total",
           "cache_link_bytes", "cache_copied_bytes", "cache_in_place_bytes",
           "floor_ms", "mbu", "mbu_gpu", "match", "max_abs", "max_rel", "argmax_agree", "tolerance",
           "speedup",
           "verdict",
           "build_s", "time_to_depth_s", "peak_rss_bytes", "device_bytes", "reason"]


def rows(runs: list[LabelledResults]) -> list[dict]:
    out = []
    for run in runs:
        cfg = verdicts.model_config(run.results)
        for p in sorted(run.results.points, key=lambda p: (p.context, p.backend)):
            bps = p.bytes_per_step or {}
            out.append({**_uncertainty_columns(p), **_traffic_columns(p, cfg),
                        "verdict": _verdict(run, p), **{
                "run": run.label, "backend": p.backend, "context": p.context,
                "capacity": p.capacity, "status": p.status,
                "step_ms_median": p.step_ms.median if p.step_ms else None,
                "step_ms_p10": p.step_ms.p10 if p.step_ms else None,
                "step_ms_p90": p.step_ms.p90 if p.step_ms else None,
                "gpu_ms_median": p.gpu_ms.median if p.gpu_ms else None,
                **{f"bytes_{k}": bps.get(k) for k in BYTE_CATEGORIES},
                "bytes_total": p.bytes_total, "floor_ms": p.floor_ms, "mbu": p.mbu,
                "mbu_gpu": metrics.gpu_mbu(p),
                "match": p.match.ok if p.match else None,
                "max_abs": p.match.max_abs if p.match else None,
                "max_rel": p.match.max_rel if p.match else None,
                "argmax_agree": p.match.argmax_agree if p.match else None,
                "tolerance": p.match.tolerance if p.match else None,
                "speedup": point_speedup(run, p), "build_s": p.build_s,
                "time_to_depth_s": p.time_to_depth_s, "peak_rss_bytes": p.peak_rss_bytes,
                "device_bytes": p.device_bytes, "reason": p.reason,
            }})
    return [{k: r[k] for k in COLUMNS} for r in out]


def _uncertainty_columns(p: Point) -> dict:
    iv = verdicts.interval_of(p)
    reps = verdicts.samples_of(p)
    slowest = p.step_ms_max or (stats.slowest(reps) if reps else None)
    return {"step_ms_low": iv.low if iv else None, "step_ms_high": iv.high if iv else None,
            "step_ms_max": slowest["ms"] if slowest else None,
            "step_ms_max_at": (f"process {slowest['repeat'] + 1} step {slowest['step']}"
                               if slowest else None),
            "repeats": len(reps) or None,
            "transients": len(p.transients or stats.transient_steps(reps)) if reps else None}


def _traffic_columns(p: Point, cfg) -> dict:
    t = verdicts.cache_traffic(p, cfg)
    return {"cache_link_bytes": t.link if t else None, "cache_copied_bytes": t.copied if t else None,
            "cache_in_place_bytes": t.in_place if t else None}


def _verdict(run: LabelledResults, p: Point) -> str | None:
    c = verdicts.over_baseline(run.results, p)
    return (c.verdict or "no interval") if c else None


def to_csv(runs: list[LabelledResults]) -> str:
    return csv_text(rows(runs), COLUMNS)


def csv_text(table: list[dict], columns: list[str] | tuple[str, ...]) -> str:
    """Rows as CSV under ``columns``, a missing figure empty (the speculative report's too)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    w.writeheader()
    for r in table:
        w.writerow({k: "" if v is None else v for k, v in r.items()})
    return buf.getvalue()


def to_json(runs: list[LabelledResults]) -> str:
    return json.dumps({
        "runs": [{"label": r.label, "workload": r.results.workload,
                  "environment": r.results.environment, "baseline": r.baseline,
                  "sentences": verdicts.sentences(r.results)} for r in runs],
        "rows": rows(runs),
    }, indent=1, allow_nan=False) + "\n"


def _md_cell(run: LabelledResults, p: Point | None) -> str:
    if p is None:
        return "—"
    if p.status != "ok":
        return p.status
    c = verdicts.cell(run.results, p, verdicts.model_config(run.results))
    return "<br>".join(c.lines()) + (" ⚠" if c.noisy else "")


def markdown_table(runs: list[LabelledResults]) -> str:
    cols = series(runs)
    lines = ["| context | " + " | ".join(series_name(r, b) for r, b in cols) + " |",
             "|---:|" + "---:|" * len(cols)]
    for ctx in sorted({c for run in runs for c in run.results.contexts}):
        lines.append(f"| {ctx} | " + " | ".join(_md_cell(r, r.results.point(b, ctx)) for r, b in cols)
                     + " |")
    return "\n".join(lines)


BANDWIDTH_HEAD = ["backend", "context", "floor ms", "step ms", "GPU ms", "MBU (wall)",
                  "MBU (GPU)"]
BANDWIDTH_NOTE = ("Device-resident backends with GPU timestamps: the floor (the bytes a step must "
                  "move over the calibrated streaming bandwidth) over the step's wall time and "
                  "over its GPU time; the gap between the two is host time.")
LINK_HEAD = ["backend", "context", "floor ms", "step ms", "step / floor",
             "step / (link + stateful step)"]
LINK_NOTE = ("Backends whose cache crosses the host link every step: the floor is the device "
             "floor plus the whole cache up and down at the calibrated h2d and d2h rates (the "
             "context's own write and read paths); step / floor says how much of the step is "
             "something else (the graph's own work beyond the floor, submits, waits). The last "
             "column puts the same family's stateful step, measured in the run, in place of "
             "the device floor: the link alone is what a stateless page must add to it.")


def _floor_points(runs: list[LabelledResults]) -> Iterator[tuple[LabelledResults, Point]]:
    """Every point of the runs whose calibration is plausible, by context then backend:
    the points a floor table may show."""
    for run in runs:
        if not run.calibration_problems:
            for p in sorted(run.results.points, key=lambda p: (p.context, p.backend)):
                yield run, p


def bandwidth_rows(runs: list[LabelledResults]) -> list[list[str]]:
    """Per device-resident point with a GPU time: its floor, wall and GPU time, and MBU over
    each (the gap between the two is host time: encoding, submits, readbacks). Runs whose
    calibration is implausible are left out."""
    out = []
    for run, p in _floor_points(runs):
        g = metrics.gpu_mbu(p)
        if g is not None and p.mbu is not None:
            out.append([series_name(run, p.backend), str(p.context), f"{p.floor_ms:.3f}",
                        f"{p.step_ms.median:.3f}", f"{p.gpu_ms.median:.3f}",
                        f"{p.mbu:.2f}", f"{g:.2f}"])
    return out


def link_rows(runs: list[LabelledResults]) -> list[list[str]]:
    """Per host-cache point with a floor: the floor, the step and their ratio (the issue's
    'stateless within 1.5x of its floor'). Runs whose calibration is implausible, and points
    faster than their floor (a link figure that under-measured; ``notes`` says so), are left
    out."""
    out = []
    for run, p in _floor_points(runs):
        if (p.status == "ok" and p.floor_ms and p.step_ms is not None
                and metrics.is_stateless(p.backend, p.details)
                and metrics.plausible_mbu(p.mbu) is not None):  # else noted, not tabled
            out.append([series_name(run, p.backend), str(p.context), f"{p.floor_ms:.3f}",
                        f"{p.step_ms.median:.3f}", f"{p.step_ms.median / p.floor_ms:.2f}",
                        _over_link_and_stateful(run, p)])
    return out


def _over_link_and_stateful(run: LabelledResults, p: Point) -> str:
    """The step over (its link time + the same family's stateful step at this context), the
    issue's floor for a stateless page; "—" where the run has no such stateful point. The
    link time is the point's floor less the device floor, which is the stateful point's
    (the same graph's bytes)."""
    s = run.results.point(p.backend.split(":", 1)[0] + ":stateful", p.context)
    if s is None or s.status != "ok" or not s.floor_ms or s.step_ms is None:
        return "—"
    floor = p.floor_ms - s.floor_ms + s.step_ms.median
    return f"{p.step_ms.median / floor:.2f}" if floor > 0 else "—"


HOST_HEAD = ["backend", "context", "step ms", "GPU ms", "wall − GPU", "write", "encode",
             "submit", "record ahead", "wait", "copy", "Python"]
HOST_NOTE = ("Where a WebNN page's step spends host time (details.host_breakdown_ms, medians "
             "over the timed steps, ms; docs/measuring.md \"Host time\"). Python: the rest of "
             "the dispatch and the read, and after it. Record ahead and wait overlap the GPU.")


def host_rows(runs: list[LabelledResults]) -> list[list[str]]:
    """Per point with a host-time breakdown: the step, its GPU time, wall − GPU and the
    parts (with ``--repeat``, each part's median over the processes: ``harness/repeats``)."""
    out = []
    for run in runs:
        for p in sorted(run.results.points, key=lambda p: (p.context, p.backend)):
            h = p.details.get("host_breakdown_ms") if p.status == "ok" else None
            if not h or p.step_ms is None:
                continue
            gap = h.get("wall_minus_gpu")
            python = sum(h.get(k, 0.0) for k in ("dispatch_other", "read_other", "after"))
            out.append([series_name(run, p.backend), str(p.context), f"{p.step_ms.median:.3f}",
                        "—" if p.gpu_ms is None else f"{p.gpu_ms.median:.3f}",
                        "—" if gap is None else f"{gap:.3f}",
                        *(f"{h.get(k, 0.0):.3f}" for k in ("write", "encode", "submit",
                                                            "record_ahead", "wait", "copy")),
                        f"{python:.3f}"])
    return out


def floor_tables(runs: list[LabelledResults]) -> list[tuple[str, str, list[str], list[list[str]]]]:
    """(title, note, head, rows) of each per-point table that has rows: bandwidth use of
    device-resident backends, the link floors of host-cache ones, the host time of WebNN
    pages."""
    tables = [("Bandwidth use", BANDWIDTH_NOTE, BANDWIDTH_HEAD, bandwidth_rows(runs)),
              ("Host-link floors", LINK_NOTE, LINK_HEAD, link_rows(runs)),
              ("Host time", HOST_NOTE, HOST_HEAD, host_rows(runs))]
    return [t for t in tables if t[3]]


def workload_what(wl: dict) -> str:
    """The model (a --model file) or the preset (its layers, width and size), as one phrase:
    run's and speculative's reports name what was measured the same way."""
    cfgd, model = wl.get("config", {}), wl.get("model")
    return (f"model {model.get('path')} ({model.get('size', 0):,} bytes, sha256 "
            f"{str(model.get('sha256'))[:12]}, {len(model.get('pairs', []))} cache pairs, "
            f"reference {model.get('reference')})" if isinstance(model, dict) else
            f"preset {wl.get('preset')}, {len(cfgd.get('layers', []))} layers "
            f"({', '.join(cfgd.get('layers', []))}), hidden {cfgd.get('hidden')}, "
            f"{cfgd.get('parameters', 0):,} parameters")


def host_lines(env: dict) -> list[str]:
    """The machine and the code a file was made on (cpu, adapter, packages, git commit and
    source digest): shared by run's and speculative's reports."""
    return [
        f"cpu: {env.get('cpu')} ({env.get('cpu_count')} cores), {env.get('platform')}, "
        f"python {env.get('python')}",
        f"adapter: {env.get('wgpu', {}).get('adapter') or env.get('wgpu', {}).get('reason', 'none')}",
        "packages: " + ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items() if v),
        f"git: {env.get('git_commit')}"
        + (f", sources {env['source_digest']}" if env.get("source_digest") else ""),
    ]


def environment_lines(run: LabelledResults) -> list[str]:
    env, wl = run.results.environment, run.results.workload
    cal = env.get("calibration", {})
    lines = [
        f"workload: {workload_what(wl)}, {wl.get('dtype')}, "
        f"{_under_load(wl)}{wl.get('warmup')} warm-up + {wl.get('steps')} timed steps, "
        f"seed {wl.get('seed')}",
        *_created_lines(run),
        *host_lines(env),
    ]
    parts = env.get("merged_from")
    if not parts:
        return lines + calibration_lines(cal)
    for part in parts:  # a merged sweep: each part's points were floored against its own
        lines += [f"{part['file']}: {line}" for line in calibration_lines(part["calibration"])]
    return lines


def _created_lines(run: LabelledResults) -> list[str]:
    parts = run.results.environment.get("merged_from")
    if not parts:
        return [f"created {run.results.created} by `{run.results.command}`"]
    return [f"merged from {p['file']}, created {p['created']} by `{p['command']}`"
            for p in parts]


def calibration_lines(cal: dict) -> list[str]:
    host, gpu = cal.get("host", {}), cal.get("wgpu", {})
    lines = []
    if host:
        lines.append(f"host memory bandwidth: {host.get('copy_gbps')} GB/s (numpy copy)")
    figures = [(k, label) for k, label in (("h2d", "h2d"), ("d2h", "d2h"), ("d2d", "d2d"),
                                           ("stream", "streaming kernel")) if f"{k}_gbps" in gpu]
    if figures:
        lines.append("wgpu bandwidth: " + ", ".join(_bandwidth(gpu, k, label) for k, label in figures))
    elif gpu.get("reason"):
        lines.append(f"wgpu bandwidth: {gpu['reason']}")
    return lines


def _bandwidth(cal: dict, key: str, label: str) -> str:
    """One calibrated figure with how it was measured, or why it is missing."""
    value = cal.get(f"{key}_gbps")
    if value is None:
        return f"{label} n/a ({cal.get(f'{key}_reason', 'not measured')})"
    method = cal.get(f"{key}_method")
    return f"{label} {value} GB/s" + (f" ({method})" if method else "")


def to_markdown(runs: list[LabelledResults], charts: list[str] | None = None) -> str:
    """The sentences and the table first (as the terminal shows them), then the rest."""
    base = runs[0].baseline
    parts = ["# statebench report", "", *(f"- {s}" for s in run_sentences(runs)), "",
             "## Decode step", "",
             f"Each cell: {verdicts.CELL_CAPTION.removeprefix('each cell: ')}; the baseline is "
             f"{base or 'absent from this run'}. Intervals: docs/results.md, \"Intervals and orderings\".",
             "", markdown_table(runs), ""]
    for run in runs:
        if run.label:
            parts += [f"## {run.label}", ""]
        parts += [f"- {line}" for line in environment_lines(run)] + [""]
    for title, note, head, body in floor_tables(runs):
        parts += [f"## {title}", "", note, "",
                  "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1),
                  *("| " + " | ".join(r) + " |" for r in body), ""]
    return "\n".join(parts + notes_and_charts(notes(runs), charts))


def notes_and_charts(ns: list[str], charts: list[str] | None) -> list[str]:
    """A markdown report's tail: its notes, then its charts (the speculative report's too)."""
    tail = ["## Notes", ""] + [f"- {n}" for n in ns] + [""] if ns else []
    for c in charts or []:
        tail += [f"![{Path(c).stem}]({c})", ""]
    return tail


# -- the report directory: never over other files unasked, one line when it cannot be written -

def check_out_dir(out: Path, force: bool = False) -> None:
    """UserError, before anything is rendered, where `out` cannot take a report: a file; a
    directory that already holds files (unless `force`: the report's own files are then
    replaced, others left); a parent that is missing, or one where no file can be made."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; a report is a directory of files: give a "
                        "directory name")
    if out.is_dir():
        if any(out.iterdir()) and not force:
            raise UserError(f"--out {out} already holds files; pass --force to write the "
                            "report over them, or give a new directory")
        where = out
    elif not out.parent.is_dir():
        raise UserError(f"--out {out}: the directory {out.parent} does not exist")
    else:
        where = out.parent
    check_writable(where, out)


@contextlib.contextmanager
def writing_to(out: Path) -> Iterator[None]:
    """A write that fails part way (disk full, a read-only mount) is one line naming it."""
    try:
        yield
    except OSError as exc:
        what = f"{exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else "")
        raise UserError(f"cannot write the report in {out} ({what}); the report there is "
                        "incomplete") from None
