"""`statebench baseline RUN [RUN ...] --name NAME`: keep a run as results/baselines/NAME.json.

Given several runs of the same sweep, the baseline is the first with each point's step
statistics replaced by the median over the runs: a baseline that happened on a noisy moment
would otherwise tighten or loosen the gate's time ratios for as long as it is kept. The runs
must agree on everything that is not a time (points, byte counts, matches).
"""

from __future__ import annotations

import argparse
import re
import tempfile
from dataclasses import replace
from pathlib import Path

from harness import results
from harness.commands.base import Command
from model.atomic import file_kind
from model.errors import UserError

BASELINE_DIR = Path("results") / "baselines"


class Baseline(Command):
    name = "baseline"
    help = "save a run as a named baseline for the gate"

    @classmethod
    def setup_arguments(cls, p: argparse.ArgumentParser) -> None:
        p.add_argument("runs", nargs="+", metavar="run",
                       help="results file to keep; several runs of one sweep: per-point medians")
        p.add_argument("--name", required=True, help="baseline name (letters, digits, - _ .)")
        p.add_argument("--dir", default=str(BASELINE_DIR),
                       help=f"where baselines live (default {BASELINE_DIR})")
        p.add_argument("--force", action="store_true", help="overwrite an existing baseline")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        path = cls.run(args.runs, args.name, Path(args.dir), args.force)
        console.print(f"baseline: {path}", markup=False, highlight=False, soft_wrap=True)
        return 0

    @staticmethod
    def run(run_paths, name: str, directory: Path = BASELINE_DIR, force: bool = False) -> Path:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name) or name.endswith(".json"):
            raise UserError(f"bad baseline name {name!r}; accepted: letters, digits, '-', '_', '.' "
                            "(no extension)")
        paths = [run_paths] if isinstance(run_paths, (str, Path)) else list(run_paths)
        runs = [results.load(p) for p in paths]
        res = runs[0]
        if not any(p.measured for p in res.points):
            raise UserError(f"{paths[0]}: no measured points; nothing to keep as a baseline")
        if len(runs) > 1:
            median_of_runs(res, list(zip(paths[1:], runs[1:], strict=True)))
        path = writable_dir(Path(directory)) / f"{name}.json"
        kind = file_kind(path)
        if kind:
            raise UserError(f"baseline {path} is {kind}, not a file; --force replaces only a "
                            "regular file: remove it or give another --name or --dir")
        if kind is not None and not force:
            raise UserError(f"baseline {path} exists; pass --force to overwrite it")
        try:  # atomic: a write that fails leaves no part of the file, and the old one whole
            res.save(path)
        except OSError as exc:
            raise UserError(f"cannot write baseline {path} ({exc.strerror or exc}); nothing "
                            "written" + (", the old one left as it was" if kind == "" else "")) from None
        return path


def writable_dir(directory: Path) -> Path:
    """--dir, made where missing; a UserError in one line where it is not a folder or no
    file can be made in it (the probe makes and removes one: it holds for root too)."""
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--dir {directory}: a file, not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as exc:
        raise UserError(f"--dir {directory}: cannot write there ({exc.strerror or exc})") from None
    return directory


def median_of_runs(first: results.Results, others: list[tuple[Path, results.Results]]) -> None:
    """Replace each measured point's step_ms of ``first`` by the median over all the runs
    (median, p10 and p90 each), after checking the others are the same sweep."""
    import numpy as np

    for path, other in others:
        if other.workload != first.workload:
            raise UserError(f"{path}: a different sweep (workload) from the first run")
    for i, p in enumerate(first.points):
        if not p.measured:
            continue
        same = []
        for path, other in others:
            q = other.point(p.backend, p.context)
            if q is None or not q.measured:
                raise UserError(f"{path}: {p.backend} @ {p.context} was not measured there")
            if q.bytes_per_step != p.bytes_per_step or q.matches != p.matches:
                raise UserError(f"{path}: {p.backend} @ {p.context} differs in bytes or match "
                                "from the first run; not one sweep")
            same.append(q)
        stats = [p.step_ms] + [q.step_ms for q in same]
        first.points[i] = replace(
            p, step_ms=results.Stats(*(float(np.median([getattr(s, k) for s in stats]))
                                       for k in ("median", "p10", "p90"))),
            details={**p.details, "baseline_runs": len(stats),
                     "baseline_run_medians_ms": [round(s.median, 4) for s in stats]})
