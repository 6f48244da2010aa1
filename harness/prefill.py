"""Chunked prefill through the decode graph (issue 31 item 1): time to depth with a K-token
graph, K tokens a dispatch, checked against the reference.

Why: the proposal has no prefill -> decode hand-off (FINDINGS 1): a page whose graph keeps
the cache (``useStateful``) reaches depth only by dispatching that graph, so the graph that
takes K new tokens a step is its prefill too. Per backend, chunk size K and context D
(a multiple of every K), one point: the K-token graph built at capacity D + K, warmed up,
then D / K dispatches from an empty cache, timed (wall, the median of ``reps``), and where
the backend reports GPU time, the sum of the dispatches' GPU times over one more prefill.
A backend whose graph keeps the cache dispatches with ``reach_depth`` (no logits read) and
reads the last chunk's logits, the first token's (that read ends the wall time: every
dispatch has run); one that holds its cache itself is stepped chunk by chunk
(``step_tokens``, each chunk's logits read), its only way through this graph. Then the
next K tokens' logits, from the state the prefill left, are checked against the
reference's (``PresetSource.reference_walk``: float64 NumPy, float32 above its size
limit, the tokens fed one at a time) with ``metrics.compare_logits``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from harness import metrics
from harness.sweep_args import positive_list
from model.errors import UserError

if TYPE_CHECKING:
    from backends.base import Backend
    from harness.sources import WorkloadSource

SCHEMA = "statebench-prefill/1"
DEFAULT_CHUNKS = "1,16,64"
DEFAULT_CONTEXTS = "512,8192"
#: the largest K: the export spells the gated delta layers' K tokens out (a graph of K steps)
MAX_CHUNK = 1024
#: dispatches of K tokens before the timed prefills (pipelines made, caches warm)
WARMUP_DISPATCHES = 2


@dataclass
class PrefillPoint:
    """One (backend, K, context): ``status`` "ok", "failed" (``reason``) or "unavailable"."""

    backend: str
    chunk: int
    context: int
    capacity: int
    status: str = "ok"
    reason: str = ""
    #: "dispatched": reach_depth, the last chunk's logits read; "stepped": every chunk's read
    how: str = ""
    dispatches: int = 0
    wall_ms: float | None = None  # the median of wall_samples_ms
    wall_samples_ms: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None  # context / wall_ms
    gpu_ms: float | None = None  # the dispatches' GPU time summed, where the backend has it
    gpu_time_reason: str = ""
    is_stateful: bool | None = None  # a page's graph granted useStateful
    #: the next K tokens' logits against the reference's (``metrics.Match`` as a dict)
    match: dict | None = None
    build_s: float | None = None


def parse_chunks(text: str) -> list[int]:
    """'1,16,64' -> [1, 16, 64]: positive integers up to MAX_CHUNK, each once; else a
    UserError."""
    return positive_list(text, "--chunks", "chunk", "1,16,64", MAX_CHUNK)


def check_multiples(contexts: list[int], chunks: list[int]) -> None:
    """Every context a multiple of every chunk (a K-token graph takes exactly K a dispatch)."""
    for d in contexts:
        for k in chunks:
            if d % k:
                raise UserError(f"context {d} is not a multiple of chunk {k}: a {k}-token graph "
                                f"reaches depth {k} tokens a dispatch")


def _takes_k(cls: type[Backend], k: int) -> str:
    """Why ``cls`` cannot run a K-token graph ("" where it can)."""
    from backends.base import Backend

    if k > 1 and cls.step_tokens is Backend.step_tokens:
        return f"{cls.name} has no K-token step (Backend.step_tokens)"
    return ""


def _prefill(b: Backend, tokens: np.ndarray, k: int, hidden: bool) -> None:
    """``tokens`` fed K a dispatch from an empty cache, the last chunk's logits read."""
    from backends.base import DepthState

    d = len(tokens)
    if hidden:
        b.reach_depth(DepthState(tokens=tokens[:d - k].copy(), cache={}))
    else:
        b.reset()
        for j in range(0, d - k, k):
            b.step_tokens(tokens[j:j + k])
    b.step_tokens(tokens[d - k:])


