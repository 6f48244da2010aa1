"""One backend at one depth, every K and acceptance asked: the end-to-end speculative
points (docs/speculative.md), measured in a worker process of their own.

Run as `python -m harness.speculative.e2e_point`: one `GroupRequest` (JSON) on stdin, each
point a line of stdout (``{"point": ...}``) as it is done, progress lines on stderr
(``PROGRESS_PREFIX``), so a sweep stopped at a time limit keeps the points finished.
`measure_group` is the same in-process (tests, `--inprocess`). Per group: the backend
with a one-token graph decodes greedily from the depth (the tokens the loop must
reproduce, and the plain step's time); then per K a K-token backend runs the loop once per
acceptance, and replays it for the state check. With ``read="ids"`` both are built to read
their argmax ids, not their logits (``loop.read_step``): like for like, and no logits check.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from backends.base import Backend, ByteCounters, DepthState
from harness.gc_window import setup_frozen
from harness.heater import heat
from harness.metrics import logits_tolerance
from harness.results import BYTE_CATEGORIES, Stats
from harness.sources import PresetSource, WorkloadSource, from_wire
from harness.speculative import loop, state_check
from harness.speculative.acceptance import Acceptance, ScriptedDrafts
from harness.speculative.spec_results import finite, point_failed, point_unavailable
from harness.worker import class_for
from model.workload import CacheSpec, Workload, cache_specs

#: a worker's stderr line that is progress (said by the sweep), not a reason
PROGRESS_PREFIX = "statebench-spec: "
#: what a step reads back (``GroupRequest.read``): K logits rows, or K argmax ids
READS = ("logits", "ids")
#: why a point's logits were not compared where the page read ids
LOGITS_NOT_READ = "the page read ids, not logits"
#: why a backend's points are unavailable where ids are asked of it
IDS_REFUSAL = "reads logits only: no read_ids"


@dataclass(frozen=True)
class GroupRequest:
    """What a worker measures: ``backend`` at ``depth``, the K's and acceptances, ``tokens``
    (N) generated per point from the depth file's prompt (``depth_arrays``)."""

    backend: str
    preset: str
    depth: int
    capacity: int
    tokens: int
    ks: list[int]
    acceptances: list[str]
    depth_file: str
    seed: int = 0
    warmup: int = 2
    warm_s: float = 0.0
    options: dict | None = None
    #: "module:Class" of a backend outside the registry (tests), imported by path
    backend_path: str | None = None
    #: a model's source (``ModelSource.to_wire``) in place of the preset (None: ``preset``)
    source: dict | None = None
    #: what every step reads back (``READS``): "logits" (the host takes their argmax) or
    #: "ids" (the page's ``read_ids``: the argmax on the device, K int64 read)
    read: str = "logits"

    def __post_init__(self) -> None:
        if self.read not in READS:
            raise ValueError(f"read {self.read!r}: one of {', '.join(READS)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> GroupRequest:
        return cls(**json.loads(text))

    @property
    def greedy_tokens(self) -> int:
        """Tokens the one-token decode generates: the loop's n, plus what its last verify
        may overshoot and its drafts read ahead (K-1)."""
        return self.tokens + max(self.ks) - 1

    def keys(self) -> list[tuple[int, str]]:
        return [(k, a) for k in self.ks for a in self.acceptances]


@dataclass
class Built:
    """A backend built and warm, with what its point records of the building."""

    backend: Backend
    build_s: float
    details: dict = field(default_factory=dict)


def backend_class(req: GroupRequest) -> type[Backend]:
    return class_for(req.backend, req.backend_path)


def load_depth(path: str) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray, int]:
    """(prompt tokens: the depth's and the first one fed, the state at depth, the
    reference's greedy tokens after the prompt, the vocabulary: the reference's logits'
    width, which a page that reads ids never shows)."""
    with np.load(path) as z:
        cache = {k.split(":", 1)[1]: z[k] for k in z.files if k.startswith("cache:")}
        return z["tokens"], cache, z["ref_greedy"], int(z["vocab"])


