"""A self-contained report.html: inline SVG charts, the table, environment, match status."""

from __future__ import annotations

import html
from pathlib import Path

from harness import verdicts
from harness.report import (
    LabelledResults,
    environment_lines,
    floor_tables,
    notes,
    run_sentences,
    series,
    series_name,
)

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; vertical-align: top; }
th { background: #f3f3f3; } td.ok { color: #176117; } td.bad { color: #b00020; font-weight: bold; }
td.na { color: #999; } .chart svg { max-width: 100%; height: auto; } code { background: #f3f3f3; }
"""


def _cell(run: LabelledResults, p) -> str:
    if p is None:
        return '<td class="na">—</td>'
    if p.status != "ok":
        return f'<td class="na" title="{html.escape(p.reason)}">{p.status}</td>'
    c = verdicts.cell(run.results, p, verdicts.model_config(run.results))
    body = "<br>".join(html.escape(x) for x in c.lines()) + (" ⚠" if c.noisy else "")
    return f'<td class="{"ok" if c.matches else "bad"}">{body}</td>'


def table_html(runs: list[LabelledResults]) -> str:
    cols = series(runs)
    head = "".join(f"<th>{html.escape(series_name(r, b))}</th>" for r, b in cols)
    body = []
    for ctx in sorted({c for run in runs for c in run.results.contexts}):
        cells = "".join(_cell(r, r.results.point(b, ctx)) for r, b in cols)
        body.append(f"<tr><th>{ctx}</th>{cells}</tr>")
    return f"<table><tr><th>context</th>{head}</tr>{''.join(body)}</table>"


def _inline_svg(path: Path) -> str:
    text = path.read_text()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def render(runs: list[LabelledResults], charts: dict[str, dict[str, Path]]) -> str:
    base = runs[0].baseline
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>statebench report</title>",
             f"<style>{CSS}</style></head><body><h1>statebench report</h1>"]
    said = run_sentences(runs)  # the sentences and the table lead, as in the terminal
    if said:
        parts.append("<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in said) + "</ul>")
    parts.append("<h2>Decode step</h2><p>"
                 + html.escape(verdicts.CELL_CAPTION[0].upper() + verdicts.CELL_CAPTION[1:])
                 + f"; the baseline is <code>{html.escape(base or 'absent')}</code>. "
                 "A point that does not match is never shown as faster.</p>")
    parts.append(table_html(runs))
    for run in runs:
        if run.label:
            parts.append(f"<h2>{html.escape(run.label)}</h2>")
        parts.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in environment_lines(run))
                     + "</ul>")
    for title, note, head_cells, rows in floor_tables(runs):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in head_cells)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>"
                       for r in rows)
        parts.append(f"<h2>{html.escape(title)}</h2><p>{html.escape(note)}</p>"
                     f"<table><tr>{head}</tr>{body}</table>")
    ns = notes(runs)
    if ns:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in ns) + "</ul>")
    parts.append("<h2>Charts</h2>")
    for _name, files in charts.items():
        if "svg" in files:
            parts.append(f"<div class='chart'>{_inline_svg(files['svg'])}</div>")
    parts.append("</body></html>")
    return "\n".join(parts)
