"""Where a sweep's workload comes from: the one place that knows a preset from a model file.

A `WorkloadSource` is what the runner and the worker ask about the workload, never "is it a
preset?": the reference walked up the contexts, what the results header says of it, what
the memory and the positions allow, which backends can run it and how one is built for it,
the bytes a point counts (its valid cache, its weights), the tolerance and name of the
reference its logits are checked against, and the floor (DESIGN §7). Two implementations,
as asv's environments are subclasses of one: `PresetSource` (a preset statebench writes,
its reference float64 NumPy) and `ModelSource` (a model someone exported,
``statebench run --model``: its reference ORT's CPU EP on the same graph,
``harness.model_run``). A source crosses to the worker as plain data (`to_wire`,
`from_wire`); a new kind registers itself in `SOURCES`, here.
"""

from __future__ import annotations

import functools
import os
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from backends.base import Backend
from harness import memory, metrics, model_bytes
from harness.logits import argmax
from harness.model_run import REFERENCE, REFERENCE_BACKEND, ModelFile, UserModel, reference_graph
from harness.results import Point
from model.errors import UserError
from model.reference import Reference
from model.workload import ModelConfig, Workload, preset, token_stream, valid_cache_bytes, weights_bytes

#: presets above this many parameters get a float32 reference (float64 would need 2× the memory)
FLOAT64_REFERENCE_MAX_PARAMS = 200_000_000
PREFILL_CHUNK = 256
#: tokens of the probe that decides whether a graph with overwritten pairs takes chunks
PROBE_TOKENS = 8
#: why a point of a model statebench did not write has no floor: its state's bytes unknown
NO_MODEL_FLOOR = "no floor: the bytes of the model's state are not known"


# -- the reference, walked up the contexts ---------------------------------------------------

class ReferenceWalk(ABC):
    """One reference walked up the contexts in ascending order: the state every backend
    starts from at a depth, and the logits of the steps after it, the look-ahead rolled
    back so that a sweep to 16k costs one walk to 16k, not the sum of all contexts."""

    @abstractmethod
    def arrays_at(self, context: int, capacity: int, ahead: int) -> dict[str, np.ndarray]:
        """``tokens`` (context + ahead), ``cache:<past name>`` (the state after ``context``
        tokens) and ``ref_logits`` (the next ``ahead`` steps'): a depth file's arrays."""

    def close(self) -> None:  # noqa: B027 - a walk with nothing to release
        """Release what the walk holds (a session, a temporary graph)."""


def reference_dtype(n_params: int) -> type[np.floating]:
    """The reference's data type for a model of `n_params` parameters (FLOAT64_REFERENCE_MAX_PARAMS)."""
    return np.float64 if n_params <= FLOAT64_REFERENCE_MAX_PARAMS else np.float32