def build(cls: type[Backend], source: WorkloadSource, workload: Workload | None,
          req: GroupRequest,
          k: int, prompt: np.ndarray) -> Built:
    """``cls`` with a K-token graph, prepared at the request's capacity and warmed up with
    ``req.warmup`` steps from position 0 (the pipelines made), then reset."""
    from harness.worker import backend_options

    b = source.backend(cls, backend_options(cls, req.options))
    b.tokens_per_step = k
    if req.read == "ids":  # the argmax taken on the device, K ids read (docs/speculative.md)
        b.read_ids = True
    if hasattr(b, "speculative"):  # a graph it can roll back (a hybrid's: deferred commit)
        b.speculative = True
    t0 = time.perf_counter()
    b.prepare(workload, req.capacity)
    build_s = time.perf_counter() - t0
    warm = np.resize(np.asarray(prompt, np.int64), max(req.warmup, 1) * k).reshape(-1, k)
    for ids in warm[:min(req.warmup, req.capacity // k)]:
        loop.read_step(b, ids)
        b.accept(k)
    b.reset()
    return Built(b, build_s)


def rollback_refusal(b: Backend) -> str:
    """Why ``b`` cannot keep fewer than K tokens of a step ("" where it can)."""
    ask = getattr(b, "rollback_refusal", None)
    if ask is not None:
        return ask()
    if type(b).accept is Backend.accept:
        return f"{b.name} has no rollback (Backend.accept keeps all K only)"
    return ""


def reach(built: Built, depth: DepthState) -> float:
    t0 = time.perf_counter()
    built.backend.reach_depth(depth)
    return time.perf_counter() - t0


@dataclass
class Emit:
    """Where a group's points go as each is done (``on_point``: the worker's stdout line,
    the sweep's file) and its slow phases are said (``say``), so a run stopped at a time
    limit keeps what it finished."""

    on_point: Callable[[dict], None] | None = None
    say: Callable[[str], None] | None = None
    points: list[dict] = field(default_factory=list)

    def point(self, p: dict) -> None:
        self.points.append(p)
        if self.on_point:
            self.on_point(p)

    def progress(self, line: str) -> None:
        if self.say:
            self.say(line)

    def fail_rest(self, req: GroupRequest, why: str) -> None:
        """The request's points not yet handed on, failed with ``why``."""
        done = {(int(p["k"]), str(p["acceptance"])) for p in self.points}
        for k, a in req.keys():
            if (k, a) not in done:
                self.point(point_failed(req, k, a, why))


def measure_group(req: GroupRequest, workload: Workload | None = None,
                  cls: type[Backend] | None = None, emit: Emit | None = None) -> list[dict]:
    """Every (K, acceptance) point of the request, each handed to ``emit`` as it is done;
    never raises Exception (a failure is its points' not yet done, with one line of
    reason)."""
    emit = emit or Emit()
    try:
        cls = cls or backend_class(req)
        if req.read == "ids" and not loop.can_read_ids(cls):
            for k, a in req.keys():
                emit.point(point_unavailable(req, k, a, IDS_REFUSAL))
            return emit.points
        ok, why = cls.available()
        if not ok:
            for k, a in req.keys():
                emit.point(point_unavailable(req, k, a, why or "not available"))
            return emit.points
        _measure(req, cls, workload, emit)
    except Exception as exc:  # noqa: BLE001 - a backend's failure is a result
        if os.environ.get("STATEBENCH_DEBUG"):
            traceback.print_exc()
        emit.fail_rest(req, f"{type(exc).__name__}: {exc}")
    return emit.points


def _timed(emit: Emit, what: str, fn: Callable[[], object]) -> object:
    """``fn()``, said before (``what`` ...) and after (done in s)."""
    emit.progress(f"{what} ...")
    t0 = time.perf_counter()
    out = fn()
    emit.progress(f"{what}: {time.perf_counter() - t0:.1f} s")
    return out


def _measure(req: GroupRequest, cls: type[Backend], workload: Workload | None,
             emit: Emit) -> None:
    source = (from_wire(req.source) if req.source
              else PresetSource(req.preset, req.seed))
    workload = workload or source.workload()
    tokens, cache, ref_greedy, depth_vocab = load_depth(req.depth_file)
    depth = DepthState(tokens=tokens[:req.depth].copy(), cache=cache)
    first = int(tokens[req.depth])
    on_gpu = not cls.on_cpu
    specs = (cache_specs(workload.config, req.capacity) if workload is not None
             else model_specs(source, cache, req.capacity))
    overwritten = [s.input for s in specs if s.kind != "append"]
    where = f"{req.backend} @ d{req.depth}"
    plain = _timed(emit, f"{where}: building the one-token graph",
                   lambda: build(cls, source, workload, req, 1, tokens))
    # an overwritten pair holds every token fed: kept at each count a loop may end at
    recurrent: dict[int, dict] = {}

    def keep_recurrent(fed: int) -> None:
        if overwritten and fed >= req.tokens:
            recurrent[req.depth + fed] = _snapshot(plain.backend, overwritten) or {}

    try:
        how = "one token a dispatch" if cls.hidden_state else "by writing the state"
        plain_depth_s = _timed(emit, f"{where}: reaching depth {req.depth} {how}",
                               lambda: reach(plain, depth))
        if on_gpu:
            heat(float(req.warm_s))
        with setup_frozen():  # the timed decode scans none of setup's objects (gc_window)
            greedy = _timed(emit, f"{where}: the one-token greedy decode of "
                            f"{req.greedy_tokens} tokens (the drafts)",
                            lambda: loop.greedy_decode(plain.backend, first, req.greedy_tokens,
                                                       keep_logits=True,
                                                       after_step=keep_recurrent))
        plain_state = _snapshot(plain.backend)
        chained = _timed(emit, f"{where}: the chained one-token decode of "
                         f"{req.greedy_tokens} tokens", lambda: chained_plain(
                             plain, depth, first, greedy.tokens, float(req.warm_s) if on_gpu
                             else 0.0))
    finally:
        plain.backend.close()
    base = {**chained, "plain_step_ms": Stats.of(greedy.step_ms).__dict__,
            "plain_ms_per_token": greedy.wall_ms / len(greedy.tokens),
            "plain_gpu_ms": _median(greedy.gpu_ms, len(greedy.step_ms)),
            "plain_time_to_depth_s": plain_depth_s,
            "greedy_matches_reference": bool(np.array_equal(greedy.tokens,
                                                            ref_greedy[:len(greedy.tokens)])),
            "reference_agree": _agree(greedy.tokens, ref_greedy)}
    # the preset's (PresetSource.tolerance; a test's own workload's), or the model's
    tol = source.tolerance if workload is None else logits_tolerance(workload.config)
    vocab = depth_vocab if workload is None else workload.config.vocab
    for k in req.ks:
        _measure_k(req, cls, source, workload, k, depth, first, greedy,
                   Plain(plain_state, recurrent), specs, tol, base, vocab, emit)


#: untimed chained tokens before the timed chain (its tensors made, its two bindings
#: recorded), as kernel_bench's
CHAIN_WARM = 2


def chained_plain(plain: Built, depth: DepthState, first: int, tokens: list[int],
                  warm_s: float) -> dict:
    """The plain baseline a page can do best when it reads ids: the same one-token graph's
    greedy decode chained on the device (the page's ``decode_chained``: step i + 1 queued before
    step i's id is read), from the same depth, its first ``CHAIN_WARM`` tokens untimed and
    the rest timed as a whole (the capacity holds the one-token decode's tokens, no more);
    its ids checked against the one-token decode's. ``plain_chained_ms_per_token`` None,
    and why, where the page cannot chain (a logits read, a host cache, ORT's and genai's
    backends)."""
    b = plain.backend
    refusal = getattr(b, "chain_refusal", None)
    why = "the backend has no chained decode" if refusal is None else refusal()
    if why:
        return {"plain_chained_ms_per_token": None, "plain_chained_matches": None,
                "plain_chained_why": why}
    want, w = np.asarray(tokens, np.int64), CHAIN_WARM
    if len(want) <= w:
        return {"plain_chained_ms_per_token": None, "plain_chained_matches": None,
                "plain_chained_why": f"{len(want)} tokens: none left after {w} untimed"}
    try:
        b.reach_depth(depth)
        warm = b.decode_chained(first, w)  # the first w tokens, untimed; the rest timed
        heat(warm_s)
        with setup_frozen():
            t0 = time.perf_counter_ns()
            ids = b.decode_chained(int(warm[-1]), len(want) - w)
            wall_ms = (time.perf_counter_ns() - t0) / 1e6
    except Exception as exc:  # noqa: BLE001 - the loop's points go on without it
        return {"plain_chained_ms_per_token": None, "plain_chained_matches": None,
                "plain_chained_why": f"failed: {type(exc).__name__}: {exc}"}
    return {"plain_chained_ms_per_token": wall_ms / (len(want) - w),
            "plain_chained_matches": bool(np.array_equal(np.concatenate([warm, ids]), want)),
            "plain_chained_why": ""}


def model_specs(source: WorkloadSource, cache: dict[str, np.ndarray],
                capacity: int) -> list[CacheSpec]:
    """A model's pairs as the state checks take them (``state_check``): an append pair's
    rows on axis 2 (BNSH, as genai's and transformers' caches are), ``capacity`` of them;
    an overwritten pair whole. ValueError (the group's points fail with it) for an append
    on another axis."""
    out = []
    for p in source.loaded.pairs:
        arr = cache[p.input]
        if p.kind == "append":
            if p.axis != 2 or arr.ndim != 4:
                raise ValueError(f"{p.input} grows on axis {p.axis} of {arr.ndim}: the state "
                                 "checks compare rows on axis 2 of 4")
            shape = (*arr.shape[:2], capacity, *arr.shape[3:])
        else:
            shape = arr.shape
        out.append(CacheSpec(p.input, p.output, tuple(shape), p.kind, -1, str(arr.dtype)))
    return out


def _measure_k(req: GroupRequest, cls: type[Backend], source: WorkloadSource,
               workload: Workload | None, k: int, depth: DepthState, first: int,
               greedy: loop.GreedyRun, plain: Plain, specs: list, tol: float, base: dict,
               vocab: int, emit: Emit) -> None:
    if cls.hidden_state and depth.depth % k:
        why = (f"depth {depth.depth} is not a multiple of K={k}: a hidden state is reached "
               "by dispatching the prompt K tokens at a time")
        for a in req.acceptances:
            emit.point(point_unavailable(req, k, a, why))
        return
    try:
        built = _timed(emit, f"{req.backend} @ d{req.depth}: building the K={k} graph",
                       lambda: build(cls, source, workload, req, k, depth.tokens))
    except Exception as exc:  # noqa: BLE001 - this K's points fail, the others go on
        for a in req.acceptances:
            emit.point(point_failed(req, k, a, f"{type(exc).__name__}: {exc}"))
        return
    b = built.backend
    try:
        refusal = rollback_refusal(b)
        for label in req.acceptances:
            acc = Acceptance.parse(label)
            if refusal and acc.kind != "full":
                emit.point(point_unavailable(req, k, label, f"rollback: {refusal}"))
                continue
            try:
                emit.point(_point(req, built, acc, depth, first, greedy, plain, specs,
                                  tol, base, vocab, not cls.on_cpu, emit))
            except Exception as exc:  # noqa: BLE001
                if os.environ.get("STATEBENCH_DEBUG"):
                    traceback.print_exc()
                emit.point(point_failed(req, k, label, f"{type(exc).__name__}: {exc}"))
    finally:
        b.close()


def _point(req: GroupRequest, built: Built, acc: Acceptance, depth: DepthState, first: int,
           greedy: loop.GreedyRun, plain: Plain, specs: list, tol: float,
           base: dict, vocab: int, on_gpu: bool, emit: Emit) -> dict:
    b, k = built.backend, built.backend.tokens_per_step
    drafts = ScriptedDrafts(np.asarray(greedy.tokens), acc, k, vocab, req.seed)
    where = f"{req.backend} @ d{req.depth} K={k} {acc.label}"
    # a hidden state is reached K tokens a dispatch here (the K-token graph: a chunked
    # prefill), a bound one by writing the depth's state
    how = f"{k} tokens a dispatch" if type(b).hidden_state else "by writing the state"
    depth_s = _timed(emit, f"{where}: reaching depth {req.depth} {how}",
                     lambda: reach(built, depth))
    if on_gpu:
        heat(float(req.warm_s))
    with setup_frozen():
        run = loop.speculate(b, first, drafts, req.tokens, keep_logits=True)
    got = _snapshot(b)
    _timed(emit, f"{where}: reaching depth {req.depth} again and replaying the "
           f"{len(run.verifies)} verifies (the state check)",
           lambda: (b.reach_depth(depth), loop.replay(b, run.verifies, vocab)))
    twin = _snapshot(b)
    # the tokens fed: the prompt's, then x and the accepted drafts of every verify, so
    # the valid rows (and the next write) end at depth + the tokens generated
    rows = req.depth + len(run.tokens)
    checks: dict = {"position": {"ok": run.position == rows, "position": run.position,
                                 "expected": rows}}
    if got is not None and twin is not None:
        checks["vs_replay"] = state_check.compare(got, twin, specs, rows, tol, True).to_dict()
    parted = loop.first_mismatch(run.tokens, greedy.tokens)
    tie = None if parted is None else loop.near_tie(run, greedy, parted, tol)
    if got is not None and plain.state is not None:
        fed = req.depth + len(greedy.tokens)  # the one-token decode's position
        want = {**plain.state, **plain.recurrent.get(rows, {})}
        same = rows == fed or rows in plain.recurrent
        upto = min(rows, fed)
        if tie is not None and tie["certified"]:  # the rows fed the same tokens, no more
            upto, same = min(upto, req.depth + parted + 1), False
        checks["vs_plain"] = state_check.compare(got, want, specs, upto, tol,
                                                 False, same_count=same).to_dict()
    return _record(req, built, acc, run, greedy, checks, logits_check(req, run, greedy, tol),
                   depth_s, base, parted, tie)


def logits_check(req: GroupRequest, run: loop.LoopRun, greedy: loop.GreedyRun,
                 tol: float) -> dict:
    """The loop's kept logits rows against the one-token decode's (``logits_against``);
    where the pages read ids there are none to compare: the check is recorded as not made
    (``ok`` None, and why), neither passed nor failed."""
    if req.read == "ids":
        return {"rows": 0, "max_rel": None, "tolerance": tol, "ok": None,
                "why": LOGITS_NOT_READ}
    worst, compared = loop.logits_against(run, greedy)
    return {"rows": compared, "max_rel": worst, "tolerance": tol,
            "ok": compared > 0 and worst <= tol}


def _record(req: GroupRequest, built: Built, acc: Acceptance, run: loop.LoopRun,
            greedy: loop.GreedyRun, checks: dict, logits: dict, depth_s: float,
            base: dict, mismatch: int | None, tie: dict | None) -> dict:
    """The point's record; ``mismatch``: the first token where the loop's leave the
    one-token decode's (None: none), ``tie``: ``loop.near_tie`` there."""
    b, k, n = built.backend, built.backend.tokens_per_step, len(run.tokens)
    vs = run.verifies
    ms = [v.verify_ms for v in vs]
    dropped = [v for v in vs if v.kept < k]
    hist: dict[str, int] = {}
    for v in vs:
        hist[str(v.kept - 1)] = hist.get(str(v.kept - 1), 0) + 1
    verify_med = float(np.median(ms))
    rollback_ms = [v.rollback_ms for v in (dropped or vs)]
    strategy = "position + accepted_count" if b.commits_by_count else "position"
    return {
        "backend": req.backend, "k": k, "acceptance": acc.label, "depth": req.depth,
        "capacity": req.capacity, "tokens": req.tokens, "status": "ok", "reason": "",
        "generated": n,
        "tokens_match_greedy": mismatch is None,
        "first_mismatch": mismatch,
        # where they part: a near-tie both graphs agree on (certified), or None
        "near_tie": tie,
        # the one-token decode's top-2 margin there (None where it read ids: no logits)
        "greedy_margin_at_mismatch": (greedy.margins[mismatch]
                                      if mismatch is not None and greedy.margins else None),
        "read": req.read,
        "logits_match_plain": logits["ok"],
        "logits_check": logits,
        "state_ok": bool(checks) and all(c["ok"] for c in checks.values()),
        "state_compared": "vs_replay" in checks and "vs_plain" in checks,
        "state": checks,
        "verifies": len(vs),
        "accepted_hist": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))),
        "mean_accepted": float(np.mean([v.kept - 1 for v in vs])),
        "scripted_as_run": all(v.kept - 1 == v.scripted for v in vs),
        "ms_per_token": run.wall_ms / n,
        "verify_ms": Stats.of(ms).__dict__,
        "verify_gpu_ms": _median([v.gpu_ms for v in vs if v.gpu_ms is not None], len(vs)),
        "verify_over_plain": verify_med / base["plain_step_ms"]["median"],
        "verify_over_plain_gpu": _ratio(_median([v.gpu_ms for v in vs if v.gpu_ms is not None],
                                                len(vs)), base["plain_gpu_ms"]),
        "speedup": base["plain_ms_per_token"] / (run.wall_ms / n),
        "speedup_vs_chained": _ratio(base.get("plain_chained_ms_per_token"), run.wall_ms / n),
        "rollback": {"strategy": strategy, "rollbacks": len(dropped),
                     "ms": Stats.of(rollback_ms).__dict__, "ms_max": float(max(rollback_ms)),
                     "of_verify": float(np.median(rollback_ms)) / verify_med,
                     "bytes": _mean_bytes([v.rollback_bytes for v in (dropped or vs)])},
        "bytes_per_verify": _mean_bytes([v.verify_bytes for v in vs]),
        "build_s": built.build_s, "time_to_depth_s": depth_s,
        **base,
        "details": _plain(dict(b.details)),
    }


