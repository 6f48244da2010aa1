"""`statebench report` over end-to-end speculative files (statebench-spec/2): the terminal
tables (e2e_render's, as `statebench speculative --backends` printed them), flat rows for
Markdown, CSV and JSON, and the environment lines. Built and returned here; the command
prints and writes (harness/commands/report.py), the charts are harness/speculative/e2e_charts.

Only rendering: which files are spec files, and a mix refused, is `spec_files`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rich.console import Group
from rich.text import Text

from harness import report
from harness.speculative import e2e_render, spec_results
from harness.speculative.spec_results import SpecResults
from model.errors import UserError

SPEC_PREFIX = "statebench-spec/"


@dataclass(frozen=True)
class SpecRun:
    """A speculative results file with the label it is shown under ("" when it is alone)."""

    label: str
    results: SpecResults


def _schema_of(path: str) -> str | None:
    """The file's schema, or None where it cannot be read as a JSON object: the run
    loader then says why, in its one line."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return d.get("schema") if isinstance(d, dict) else None


def spec_files(files: list[str]) -> bool:
    """True where every file is an end-to-end speculative one, False where none is a
    speculative file; a UserError (one line) for a per-layer simulation file or a mix of
    speculative and run files, which share no table."""
    schemas = {f: _schema_of(f) for f in files}
    spec = [f for f, s in schemas.items() if s and s.startswith(SPEC_PREFIX)]
    for f in spec:
        if schemas[f] != spec_results.SCHEMA:
            raise UserError(f"{f}: schema {schemas[f]!r}, the per-layer simulation's "
                            "(`statebench speculative` without --backends prints its tables); "
                            "report takes run files (statebench/2) or end-to-end speculative "
                            f"ones ({spec_results.SCHEMA})")
    if spec and len(spec) < len(files):
        other = next(f for f in files if f not in spec)
        raise UserError(f"{spec[0]} is a speculative results file ({spec_results.SCHEMA}) and "
                        f"{other} is not: report them in separate calls")
    return bool(spec)


def load(files: list[str]) -> list[SpecRun]:
    """Each file loaded and validated, labelled by its stem when there are several."""
    loaded = [spec_results.load(f) for f in files]
    if len(files) == 1:
        return [SpecRun("", loaded[0])]
    names = [Path(f).stem for f in files]
    if len(set(names)) < len(names):
        names = [f"{i + 1}:{n}" for i, n in enumerate(names)]
    return [SpecRun(n, r) for n, r in zip(names, loaded, strict=True)]


def _where(run: SpecRun, line: str) -> str:
    return f"{run.label}: {line}" if run.label else line


def notes(runs: list[SpecRun]) -> list[str]:
    """e2e_render's notes of every file, prefixed with its label when there are several."""
    return [_where(run, n) for run in runs for n in e2e_render.notes(run.results)]


def summary(runs: list[SpecRun]) -> Group:
    """The tables `statebench speculative --backends` printed, one per file, and the notes,
    coloured as it colours them."""
    parts: list = []
    for run in runs:
        t = e2e_render.table(run.results)
        if run.label:
            t.title = f"{run.label} · {t.title}"
        parts.append(t)
    parts += [Text(_where(run, n), style="red" if n.startswith("✗") else "yellow")
              for run in runs for n in e2e_render.notes(run.results)]
    return Group(*parts)


# -- flat rows: a row per file × depth × K × acceptance × backend ------------------------------

COLUMNS = ["run", "preset", "depth", "k", "acceptance", "backend", "status", "ms_per_token",
           "plain_ms_per_token", "speedup", "plain_chained_ms_per_token", "speedup_vs_chained",
           "verify_ms", "verify_over_plain", "verify_gpu_ms",
           "verify_over_plain_gpu", "plain_step_ms", "plain_gpu_ms", "mean_accepted",
           "verifies", "rollback_ms", "rollback_strategy", "rollbacks", "tokens_match_greedy",
           "read", "logits_match_plain", "logits_max_rel", "state_ok", "state_compared",
           "check", "reason"]