class NumpyReferenceWalk(ReferenceWalk):
    """A preset's float64 NumPy reference: the prefix prefilled once (each context
    continues from the last); the state is cut to each point's capacity."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], seed: int,
                 length: int, capacity: int) -> None:
        dtype = reference_dtype(sum(int(w.size) for w in weights.values()))
        self.tokens = token_stream(cfg, length, seed)
        self.ref = Reference(cfg, weights, capacity, dtype=dtype)

    def arrays_at(self, context: int, capacity: int, ahead: int) -> dict[str, np.ndarray]:
        ref = self.ref
        if context < ref.position:
            raise ValueError("contexts must be visited in ascending order")
        while ref.position < context:
            ref.prefill(self.tokens[ref.position:min(ref.position + PREFILL_CHUNK, context)],
                        logits=False)
        saved = ref.save()
        arrays = {"tokens": self.tokens[:context + ahead]}
        arrays.update({f"cache:{k}": v for k, v in ref.cache_arrays(capacity).items()})
        arrays["ref_logits"] = np.stack([ref.step(int(t)) for t in self.tokens[context:context + ahead]])
        ref.restore(saved)
        return arrays


class OrtReferenceWalk(ReferenceWalk):
    """A model file's reference (``harness.model_run``): ORT's CPU EP on the same graph, its
    cache growing as the model gives it. The prompt to each depth is a random token prefix
    of the seed, fed 256 tokens a run where the graph takes several (``prefill``: to 8192
    one token a run copied the growing cache in and out 8192 times, minutes on a 1B model);
    the steps after it (warm-up and timed) are the reference's own greedy
    tokens, each the argmax of the reference's logits before it, so the sweep decodes as a
    user's greedy loop does and a backend that picks its own tokens (onnxruntime-genai's
    loop, ``backends.genai``) is checked against the reference's picks (docs/byom.md,
    "The look-ahead is the reference's greedy walk"). Each cache holds its valid rows
    (``capacity`` is not needed to cut it)."""

    def __init__(self, model: UserModel, seed: int, length: int, capacity: int) -> None:
        from backends.ort import BACKENDS

        self._folder = tempfile.TemporaryDirectory(prefix="statebench-reference-")
        graph = reference_graph(model, Path(self._folder.name))
        self.ref = BACKENDS[REFERENCE_BACKEND].create(ModelFile(graph, model.hand_pairs))
        try:
            self.ref.prepare(None, capacity)
            self.vocab = int(self.ref.step(0).size)  # the logits' width, then back to empty
        except Exception as exc:  # noqa: BLE001 - ORT's own reason is the answer
            self._folder.cleanup()
            raise UserError(f"the reference ({REFERENCE}) cannot run {model.path}: "
                            f"{' '.join(str(exc).split())}") from None
        self.ref.reset()
        self.tokens = np.random.default_rng(seed).integers(0, self.vocab, size=length,
                                                           dtype=np.int64)
        #: the reference's logits after the prefix it holds (None: no token fed yet)
        self.last: np.ndarray | None = None
        #: tokens a run on the way to a depth: PREFILL_CHUNK where the graph takes several
        #: (``UserModel.takes_token_chunks``; with overwritten pairs, where a probe's chunk
        #: agrees with its tokens one a run: ``_chunks_agree``), else 1; the steps after a
        #: depth are one a run
        self.chunk = 1
        if model.takes_token_chunks or (model.may_take_token_chunks
                                        and self._chunks_agree(model.tolerance)):
            self.chunk = PREFILL_CHUNK

    def _chunks_agree(self, tolerance: float) -> bool:
        """Whether the graph's overwritten pairs (a recurrent state, a conv window) come out
        of a run of ``PROBE_TOKENS`` tokens as out of as many runs of one: the last logits
        and every pair within ``tolerance`` of the largest magnitude (float rounding: the
        chunk's sums go another way). A graph that computes its state for one token only
        fails, and the reference walks it one token a run. Leaves the reference empty."""
        ref, ids = self.ref, self.tokens[:PROBE_TOKENS]
        if len(ids) < PROBE_TOKENS:
            return False
        got = {}
        for how in ("chunk", "tokens"):
            ref.reset()
            try:
                if how == "chunk":
                    last = np.array(ref.prefill(ids), np.float64)
                else:
                    for t in ids:
                        last = np.array(ref.step(int(t)), np.float64)
            except Exception:  # noqa: BLE001 - a graph that refuses a chunk walks one a run
                ref.reset()
                return False
            got[how] = [last] + [np.asarray(ref.past[k], np.float64) for k in sorted(ref.past)]
        ref.reset()
        return all(a.shape == b.shape and np.all(np.isfinite(a))
                   and np.max(np.abs(a - b), initial=0.0)
                   <= tolerance * max(float(np.max(np.abs(b), initial=0.0)), 1e-30)
                   for a, b in zip(got["chunk"], got["tokens"], strict=True))

    def arrays_at(self, context: int, capacity: int, ahead: int) -> dict[str, np.ndarray]:
        """The prefix ``tokens[:context]`` of the seed's stream, then ``ahead`` greedy
        tokens: the first the argmax of the logits after the prefix, each next one the
        argmax of the step before's (the first of the stream where the prefix is empty)."""
        ref = self.ref
        if context < ref.position:
            raise ValueError("contexts must be visited in ascending order")
        while ref.position < context:  # in chunks where the graph takes them (above)
            n = min(self.chunk, context - ref.position)
            if n > 1:
                self.last = np.array(ref.prefill(self.tokens[ref.position:ref.position + n]),
                                     copy=True)
            else:
                self.last = np.array(ref.step(int(self.tokens[ref.position])), copy=True)
        saved, last = dict(ref.past), self.last
        greedy: list[int] = []
        logits: list[np.ndarray] = []
        for i in range(ahead):
            prev = last if i == 0 else logits[-1]
            greedy.append(int(argmax(prev)) if prev is not None else int(self.tokens[context]))
            logits.append(np.array(ref.step(greedy[-1]), copy=True))
        arrays = {"tokens": np.concatenate([self.tokens[:context],
                                            np.asarray(greedy, np.int64)])}
        arrays.update({f"cache:{k}": v for k, v in saved.items()})
        arrays["ref_logits"] = np.stack(logits) if logits else np.zeros((0, self.vocab))
        ref.past, ref.position = saved, context
        return arrays

    def close(self) -> None:
        self.ref.close()
        self._folder.cleanup()


# -- the sources -----------------------------------------------------------------------------

class WorkloadSource(ABC):
    """What a sweep measures on, and everything about it that differs by where it came from.

    It is also what a backend is built for (``backends.base.BuildSource``: ``model_path``,
    ``hand_pairs``)."""

    #: the name `to_wire` records and `SOURCES` knows it by
    kind: ClassVar[str]
    seed: int

    # -- what a backend reads (BuildSource) ----------------------------------------------

    @property
    def model_path(self) -> Path | None:
        """The model file a backend runs as given; None: statebench's own export."""
        return None

    @property
    def hand_pairs(self) -> dict[str, str]:
        """Cache pairs named by hand (``--pairs``), past -> present."""
        return {}

    # -- the runner's side ---------------------------------------------------------------

    @property
    @abstractmethod
    def label(self) -> str:
        """The workload's name in file names (depth files, the default results file)."""

    def check_positions(self, last: int) -> None:  # noqa: B027 - nothing limits a preset
        """Refuse, in one line, a sweep whose last position (0-based) it cannot reach."""

    def check_memory(self, capacity: int, length: int, ahead: int, context: int) -> None:  # noqa: B027
        """Refuse a sweep that cannot fit in this machine's memory, before any work."""

    @abstractmethod
    def reference_walk(self, length: int, capacity: int) -> ReferenceWalk:
        """The reference over ``length`` tokens at cache ``capacity`` (a `UserError` where
        it cannot run the workload)."""

    def depth_arrays(self, context: int, capacity: int, ahead: int) -> dict[str, np.ndarray]:
        """One depth's arrays from a fresh walk (tests; the sweep walks once)."""
        walk = self.reference_walk(context + ahead, capacity)
        try:
            return walk.arrays_at(context, capacity, ahead)
        finally:
            walk.close()

    @property
    @abstractmethod
    def working_set(self) -> int:
        """Bytes the calibration's host figures should exceed (the weights a step reads)."""

    @abstractmethod
    def describe(self, capacity: int) -> dict:
        """The results' ``workload`` entries that say what ran (preset or model, dtype)."""

    def refusal(self, cls: type[Backend]) -> str:
        """Why backend ``cls`` cannot run this workload ("" where it may), before any worker."""
        return ""

    def floor(self, point: Point, calibration: dict) -> tuple[float | None, str]:
        """(the point's floor in ms, "") or (None, why not): DESIGN §7."""
        return None, "no floor"

    # -- the worker's side ---------------------------------------------------------------

    def backend(self, cls: type[Backend], options: object | None = None) -> Backend:
        """An instance of ``cls`` built for this workload (``Backend.create``)."""
        return cls.create(self, options)

    def workload(self) -> Workload | None:
        """What ``Backend.prepare`` is handed: a preset's ``Workload``; None for a model file."""
        return None

    @abstractmethod
    def cache_bytes(self, context: int, cache: dict[str, np.ndarray]) -> int:
        """Bytes of valid cache at ``context`` (``cache``: the depth file's state)."""

    @property
    @abstractmethod
    def weights_bytes(self) -> int:
        """The weights' bytes a point records."""

    @property
    @abstractmethod
    def tolerance(self) -> float:
        """The relative logits tolerance (``metrics.compare_logits``)."""

    #: what the logits are compared with, in a mismatch's reason
    reference_name: ClassVar[str]

    def prepare_refusal(self, exc: Exception) -> str | None:
        """The reason a backend whose ``prepare`` raised ``exc`` is unavailable, or None
        where the failure is the point's (it fails)."""
        return None

    @abstractmethod
    def to_wire(self) -> dict:
        """This source as JSON-ready data (``kind`` and what `from_wire` needs)."""

    @classmethod
    @abstractmethod
    def from_wire(cls, d: dict) -> WorkloadSource:
        """The source `to_wire` wrote."""


#: the sources by kind (``to_wire``'s "kind"): a new kind of workload is one class here
SOURCES: dict[str, type[WorkloadSource]] = {}


def _source(cls: type[WorkloadSource]) -> type[WorkloadSource]:
    SOURCES[cls.kind] = cls
    return cls


@functools.lru_cache(maxsize=1)
def _workload(preset_name: str, seed: int) -> Workload:
    """A worker's workload, kept for the next in-process point of the same preset."""
    return Workload.build(preset(preset_name), seed)


def sweep_memory_bytes(cfg: ModelConfig, capacity: int, length: int, ahead: int) -> int:
    """A lower bound on the memory a sweep holds at once at `capacity` rows, `length` tokens
    and `ahead` (warm-up + timed) steps: the reference's weights and state (twice:
    `NumpyReferenceWalk.arrays_at` keeps a copy to roll back to), the state in the graphs'
    types for the depth file, the reference's logits for the steps (in the runner and in the
    worker, which also keeps its own in float32), and in the worker the weights, the depth
    file's state and the backend's own cache."""
    params = cfg.describe()["parameters"]
    ref_item = np.dtype(reference_dtype(params)).itemsize
    return (params * (ref_item + 4) + 2 * memory.state_bytes(cfg, capacity, ref_item)
            + 3 * memory.state_bytes(cfg, capacity) + 8 * length
            + ahead * cfg.vocab * (2 * ref_item + 4))


@_source
@dataclass
class PresetSource(WorkloadSource):
    """A preset statebench writes (``model.workload``): seeded weights, its own exports, a
    float64 NumPy reference, and a floor."""

    kind: ClassVar[str] = "preset"
    reference_name: ClassVar[str] = "the float64 reference"
    name: str = "small"
    seed: int = 0

    @functools.cached_property
    def config(self) -> ModelConfig:
        return preset(self.name)

    @property
    def label(self) -> str:
        return self.name

    def check_memory(self, capacity: int, length: int, ahead: int, context: int) -> None:
        memory.require(sweep_memory_bytes(self.config, capacity, length, ahead),
                       f"{self.name} at context {context} (capacity {capacity}) with "
                       f"{ahead} warm-up and timed steps",
                       "use smaller --contexts, --capacity or --steps")

    def reference_walk(self, length: int, capacity: int) -> ReferenceWalk:
        weights = Workload.build(self.config, self.seed).weights
        return NumpyReferenceWalk(self.config, weights, self.seed, length, capacity)

    @property
    def working_set(self) -> int:
        return weights_bytes(self.config)

    def describe(self, capacity: int) -> dict:
        cfg = self.config
        return {"preset": self.name, "dtype": cfg.dtype, "config": cfg.describe()}

    def refusal(self, cls: type[Backend]) -> str:
        return cls.preset_refusal()

    def floor(self, point: Point, calibration: dict) -> tuple[float | None, str]:
        return metrics.floor_ms(point.backend, self.config, point.weights_bytes, point.context,
                                point.capacity, calibration, point.details)

    def workload(self) -> Workload:
        return _workload(self.name, self.seed)

    def cache_bytes(self, context: int, cache: dict[str, np.ndarray]) -> int:
        return valid_cache_bytes(self.config, context)

    @property
    def weights_bytes(self) -> int:
        return self.workload().weights_bytes

    @property
    def tolerance(self) -> float:
        return metrics.logits_tolerance(self.config)

    def to_wire(self) -> dict:
        return {"kind": self.kind, "preset": self.name, "seed": self.seed}

    @classmethod
    def from_wire(cls, d: dict) -> PresetSource:
        return cls(str(d["preset"]), int(d.get("seed", 0)))


@_source
@dataclass
class ModelSource(WorkloadSource):
    """A model statebench did not write (``harness.model_run``): its own graph, ORT's CPU EP
    as the reference, the floor and cache figures from its pairs' pinned shapes and its
    initializers (``harness.model_bytes``). The runner's holds the loaded ``UserModel``
    (`load`); a worker's is the path and the figures the runner measured of it (`from_wire`)."""

    kind: ClassVar[str] = "model"
    reference_name: ClassVar[str] = "the reference (ORT's CPU EP)"
    path: Path = field(default_factory=Path)
    pairs: dict[str, str] = field(default_factory=dict)
    seed: int = 0
    #: the model's files' bytes and its logits tolerance, as the runner found them
    size: int = 0
    model_tolerance: float = metrics.FLOAT32_TOLERANCE
    #: the weights' bytes a step reads, and the state's bytes (None: why not, in state_reason)
    weights: int = 0
    state: metrics.StateBytes | None = None
    state_reason: str = ""
    user: UserModel | None = field(default=None, repr=False, compare=False)

    @classmethod
    def load(cls, model: str | os.PathLike, hand_pairs: dict[str, str] | None = None,
             seed: int = 0) -> ModelSource:
        """The model at ``model`` checked and read (``UserModel.load``: a bad path, file or
        pair is a `UserError`)."""
        user = UserModel.load(model, hand_pairs)
        state, why = model_state(user)
        return cls(user.path, dict(hand_pairs or {}), seed, user.size, user.tolerance,
                   model_bytes.weights_bytes(user.proto).total, state, why, user)

    @property
    def model_path(self) -> Path:
        return self.path

    @property
    def hand_pairs(self) -> dict[str, str]:
        return self.pairs

    @property
    def loaded(self) -> UserModel:
        if self.user is None:
            self.user = UserModel.load(self.path, self.pairs)
        return self.user

    @property
    def label(self) -> str:
        return f"model-{self.loaded.name}"

    def check_positions(self, last: int) -> None:
        self.loaded.check_positions(last)

    def reference_walk(self, length: int, capacity: int) -> ReferenceWalk:
        return OrtReferenceWalk(self.loaded, self.seed, length, capacity)

    @property
    def working_set(self) -> int:
        return self.size

    def describe(self, capacity: int) -> dict:
        user = self.loaded
        return {"model": {**user.describe(capacity), "bytes": self.bytes_record()},
                "dtype": model_bytes.logits_dtype(user.proto, user.pairs)}

    def bytes_record(self) -> dict:
        """workload.model.bytes: the state per step (``StateBytes.to_dict``) or why it is
        not known, and the weights a step reads (``model_bytes.weights_bytes``)."""
        w = model_bytes.weights_bytes(self.loaded.proto)
        state = self.state.to_dict() if self.state else {"reason": self.state_reason}
        return {"state": state, "weights_bytes": w.total, "weights_stored_bytes": w.stored,
                "gathered": list(w.gathered)}

    def refusal(self, cls: type[Backend]) -> str:
        return self.loaded.refusal(cls)

    def floor(self, point: Point, calibration: dict) -> tuple[float | None, str]:
        if self.state is None:
            return None, f"{NO_MODEL_FLOOR} ({self.state_reason})"
        return metrics.floor_ms(point.backend, self.state, point.weights_bytes, point.context,
                                point.capacity, calibration, point.details)

    def cache_bytes(self, context: int, cache: dict[str, np.ndarray]) -> int:
        return sum(a.nbytes for a in cache.values())  # each cache's valid rows

    @property
    def weights_bytes(self) -> int:
        return self.weights

    @property
    def tolerance(self) -> float:
        return self.model_tolerance

    def prepare_refusal(self, exc: Exception) -> str | None:
        # a backend that cannot build a user's model is unavailable, with its reason
        return " ".join(str(exc).split())

    def to_wire(self) -> dict:
        return {"kind": self.kind, "model": str(self.path), "pairs": self.pairs,
                "seed": self.seed, "model_bytes": self.size, "tolerance": self.model_tolerance,
                "weights_bytes": self.weights,
                "state": self.state.to_dict() if self.state else None,
                "state_reason": self.state_reason}

    @classmethod
    def from_wire(cls, d: dict) -> ModelSource:
        state = d.get("state")
        return cls(Path(d["model"]), dict(d.get("pairs") or {}), int(d.get("seed", 0)),
                   int(d["model_bytes"]), float(d.get("tolerance") or metrics.FLOAT32_TOLERANCE),
                   int(d.get("weights_bytes") or 0),
                   metrics.StateBytes.from_dict(state) if state else None,
                   str(d.get("state_reason") or ""))


def model_state(user: UserModel) -> tuple[metrics.StateBytes | None, str]:
    """The model's state bytes (``model_bytes.state_bytes``), or None and why not."""
    try:
        return model_bytes.state_bytes(user.proto, user.pairs), ""
    except model_bytes.StateUnknown as exc:
        return None, str(exc)


def from_wire(d: dict) -> WorkloadSource:
    """The source a request carries (``WorkloadSource.to_wire``)."""
    try:
        cls = SOURCES[d["kind"]]
    except KeyError:
        raise ValueError(f"unknown workload source {d.get('kind')!r}; known: "
                         f"{', '.join(SOURCES)}") from None
    return cls.from_wire(d)


def source_for(preset_name: str, model: str | os.PathLike | None = None,
               hand_pairs: dict[str, str] | None = None, seed: int = 0) -> WorkloadSource:
    """The source ``statebench run`` names: ``model`` (a file, with its hand-named pairs)
    where given, else the preset (a bad name or file is a `UserError`)."""
    if model is not None:
        return ModelSource.load(model, hand_pairs, seed)
    source = PresetSource(preset_name, seed)
    _ = source.config  # an unknown preset is refused here
    return source
