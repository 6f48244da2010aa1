"""What the deferred-commit export's tests share (``tests/test_rollback_export*.py``): a
speculative run of verifies accepting full, partial and zero counts on one runner (ORT's CPU
EP, onnx.reference, the WebNN stateful graph), checked after every verify against the
float64 reference fed only the accepted tokens."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from model import export as E
from model import rollback_feeds as RF
from model.reference import Reference
from model.workload import Workload, cache_specs

#: fresh weights (not the default seed's)
SEED = 7
CAPACITY = 40


def schedule(k: int) -> list[int]:
    """Accepted counts of successive verifies: full, partial, zero, partial, full, half."""
    return [k, 1, 0, k - 1, k, k // 2]


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def speculate(w: Workload, k: int, dispatch: Callable, state: Callable | None,
              counts: list[int] | None = None, seed: int = 0, tol: float = 1e-5) -> list[float]:
    """Verifies of K random drafts at the accepted position, ``dispatch(ids, position,
    accepted) -> logits (K, vocab)``, each kept count from ``counts``: every verify's logits
    equal the reference's after only the accepted tokens (the K drafts fed on top, causal),
    and (``state()``: the deferred pairs, by past name) the state the next dispatch commits
    equals the reference's. Returns the logits' errors."""
    cfg = w.config
    ref = Reference(cfg, w.weights, CAPACITY)
    rng = np.random.default_rng(seed)
    pos, acc, errs = 0, 0, []
    for m in counts or schedule(k):
        ids = rng.integers(0, cfg.vocab, size=k).astype(np.int64)
        got = np.asarray(dispatch(ids, pos, acc), np.float64).reshape(k, -1)
        saved = ref.save()
        want = ref.step_tokens(ids)
        ref.restore(saved)
        errs.append(rel(got, want))
        assert errs[-1] < tol, f"K={k} at {pos} after {acc} kept: logits {errs[-1]:.2e}"
        assert np.array_equal(got.argmax(-1), want.argmax(-1))
        if m:
            ref.prefill(ids[:m], logits=False)
        pos, acc = pos + m, m
        if state is not None:
            check_committed(cfg, state(), acc, k, ref, pos)
    return errs


def check_committed(cfg, pairs: dict[str, np.ndarray], accepted: int, k: int, ref: Reference,
                    pos: int) -> None:
    """The deferred pairs after a verify, committed over ``accepted`` tokens, against the
    reference's state: recurrent states and conv windows within float32 rounding, KV rows
    before ``pos`` too (the rows beyond are the rejected drafts', masked)."""
    got = RF.committed(cfg, pairs, accepted, k)
    want = ref.cache_arrays()
    for name, a in want.items():
        g = got[name]
        if name.startswith("past_key_values."):
            g, a = g[:, :, :pos], a[:, :, :pos]
        assert rel(g, a) < 1e-5, f"{name} after {accepted} kept: {rel(g, a):.2e}"


def ordinary_specs(cfg, capacity: int) -> list:
    return cache_specs(cfg, capacity)


class OrtRun:
    """A graph on ORT's CPU EP, its pairs carried by the caller (present -> past)."""

    def __init__(self, path, specs: list) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.specs = specs
        self.state = {s.input: np.zeros(s.shape, s.dtype) for s in specs}

    def __call__(self, ids: np.ndarray, pos: int, acc: int) -> np.ndarray:
        k = len(ids)
        feeds = {"input_ids": ids.reshape(1, k),
                 "position_ids": (pos + np.arange(k, dtype=np.int64)).reshape(1, k), **self.state}
        if RF.ACCEPTED in self.inputs:
            feeds[RF.ACCEPTED] = RF.feeds(RF.ACCEPTED, pos, k, acc)
        out = dict(zip(self.names, self.session.run(None, feeds), strict=True))
        self.state = {s.input: out[s.output] for s in self.specs}
        return out["logits"].reshape(k, -1)


def deferred(w: Workload, k: int, cache_dir) -> tuple:
    """The deferred export of ``w`` at K, and its pairs."""
    path = E.export(w, "standard", CAPACITY, cache_dir, tokens=k, rollback="deferred")
    return path, RF.cache_specs_deferred(w.config, CAPACITY, k)
