"""A self-contained report.html of end-to-end speculative files: run's report.html's style
and inline SVG charts (harness/html_report.py), the spec report's table, environment, notes."""

from __future__ import annotations

import html
from pathlib import Path

from harness.html_report import CSS, _inline_svg
from harness.speculative.e2e_report import (
    MD_CAPTION,
    MD_HEAD,
    SpecRun,
    environment_lines,
    md_cells,
    notes,
    ordered,
    title,
)


def table_html(run: SpecRun) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in MD_HEAD)
    body = []
    for p in ordered(run.results):
        cells = md_cells(p)
        mark = cells[-1][:1]
        css = "ok" if mark == "✓" else "bad" if mark == "✗" else "na"
        tds = "".join(f"<td>{html.escape(c)}</td>" for c in cells[:-1])
        body.append(f"<tr><td>{p['depth']}</td><td>{p['k']}</td>"
                    f"<td>{html.escape(str(p['acceptance']))}</td>"
                    f"<td>{html.escape(p['backend'])}</td>{tds}"
                    f"<td class='{css}'>{html.escape(cells[-1])}</td></tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def render(runs: list[SpecRun], charts: dict[str, dict[str, Path]]) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'>"
             "<title>statebench speculative report</title>",
             f"<style>{CSS}</style></head><body><h1>statebench speculative report</h1>",
             f"<p>{html.escape(MD_CAPTION)}</p>"]
    for run in runs:
        parts.append(f"<h2>{html.escape(title(run))}</h2>")
        parts.append(table_html(run))
        parts.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>"
                                      for x in environment_lines(run)) + "</ul>")
    ns = notes(runs)
    if ns:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in ns)
                     + "</ul>")
    parts.append("<h2>Charts</h2>")
    for files in charts.values():
        if "svg" in files:
            parts.append(f"<div class='chart'>{_inline_svg(files['svg'])}</div>")
    parts.append("</body></html>")
    return "\n".join(parts)
