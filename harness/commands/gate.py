"""`statebench gate RUN [RUN ...] --baseline BASE`: exit 1 on a regression, 0 otherwise, 2 on
bad input. Several runs of one sweep: a slowdown must show in every one (harness/gate.py)."""

from __future__ import annotations

import argparse

from rich.text import Text

from harness import gate, results
from harness.commands import common_args
from harness.commands.base import Command


class Gate(Command):
    name = "gate"
    help = "fail (exit 1) when a run regresses against a baseline"

    @classmethod
    def setup_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("runs", nargs="+", metavar="run",
                       help="results file of the run to check; several runs of the same sweep "
                            "are each checked, and a point's step-time ratio is its smallest "
                            "across them (a slowdown must show in every run)")
        p.add_argument("--baseline", required=True,
                       help="baseline results file (e.g. results/baselines/ci.json)")
        p.add_argument("--max-slowdown", type=common_args.fraction, default=0.25,
                       help="allowed worsening of each backend's step-time ratio over the "
                            "stateless baseline (default 0.25 = 25%%)")
        p.add_argument("--bytes-exact", action="store_true",
                       help="any byte-count change fails (default: more than 1%%)")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        return cls.run(args.runs, args.baseline, args.max_slowdown, args.bytes_exact, console)

    @classmethod
    def run(cls, run_paths, base_path, max_slowdown, bytes_exact, console) -> int:
        runs = [results.load(p) for p in run_paths]
        verdict = gate.compare(runs, results.load(base_path), max_slowdown, bytes_exact,
                               names=(*map(str, run_paths), str(base_path)))
        console.print(gate.table(verdict))
        for line in gate.lines(verdict):
            console.print(Text(line, style="green" if line.startswith("gate: passed") else
                               ("red" if line.startswith(("✗", "gate: FAILED")) else "yellow")))
        return 0 if verdict.ok else 1
