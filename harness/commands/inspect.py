"""`statebench inspect MODEL`: a model statebench did not write, as statebench sees it: its
inputs and outputs, the cache pairs its names give (and the rule that matched), the dims
pinned for a decode step, and per backend family whether it runs or what stops it."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table

from harness.commands.base import Command
from harness.commands.common_args import add_model_argument, parse_pairs
from model.errors import UserError


class Inspect(Command):
    name = "inspect"
    help = "show a model's inputs, outputs, cache pairs and where it can run"

    @classmethod
    def setup_arguments(cls, p) -> None:
        add_model_argument(p)
        p.add_argument("--format", choices=("table", "json"), default="table")
        p.add_argument("--pairs", default=None, metavar="IN=OUT,...",
                       help="cache pairs named by hand where no naming rule matches")
        p.add_argument("--capacity", type=int, default=256,
                       help="past rows the pinned dims give the cache (default 256)")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        if args.capacity < 1:
            raise UserError(f"--capacity must be at least 1, not {args.capacity}")
        from harness.model_info import inspect_model  # ONNX: only when it runs

        report = inspect_model(args.model, args.capacity, parse_pairs(args.pairs))
        if args.format == "json":
            console.print(json.dumps(report, indent=2), markup=False, highlight=False,
                          soft_wrap=True)
            return 0
        for table in cls.tables(report):
            console.print(table)
        return 0

    @staticmethod
    def tables(report: dict) -> list[Table]:
        io = Table(title=escape(report["model"]))
        for col in ("", "name", "type", "shape"):
            io.add_column(col)
        for side in ("inputs", "outputs"):
            for v in report[side]:
                io.add_row(side[:-1], escape(v["name"]), v["type"], escape(str(v["shape"])))
        pairs = Table(title="cache pairs (rules: " + (", ".join(report["naming_rules"]) or "none")
                      + ")")
        for col in ("input", "output", "kind", "axis", "how"):
            pairs.add_column(col)
        for p in report["pairs"]:
            pairs.add_row(escape(p["input"]), escape(p["output"]), p["kind"],
                          "" if p["axis"] is None else str(p["axis"]), escape(p.get("how", "")))
        if report["pairs_error"]:
            pairs.add_row("[red]error[/]", escape(report["pairs_error"]), "", "", "")
        dims = Table(title=f"dims pinned (capacity {report['capacity']})")
        for col in ("symbol", "value", "how"):
            dims.add_column(col)
        for k, d in report["dims"].items():
            dims.add_row(escape(k), str(d["value"]), d["how"])
        runs = Table(title="backends")
        for col in ("family", "runs", "first thing that stops it"):
            runs.add_column(col)
        for fam, v in report.get("backends", {}).items():
            runs.add_row(fam, "[green]yes[/]" if v["runs"] else "[red]no[/]", escape(v["why_not"]))
        return [io, pairs, dims, runs]
