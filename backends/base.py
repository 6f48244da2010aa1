"""The one protocol every backend implements, its byte counters, and the registry.

A backend is one way a page (or an ORT user) carries the decode state across steps. The runner
only talks to this protocol; backends count their own bytes where the bytes move (DESIGN §7).
"""

from __future__ import annotations

import fnmatch
import inspect
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from backends.webnn.counters import ByteCounters
from model.errors import UserError
from model.workload import Workload


@dataclass(frozen=True)
class DepthState:
    """How a backend reaches depth L (DESIGN §5).

    `tokens` is the teacher-forced prefix of length L; `cache` is the state after it
    (float32, by past name, in the reference's layouts: `cache_specs` by default; a backend
    whose graph lays a state out otherwise converts it, `workload.in_layout`). A page-owned
    cache may be written from `cache` directly; a hidden (stateful) cache must be reached by
    dispatching `tokens`.
    """

    tokens: np.ndarray
    cache: dict[str, np.ndarray]

    @property
    def depth(self) -> int:
        return len(self.tokens)


def into_capacity(rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A cache's valid rows (a user model's depth: ``harness.model_run``) at the front of
    zeros of the capacity-sized ``shape``; an array already that shape as it is."""
    if tuple(rows.shape) == tuple(shape):
        return rows
    full = np.zeros(shape, rows.dtype)
    full[tuple(slice(0, n) for n in rows.shape)] = rows
    return full


def check_tokens(tokens: np.ndarray, k: int) -> np.ndarray:
    """``tokens`` as a flat int64 array of ``k`` tokens (a K-token graph takes exactly its
    K), else ValueError."""
    arr = np.asarray(tokens, np.int64).reshape(-1)
    if len(arr) != k:
        raise ValueError(f"{len(arr)} tokens given to a step of {k}")
    return arr


class BuildSource(Protocol):
    """What a backend reads of the workload it is built for (``harness.sources`` implements
    it): the model file it runs as given, or None for statebench's own export of a preset
    (the ``Workload`` that ``prepare`` is then handed), and the cache pairs named by hand."""

    @property
    def model_path(self) -> str | os.PathLike | None: ...

    @property
    def hand_pairs(self) -> dict[str, str]: ...


class Backend(ABC):
    """Prepare for a workload and capacity, reach depth, step one token, reset.

    Subclasses set `name` ("family:mode") and count bytes into `self.counters`. What the
    harness asks of a backend it asks here, never of its name: how to build one for a
    workload (`create`), the options it takes (`options_type`), whether it computes on the
    host's CPU (`on_cpu`) and whether its cache crosses the host link every step
    (`host_cache`). `register` checks all of it.
    """

    name: str = ""
    #: True when the cache is hidden (reached by dispatching, never written by the page)
    hidden_state: bool = False
    #: True when `available()` asks wgpu for an adapter: the harness asks first, in a child
    #: process (a driver can abort the process that enumerates adapters), and marks the
    #: backend unavailable with that probe's reason where it found none
    uses_wgpu_adapter: bool = False
    #: True when it computes on the host's CPU: its floor is the host's memory bandwidth, and
    #: no GPU is heated or its clock sampled for its points
    on_cpu: bool = False
    #: True when the cache lives on the host and crosses the host link both ways every step
    #: (its floor counts the link; speedups are taken over such a backend)
    host_cache: bool = False

    def __init__(self) -> None:
        self.counters = ByteCounters()
        self.details: dict[str, object] = {}  # per-point facts for the results (e.g. in_place per pair)

    @classmethod
    def create(cls, source: BuildSource, options: object | None = None) -> Backend:
        """One built for ``source``, with ``options`` (an instance of ``options_type()``, or
        None: the backend's defaults). The default builds a backend that takes no
        arguments: it runs presets only (``runs_models``)."""
        return cls()

    #: True when `create` builds it for a model file as given (``source.model_path``)
    runs_models: bool = False

    @classmethod
    def options_type(cls) -> type | None:
        """The options record `create` takes (the WebNN pages: ``KernelOptions``); None where
        it takes none (``--kernel-option`` is then not for it)."""
        return None

    @classmethod
    def preset_refusal(cls) -> str:
        """Why it cannot run statebench's presets, before any worker ("" where it can; a
        backend of models only, such as onnxruntime-genai's loop, says why not)."""
        return ""

    @classmethod
    def model_refusal(cls, proto: object, hand_pairs: dict[str, str] | None = None) -> str:
        """Why it cannot run the model ``proto`` (an ``onnx.ModelProto``) as given, before
        any worker ("" where it may try: a backend that cannot build it says so in
        ``prepare``)."""
        return ""

    @classmethod
    @abstractmethod
    def available(cls) -> tuple[bool, str]:
        """(True, "") or (False, why not): an uninstalled package, no adapter, no device."""

    @classmethod
    def runs_on(cls) -> str:
        """The engine that runs it, its version and the backend API under it, where it can
        tell ("" otherwise); `statebench backends` shows it."""
        return ""

    @abstractmethod
    def prepare(self, workload: Workload, capacity: int) -> None:
        """Build graphs/sessions and allocate buffers for a fixed cache capacity."""

    @abstractmethod
    def reach_depth(self, depth: DepthState) -> None:
        """Bring the cache to `depth.depth` tokens (see DepthState)."""

    @abstractmethod
    def step(self, token: int) -> np.ndarray:
        """Feed one token at the current position; return its logits (vocab,) on the host in
        the graph's own type (float32, or float16 where the graph's logits are: what a page
        reading with ``readTensor(tensor, outputData)`` gets; widening them is the caller's,
        outside what it times, and ``harness.logits.argmax`` picks from either fast). The
        array may be the backend's own, overwritten by its next step: copy it to keep it."""

    #: K, the new tokens one dispatch of its graph takes (``step_tokens``; statebench's
    #: export of K-token graphs, ``model.export``'s ``tokens``); set before ``prepare``
    tokens_per_step: int = 1

    def step_tokens(self, tokens: np.ndarray) -> np.ndarray:
        """Feed K = ``tokens_per_step`` tokens at positions P .. P+K-1 in one dispatch (a
        speculative verify, a chunk of a prefill); return logits (K, vocab), the backend's
        own array in the graph's type as ``step``'s. K = 1 is ``step``, the default here; a backend
        that builds K-token graphs overrides it."""
        tokens = check_tokens(tokens, self.tokens_per_step)
        if self.tokens_per_step != 1:
            raise NotImplementedError(f"{self.name} has no K-token step")
        return self.step(int(tokens[0])).reshape(1, -1)

    def accept(self, kept: int) -> None:
        """Keep the first ``kept`` (0 .. K) of the K tokens the last ``step_tokens`` fed and
        drop the rest: the state ends as if only those had been fed, the next step at
        P + ``kept`` (a speculative verify's rollback, docs/speculative.md). Keeping all K
        changes nothing, the default here; a backend that can roll back overrides it, one
        that cannot refuses (NotImplementedError, its reason)."""
        k = self.tokens_per_step
        if self.kept_of(kept) != k:
            raise NotImplementedError(f"{self.name} cannot roll back a step (keep {kept} of {k})")

    @property
    def commits_by_count(self) -> bool:
        """Whether the graph commits a verify's kept tokens itself, told the count
        (``accepted_count``: a deferred commit), beside the KV rows' rollback by position:
        the rollback strategy a speculative loop reports. None here."""
        return False

    def kept_of(self, kept: int) -> int:
        """``kept`` as the tokens kept of a K-token step, 0 .. K (ValueError otherwise)."""
        k = self.tokens_per_step
        if isinstance(kept, bool) or not 0 <= int(kept) <= k:
            raise ValueError(f"kept {kept!r}: the tokens kept of a step of {k}, 0 .. {k}")
        return int(kept)

    @abstractmethod
    def reset(self) -> None:
        """Empty the cache and return to position 0."""

    def gpu_time_ms(self) -> float | None:
        """GPU time of the last step where the device can time it, else None."""
        return None

    def host_breakdown_ms(self) -> dict[str, float] | None:
        """Where the last step's host time went, in ms per part (docs/measuring.md, "Host
        time"), where the backend can tell, else None."""
        return None

    def device_bytes(self) -> int | None:
        """Device bytes this backend allocated, where it can tell."""
        return None

    def close(self) -> None:  # noqa: B027 - optional hook, most backends free on GC
        """Release devices and sessions."""


_REGISTRY: dict[str, type[Backend]] = {}
#: the traits the harness asks of a backend class, each a bool
TRAITS = ("hidden_state", "uses_wgpu_adapter", "on_cpu", "host_cache", "runs_models")
#: what must be a classmethod of a registered backend
CLASS_METHODS = ("available", "runs_on", "create", "options_type", "model_refusal",
                 "preset_refusal")


def check_complete(cls: type[Backend]) -> None:
    """TypeError naming what is missing unless ``cls`` is a complete backend: a 'family:mode'
    name, every abstract method implemented, each trait a bool, the class methods class
    methods, and a backend that runs models building one for them (its own `create`).
    ``options_type()`` is not called here: it may import what only the backend needs."""
    if not isinstance(cls.name, str) or cls.name.count(":") != 1 or not all(cls.name.split(":")):
        raise TypeError(f"{cls.__name__}.name must be 'family:mode', not {cls.name!r}")
    missing = getattr(cls, "__abstractmethods__", frozenset())
    if missing:
        raise TypeError(f"{cls.__name__} does not implement {', '.join(sorted(missing))}")
    for trait in TRAITS:
        if not isinstance(getattr(cls, trait), bool):
            raise TypeError(f"{cls.__name__}.{trait} must be a bool, not {getattr(cls, trait)!r}")
    for meth in CLASS_METHODS:
        if not isinstance(inspect.getattr_static(cls, meth), classmethod):
            raise TypeError(f"{cls.__name__}.{meth} must be a classmethod")
    if cls.runs_models and cls.create.__func__ is Backend.create.__func__:
        raise TypeError(f"{cls.__name__} runs models but does not say how to build one (create)")


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator; checks the backend is complete (``check_complete``) before anyone
    can pick it, and that no other class has its name."""
    check_complete(cls)
    other = _REGISTRY.get(cls.name)
    if other is not None and other.__qualname__ != cls.__qualname__:
        raise TypeError(f"{cls.__name__}: the name {cls.name!r} is {other.__name__}'s")
    _REGISTRY[cls.name] = cls
    return cls


def registry() -> dict[str, type[Backend]]:
    """All known backends, importing the modules that define them."""
    from backends import load_all

    load_all()
    return dict(_REGISTRY)


def select(patterns: str) -> list[str]:
    """Resolve a comma list of names or globs (`ort-cpu:*`) to backend names, in order."""
    names = list(registry())
    chosen: list[str] = []
    for pat in (p.strip() for p in patterns.split(",")):
        if not pat:
            continue
        hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            raise UserError(f"unknown backend {pat!r}; accepted: {', '.join(names)} (globs allowed)")
        chosen += [h for h in hits if h not in chosen]
    if not chosen:
        raise UserError("no backend given")
    return chosen
