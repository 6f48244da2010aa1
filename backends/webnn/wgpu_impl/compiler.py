"""Graph → ordered list of launches (kernels and buffer copies) with their storage slots.

Pure planning, no device calls: the context turns slots into buffers and launches into
pipelines and bind groups once, at build time.

Slots (where an operand's elements live):
``("input", name)`` / ``("output", name)``: the page's MLTensor, resolved at dispatch;
``("temp", id)``: an intermediate buffer; ``("const", key)``: a constant buffer;
``("state", pair, "cur"|"next")``: a hidden state buffer (PROPOSAL);
``("status",)``: the capacity-check word (PROPOSAL).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from .. import shapes as S
from .._classes import (
    MLKVCachePair,
    MLOperand,
    blocks,
)
from ..errors import NotSupportedError
from ..kernels import Kernel
from ..kernels import elementwise as EW
from ..kernels import matmul as MM
from ..kernels import movement as MV
from ..kernels import quant as QK
from ..kernels import reduce as RD
from ..stateful import PairPlan, analyse, root
from . import fusion
from . import gemv as GV
from .match_attention import Attention, last2_transpose_input, match_attention
from .match_gdn import GatedDelta, match_gated_delta
from .target import Target

Slot = tuple

#: kernel-variant overrides for benchmarks and tests (None: chosen per adapter);
#: "attention": None/"flash" (two-launch decode attention where the pattern matches),
#: "unfused" (QK, chain, softmax, split-K probs·V), "generic" (plain matmuls)
#: "gemv_prologue": where a gemv's input vector reads a one-element reduction (RMSNorm):
#: None/"launch" (the vector and its reduction in one launch of their own), "off" (each
#: launched on its own), "full" (both computed by each gemv workgroup: measured slower on
#: the H200, PERFORMANCE.md), "vector" (the vector computed by each gemv workgroup, the
#: reduction launched)
#: "row_writes": None (scatters of one index tensor into same-shaped caches: one launch),
#: "separate"
#: "attention_splits": None (kernels/attention.SPLITS) or the splits per head flash-decoding
#: aims at on long caches
#: "cache_copy": how a non-stateful scatter copies the unchanged cache into its output:
#: None (float32 caches: a vec4 copy kernel, 256 invocations a workgroup; on the H200 it
#: took llama-1b's reuse step at 8192 from 4.97 to 2.72 ms of GPU time), "identity" (the
#: element-wise identity kernel, one value per invocation), "buffer" (copy_buffer_to_buffer:
#: splits the pass); FINDINGS 18
#: "gemv_weights": how constant weights of the GPU matrix-vector kernels are stored: None
#: (float16 where every value of the constant is a float16 value, so nothing is lost; else
#: float32), "f32", "f16" (always: lossy unless the weights are float16 values)
#: "gdn": one decode step of a gated delta net (decay, retrieval, delta, rank-1 update,
#: output matvec and its scale) where the pattern matches (wgpu_impl/match_gdn.py): None (one
#: launch on GPU adapters, the generic ops on CPU adapters), "generic" (the ops one by one),
#: "fused[LANES][_sh][_norms]" (the one launch on any adapter; LANES invocations per state
#: row, default 32; "_sh": sums through workgroup memory, not subgroupAdd; "_norms": q's
#: and k's L2 norms keep their own launches instead of being folded into the kernel)
#: "record_ahead": None (per adapter: GPUs on, CPU adapters off), "on" (a context records
#: each dispatch's successor while the device runs it: context._record_ahead; its command
#: buffers in one queue.submit), "pieces" (the same, submitted one by one), "off"
#: (every dispatch encodes its own); read when a context is created
#: "f16_loads": how flash-decoding loads a float16 KV cache: None/"wide" (16-byte
#: ``vec4<u32>`` loads of 8 halves, unpacked, where the head dimension is a multiple of 8;
#: else as "vec4"), "vec4" (``vec4<f16>`` loads of 4 halves, or ``f16`` when d % 4 != 0)
#: "read_copy": None ("dispatch": a dispatch's readable outputs are copied to staging at the
#: end of its last command buffer, so a read right after only maps: context._read_copy_for),
#: "separate" (each read copies in a submit of its own), "separate_sync" (the same, and each
#: map preceded by wgpu-py's empty submit, as before either change: staging.map_read); read
#: when a context is created
OPTIONS: dict[str, str | None] = {"gemv": None, "attention": None, "gemv_prologue": None,
                                  "row_writes": None, "attention_splits": None,
                                  "record_ahead": None, "cache_copy": None,
                                  "gemv_weights": None, "gdn": None, "f16_loads": None,
                                  "read_copy": None}


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


@dataclass
class Plan:
    launches: list[Any] = field(default_factory=list)
    temps: dict[Slot, int] = field(default_factory=dict)  # slot -> 4-byte words
    consts: dict[Slot, np.ndarray | Deferred] = field(default_factory=dict)  # slot -> contents
    pairs: list[PairPlan] = field(default_factory=list)
    has_check: bool = False
    max_binding: int = 1 << 27  # the device's max storage-buffer binding size, bytes
    target: Target = field(default_factory=Target)
    groups: dict[int, fusion.Group] = field(default_factory=dict)  # root id -> fused group
    attention: dict[int, Attention] = field(default_factory=dict)  # probs·V id ->
    stacked: dict[int, list[MLOperand]] = field(default_factory=dict)  # first gemv -> all
    fold: dict[int, MLOperand] = field(default_factory=dict)  # matmul id -> B read transposed
    epilogue: dict[int, tuple[MLOperand, MLOperand]] = field(default_factory=dict)  # gemv -> (add, residual)
    prologue: dict[int, GV.Prologue] = field(default_factory=dict)  # gemv -> its input vector
    vectors: dict[int, GV.Prologue] = field(default_factory=dict)  # vector -> it + its reduction
    row_writes: dict[int, list[MLOperand]] = field(default_factory=dict)  # first scatter -> all
    in_place: dict[int, PairPlan] = field(default_factory=dict)  # writer id -> its pair
    gdn: dict[int, GatedDelta] = field(default_factory=dict)  # anchor id -> matched step


@dataclass
class _Step:
    """One schedulable unit: an op node's launches, an output copy, or the check."""

    key: float
    kind: str  # "op" | "copy" | "check"
    node: MLOperand | None = None
    reads: list[MLOperand] = field(default_factory=list)  # roots read
    writes: MLOperand | None = None  # root written
    copy_dst: Slot | None = None
    more: list[MLOperand] = field(default_factory=list)  # also written (stacked gemvs)

    @property
    def written(self) -> list[MLOperand]:
        return ([self.writes] if self.writes is not None else []) + self.more


