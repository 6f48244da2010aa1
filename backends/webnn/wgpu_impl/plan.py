"""What the compiler hands the context: launches (kernels and buffer copies, defined in
``launches``) and the storage slots they bind.

Slots (where an operand's elements live):
``("input", name)`` / ``("output", name)``: the page's MLTensor, resolved at dispatch;
``("temp", id)``: an intermediate buffer; ``("const", key)``: a constant buffer;
``("state", pair, "cur"|"next")``: a hidden state buffer (PROPOSAL);
``("status",)``: the capacity-check word (PROPOSAL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir import Node
from ..stateful import PairPlan
from . import fusion
from . import gemv as GV
from .launches import CopyLaunch, Deferred, KernelLaunch, Slot
from .match_attention import Attention
from .match_gdn import GatedDelta
from .options import KernelOptions
from .target import Target

__all__ = ["CopyLaunch", "Deferred", "KernelLaunch", "Plan", "Slot"]

if TYPE_CHECKING:
    from .match_q4 import Q4Weight


@dataclass
class Plan:
    """A graph's launches in order, the buffers they bind, and what the passes decided."""

    launches: list[Any] = field(default_factory=list)
    temps: dict[Slot, int] = field(default_factory=dict)  # slot -> 4-byte words
    consts: dict[Slot, np.ndarray | Deferred] = field(default_factory=dict)  # slot -> contents
    pairs: list[PairPlan] = field(default_factory=list)
    has_check: bool = False
    max_binding: int = 1 << 27  # the device's max storage-buffer binding size, bytes
    target: Target = field(default_factory=Target)
    options: KernelOptions = field(default_factory=KernelOptions)  # the context's
    groups: dict[int, fusion.Group] = field(default_factory=dict)  # root id -> fused group
    attention: dict[int, Attention] = field(default_factory=dict)  # probs·V id ->
    #: probs·V id -> its layer's K and V row writes, written by attention's pass 1
    attention_writes: dict[int, tuple[Node, Node]] = field(default_factory=dict)
    stacked: dict[int, list[Node]] = field(default_factory=dict)  # first gemv -> all
    fold: dict[int, Node] = field(default_factory=dict)  # matmul id -> B read transposed
    epilogue: dict[int, tuple[Node, Node]] = field(default_factory=dict)  # gemv -> (add, residual)
    #: gemv -> its input vector
    prologue: dict[int, GV.Prologue | GV.CombinePrologue] = field(default_factory=dict)
    #: probs·V id -> the product computing its combine (``GV.CombinePrologue``)
    combined: dict[int, int] = field(default_factory=dict)
    vectors: dict[int, GV.Prologue] = field(default_factory=dict)  # vector -> it + its reduction
    row_writes: dict[int, list[Node]] = field(default_factory=dict)  # first scatter -> all
    in_place: dict[int, PairPlan] = field(default_factory=dict)  # writer id -> its pair
    gdn: dict[int, GatedDelta] = field(default_factory=dict)  # anchor id -> matched step
    q4: dict[int, Q4Weight] = field(default_factory=dict)  # matmul id -> its 4-bit weights
    q4_rows: dict[int, Q4Weight] = field(default_factory=dict)  # the same, several rows
    stacked_rows: dict[int, list[Node]] = field(default_factory=dict)  # q4_rows of one input
    head_rows: dict[int, tuple[Node, int]] = field(default_factory=dict)  # q4_rows -> (attention out, D)
    gated: dict[int, GV.Gated] = field(default_factory=dict)  # first gemv -> what it writes
    norm_stats: dict[int, GV.NormStats] = field(default_factory=dict)  # gemv -> its partials
    capsule: dict[int, Any] = field(default_factory=dict)  # anchor -> GDN capture / replay


