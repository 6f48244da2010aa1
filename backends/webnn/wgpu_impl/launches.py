"""The launches a plan is made of (kernels and buffer copies), the storage slots they bind,
and constant contents made at upload: apart from ``plan`` so the lowerings registered by
the matchers can build them without importing the plan (which imports the matchers)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..kernels import Kernel

Slot = tuple


@dataclass
class Deferred:
    """A constant buffer's contents, made when the context uploads it (then dropped)."""

    size: int  # 4-byte words (float32 or packed float16 pairs)
    make: Callable[[], np.ndarray]


@dataclass
class KernelLaunch:
    kernel: Kernel
    slots: list[Slot]


@dataclass
class CopyLaunch:
    """A device buffer-to-buffer copy (counted d2d)."""

    src: Slot
    dst: Slot
    nbytes: int
