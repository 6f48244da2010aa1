"""The one protocol every backend implements, its byte counters, and the registry.

A backend is one way a page (or an ORT user) carries the decode state across steps. The runner
only talks to this protocol; backends count their own bytes where the bytes move (DESIGN §7).
"""

from __future__ import annotations

import fnmatch
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

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


class Backend(ABC):
    """Prepare for a workload and capacity, reach depth, step one token, reset.

    Subclasses set `name` ("family:mode") and count bytes into `self.counters`.
    """

    name: str = ""
    #: True when the cache is hidden (reached by dispatching, never written by the page)
    hidden_state: bool = False
    #: True when `available()` asks wgpu for an adapter: the harness asks first, in a child
    #: process (a driver can abort the process that enumerates adapters), and marks the
    #: backend unavailable with that probe's reason where it found none
    uses_wgpu_adapter: bool = False

    def __init__(self) -> None:
        self.counters = ByteCounters()
        self.details: dict[str, object] = {}  # per-point facts for the results (e.g. in_place per pair)

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
        """Feed one token at the current position; return float32 logits (vocab,) on the host.
        The array may be the backend's own, overwritten by its next step (a page reading
        with ``readTensor(tensor, outputData)``): copy it to keep it."""

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


BackendFactory = Callable[[], Backend]
_REGISTRY: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator; checks the backend is complete before anyone can pick it."""
    if not cls.name or ":" not in cls.name:
        raise TypeError(f"{cls.__name__}.name must be 'family:mode'")
    missing = getattr(cls, "__abstractmethods__", frozenset())
    if missing:
        raise TypeError(f"{cls.__name__} does not implement {', '.join(sorted(missing))}")
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