def ordered(results: SpecResults) -> list[dict]:
    """The points in the terminal table's order: depth × K × acceptance rows as they first
    appear, backends in each as their columns appear."""
    backends = list(dict.fromkeys(p["backend"] for p in results.points))
    rows = list(dict.fromkeys((p["depth"], p["k"], p["acceptance"]) for p in results.points))
    by = {(p["depth"], p["k"], p["acceptance"], p["backend"]): p for p in results.points}
    return [by[(*r, b)] for r in rows for b in backends if (*r, b) in by]


def check_mark(p: dict) -> str:
    """✓ (every check passed), ✓* (passed, the state not read back), ✓† (passed, the logits
    not read: the page read ids) or ✗, as the table's."""
    return e2e_render.mark(p)


def rows(runs: list[SpecRun]) -> list[dict]:
    out = []
    for run in runs:
        for p in ordered(run.results):
            ok = p["status"] == "ok"
            m = p if ok else {}
            rb = m.get("rollback", {})
            out.append({
                "run": run.label, "preset": run.results.workload.get("preset"),
                "depth": p["depth"], "k": p["k"], "acceptance": p["acceptance"],
                "backend": p["backend"], "status": p["status"],
                "ms_per_token": m.get("ms_per_token"),
                "plain_ms_per_token": m.get("plain_ms_per_token"), "speedup": m.get("speedup"),
                "plain_chained_ms_per_token": m.get("plain_chained_ms_per_token"),
                "speedup_vs_chained": m.get("speedup_vs_chained"),
                "verify_ms": m.get("verify_ms", {}).get("median"),
                "verify_over_plain": m.get("verify_over_plain"),
                "verify_gpu_ms": m.get("verify_gpu_ms"),
                "verify_over_plain_gpu": m.get("verify_over_plain_gpu"),
                "plain_step_ms": m.get("plain_step_ms", {}).get("median"),
                "plain_gpu_ms": m.get("plain_gpu_ms"), "mean_accepted": m.get("mean_accepted"),
                "verifies": m.get("verifies"), "rollback_ms": rb.get("ms", {}).get("median"),
                "rollback_strategy": rb.get("strategy"), "rollbacks": rb.get("rollbacks"),
                "tokens_match_greedy": m.get("tokens_match_greedy"),
                "read": spec_results.read_of(p) if ok else None,
                "logits_match_plain": m.get("logits_match_plain"),
                "logits_max_rel": m.get("logits_check", {}).get("max_rel"),
                "state_ok": m.get("state_ok"), "state_compared": m.get("state_compared"),
                "check": check_mark(p) if ok else None, "reason": p["reason"]})
    return out


def to_csv(runs: list[SpecRun]) -> str:
    return report.csv_text(rows(runs), COLUMNS)


def to_json(runs: list[SpecRun]) -> str:
    return json.dumps({
        "runs": [{"label": r.label, "created": r.results.created, "command": r.results.command,
                  "workload": r.results.workload, "environment": r.results.environment}
                 for r in runs],
        "rows": rows(runs)}, indent=1, allow_nan=False) + "\n"


# -- Markdown ----------------------------------------------------------------------------------

MD_HEAD = ["depth", "K", "accept", "backend", "ms / token", "plain ms / token", "speedup",
           "verify ms (× step)", "GPU verify ms (× GPU step)", "mean accepted",
           "rollback ms (strategy)", "check"]
MD_CAPTION = ("A row per depth × K × acceptance × backend. ms / token: the loop's wall time per "
              "generated token; plain: the same page's one-token decode's (/ chained on the "
              "device, where the page read ids); speedup: plain over the loop (/ chained over "
              "it). verify ms: the median K-token verify, × the median one-token step; "
              "GPU: the same by GPU timestamps, where recorded. mean accepted: drafts accepted "
              "per verify. rollback: the median time to undo the rejected rows and how. check: "
              "✓ where the tokens are the one-token decode's greedy ones, the verify logits "
              "match its logits and the state after the loop is the one feeding only the "
              "accepted tokens gives (✓*: the state not read back, its next write's position "
              "checked; ✓†: the page read its argmax ids, not logits, so the logits were not "
              "compared); ✗ and the failing check otherwise (the notes say by how much).")


def _f(v: float | None, fmt: str, suffix: str = "") -> str:
    return "—" if v is None else f"{v:{fmt}}{suffix}"


