"""A page and the float64 reference at the same depth of a workload: the start of every
check that compares a page's steps with the reference's."""

from __future__ import annotations

import numpy as np

from backends.base import DepthState
from model.reference import Reference
from model.workload import Workload, token_stream


def at_depth(page, wl: Workload, cap: int, depth: int) -> tuple[np.ndarray, Reference]:
    """(the workload's tokens, the reference fed its first ``depth``), ``page`` brought to
    the same depth from the reference's cache."""
    tokens = token_stream(wl.config, cap)
    ref = Reference(wl.config, wl.weights, cap)
    ref.prefill(tokens[:depth])
    page.reach_depth(DepthState(tokens=tokens[:depth].copy(), cache=ref.cache_arrays()))
    return tokens, ref
