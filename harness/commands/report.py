"""`statebench report FILE... [--out DIR] [--format ...]`: tables, charts, md/csv/json/html.

Run files (statebench/2) and end-to-end speculative files (statebench-spec/2) each get their
own report (harness/report.py; harness/speculative/e2e_report.py), chosen by the files'
schema; the directory rules (`--out`, `--force`) are the same for both."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from harness import report, results
from harness.commands.base import Command
from harness.commands.common_args import check_format
from model.errors import UserError

FORMATS = ("table", "md", "csv", "json", "html")


class Report(Command):
    name = "report"
    help = "tables and charts from one or more results files"

    @classmethod
    def setup_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("files", nargs="+", help="results files (several are compared side by side)")
        p.add_argument("--out", default=None,
                       help="directory for charts (PNG, SVG) and report.{md,csv,json,html}: "
                            "a new or empty one, in a directory that exists, unless --force")
        p.add_argument("--force", action="store_true",
                       help="write into an --out directory that already holds files")
        p.add_argument("--merge", action="store_true",
                       help="the files are one sweep split over calls (same workload, code "
                            "and adapter): show them as one run")
        p.add_argument("--format", default="table",
                       help=f"what to print: {', '.join(FORMATS)} (default table)")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        fmt = check_format(args.format, FORMATS)
        from harness.speculative import e2e_report

        spec = e2e_report.spec_files(args.files)
        if spec and args.merge:
            raise UserError("--merge joins run files (statebench/2) split over calls; "
                            "speculative files are reported side by side without it")
        if args.out:
            report.check_out_dir(Path(args.out), force=args.force)
        if spec:
            return SpecReport.run(args, fmt, console, err_console)
        runs = cls.load(args.files, merged=args.merge)
        return emit(args, fmt, console, err_console, cls.render(runs, fmt, " ".join(args.files)),
                    lambda out: cls.write(runs, out))

    @staticmethod
    def load(files: list[str], merged: bool = False) -> list[report.LabelledResults]:
        loaded = [results.load(f) for f in files]
        if merged:
            from harness.merge import merge

            return report.label_runs([merge(loaded, [Path(f).name for f in files])])
        return report.label_runs(loaded, files)

    @staticmethod
    def render(runs: list[report.LabelledResults], fmt: str, source: str | None = None):
        if fmt == "table":
            return report.summary(runs, source)
        if fmt == "md":
            return report.to_markdown(runs)
        if fmt == "csv":
            return report.to_csv(runs)
        if fmt == "json":
            return report.to_json(runs)
        from harness import html_report

        return html_report.render(runs, {})

    @staticmethod
    def write(runs: list[report.LabelledResults], out: Path) -> list[Path]:
        from harness import charts, html_report

        out.mkdir(parents=True, exist_ok=True)
        made = charts.write_all(runs, out)
        files = [p for fmts in made.values() for p in fmts.values()]
        pngs = [made[c]["png"].name for c in made]
        for name, text in (("report.md", report.to_markdown(runs, pngs)),
                           ("report.csv", report.to_csv(runs)),
                           ("report.json", report.to_json(runs)),
                           ("report.html", html_report.render(runs, made))):
            (out / name).write_text(text)
            files.append(out / name)
        return files


def emit(args, fmt: str, console, err_console, printed, write: Callable[[Path], list[Path]]
         ) -> int:
    """Print a report's rendering, then (``--out``) write its files with ``write``: the
    table first, then the line saying where the files went."""
    if fmt == "table":
        console.print(printed)
    else:
        console.print(printed, markup=False, highlight=False, soft_wrap=True, end="")
    if args.out:
        console.file.flush()
        with report.writing_to(Path(args.out)):
            written = write(Path(args.out))
        err_console.print(f"report: {len(written)} files in {args.out} "
                          f"(open {Path(args.out) / 'report.html'})", highlight=False)
    return 0


class SpecReport:
    """`report` over end-to-end speculative files: speculative's tables, charts, reports."""

    @staticmethod
    def run(args, fmt: str, console, err_console) -> int:
        from harness.speculative import e2e_report

        runs = e2e_report.load(args.files)
        return emit(args, fmt, console, err_console, SpecReport.render(runs, fmt),
                    lambda out: SpecReport.write(runs, out))

    @staticmethod
    def render(runs, fmt: str):
        from harness.speculative import e2e_html, e2e_report

        if fmt == "table":
            return e2e_report.summary(runs)
        if fmt == "md":
            return e2e_report.to_markdown(runs)
        if fmt == "csv":
            return e2e_report.to_csv(runs)
        if fmt == "json":
            return e2e_report.to_json(runs)
        return e2e_html.render(runs, {})

    @staticmethod
    def write(runs, out: Path) -> list[Path]:
        from harness.speculative import e2e_charts, e2e_html, e2e_report

        out.mkdir(parents=True, exist_ok=True)
        made = e2e_charts.write_all(runs, out)
        files = [p for fmts in made.values() for p in fmts.values()]
        pngs = [made[c]["png"].name for c in made]
        for name, text in (("report.md", e2e_report.to_markdown(runs, pngs)),
                           ("report.csv", e2e_report.to_csv(runs)),
                           ("report.json", e2e_report.to_json(runs)),
                           ("report.html", e2e_html.render(runs, made))):
            (out / name).write_text(text)
            files.append(out / name)
        return files
