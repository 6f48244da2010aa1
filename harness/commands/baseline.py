"""`statebench baseline RUN --name NAME`: keep a run as results/baselines/NAME.json."""

from __future__ import annotations

import re
from pathlib import Path

from harness import results
from harness.workload import UserError

BASELINE_DIR = Path("results") / "baselines"


class Baseline:
    name = "baseline"

    @classmethod
    def setup_arguments(cls, subparsers) -> None:
        p = subparsers.add_parser(cls.name, help="save a run as a named baseline for the gate")
        p.add_argument("run", help="results file to keep")
        p.add_argument("--name", required=True, help="baseline name (letters, digits, - _ .)")
        p.add_argument("--dir", default=str(BASELINE_DIR),
                       help=f"where baselines live (default {BASELINE_DIR})")
        p.add_argument("--force", action="store_true", help="overwrite an existing baseline")
        p.set_defaults(func=cls.run_from_args)

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        path = cls.run(args.run, args.name, Path(args.dir), args.force)
        console.print(f"baseline: {path}")
        return 0

    @staticmethod
    def run(run_path, name: str, directory: Path = BASELINE_DIR, force: bool = False) -> Path:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name.endswith(".json"):
            raise UserError(f"bad baseline name {name!r}; accepted: letters, digits, '-', '_', '.' "
                            "(no extension)")
        res = results.load(run_path)
        if not any(p.measured for p in res.points):
            raise UserError(f"{run_path}: no measured points; nothing to keep as a baseline")
        path = Path(directory) / f"{name}.json"
        if path.exists() and not force:
            raise UserError(f"baseline {path} exists; pass --force to overwrite it")
        res.save(path)
        return path