def compile_graph(outputs: dict[str, MLOperand], pairs: list[MLKVCachePair],
                  stateful: bool, inputs: dict[str, MLOperand],
                  max_binding: int = 1 << 27, target: Target | None = None) -> Plan:
    plan = Plan(max_binding=max_binding, target=target or Target())
    dest: dict[int, Slot] = {}  # root id -> slot it must be computed into
    steps: list[_Step] = []
    extra_copies: list[tuple[MLOperand, Slot, str]] = []

    # -- where the results go ----------------------------------------------------------
    pair_outputs = {p.output for p in pairs} if stateful else set()
    if stateful:
        for i, p in enumerate(pairs):
            past = inputs[p.input]
            dest[past._id] = ("state", i, "cur")
            plan.pairs.append(analyse(i, p, past, outputs[p.output]))
    for name, o in outputs.items():
        if name in pair_outputs:
            continue
        r = root(o)
        if r._kind == "op" and r._id not in dest:
            dest[r._id] = ("output", name)
        else:
            extra_copies.append((r, ("output", name), name))
    for name, o in inputs.items():
        if o._id not in dest:
            dest[o._id] = ("input", name)

    # -- the op steps -----------------------------------------------------------------
    nodes = _reachable(list(outputs.values()))
    _check_float16(nodes)
    fold = plan.fold  # matmul id -> transpose input read with b_t
    for o in nodes:
        if o._kind == "op" and o._op == "matmul":
            src = last2_transpose_input(root(o._inputs[1]))
            if src is not None:
                fold[o._id] = src
    # -- loop fusion: element-wise chains computed inside their consumers ---------------
    writers = {pp.writer._id for pp in plan.pairs if pp.writer is not None}
    pinned = set(dest) | writers | {root(outputs[p.output])._id for p in pairs if stateful}
    # a matmul reading a transpose's input directly needs that input in memory: a fusible
    # one (a float16 cache's widening cast) must not be computed only inside the transpose
    pinned |= {src._id for src in fold.values()}
    inlined, groups = fusion.plan(nodes, pinned, writers,
                                   max(1, plan.target.max_storage - 3),
                                   no_read={inputs[p.input]._id for p in pairs})
    plan.groups = groups
    # -- decode attention: QK, score chain, softmax and probs·V in two launches ----------
    if OPTIONS.get("attention") in (None, "flash"):
        plan.attention = match_attention(nodes, inlined, groups, pinned,
                                         plan.target.shared_bytes)
    absorbed = {x._id for m in plan.attention.values() for x in m.absorbed}
    # -- matrix-vector products of one input against stacked weights: one launch --------
    gpu_gemv = not _gemv_variant(plan.target).startswith(("cols", "legacy"))
    if gpu_gemv:
        plan.stacked = GV.stacked_gemvs(nodes, fold, plan.max_binding)
    absorbed |= {x._id for ms in plan.stacked.values() for x in ms[1:]}
    # -- residual adds folded into the matrix-vector product feeding them -------------
    if gpu_gemv:
        plan.epilogue = GV.residual_epilogues(nodes, fold, inlined, groups, pinned | absorbed,
                                              set(plan.stacked))
    absorbed |= {add._id for add, _ in plan.epilogue.values()}
    # -- a gemv's input vector computed by the gemv (RMSNorm's tail, SwiGLU) ------------
    mode = OPTIONS.get("gemv_prologue") or "launch"
    if gpu_gemv and mode in ("full", "vector"):
        plan.prologue = GV.gemv_prologues(nodes, fold, inlined, groups, pinned | absorbed,
                                          plan.target, reductions=mode == "full")
    elif gpu_gemv and mode == "launch":
        # a graph output may be such a vector (it is written anyway); a state writer not
        plan.vectors = GV.row_reductions(nodes, inlined, groups, (pinned - set(dest)) | absorbed,
                                         pinned | absorbed, plan.target)
    absorbed |= {x._id for pro in plan.prologue.values() for x in pro.absorbed}
    absorbed |= {pro.reduce_op._id for pro in plan.vectors.values()}
    # -- row writes at one index tensor (a layer's K and V): one launch ----------------
    if OPTIONS.get("row_writes") != "separate":
        plan.row_writes = _row_write_groups(nodes, absorbed, groups, plan.target.max_storage)
    absorbed |= {x._id for ms in plan.row_writes.values() for x in ms[1:]}
    # -- a gated delta net's decode step: one launch ------------------------------------
    gdn = _gdn_variant(plan.target)
    if gdn is not None:
        vectors = set(plan.vectors) | {pro.reduce_op._id for pro in plan.vectors.values()}
        taken = (absorbed - vectors) | {*plan.attention, *plan.stacked, *plan.epilogue,
                                        *plan.prologue, *plan.row_writes}
        plan.gdn = match_gated_delta(nodes, inlined, groups, pinned, taken,
                                     plan.target.max_storage, vectors, fold_norms=gdn[2])
        for m in plan.gdn.values():  # q's and k's norms folded in: no launch of their own
            for nrm in m.norms:
                plan.vectors.pop(nrm.out._id, None)
    absorbed |= {x._id for m in plan.gdn.values() for x in m.absorbed}

    def reads_of(o: MLOperand) -> list[MLOperand]:
        """The roots one op's launch reads: its fused group's leaves or its inputs."""
        if o._id in plan.attention:
            return list(plan.attention[o._id].leaves)
        if o._id in plan.gdn:
            return list(plan.gdn[o._id].leaves)
        if o._id in plan.vectors:
            return list(plan.vectors[o._id].leaves)
        if o._id in groups:
            return list(groups[o._id].leaves)
        return [root(x) for x in o._inputs]

    for o in nodes:
        if o._kind != "op" or o._op == "reshape" or o._id in inlined or o._id in absorbed:
            continue
        reads = reads_of(o)
        if o._id in fold:
            reads[1] = fold[o._id]
        if o._id in plan.prologue:
            reads = list(plan.prologue[o._id].leaves) + reads[1:]
        more = plan.stacked.get(o._id, [o])[1:]
        for m in plan.row_writes.get(o._id, [o])[1:]:
            more.append(m)
            reads += [r for r in reads_of(m) if r not in reads]
        if o._id in plan.gdn:
            more.append(plan.gdn[o._id].state_out)  # the new state, written by the launch
        if o._id in plan.epilogue:
            add_node, res = plan.epilogue[o._id]
            reads.append(res)
            more.append(add_node)
        steps.append(_Step(o._id, "op", o, reads, o, more=more))
    for r, slot, _name in extra_copies:
        steps.append(_Step(1e18, "copy", None, [r], None, slot))

    check_step = None
    appends = [pp for pp in plan.pairs if pp.append]
    if appends:
        unique = list({root(pp.indices)._id: root(pp.indices) for pp in appends}.values())
        check_step = _Step(-1, "check", None, unique)
        steps.append(check_step)
        plan.has_check = True

    # -- the in-place decision (greedy, pair order) -------------------------------------
    chosen: list[PairPlan] = []
    for pp in plan.pairs:
        if pp.writer is None:
            continue
        if _schedule(steps, chosen + [pp], check_step) is not None:
            chosen.append(pp)
    for pp in chosen:
        pp.in_place = True
    for pp in plan.pairs:
        present = root(outputs[pp.pair.output])
        slot = ("state", pp.index, "cur" if pp.in_place else "next")
        if pp.writer is not None:
            dest[pp.writer._id] = slot
        else:
            steps.append(_Step(1e18, "copy", None, [present], None, slot))
    order = _schedule(steps, chosen, check_step)
    assert order is not None

    # -- liveness: drop steps nobody needs (e.g. a transpose folded into matmul) --------
    needed = {sl for sl in dest.values() if sl[0] in ("output", "state")}
    live_roots: set[int] = set()
    for st in reversed(order):
        if st.kind in ("copy", "check") or any(
                w._id in live_roots or dest.get(w._id) in needed for w in st.written):
            st.live = True  # type: ignore[attr-defined]
            live_roots.update(r._id for r in st.reads)
        else:
            st.live = False  # type: ignore[attr-defined]

    def slot_of(r: MLOperand) -> Slot:
        if r._id in dest:
            return dest[r._id]
        if r._kind == "constant":
            sl = ("const", r._id)
            plan.consts.setdefault(sl, r._value.astype(r._dtype.device_np, copy=False).reshape(-1))
            return sl
        sl = ("temp", r._id)
        plan.temps[sl] = -(-S.size(r._shape) * r._dtype.itemsize // 4)
        return sl

    in_place_writer = {pp.writer._id: pp for pp in chosen}
    plan.in_place = in_place_writer
    for st in order:
        if not st.live:  # type: ignore[attr-defined]
            continue
        if st.kind == "check":
            ids = [r._id for r in st.reads]
            k = MV.capacity_check([(pp.indices._dtype.wgsl, pp.indices._shape,
                                    pp.past._shape) for pp in appends],
                                  [ids.index(root(pp.indices)._id) for pp in appends])
            plan.launches.append(KernelLaunch(k, [("status",)] + [slot_of(r) for r in st.reads]))
        elif st.kind == "copy":
            r = st.reads[0]
            plan.launches.append(CopyLaunch(slot_of(r), st.copy_dst,
                                            r._dtype.itemsize * S.size(r._shape)))
        else:
            pp = in_place_writer.get(st.node._id)
            _lower(plan, st.node, st.reads, slot_of, pp, plan.has_check)
    return plan


#: ops the wgpu kernels run on float16 operands (WGSL f16 storage): casts, element-wise
#: ops, data movement and row writes, and a float16 K/V cast to float32 where decode
#: attention reads it (``attention.match_attention`` reads the float16 cache directly)
F16_OPS = fusion.FUSIBLE | {"reshape", "gather", "scatter_nd", "dequantize_linear"}


def _check_float16(nodes: list[MLOperand]) -> None:
    """NotSupportedError at build for an op on float16 operands the kernels do not cover
    (matmul, softmax, reductions, ...: they accumulate in float32 buffers)."""
    for o in nodes:
        if o._kind != "op" or o._op in F16_OPS:
            continue
        if any(x._dtype.wgsl == "f16" for x in (o, *o._inputs)):
            raise NotSupportedError(f"{o._op} on float16 operands is not supported by the wgpu "
                                    f"backend; cast them to float32 (supported on float16: "
                                    f"{', '.join(sorted(F16_OPS))})")


def _row_write_groups(nodes: list[MLOperand], absorbed: set[int], groups: dict[int, Any],
                      max_storage: int) -> dict[int, list[MLOperand]]:
    """scatter_nd ops writing same-shaped tensors at one index tensor (a layer's K and V
    rows), grouped: first id -> the group, within the storage-binding limit."""
    by_key: dict[tuple, list[MLOperand]] = {}
    for o in nodes:
        if o._kind == "op" and o._op == "scatter_nd" and o._id not in absorbed:
            key = (root(o._inputs[1])._id, tuple(o._shape), tuple(o._inputs[2]._shape),
                   o._dtype.wgsl)
            by_key.setdefault(key, []).append(o)
    out: dict[int, list[MLOperand]] = {}
    for ms in by_key.values():
        group: list[MLOperand] = []
        used = 2  # indices, status
        for m in ms:
            need = 1 + (len(groups[m._id].inner.leaves) if m._id in groups else 1)
            # members must not depend on each other (layer 1's K row needs layer 0's cache)
            independent = not any(g._id in _ancestors(m) for g in group)
            if group and (used + need > max_storage or not independent):
                if len(group) > 1:
                    out[group[0]._id] = group
                group, used = [], 2
            group.append(m)
            used += need
        if len(group) > 1:
            out[group[0]._id] = group
    return out


def _ancestors(o: MLOperand) -> set[int]:
    """Ids of every operand ``o`` depends on."""
    seen: set[int] = set()
    stack = list(o._inputs)
    while stack:
        x = stack.pop()
        if x._id not in seen:
            seen.add(x._id)
            stack.extend(x._inputs)
    return seen


def _reachable(outs: list[MLOperand]) -> list[MLOperand]:
    seen: dict[int, MLOperand] = {}
    stack = list(outs)
    while stack:
        o = stack.pop()
        if o._id not in seen:
            seen[o._id] = o
            stack.extend(o._inputs)
    return [seen[k] for k in sorted(seen)]  # creation order is a topological order


def _schedule(steps: list[_Step], in_place: list[PairPlan],
              check: _Step | None) -> list[_Step] | None:
    """Topological order honouring data dependencies plus, for each in-place pair, 'every
    other reader of the state before its writer' and 'the capacity check before any
    in-place write'. None if those constraints form a cycle."""
    producer = {w._id: st for st in steps for w in st.written}
    edges: dict[int, set[int]] = {id(st): set() for st in steps}  # step -> successors
    indeg = {id(st): 0 for st in steps}
    byid = {id(st): st for st in steps}

    def edge(a: _Step, b: _Step) -> None:
        if a is not b and id(b) not in edges[id(a)]:
            edges[id(a)].add(id(b))
            indeg[id(b)] += 1

    for st in steps:
        for r in st.reads:
            if r._id in producer:
                edge(producer[r._id], st)
    for pp in in_place:
        w = producer[pp.writer._id]
        for st in steps:
            if st is w or pp.past not in st.reads:
                continue
            edge(st, w)
        if w.node is not None:
            for k, x in enumerate(w.node._inputs):
                allowed = (pp.append and k == 0) or k == pp.alias_input
                if root(x) is pp.past and not allowed:
                    return None  # the writer reads the old state elsewhere
        if check is not None:
            edge(check, w)
    heap = [(st.key, n, id(st)) for n, st in enumerate(steps) if indeg[id(st)] == 0]
    heapq.heapify(heap)
    out: list[_Step] = []
    while heap:
        _, n, sid = heapq.heappop(heap)
        out.append(byid[sid])
        for nxt in edges[sid]:
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                heapq.heappush(heap, (byid[nxt].key, n + len(steps), nxt))
    return out if len(out) == len(steps) else None


#: gemv_cols variants: (columns per invocation, workgroup size, workgroups; 0: all blocks)
_COLS = {"cols": (8, 32, 8), "cols2": (2, 64, 0), "cols4": (4, 64, 0), "cols4g8": (4, 64, 8),
         "cols8g8": (8, 32, 8), "cols2g4": (2, 64, 4), "cols2g16": (2, 64, 16),
         "cols4g4": (4, 32, 4), "cols1g8": (1, 64, 8)}


#: gemv_rows variants: ``rows[LANES][_sh][_uDEPTH]`` (invocations per weight row, default 32;
#: ``_sh``: sums through workgroup memory, not subgroupAdd; vec4 loads in flight, default 4)
_ROWS_VARIANT = re.compile(r"rows(\d+)?(_sh)?(?:_u(\d+))?")


def _gemv_variant(t: Target, cols_ok: bool = True) -> str:
    """The matrix-vector kernel for this adapter (PERFORMANCE.md): one invocation per
    column on CPU adapters, ``lanes`` invocations per column with subgroup sums on GPUs."""
    v = OPTIONS.get("gemv") or ("cols" if t.cpu else "rows")
    if v.startswith("cols") and not cols_ok:
        v = "rows"
    return v


_GDN_VARIANT = re.compile(r"fused(\d+)?(_sh)?(_norms)?")


def _gdn_variant(t: Target) -> tuple[int, bool, bool] | None:
    """(lanes per state row, sums through workgroup memory, fold q's and k's L2 norms) of
    the gated delta kernel, or None for the generic ops (OPTIONS["gdn"]; by default the
    kernel on GPU adapters only, PERFORMANCE.md)."""
    how = OPTIONS.get("gdn")
    if how == "generic" or (how is None and t.cpu):
        return None
    m = _GDN_VARIANT.fullmatch(how or "fused")
    if m is None:
        raise ValueError(f"OPTIONS['gdn'] = {how!r}; accepted: None, 'generic', "
                         "'fused[LANES][_sh][_norms]' (e.g. 'fused', 'fused8_sh')")
    lanes = int(m.group(1) or 32)
    if lanes < 1 or lanes > 256 or lanes & (lanes - 1):
        raise ValueError(f"OPTIONS['gdn'] = {how!r}: lanes per state row must be a power of "
                         "two from 1 to 256")
    return lanes, bool(m.group(2)), not m.group(3)


def _gemv_rows(t: Target, variant: str, a_shape: Any, b_shape: Any, shp: Any, n0: int,
               chunk: int | None, residual: bool = False,
               splits: list[int] | None = None,
               prologue: MM.VectorSource | None = None, f16_weights: bool = False) -> Kernel:
    if variant == "legacy":
        return MM.gemv(a_shape, b_shape, shp, b_t=True, n_off=n0, n_chunk=chunk)
    m = _ROWS_VARIANT.fullmatch(variant)
    lanes = int(m.group(1) or 32) if m else 32
    depth = int(m.group(3) or 4) if m else 4
    if t.cpu and variant == "cols":
        lanes = 8
    sub = None if m and m.group(2) else t.subgroup
    return MM.gemv_rows(a_shape, b_shape, shp, n_off=n0, n_chunk=chunk, lanes=lanes,
                        wg=max(256, lanes), subgroup=sub, residual=residual, splits=splits,
                        prologue=prologue, depth=depth, f16_weights=f16_weights)


def _f16_weights(variant: str, K: int, values: list[np.ndarray]) -> bool:
    """Whether a constant-weight gemv streams float16 weights (OPTIONS["gemv_weights"]):
    the rows kernels only, K a multiple of 4."""
    how = OPTIONS.get("gemv_weights")
    if how == "f32" or not variant.startswith("rows") or K % 4:
        return False
    return how == "f16" or all(GV.f16_exact(v) for v in values)


def _weights(count: int, rows: Callable[[], np.ndarray], half: bool) -> Deferred:
    """``count`` weights of (N, K) rows as uploaded: float32, or float16 two to a u32."""
    return Deferred(count // 2, partial(GV.packed_f16, rows)) if half else Deferred(count, rows)


def _gemv_input(plan: Plan, o: MLOperand, ins: list[Slot],
                slot_of: Any) -> tuple[list[Slot], MM.VectorSource | None]:
    """(slots bound for a gemv's input vector, its prologue source or None): the vector's
    own slot, or the leaves the gemv computes it from."""
    pro = plan.prologue.get(o._id)
    if pro is None:
        return [ins[0]], None
    return [slot_of(x) for x in pro.leaves], pro.source()


def _lower(plan: Plan, o: MLOperand, reads: list[MLOperand], slot_of: Any,
           pp: PairPlan | None, has_check: bool) -> None:
    """Append the launches of one op node."""
    op = o._op
    out_slot = slot_of(o)
    t = o._dtype.wgsl
    shp = o._shape
    ins = [slot_of(r) for r in reads]
    guarded = pp is not None and has_check
    add = plan.launches.append
    if o._id in plan.stacked:
        group = plan.stacked[o._id]
        parts = [GV.const_weight(m, plan.fold) for m in group]
        sizes = [m._shape[-1] for m in group]
        K = o._inputs[0]._shape[-1]
        variant = _gemv_variant(plan.target)
        half = _f16_weights(variant, K, [src._value for src, _, _ in parts])
        slot = ("const", ("S", o._id))
        plan.consts.setdefault(slot, _weights(sum(sizes) * K, partial(GV.stacked_rows, parts),
                                              half))
        a_slots, source = _gemv_input(plan, o, ins, slot_of)
        k = _gemv_rows(plan.target, variant, o._inputs[0]._shape,
                       (sum(sizes), K), (1, sum(sizes)), 0, None, splits=sizes,
                       prologue=source, f16_weights=half)
        add(KernelLaunch(k, a_slots + [slot] + [slot_of(m) for m in group]))
    elif o._id in plan.gdn:
        m = plan.gdn[o._id]
        lanes, shared, _ = _gdn_variant(plan.target) or (32, False, True)
        old, new = slot_of(m.state_in), slot_of(m.state_out)
        in_place = old == new  # the paired state updated where it lies (each row by its lanes)
        guarded = has_check and m.state_out._id in plan.in_place
        k = m.kernel(in_place, guarded, lanes, None if shared else plan.target.subgroup)
        add(KernelLaunch(k, ins[in_place:] + [new, out_slot] + ([("status",)] if guarded else [])))
    elif o._id in plan.attention:
        splits = OPTIONS.get("attention_splits")
        k1, k2, parts = plan.attention[o._id].kernels(plan.target.shared_bytes,
                                                      int(splits) if splits else None,
                                                      OPTIONS.get("f16_loads"))
        part = ("temp", ("flash", o._id))
        plan.temps[part] = parts
        add(KernelLaunch(k1, ins + [part]))
        add(KernelLaunch(k2, [part, out_slot]))
    elif o._id in plan.vectors:
        vec = plan.vectors[o._id]
        count = S.size(shp)
        traffic = 4 * (sum(S.size(x._shape) for x in vec.leaves) + count)
        add(KernelLaunch(MM.computed_vector(vec.source(), count, traffic, count // shp[-1]),
                         ins + [out_slot]))
    elif o._id in plan.groups and not fusion.is_host(o):  # hosts: below, per op
        group = plan.groups[o._id]
        add(KernelLaunch(group.kernel(guarded), [slot_of(x) for x in group.leaves] + [out_slot]
                         + ([("status",)] if guarded else [])))
    elif op in fusion.ELEMENTWISE:
        alias = pp.alias_input if pp is not None else None
        k = EW.elementwise(op, [x._dtype.wgsl for x in o._inputs],
                           [x._shape for x in o._inputs], t, shp, alias=alias,
                           guarded=guarded)
        slots = [s for j, s in enumerate(ins) if j != alias] + [out_slot]
        add(KernelLaunch(k, slots + ([("status",)] if guarded else [])))
    elif op == "matmul":
        a, b = o._inputs
        src = plan.fold.get(o._id, root(b))  # storage read for B (reshapes are views)
        b_t = src is not root(b)
        # B's logical shape: the transpose's input when the transpose is folded
        b_shape = root(b)._inputs[0]._shape if b_t else b._shape
        M = a._shape[-2]
        if M == 1 and src._kind == "constant" and len(b_shape) == 2:
            # constants are the implementation's business: weights repacked (N, K), each
            # chunk at upload time (Deferred), so the host never holds a second model
            N, K = (b_shape[0], b_shape[1]) if b_t else (b_shape[1], b_shape[0])
            variant = _gemv_variant(plan.target)
            half = _f16_weights(variant, K, [src._value])
            per = max(8, (plan.max_binding // (4 * K)) // 8 * 8)
            for c, n0 in enumerate(range(0, N, per)):
                nc = min(per, N - n0)
                chunk = None if nc == N else nc
                rows = partial(GV.weight_rows, src, b_shape, b_t, n0, nc)
                if variant.startswith("cols"):
                    # k-major, interleaved by column (kernels/matmul.py gemv_cols)
                    slot = ("const", ("C", src._id, c))
                    plan.consts.setdefault(slot, Deferred(nc * K, partial(GV.interleave, rows, nc, K)))
                    ncols, wg, ng = _COLS.get(variant, _COLS["cols"])
                    k = MM.gemv_cols(a._shape, K, shp, n_off=n0, n_chunk=chunk, cols=ncols,
                                     wg=wg, groups=ng)
                    add(KernelLaunch(k, [ins[0], slot, out_slot]))
                    continue
                if b_t and nc == N and not half:
                    slot = slot_of(src)  # already (N, K) and whole: the constant itself
                else:
                    slot = ("const", ("H" if half else "T", src._id, c))
                    plan.consts.setdefault(slot, _weights(nc * K, rows, half))
                if variant == "legacy":
                    k = MM.gemv(a._shape, (N, K), shp, b_t=True, n_off=n0, n_chunk=chunk)
                    add(KernelLaunch(k, [ins[0], slot, out_slot]))
                else:
                    a_slots, source = _gemv_input(plan, o, ins, slot_of)
                    dst, res = plan.epilogue.get(o._id, (o, None))  # (the add, residual)
                    k = _gemv_rows(plan.target, variant, a._shape, (N, K), shp, n0, chunk,
                                   residual=res is not None, prologue=source, f16_weights=half)
                    add(KernelLaunch(k, a_slots + [slot] + ([slot_of(res)] if res is not None
                                                            else []) + [slot_of(dst)]))
        elif b_t and M == 1:
            k = _gemv_rows(plan.target, _gemv_variant(plan.target, cols_ok=False), a._shape,
                           b_shape, shp, 0, None)
            add(KernelLaunch(k, [ins[0], ins[1], out_slot]))
        elif 1 < M <= 8 and b_t and OPTIONS.get("attention") != "generic":
            add(KernelLaunch(MM.matmul_bt_small_m(a._shape, b_shape, shp),
                             [ins[0], ins[1], out_slot]))
        elif (M <= 8 and not b_t and a._shape[-1] >= 256
              and OPTIONS.get("attention") != "generic"):
            chunk = 512 if plan.target.cpu else 64
            k1, k2, parts = MM.matmul_splitk(a._shape, b_shape, shp, chunk)
            part = ("temp", ("splitk", o._id))
            plan.temps[part] = parts
            add(KernelLaunch(k1, [ins[0], ins[1], part]))
            add(KernelLaunch(k2, [part, out_slot]))
        else:
            add(KernelLaunch(MM.matmul(a._shape, b_shape, shp, b_t=b_t),
                             [ins[0], ins[1], out_slot]))
    elif op == "dequantize_linear":
        x, scale, _ = o._inputs
        k = QK.dequantize_linear(x._dtype.name, x._shape, blocks(x._shape, scale._shape), t)
        add(KernelLaunch(k, ins + [out_slot]))
    elif op == "softmax":
        x = o._inputs[0]
        wg = 256 if not plan.target.cpu and x._shape[o._attrs["axis"]] >= 1024 else 64
        add(KernelLaunch(RD.softmax(x._shape, o._attrs["axis"], wg), [ins[0], out_slot]))
    elif op.startswith("reduce_"):
        group = plan.groups.get(o._id)
        wg = 64 if plan.target.cpu else 256
        add(KernelLaunch(RD.reduce(op, t, o._inputs[0]._shape, o._attrs["axes"],
                                   group.input_source() if group else None, wg=wg),
                         [slot_of(x) for x in group.inner.leaves] + [out_slot] if group
                         else [ins[0], out_slot]))
    elif op == "transpose":
        x = o._inputs[0]
        st = S.strides(x._shape)
        k = MV.strided_copy(t, shp, 0, [st[p] for p in o._attrs["permutation"]], 0,
                            S.strides(shp), "transpose")
        add(KernelLaunch(k, [ins[0], out_slot]))
    elif op == "slice":
        x = o._inputs[0]
        st = S.strides(x._shape)
        base = sum(s * d for s, d in zip(o._attrs["starts"], st, strict=False))
        k = MV.strided_copy(t, shp, base, [d * s for d, s in zip(st, o._attrs["strides"], strict=False)],
                            0, S.strides(shp), "slice")
        add(KernelLaunch(k, [ins[0], out_slot]))
    elif op == "concat":
        ax = o._attrs["axis"]
        ost = S.strides(shp)
        off = 0
        for x, sl in zip(o._inputs, ins, strict=False):
            k = MV.strided_copy(t, x._shape, 0, S.strides(x._shape), off * ost[ax], ost,
                                "concat")
            add(KernelLaunch(k, [sl, out_slot]))
            off += x._shape[ax]
    elif op == "gather":
        x, idx = o._inputs
        ax = o._attrs["axis"]
        src = reads[0]
        row = 4 * S.size(x._shape[1:])
        if src._kind == "constant" and ax == 0 and row * x._shape[0] > plan.max_binding:
            # a table beyond the storage-binding limit (a 128k-row embedding): one launch
            # per chunk of rows, each writing the outputs whose index falls in it
            per = max(1, plan.max_binding // row)
            flat = src._value.astype(src._dtype.device_np, copy=False).reshape(x._shape[0], -1)
            for c, r0 in enumerate(range(0, x._shape[0], per)):
                slot = ("const", ("G", src._id, c))
                plan.consts.setdefault(slot, np.ascontiguousarray(flat[r0:r0 + per]).reshape(-1))
                k = MV.gather(t, idx._dtype.wgsl, x._shape, idx._shape, 0,
                              rows=(r0, min(r0 + per, x._shape[0])))
                add(KernelLaunch(k, [slot, ins[1], out_slot]))
        else:
            k = MV.gather(t, idx._dtype.wgsl, x._shape, idx._shape, ax)
            add(KernelLaunch(k, [ins[0], ins[1], out_slot]))
    elif op == "scatter_nd":
        idx = o._inputs[1]
        members = plan.row_writes.get(o._id, [o])
        guarded = has_check and any(m._id in plan.in_place for m in members)
        updates, upd_slots = [], []
        for j, m in enumerate(members):
            mp = plan.in_place.get(m._id)
            if not (mp is not None and mp.append):
                # the unchanged rows are copied by a kernel in the same compute pass: a
                # copy_buffer_to_buffer would split the pass (a pipeline barrier per cache
                # on NVIDIA, ~7 ms per llama-1b step on the H200), a cost of this
                # implementation, not of the stateless API. Counted as kernel bytes.
                pair = [slot_of(root(m._inputs[0])), slot_of(m)]
                how = OPTIONS.get("cache_copy")
                if how == "buffer":
                    add(CopyLaunch(*pair, o._dtype.itemsize * S.size(shp)))
                elif how in (None, "vec4") and t in ("f32", "f16"):
                    add(KernelLaunch(MV.copy_vec4(S.size(shp), itemsize=o._dtype.itemsize),
                                     pair))
                else:
                    add(KernelLaunch(EW.elementwise("identity", [t], [shp], t, shp), pair))
            group = plan.groups.get(m._id)  # updates computed by the row write (RoPE of k)
            if group is None:
                updates.append(None)
                upd_slots.append(slot_of(root(m._inputs[2])))
            else:
                updates.append(group.input_source(first=1 + len(upd_slots), prefix=f"u{j}_"))
                upd_slots += [slot_of(leaf) for leaf in group.inner.leaves]
        k = MV.scatter_nd(t, idx._dtype.wgsl, shp, idx._shape, guarded=guarded, updates=updates)
        add(KernelLaunch(k, [slot_of(root(idx))] + upd_slots + [slot_of(m) for m in members]
                         + ([("status",)] if guarded else [])))
    else:
        raise NotImplementedError(f"op {op!r}")
