"""The CI gate (DESIGN §9): compare a run with a baseline; exit 1 on a regression.

A point regresses when it stops matching the reference, when a byte count changes (bytes are
counted, so deterministic: exactly with `bytes_exact`, else by more than 1%), or when its
same-run ratio — its step time over the stateless baseline's at the same context — worsens by
more than `max_slowdown` relative to the baseline file's ratio. Ratios within one run cancel
most of the machine's speed, so a baseline recorded elsewhere still says something.

Several runs of the same sweep may be gated together: each is checked for matches, bytes and
status, and a point's ratio is its smallest across them, so a slowdown fails only where it
shows in every run (timeit's best of repeats; one run's stall on a shared runner is not a
regression, a regression is in every run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

from rich.table import Table
from rich.text import Text

from harness import metrics
from harness.results import BYTE_CATEGORIES, Point, Results
from model.errors import UserError

BYTES_TOLERANCE = 0.01


@dataclass
class Check:
    backend: str
    context: int
    ok: bool
    ratio: float | None = None
    base_ratio: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.backend} @ {self.context}"


@dataclass
class Verdict:
    checks: list[Check]
    baseline_backend: str | None
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


#: what must agree, beyond the preset, for a run's bytes and times to be comparable with a
#: baseline's (the model's own fields are compared too: `unlike`)
LIKE_FOR_LIKE = ("steps", "warmup", "capacity", "seed", "dtype")
#: model fields that older results files lack, at the value they then had
_CONFIG_DEFAULTS = {"weights": "float32", "kv_cache": "float32"}


def unlike(run: dict, base: dict) -> list[str]:
    """How the run's workload differs from the baseline's beyond the preset, one entry a
    field (`steps 8 where the baseline has 16`); empty when they are like for like."""
    out = [f"{k} {run.get(k)!r} where the baseline has {base.get(k)!r}"
           for k in LIKE_FOR_LIKE if run.get(k) != base.get(k)]
    rm, bm = run.get("model") or {}, base.get("model") or {}
    if rm.get("sha256") != bm.get("sha256"):  # a model statebench did not write, by content
        out.append(f"model sha256 {rm.get('sha256')!r} where the baseline has "
                   f"{bm.get('sha256')!r}")
    rc, bc = run.get("config") or {}, base.get("config") or {}
    for k in dict.fromkeys([*rc, *bc]):
        if k == "name" or (k not in _CONFIG_DEFAULTS and (k not in rc or k not in bc)):
            continue  # a field only one side records (older files) cannot differ
        a, b = rc.get(k, _CONFIG_DEFAULTS.get(k)), bc.get(k, _CONFIG_DEFAULTS.get(k))
        if a != b:
            out.append(f"model {k} {a!r} where the baseline has {b!r}")
    return out


def compare(runs: Results | Sequence[Results], base: Results, max_slowdown: float = 0.25,
            bytes_exact: bool = False, names: tuple[str, ...] = ("run", "baseline")) -> Verdict:
    """Every measured baseline point checked in each run (`names`: the runs' files, then the
    baseline's, for errors); a point's ratio is its smallest over the runs."""
    runs = [runs] if isinstance(runs, Results) else list(runs)
    if not runs:
        raise UserError("no run to gate")
    if max_slowdown < 0:
        raise UserError(f"--max-slowdown {max_slowdown} must be ≥ 0 (e.g. 0.25 for 25%)")
    run_names = list(names[:-1]) if len(names) == len(runs) + 1 else \
        [f"run {i + 1}" for i in range(len(runs))]
    for run, name in zip(runs, run_names, strict=True):
        _like_for_like(run, base, name, names[-1])
    verdict = Verdict([], ", ".join(dict.fromkeys(
        b for b in (metrics.stateless_baseline(base.points, n) for n in base.backends) if b)) or None)
    for bp in base.points:
        if bp.status != "ok":
            continue
        c = Check(bp.backend, bp.context, ok=True)
        verdict.checks.append(c)
        for run, name in zip(runs, _tags(run_names), strict=True):
            tag = f"{name}: " if len(runs) > 1 else ""
            c.problems += [tag + p for p in _point_problems(run, bp, bytes_exact)]
        c.ok = not c.problems
        stateless = metrics.stateless_baseline(base.points, bp.backend)
        if not stateless or bp.backend == stateless:
            continue
        ratios = [r for r in (metrics.ratio(run.point(bp.backend, bp.context),
                                            run.point(stateless, bp.context)) for run in runs)
                  if r is not None]
        c.ratio = min(ratios) if ratios else None
        c.base_ratio = metrics.ratio(bp, base.point(stateless, bp.context))
        if c.ratio is not None and c.base_ratio is not None:
            if c.ratio > c.base_ratio * (1 + max_slowdown):
                c.ok = False
                every = " in every run" if len(runs) > 1 else ""
                c.problems.append(f"step time / {stateless} {c.base_ratio:.3f} → {c.ratio:.3f} "
                                  f"(+{c.ratio / c.base_ratio - 1:.0%} > {max_slowdown:.0%}"
                                  f"{every})")
        elif c.base_ratio is not None and c.ok:
            verdict.warnings.append(f"{c.where}: no same-run ratio ({stateless} not measured)")
    if not verdict.checks:
        raise UserError("the baseline has no measured points to gate against")
    return verdict


def _tags(names: list[str]) -> list[str]:
    """The runs' file names where they tell the runs apart (a problem's line stays short),
    else the names as given."""
    short = [PurePath(n).name for n in names]
    return short if len(set(short)) == len(short) else names


def _like_for_like(run: Results, base: Results, name: str, base_name: str) -> None:
    """UserError where ``run`` is not a run of the baseline's workload."""
    if run.workload.get("preset") != base.workload.get("preset"):
        raise UserError(f"{name} is preset {run.workload.get('preset')!r} but the baseline is "
                        f"{base.workload.get('preset')!r}; gate like against like")
    differs = unlike(run.workload, base.workload)
    if differs:
        raise UserError(f"{name} is not like for like with {base_name}: its "
                        f"{'; '.join(differs)}; gate a run of the baseline's workload")


