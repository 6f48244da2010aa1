"""`statebench run`: sweep backends × contexts, save the results, print the table."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from backends.base import select
from harness import report, runner
from harness.commands import common_args
from harness.commands.base import Command
from model.workload import preset


class Run(Command):
    name = "run"
    help = "decode N tokens at each depth with each backend"

    @classmethod
    def setup_arguments(cls, p: argparse.ArgumentParser) -> None:
        common_args.add_preset(p)
        common_args.add_backends(p)
        p.add_argument("--contexts", default=runner.DEFAULT_CONTEXTS,
                       help=f"comma list of depths L to decode at (default {runner.DEFAULT_CONTEXTS})")
        p.add_argument("--steps", type=common_args.positive_int, default=16,
                       help="timed decode steps per point (default 16)")
        p.add_argument("--warmup", type=common_args.nonnegative_int, default=2,
                       help="untimed steps before timing (default 2)")
        p.add_argument("--warm-s", type=common_args.nonnegative_float, default=runner.DEFAULT_WARM_S,
                       help="seconds of continuous GPU load (a streaming kernel) before each"
                            " GPU point's warm-up steps, so the GPU's clocks are up for every"
                            f" backend alike (default {runner.DEFAULT_WARM_S:g}; nothing runs on"
                            " a CPU adapter)")
        p.add_argument("--repeat", type=common_args.positive_int, default=1,
                       help="measure each point in N fresh worker processes, taken in turns"
                            " over the backends; the interval of the median then takes in the"
                            " spread between processes (default 1; 3 or more for an ordering)")
        p.add_argument("--capacity", type=common_args.positive_int, default=None,
                       help="fixed cache capacity (default: context + warmup + steps)")
        p.add_argument("--seed", type=int, default=0, help="weights and token seed (default 0)")
        p.add_argument("--out", default=None,
                       help="results file (default results/run-<preset>-<timestamp>.json)")
        p.add_argument("--inprocess", action="store_true",
                       help="measure in this process instead of a worker per point (debugging)")
        p.add_argument("--point-timeout", type=common_args.positive_int,
                       default=int(runner.WORKER_TIMEOUT_S),
                       help="seconds one backend x context point may take before it is recorded as"
                            f" failed (default {int(runner.WORKER_TIMEOUT_S)})")
        p.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                       help="skip the bandwidth calibration (no floors or MBU)")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        preset(args.preset)  # validate before anything slow
        rc = runner.RunConfig(
            preset=args.preset, backends=select(args.backends),
            contexts=runner.parse_contexts(args.contexts), steps=args.steps, warmup=args.warmup,
            warm_s=args.warm_s, repeat=args.repeat,
            capacity=args.capacity, seed=args.seed, inprocess=args.inprocess,
            calibrate=args.calibrate, timeout_s=float(args.point_timeout),
            command="statebench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        )
        out = Path(args.out) if args.out else runner.default_out(args.preset)
        return cls.run(rc, out, console, err_console)

    @classmethod
    def run(cls, rc: runner.RunConfig, out: Path, console, err_console) -> int:
        try:
            results = runner.run_sweep(rc, out, console=err_console)
        except KeyboardInterrupt:
            err_console.print(f"statebench: interrupted; the points measured so far are in {out}",
                              markup=False, highlight=False)
            return 130
        console.print(report.summary(report.label_runs([results])))
        console.print(f"results: {out}")
        console.print(f"report:  statebench report {out} --out {out.with_suffix('')}-report")
        return 0
