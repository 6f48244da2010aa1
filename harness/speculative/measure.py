"""The measurement as plain data (schema statebench-spec/1): per layer shape and
acceptance m, each strategy's bytes, median time and error against the oracle."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from harness.speculative.attention_rollback import (
    ATTENTION_STRATEGIES,
    attention_oracle,
    attention_strategy,
    make_attention_draft,
)
from harness.speculative.counters import F32
from harness.speculative.drafts import (
    AttentionShape,
    GdnShape,
    layer_shapes,
    make_draft,
    oracle_state,
    rel_err,
)
from harness.speculative.gdn_rollback import gdn_strategies
from harness.speculative.limits import check_args

SCHEMA = "statebench-spec/1"
#: float32 strategies against the float64 oracle: max |Δ| / max |oracle|
TOLERANCE = 1e-4


@dataclass
class Cell:
    """One strategy at one acceptance m."""

    status: str = "ok"  # ok | unavailable | failed
    reason: str = ""
    bytes: dict[str, int] | None = None
    time_ms: float | None = None
    max_rel_err: float | None = None
    ok: bool | None = None


@dataclass
class LayerResult:
    kind: str  # gdn | attention
    shape: dict
    layers: list[int]
    draft_len: int
    rows: list[dict] = field(default_factory=list)  # {"m": m, "strategies": {name: Cell}}
    closed_form: dict = field(default_factory=dict)


def _median_ms(fn: Callable[[], object], reps: int, clock: Callable[[], float]) -> float:
    times = []
    for _ in range(reps):
        t0 = clock()
        fn()
        times.append((clock() - t0) * 1e3)
    return float(np.median(times))


def measure_gdn(sh: GdnShape, layers: list[int], k: int, reps: int = 5, seed: int = 0,
                clock: Callable[[], float] = time.perf_counter) -> LayerResult:
    d = make_draft(sh, k, seed)
    res = LayerResult("gdn", asdict(sh), layers, k, closed_form={
        "state_bytes": sh.state_bytes, "capsule_row_bytes": sh.capsule_row_floats * F32,
        "capsule_bytes": k * sh.capsule_row_floats * F32, "checkpoint_bytes": k * sh.state_bytes})
    strategies = gdn_strategies(sh, k)
    for m in range(k + 1):
        oracle = oracle_state(d, m)
        row: dict[str, Cell] = {}
        for name, (fn, why) in strategies.items():
            if fn is None:
                row[name] = Cell(status="unavailable", reason=why)
                continue
            try:
                state, b = fn(d, m)
                err = rel_err(state, oracle)
                t = _median_ms(lambda fn=fn, m=m: fn(d, m), reps, clock)
                row[name] = Cell(bytes=b.to_dict(), time_ms=t, max_rel_err=err, ok=err <= TOLERANCE)
            except Exception as exc:  # noqa: BLE001 - a failing engine is reported, others go on
                row[name] = Cell(status="failed", reason=f"{type(exc).__name__}: {exc}")
        res.rows.append({"m": m, "strategies": row})
    return res


def measure_attention(sh: AttentionShape, layers: list[int], k: int, depth: int, reps: int = 5,
                      seed: int = 0, clock: Callable[[], float] = time.perf_counter) -> LayerResult:
    d = make_attention_draft(sh, k, depth, seed)
    res = LayerResult("attention", {**asdict(sh), "depth": depth}, layers, k,
                      closed_form={"row_bytes": sh.row_bytes})
    for m in range(k + 1):
        ok_k, ok_v = attention_oracle(d, m)
        row: dict[str, Cell] = {}
        for name in ATTENTION_STRATEGIES:
            fn = attention_strategy(name)
            c, b = fn(d, m)
            ok = (c.length == depth + m and np.array_equal(c.k[:, :c.length], ok_k)
                  and np.array_equal(c.v[:, :c.length], ok_v))
            t = _median_ms(lambda fn=fn, m=m: fn(d, m), reps, clock)
            row[name] = Cell(bytes=b.to_dict(), time_ms=t, max_rel_err=0.0 if ok else float("inf"),
                             ok=ok)
        res.rows.append({"m": m, "strategies": row})
    return res


def measure(preset_name: str, k: int = 4, reps: int = 5, depth: int = 256, seed: int = 0,
            clock: Callable[[], float] = time.perf_counter) -> dict:
    """The whole `statebench speculative` measurement as plain data (schema statebench-spec/1)."""
    cfg = check_args(preset_name, k, reps, depth)
    gdn, attn = layer_shapes(cfg)
    layers = [measure_gdn(sh, ls, k, reps, seed, clock) for sh, ls in gdn.items()]
    layers += [measure_attention(sh, ls, k, depth, reps, seed, clock) for sh, ls in attn.items()]
    return {"schema": SCHEMA, "preset": cfg.name, "k": k, "reps": reps, "depth": depth,
            "seed": seed, "tolerance": TOLERANCE,
            "layers": [_jsonable_layer(lr) for lr in layers]}


def _jsonable_layer(lr: LayerResult) -> dict:
    d = asdict(lr)
    d["rows"] = [{"m": r["m"], "strategies": {n: asdict(c) for n, c in r["strategies"].items()}}
                 for r in lr.rows]
    for r in d["rows"]:
        for c in r["strategies"].values():
            if c["max_rel_err"] is not None and not np.isfinite(c["max_rel_err"]):
                c["max_rel_err"] = None
    return d
