"""The speculative loop on a backend: verify K tokens in one dispatch, accept m drafts,
roll back, continue (docs/speculative.md); the greedy decode it must reproduce; and the
replay that checks the rolled-back state.

A verify feeds x (the newest token, not yet in the state, at position P) and K-1 drafts at
P .. P+K-1; y_j = argmax of logits row j is the target's token for position P+j+1. m is the
number of leading drafts equal to the y before them (0 .. K-1); the verify generates the m
drafts and y_m (the correction, or the bonus where m = K-1) and keeps m+1 of its K tokens
(``Backend.accept``): P grows by m+1 and y_m is the next x.

Every step reads back what its backend was built to read (``read_step``): K rows of logits,
their argmax taken on the host, or, on a page built with ``read_ids``, the K argmax ids
computed on the device (``step_ids``: K int64, no logits, so no check of them). The two
halves are apart so that a verify's time is the dispatch and the read, the host's argmax
after it (as before ids were read).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from backends.base import Backend, ByteCounters
from harness.logits import argmax
from harness.speculative.acceptance import ScriptedDrafts, wrong_token


@dataclass(frozen=True)
class Verify:
    """One verify as the loop ran it."""

    fed: np.ndarray  # the K tokens: x, then the K-1 drafts
    kept: int  # m + 1
    scripted: int  # the m the drafts were made for
    verify_ms: float  # read_step: the dispatch and the K logits rows (or K ids) read back
    rollback_ms: float  # accept(kept)
    gpu_ms: float | None
    verify_bytes: ByteCounters
    rollback_bytes: ByteCounters


@dataclass
class LoopRun:
    """A speculative decode: the tokens generated (at least the n asked for: the last
    verify may overshoot), every verify, the loop's wall time and the final position."""

    tokens: list[int] = field(default_factory=list)
    verifies: list[Verify] = field(default_factory=list)
    wall_ms: float = 0.0
    position: int = 0
    #: with ``keep_logits``: each verify's kept rows of logits (kept, vocab), the rows its
    #: generated tokens came from (copied outside ``wall_ms``); empty where ids were read
    logits: list[np.ndarray] = field(default_factory=list)


@dataclass
class GreedyRun:
    """A non-speculative greedy decode, one token a step: the tokens, each step's wall and
    GPU ms, and each step's margin (top logit minus the second: a near-tie where small; none
    where the backend read ids, not logits)."""

    tokens: list[int] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    gpu_ms: list[float] = field(default_factory=list)
    margins: list[float] = field(default_factory=list)
    position: int = 0
    #: the decode's wall time, argmax included, copies of the logits excluded
    wall_ms: float = 0.0
    #: with ``keep_logits``: every step's logits (n, vocab); empty where ids were read
    logits: list[np.ndarray] = field(default_factory=list)


def margin(logits: np.ndarray) -> float:
    top2 = np.partition(np.asarray(logits, np.float64).reshape(-1), -2)[-2:]
    return float(top2[1] - top2[0])


def reads_ids(backend: Backend) -> bool:
    """Whether ``backend`` was built to read its next ids (``read_ids``), not its logits."""
    return bool(getattr(backend, "read_ids", False))


def can_read_ids(cls: type[Backend]) -> bool:
    """Whether a backend of ``cls`` can be built to read ids: it has ``step_ids`` (the
    wgpu pages' ``read_ids``); ORT's and genai's backends read logits only."""
    return callable(getattr(cls, "step_ids", None))


def read_step(backend: Backend, tokens: int | np.ndarray) -> np.ndarray:
    """One dispatch of ``tokens`` (an int: a one-token step) and what it reads back, as the
    backend was built to: its K next ids (``step_ids``, int64 (K,)) or its K logits rows
    ((K, vocab)). The loop's timed read: the host's argmax is ``next_ids``'s, after it."""
    if reads_ids(backend):
        return np.asarray(backend.step_ids(tokens), np.int64).reshape(-1)
    if np.ndim(tokens) == 0:
        return np.asarray(backend.step(int(tokens))).reshape(1, -1)
    return backend.step_tokens(np.asarray(tokens, np.int64))