def _gpu_prefill_ms(b: Backend, tokens: np.ndarray, k: int) -> float | None:
    """The GPU time of one more prefill, chunk by chunk (each dispatch's own timestamps,
    read with its logits), or None where a dispatch has none; the prefill runs to the end
    either way."""
    b.reset()
    times = []
    for j in range(0, len(tokens), k):
        b.step_tokens(tokens[j:j + k])
        times.append(b.gpu_time_ms())
    return None if None in times else float(sum(times))


def measure_point(source: WorkloadSource, name: str, k: int, context: int, tokens: np.ndarray,
                  ref_logits: np.ndarray, reps: int) -> PrefillPoint:
    """One point (module docstring); a backend that cannot run is "unavailable", one that
    raises while it runs "failed" with its one-line reason."""
    from backends.base import registry

    cls = registry()[name]
    pt = PrefillPoint(name, k, context, context + k, dispatches=context // k)
    ok, why = cls.available()
    why = why if not ok else source.refusal(cls) or _takes_k(cls, k)
    if why:
        pt.status, pt.reason = "unavailable", why
        return pt
    b = source.backend(cls, None)
    b.tokens_per_step = k
    hidden = bool(cls.hidden_state)
    pt.how = "dispatched" if hidden else "stepped"
    try:
        t0 = time.perf_counter()
        b.prepare(source.workload(), pt.capacity)
        pt.build_s = time.perf_counter() - t0
        pt.is_stateful = b.details.get("is_stateful")
        for j in range(min(WARMUP_DISPATCHES, context // k)):
            b.step_tokens(tokens[j * k:(j + 1) * k])
        for _ in range(reps):
            t0 = time.perf_counter()
            _prefill(b, tokens[:context], k, hidden)
            pt.wall_samples_ms.append((time.perf_counter() - t0) * 1e3)
        pt.wall_ms = statistics.median(pt.wall_samples_ms)
        pt.tokens_per_s = context / (pt.wall_ms / 1e3)
        if b.gpu_time_ms() is not None:
            pt.gpu_ms = _gpu_prefill_ms(b, tokens[:context], k)
        if pt.gpu_ms is None:
            pt.gpu_time_reason = (b.details.get("gpu_time_reason")
                                  or "the backend reports no GPU time")
        got = list(np.array(b.step_tokens(tokens[context:context + k]), np.float64))
        m = metrics.compare_logits(got, ref_logits[:k], source.tolerance)
        pt.match = asdict(m)
        if not m.ok:
            pt.status = "failed"
            pt.reason = metrics.mismatch_reason(got, ref_logits[:k], source.tolerance,
                                                source.reference_name)
    except Exception as exc:  # noqa: BLE001 - the point fails with its reason, the rest run
        pt.status, pt.reason = "failed", " ".join(str(exc).split()) or type(exc).__name__
    finally:
        b.close()
    return pt


def measure(preset_name: str, backends: list[str], chunks: list[int], contexts: list[int],
            reps: int = 3, seed: int = 0,
            progress: Callable[[PrefillPoint, dict], None] | None = None,
            model: str | None = None) -> dict:
    """Every point, contexts ascending (one reference walk serves them all): the results'
    body (``schema``, the workload, ``points``). ``model``: a model file in place of the
    preset (its K-token graphs; ORT's CPU EP its reference, ``ModelSource``).
    ``progress`` is given each point and the body so far (its points up to that one), so a
    caller can save a run that is stopped part way (``statebench prefill --out``)."""
    check_multiples(contexts, chunks)
    from harness.sources import source_for  # ONNX and the exports: only when it runs

    source = source_for(preset_name, model, seed=seed)
    contexts, kmax = sorted(contexts), max(chunks)
    top = contexts[-1] + kmax
    source.check_memory(top, top, kmax, contexts[-1])
    source.check_positions(top - 1)
    body = {"schema": SCHEMA, "workload": source.describe(top), "seed": seed,
            "chunks": chunks, "contexts": contexts, "reps": reps,
            "reference": source.reference_name, "tolerance": source.tolerance,
            "points": []}
    walk = source.reference_walk(top, top)
    try:
        for d in contexts:
            arrays = walk.arrays_at(d, d + kmax, kmax)
            for name in backends:
                for k in chunks:
                    pt = measure_point(source, name, k, d, arrays["tokens"],
                                       arrays["ref_logits"], reps)
                    body["points"].append(asdict(pt))
                    if progress is not None:
                        progress(pt, body)
    finally:
        walk.close()
    return body
