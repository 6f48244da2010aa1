"""`statebench spec --preset P --k K [--out FILE]`: speculative-decoding rollback strategies
(DESIGN §8): bytes, time and a float64 check per GDN / attention layer shape and acceptance m."""

from __future__ import annotations

import shlex
import sys
from datetime import UTC, datetime

from rich.text import Text

from harness import speculative
from harness.commands import common_args


class Spec:
    name = "spec"

    @classmethod
    def setup_arguments(cls, subparsers) -> None:
        p = subparsers.add_parser(
            cls.name, help="speculative decoding: state rollback strategies, bytes and time per m")
        common_args.add_preset(p, default="tiny")
        p.add_argument("--k", type=int, default=4,
                       help=f"draft length K, 1..{speculative.MAX_DRAFT} (ORT GatedDeltaNet's "
                            "state_update_capacity limit; default 4)")
        p.add_argument("--reps", type=common_args.positive_int, default=5,
                       help="timed repetitions per strategy and m; the median is reported (default 5)")
        p.add_argument("--depth", type=common_args.positive_int, default=256,
                       help="valid KV rows before the draft, for attention layers (default 256)")
        p.add_argument("--seed", type=int, default=0, help="draft inputs seed (default 0)")
        p.add_argument("--out", default=None, help="write the results as JSON (statebench-spec/1)")
        p.set_defaults(func=cls.run_from_args)

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        speculative.check_args(args.preset, args.k, args.reps, args.depth)  # before anything slow
        data = cls.run(args.preset, args.k, args.reps, args.depth, args.seed)
        for table in speculative.tables(data):
            console.print(table)
        for line in speculative.notes(data):
            console.print(Text(line, style="red" if line.startswith("✗") else "yellow"))
        if args.out:
            from harness import results

            results.write_json_atomic(args.out, data)
            console.print(f"results: {args.out}")
        return 0

    @staticmethod
    def run(preset: str, k: int, reps: int = 5, depth: int = 256, seed: int = 0) -> dict:
        from harness.calibrate import environment

        data = speculative.measure(preset, k, reps, depth, seed)
        return {"schema": data.pop("schema"),
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": "statebench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                "environment": environment(), **data}