def next_ids(backend: Backend, read: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(the K next ids, the K logits rows or None) of a step's ``read``: the logits' argmax
    on the host, or the ids the device took where the backend read ids (no logits)."""
    if reads_ids(backend):
        return read, None
    return np.asarray(argmax(read, axis=-1)).reshape(-1), read


def greedy_decode(backend: Backend, first: int, n: int, keep_logits: bool = False,
                  after_step: Callable[[int], None] | None = None) -> GreedyRun:
    """``n`` tokens from a backend of one-token steps at its depth, ``first`` fed first;
    ``after_step(fed)`` after each step (``fed`` tokens fed so far), outside the timing."""
    run, x, aside = GreedyRun(), int(first), 0
    t_start = time.perf_counter_ns()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        read = read_step(backend, x)
        run.step_ms.append((time.perf_counter_ns() - t0) / 1e6)
        g = backend.gpu_time_ms()
        if g is not None:
            run.gpu_ms.append(float(g))
        ids, logits = next_ids(backend, read)
        x = int(ids[0])
        run.tokens.append(x)
        t1 = time.perf_counter_ns()
        if logits is not None:
            run.margins.append(margin(logits))
            if keep_logits:
                run.logits.append(np.array(logits, np.float32).reshape(-1))
        if after_step is not None:
            after_step(len(run.tokens))
        aside += time.perf_counter_ns() - t1
    run.wall_ms = (time.perf_counter_ns() - t_start - aside) / 1e6
    run.position = int(getattr(backend, "position", 0))
    return run


def accepted(drafts: np.ndarray, targets: np.ndarray) -> int:
    """m: the leading drafts equal to the target's token before each (``targets`` the
    argmax of the verify's rows)."""
    m = 0
    while m < len(drafts) and int(drafts[m]) == int(targets[m]):
        m += 1
    return m


def speculate(backend: Backend, first: int, drafts: ScriptedDrafts, n: int,
              keep_logits: bool = False) -> LoopRun:
    """At least ``n`` tokens from a K-token backend at its depth, ``first`` the newest token
    (not yet fed); every verify one ``read_step`` (K logits rows, or K ids) and one
    ``accept``."""
    run, x, aside = LoopRun(), int(first), 0
    t_start = time.perf_counter_ns()
    while len(run.tokens) < n:
        proposed, scripted = drafts.propose(len(run.tokens))
        fed = np.concatenate([[x], proposed]).astype(np.int64)
        backend.counters.reset()
        t0 = time.perf_counter_ns()
        read = read_step(backend, fed)
        t1 = time.perf_counter_ns()
        gpu = backend.gpu_time_ms()
        verify_bytes = backend.counters.snapshot()
        targets, logits = next_ids(backend, read)
        m = accepted(proposed, targets)
        run.tokens += [int(t) for t in proposed[:m]] + [int(targets[m])]
        backend.counters.reset()
        t2 = time.perf_counter_ns()
        backend.accept(m + 1)
        t3 = time.perf_counter_ns()
        run.verifies.append(Verify(fed, m + 1, scripted, (t1 - t0) / 1e6, (t3 - t2) / 1e6,
                                   None if gpu is None else float(gpu), verify_bytes,
                                   backend.counters.snapshot()))
        x = int(targets[m])
        if keep_logits and logits is not None:
            t4 = time.perf_counter_ns()
            run.logits.append(np.array(logits[:m + 1], np.float32))
            aside += time.perf_counter_ns() - t4
    run.wall_ms = (time.perf_counter_ns() - t_start - aside) / 1e6
    run.position = int(getattr(backend, "position", 0))
    return run


def logits_against(run: LoopRun, plain: GreedyRun) -> tuple[float, int]:
    """(the largest max|Δ|/max|plain| of the loop's kept logits rows against the one-token
    decode's at the same positions, the rows compared): row j of a verify after n tokens
    is the plain decode's step n+j (both predict token n+j+1). Rows past the plain
    decode, or after the loop's tokens left the plain ones, are not compared."""
    from harness.speculative.state_check import rel

    worst, rows, n = 0.0, 0, 0
    for v, kept_rows in zip(run.verifies, run.logits, strict=True):
        for j, row in enumerate(kept_rows):
            if n + j >= len(plain.logits) or run.tokens[:n + j] != plain.tokens[:n + j]:
                return worst, rows
            worst, rows = max(worst, rel(row, plain.logits[n + j])), rows + 1
        n += v.kept
    return worst, rows


def first_mismatch(got: list[int], want: list[int]) -> int | None:
    """The first index where ``got`` leaves ``want`` (over the shorter), or None."""
    return next((i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y), None)


def kept_row(run: LoopRun, i: int) -> np.ndarray | None:
    """The kept logits row the loop's token ``i`` came from (None where none was kept)."""
    n = 0
    for v, rows in zip(run.verifies, run.logits, strict=False):
        if i < n + v.kept:
            return rows[i - n]
        n += v.kept
    return None


def near_tie(run: LoopRun, plain: GreedyRun, i: int, tolerance: float) -> dict | None:
    """Where the loop's token ``i`` differs from the one-token decode's, whether that is a
    near-tie both graphs agree on: in the one-token decode's row, the loop's token lies
    ``gap`` below its top, and in the loop's row the one-token decode's token lies
    ``loop_gap`` below the loop's; ``certified`` where both are within the logits
    tolerance's absolute size there (``tolerance`` · max|plain row|, the logits check's
    scale): the two rows then agree within the tolerance and only their order of two
    near-equal logits differs. None where either row was not kept (ids read)."""
    got = kept_row(run, i)
    if got is None or i >= len(plain.logits):
        return None
    want = np.asarray(plain.logits[i], np.float64).reshape(-1)
    got = np.asarray(got, np.float64).reshape(-1)
    t_loop, t_plain = int(run.tokens[i]), int(plain.tokens[i])
    gap, loop_gap = want[t_plain] - want[t_loop], got[t_loop] - got[t_plain]
    bound = tolerance * float(np.max(np.abs(want)))
    return {"at": i, "loop_token": t_loop, "plain_token": t_plain, "gap": float(gap),
            "loop_gap": float(loop_gap), "bound": bound,
            "certified": bool(0 <= gap <= bound and 0 <= loop_gap <= bound)}


def replay(backend: Backend, verifies: list[Verify], vocab: int) -> None:
    """The same verifies on a backend at the same depth, every dropped token (past each
    verify's kept ones) replaced by another: a correct rollback leaves no trace of the
    dropped tokens, so the rows kept end bitwise as the loop's (``state_check``). Only the
    dispatches matter: what each reads back (logits or ids) is dropped."""
    for v in verifies:
        fed = v.fed.copy()
        fed[v.kept:] = [wrong_token(t, vocab) for t in fed[v.kept:]]
        read_step(backend, fed)
        backend.accept(v.kept)