@dataclass
class Plain:
    """The one-token decode's state at its end, and its overwritten pairs at each
    position a loop may end at (position -> past name -> array)."""

    state: dict[str, np.ndarray] | None
    recurrent: dict[int, dict[str, np.ndarray]]


def _snapshot(b: Backend, names: list[str] | None = None) -> dict[str, np.ndarray] | None:
    snap = getattr(b, "state_snapshot", None)
    return None if snap is None else snap(names)


def _median(samples: list[float], want: int) -> float | None:
    return float(np.median(samples)) if samples and len(samples) == want else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _agree(got: list[int], ref: np.ndarray) -> int:
    n = 0
    while n < min(len(got), len(ref)) and int(got[n]) == int(ref[n]):
        n += 1
    return n


def _mean_bytes(counters: list[ByteCounters]) -> dict[str, float]:
    return {c: float(np.mean([getattr(x, c) for x in counters])) for c in BYTE_CATEGORIES}


def _plain(d: dict) -> dict:
    return json.loads(json.dumps(d, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


def main() -> int:
    out = os.fdopen(os.dup(1), "w")  # backends and drivers may print: stdout is the reply's
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    req = GroupRequest.from_json(sys.stdin.read())

    def send(p: dict) -> None:  # one point a line, as it is done
        out.write(json.dumps({"point": finite(p)}, allow_nan=False) + "\n")
        out.flush()

    def say(line: str) -> None:
        sys.stderr.write(PROGRESS_PREFIX + line + "\n")
        sys.stderr.flush()

    measure_group(req, emit=Emit(send, say))
    return 0


if __name__ == "__main__":
    sys.exit(main())
