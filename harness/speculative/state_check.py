"""Whether a rolled-back state is the state of feeding only the accepted tokens
(docs/speculative.md, "Checks").

Two comparisons of state snapshots (past name -> array, a page's ``state_snapshot``):
- against the replay (the same verifies, the dropped tokens replaced by others): the KV rows
  within the valid length bitwise equal (a positional pair's rows past it are never read);
  an overwritten pair (a GDN state) within the tolerance;
- against a one-token backend fed the same tokens one at a time: every pair within the
  tolerance, max|Δ| / max|want| per pair (a K-token graph's rows are sums in another order
  than a one-token graph's, so not bitwise: tests/test_ktoken.py's xfail).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from model.workload import CacheSpec


@dataclass(frozen=True)
class StateComparison:
    """``differs``: the pairs not as required; ``max_rel``: the largest max|Δ|/max|want|
    over the pairs compared; ``missing``: pairs in one snapshot only."""

    rows: int
    bitwise: bool
    max_rel: float
    tolerance: float
    differs: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    #: overwritten pairs left out: the two states fed different counts of tokens
    skipped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differs and not self.missing

    def to_dict(self) -> dict:
        return {"rows": self.rows, "bitwise": self.bitwise, "ok": self.ok,
                "max_rel": self.max_rel, "tolerance": self.tolerance,
                "differs": self.differs, "missing": self.missing, "skipped": self.skipped}


def valid(spec: CacheSpec, arr: np.ndarray, rows: int) -> np.ndarray:
    """A positional pair's first ``rows`` rows (axis 2: (1, kv_heads, C, head_dim)); an
    overwritten pair whole."""
    a = np.asarray(arr).reshape(spec.shape[:2] + (-1,) + spec.shape[3:]) if spec.kind == "append" \
        else np.asarray(arr)
    return a[:, :, :rows] if spec.kind == "append" else a


def rel(got: np.ndarray, want: np.ndarray) -> float:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not (np.isfinite(g).all() and np.isfinite(w).all()):
        return float("inf")
    scale = float(np.abs(w).max()) if w.size else 0.0
    d = float(np.abs(g - w).max()) if w.size else 0.0
    return d / scale if scale > 0 else (0.0 if d == 0 else float("inf"))


def compare(got: dict[str, np.ndarray], want: dict[str, np.ndarray], specs: list[CacheSpec],
            rows: int, tolerance: float, bitwise_kv: bool,
            same_count: bool = True) -> StateComparison:
    """``got`` against ``want`` over the pairs of ``specs`` (KV rows below ``rows``):
    ``bitwise_kv`` requires the KV rows equal bit for bit, else within ``tolerance``.
    ``same_count`` False: the states fed different counts of tokens, so only KV rows
    compare (an overwritten pair holds every token fed)."""
    differs, missing, skipped, worst = [], [], [], 0.0
    for spec in specs:
        if spec.input not in got or spec.input not in want:
            missing.append(spec.input)
            continue
        if spec.kind != "append" and not same_count:
            skipped.append(spec.input)
            continue
        g, w = valid(spec, got[spec.input], rows), valid(spec, want[spec.input], rows)
        r = rel(g, w)
        worst = max(worst, r)
        if bitwise_kv and spec.kind == "append":
            if g.shape != w.shape or g.tobytes() != w.tobytes():
                differs.append(spec.input)
        elif not r <= tolerance:
            differs.append(spec.input)
    return StateComparison(rows, bitwise_kv, worst, tolerance, differs, missing, skipped)