def _checks(p: dict) -> str:
    """The mark and the three checks, each ✓/✗, with the logits' max rel error."""
    def ok(v: bool) -> str:
        return "✓" if v else "✗"

    logits = p.get("logits_check", {})
    state = ("state ✓*" if p.get("state_compared", True) is False and p["state_ok"]
             else f"state {ok(p['state_ok'])}")
    at = "" if p["tokens_match_greedy"] else f" at {p.get('first_mismatch')}"
    if e2e_render.parted_at_near_tie(p):
        at += " (a near-tie: checked up to it)"
    rel = f" (max rel {logits['max_rel']:.2g})" if logits.get("max_rel") is not None else ""
    verdict = e2e_render.logits_ok(p)
    said = "— (not read: ids)" if verdict is None else f"{ok(verdict)}{rel}"
    chained = ("" if p.get("plain_chained_matches") is None
               else f", chained ids {ok(p['plain_chained_matches'])}")
    tokens = p["tokens_match_greedy"] or e2e_render.parted_at_near_tie(p)
    return (f"{check_mark(p)} tokens {ok(tokens)}{at}, "
            f"logits {said}, {state}{chained}")


def md_cells(p: dict) -> list[str]:
    """One point's cells after its depth, K, acceptance and backend."""
    if p["status"] != "ok":
        return [p["status"]] + ["—"] * (len(MD_HEAD) - 5)
    rb = p["rollback"]
    gpu = (f"{_f(p.get('verify_gpu_ms'), '.3f')} ({_f(p.get('verify_over_plain_gpu'), '.2f', '×')})"
           if p.get("verify_gpu_ms") is not None else "—")
    chained = p.get("plain_chained_ms_per_token")
    plain, speedup = _f(p["plain_ms_per_token"], ".3f"), _f(p["speedup"], ".2f", "×")
    if chained is not None:
        plain += f" / {chained:.3f}"
        speedup += f" / {_f(p.get('speedup_vs_chained'), '.2f', '×')}"
    return [_f(p["ms_per_token"], ".3f"), plain, speedup,
            f"{_f(p['verify_ms'].get('median'), '.3f')} ({_f(p['verify_over_plain'], '.2f', '×')})",
            gpu, _f(p.get("mean_accepted"), ".2f"),
            f"{_f(rb['ms'].get('median'), '.4f')} ({rb.get('strategy')})", _checks(p)]


def markdown_table(run: SpecRun) -> str:
    lines = ["| " + " | ".join(MD_HEAD) + " |", "|" + "---:|" * 3 + "---|" + "---:|" * 7 + "---|"]
    for p in ordered(run.results):
        cells = [str(p["depth"]), str(p["k"]), str(p["acceptance"]), p["backend"], *md_cells(p)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def environment_lines(run: SpecRun) -> list[str]:
    """What was measured and how, then the machine and code (run's report's lines)."""
    r = run.results
    wl, env = r.workload, r.environment
    warm = wl.get("warm_s")
    return [
        f"workload: {report.workload_what(wl)}, {wl.get('dtype')}, {wl.get('tokens')} tokens "
        f"generated a point, K {_list(wl.get('k'))}, acceptance {_list(wl.get('acceptance'))}, "
        f"depths {_list(wl.get('contexts'))}, "
        f"{'no time' if warm is None else f'{warm:g} s'} under load, {wl.get('warmup')} "
        f"warm-up, seed {wl.get('seed')}, each step reading {wl.get('read', 'logits')}",
        f"created {r.created} by `{r.command}`",
        *report.host_lines(env),
        *report.calibration_lines(env.get("calibration", {})),
    ]


def _list(v: object) -> str:
    return ", ".join(map(str, v)) if isinstance(v, list) else str(v)


def title(run: SpecRun) -> str:
    w = run.results.workload
    head = f"{w.get('preset')} · {w.get('tokens')} tokens"
    return f"{run.label} · {head}" if run.label else head


def to_markdown(runs: list[SpecRun], charts: list[str] | None = None) -> str:
    """Per file its table and environment, then the notes and the charts."""
    parts = ["# statebench speculative report", "", MD_CAPTION, ""]
    for run in runs:
        parts += [f"## {title(run)}", "", markdown_table(run), "",
                  *(f"- {line}" for line in environment_lines(run)), ""]
    return "\n".join(parts + report.notes_and_charts(notes(runs), charts))
