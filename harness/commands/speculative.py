"""`statebench speculative --preset P --k K [--out FILE]` (alias `spec`): speculative-decoding
rollback strategies (DESIGN §8): bytes, time and a float64 check per GDN / attention layer shape
and acceptance m."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from rich.text import Text

from harness import results, speculative
from harness.commands import common_args
from harness.commands.base import Command
from model.errors import UserError


class Speculative(Command):
    name = "speculative"
    aliases = ("spec",)
    help = "speculative decoding: state rollback strategies, bytes and time per m"

    @classmethod
    def setup_arguments(cls, p: argparse.ArgumentParser) -> None:
        common_args.add_preset(p, default="tiny")
        p.add_argument("--k", type=int, default=4,
                       help=f"draft length K, 1..{speculative.MAX_DRAFT} (ORT GatedDeltaNet's "
                            "state_update_capacity limit; default 4)")
        p.add_argument("--reps", type=common_args.positive_int, default=5,
                       help="timed repetitions per strategy and m; the median is reported (default 5)")
        p.add_argument("--depth", type=common_args.positive_int, default=256,
                       help="valid KV rows before the draft, for attention layers (default 256)")
        p.add_argument("--seed", type=common_args.nonnegative_int, default=0,
                       help="draft inputs seed (default 0)")
        p.add_argument("--out", default=None, help="write the results as JSON (statebench-spec/1)")
        p.add_argument("--force", action="store_true", help="replace an existing --out file")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        # everything the run could refuse is refused before anything slow or large
        speculative.check_args(args.preset, args.k, args.reps, args.depth)
        out = results.check_out_file(args.out, args.force) if args.out else None
        data = cls.run(args.preset, args.k, args.reps, args.depth, args.seed)
        for table in speculative.tables(data):
            console.print(table)
        for line in speculative.notes(data):
            console.print(Text(line, style="red" if line.startswith("✗") else "yellow"))
        if out:
            try:
                results.write_json_atomic(out, data)
            except OSError as exc:
                raise UserError(f"could not save {out}: {exc.strerror or exc}; the tables above "
                                "are all that is kept of this run") from None
            console.print(f"results: {out}", markup=False, highlight=False, soft_wrap=True)
        return 0

    @classmethod
    def run(cls, preset: str, k: int, reps: int = 5, depth: int = 256, seed: int = 0) -> dict:
        from harness.calibrate import environment

        data = speculative.measure(preset, k, reps, depth, seed)
        return {"schema": data.pop("schema"),
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": cls.command_line(),
                "environment": environment(), **data}