def _point_problems(run: Results, bp: Point, bytes_exact: bool) -> list[str]:
    """What is wrong with the run's point at the baseline point ``bp`` beyond its time."""
    p = run.point(bp.backend, bp.context)
    if p is None:
        return ["missing from the run"]
    if p.status != "ok":
        return [f"{p.status}: {p.reason}"]
    out = []
    if not p.matches:
        out.append(f"logits no longer match ({p.reason or f'max rel {p.match.max_rel:.2e}'})")
    for k in BYTE_CATEGORIES:
        a, b = p.bytes_per_step[k], bp.bytes_per_step[k]
        changed = a != b if bytes_exact else abs(a - b) > BYTES_TOLERANCE * max(abs(b), 1)
        if changed:
            out.append(f"{k} bytes/step {b:,.0f} → {a:,.0f}")
    return out


def table(v: Verdict) -> Table:
    title = "statebench gate" + (f" (ratios over {v.baseline_backend})" if v.baseline_backend else "")
    t = Table(title=title)
    for col, just in (("", "left"), ("backend", "left"), ("context", "right"),
                      ("ratio (base → run)", "right"), ("problems", "left")):
        t.add_column(col, justify=just)
    for c in v.checks:
        r = "—" if c.ratio is None else f"{c.base_ratio:.3f} → {c.ratio:.3f}" \
            if c.base_ratio is not None else f"{c.ratio:.3f}"
        t.add_row(Text("✓", style="green") if c.ok else Text("✗", style="bold red"), c.backend,
                  str(c.context), r, "; ".join(c.problems))
    return t


def lines(v: Verdict) -> list[str]:
    """One line per failing point, naming it, and the summary."""
    out = [f"✗ {c.where}: {'; '.join(c.problems)}" for c in v.failures]
    out += [f"warning: {w}" for w in v.warnings]
    n = len(v.checks)
    out.append(f"gate: {'passed' if v.ok else 'FAILED'} — {n - len(v.failures)}/{n} points ok")
    return out
