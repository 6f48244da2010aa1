"""Lowering: each planned step to its launches (WGSL kernels generated for its shapes, or
buffer copies), and each operand to the storage slot those launches bind.

Which function lowers an op node is the registry's (``lowerings``): the matchers' lowerings
(in ``gemv``, ``fusion``, ``match_*``) and the plain ops' below, one a family.
"""

from __future__ import annotations

import numpy as np

from .. import shapes as S
from .._classes import blocks
from ..ir import Node
from ..kernels import elementwise as EW
from ..kernels import matmul as MM
from ..kernels import movement as MV
from ..kernels import pool as PL
from ..kernels import quant as QK
from ..kernels import reduce as RD
from ..kernels import upsample as UP
from ..stateful import root
from . import fusion, match_attention, match_gdn, match_gdn_capsule, match_q4  # noqa: F401  (registers)
from . import gemv as GV  # registers
from .launches import CopyLaunch, KernelLaunch, Slot
from .lowerings import Site, claims, lowering_of, lowers
from .plan import Plan
from .planning import Step

REDUCE_OPS = ("reduce_mean", "reduce_sum", "reduce_max", "reduce_min", "reduce_product")


def lower_steps(plan: Plan, order: list[Step], dest: dict[int, Slot]) -> None:
    """Append the launches of every live step, in order; operands without a destination
    get a constant or an intermediate slot."""

    def slot_of(r: Node) -> Slot:
        if r.id in dest:
            return dest[r.id]
        if r.kind == "constant":
            sl = ("const", r.id)
            plan.consts.setdefault(sl, r.value.astype(r.dtype.device_np, copy=False).reshape(-1))
            return sl
        sl = ("temp", r.id)
        plan.temps[sl] = -(-S.size(r.shape) * r.dtype.itemsize // 4)
        return sl

    appends = [pp for pp in plan.pairs if pp.append]
    for st in order:
        if not st.live:
            continue
        if st.kind == "check":
            ids = [r.id for r in st.reads]
            k = MV.capacity_check([(pp.indices.dtype.wgsl, pp.indices.shape,
                                    pp.past.shape) for pp in appends],
                                  [ids.index(root(pp.indices).id) for pp in appends])
            plan.launches.append(KernelLaunch(k, [("status",)] + [slot_of(r) for r in st.reads]))
        elif st.kind == "copy":
            r = st.reads[0]
            plan.launches.append(CopyLaunch(slot_of(r), st.copy_dst,
                                            r.dtype.itemsize * S.size(r.shape)))
        else:
            n = Site(plan, st.node, st.reads, slot_of, plan.in_place.get(st.node.id),
                     plan.has_check)
            lowering_of(plan, st.node)(n)



@lowers(*sorted(fusion.ELEMENTWISE))
def _elementwise(n: Site) -> None:
    """One element-wise op (not fused): an input the pair aliases in place is not bound."""
    o = n.node
    alias = n.pair.alias_input if n.pair is not None else None
    k = EW.elementwise(o.op, [x.dtype.wgsl for x in o.inputs], [x.shape for x in o.inputs],
                       n.wgsl, n.shape, alias=alias, guarded=n.guarded, attrs=o.attrs)
    slots = [s for j, s in enumerate(n.ins) if j != alias] + [n.out]
    n.add(KernelLaunch(k, slots + n.status()))


@lowers("matmul")
def _matmul(n: Site) -> None:
    """A product: one row times constant weights (``gemv``), one row or a few against a
    transposed B, a few rows split along K, or the generic tiled kernel."""
    plan, o, ins, out, shp = n.plan, n.node, n.ins, n.out, n.shape
    a, b = o.inputs
    src = plan.fold.get(o.id, root(b))  # storage read for B (reshapes are views)
    b_t = src is not root(b)
    # B's logical shape: the transpose's input when the transpose is folded
    b_shape = root(b).inputs[0].shape if b_t else b.shape
    M = a.shape[-2]
    if M == 1 and src.kind == "constant" and len(b_shape) == 2:
        GV.lower_const_gemv(n, src, b_shape, b_t)
    elif b_t and M == 1:
        k = GV.gemv_rows(plan.target, plan.options.gemv_variant(plan.target, cols_ok=False),
                         a.shape, b_shape, shp, 0, None)
        n.add(KernelLaunch(k, [ins[0], ins[1], out]))
    elif 1 < M <= 8 and b_t and plan.options.attention != "generic":
        n.add(KernelLaunch(MM.matmul_bt_small_m(a.shape, b_shape, shp), [ins[0], ins[1], out]))
    elif M <= 8 and not b_t and a.shape[-1] >= 256 and plan.options.attention != "generic":
        chunk = 512 if plan.target.cpu else 64
        k1, k2, parts = MM.matmul_splitk(a.shape, b_shape, shp, chunk)
        part = ("temp", ("splitk", o.id))
        plan.temps[part] = parts
        n.add(KernelLaunch(k1, [ins[0], ins[1], part]))
        n.add(KernelLaunch(k2, [part, out]))
    else:
        n.add(KernelLaunch(MM.matmul(a.shape, b_shape, shp, b_t=b_t), [ins[0], ins[1], out]))


@lowers("dequantize_linear")
def _dequantize_linear(n: Site) -> None:
    x, scale, zp = n.node.inputs
    k = QK.dequantize_linear(x.dtype.name, x.shape, blocks(x.shape, scale.shape), n.wgsl,
                             x_packed=_packed(x), zp_packed=_packed(zp))
    n.add(KernelLaunch(k, n.ins + [n.out]))


def _packed(x: Node) -> bool:
    """Whether an int4/uint4 operand lies packed (a constant: ``dtypes``), not a word an
    element."""
    return x.kind == "constant"


@lowers("quantize_linear")
def _quantize_linear(n: Site) -> None:
    x, scale, zp = n.node.inputs
    k = QK.quantize_linear(n.node.dtype.name, x.dtype.wgsl, x.shape,
                           blocks(x.shape, scale.shape), zp_packed=_packed(zp))
    n.add(KernelLaunch(k, n.ins + [n.out]))


@lowers("softmax")
def _softmax(n: Site) -> None:
    x, axis = n.node.inputs[0], n.node.attrs["axis"]
    wg = 256 if not n.plan.target.cpu and x.shape[axis] >= 1024 else 64
    n.add(KernelLaunch(RD.softmax(x.shape, axis, wg), [n.ins[0], n.out]))


@lowers(*REDUCE_OPS)
def _reduce(n: Site) -> None:
    """A reduction, reading its input's fused group (if any) itself."""
    o = n.node
    group = n.plan.groups.get(o.id)
    wg = 64 if n.plan.target.cpu else 256
    k = RD.reduce(o.op, n.wgsl, o.inputs[0].shape, o.attrs["axes"],
                  group.input_source() if group else None, wg=wg)
    reads = [n.slot_of(x) for x in group.inner.leaves] if group else [n.ins[0]]
    n.add(KernelLaunch(k, reads + [n.out]))


@lowers("arg_min", "arg_max")
def _arg_reduce(n: Site) -> None:
    """argMin / argMax: an invocation or a workgroup a row (``arg_reduce``); a row longer than
    ``ARG_SPLIT_ROW`` (a vocabulary's logits) over several workgroups, then combined
    (``arg_split``)."""
    x = n.node.inputs[0]
    wg = 64 if n.plan.target.cpu else 256
    axis = n.node.attrs["axis"]
    if x.shape[axis] > RD.ARG_SPLIT_ROW:  # a vocabulary's row: split over workgroups
        k1, k2, words = RD.arg_split(n.node.op, x.dtype.wgsl, x.shape, axis, wg=wg)
        part = ("temp", ("arg_split", n.node.id))
        n.plan.temps[part] = words
        n.add(KernelLaunch(k1, [n.ins[0], part]))
        n.add(KernelLaunch(k2, [part, n.out]))
        return
    k = RD.arg_reduce(n.node.op, x.dtype.wgsl, x.shape, axis, wg=wg)
    n.add(KernelLaunch(k, [n.ins[0], n.out]))


@lowers(*PL.POOL_OPS)
def _pool2d(n: Site) -> None:
    """averagePool2d / l2Pool2d / maxPool2d: an invocation an output element, its window
    looped (float16 widened to float32 by the builder, as reductions are)."""
    a = n.node.attrs
    k = PL.pool2d(n.node.op, n.wgsl, n.node.inputs[0].shape, n.shape, a["layout"], a["window"],
                  a["padding"], a["strides"], a["dilations"])
    n.add(KernelLaunch(k, [n.ins[0], n.out]))


@lowers("transpose")
def _transpose(n: Site) -> None:
    o = n.node
    st = S.strides(o.inputs[0].shape)
    k = MV.strided_copy(n.wgsl, n.shape, 0, [st[p] for p in o.attrs["permutation"]], 0,
                        S.strides(n.shape), "transpose", guarded=n.guarded)
    n.add(KernelLaunch(k, [n.ins[0], n.out] + n.status()))


@lowers("slice")
def _slice(n: Site) -> None:
    o = n.node
    st = S.strides(o.inputs[0].shape)
    base = sum(s * d for s, d in zip(o.attrs["starts"], st, strict=False))
    k = MV.strided_copy(n.wgsl, n.shape, base,
                        [d * s for d, s in zip(st, o.attrs["strides"], strict=False)],
                        0, S.strides(n.shape), "slice", guarded=n.guarded)
    n.add(KernelLaunch(k, [n.ins[0], n.out] + n.status()))


@lowers("concat")
def _concat(n: Site) -> None:
    """One launch writing every input at its offset along the axis (the fused kernel, a
    group of the concat alone): a conv window's ``concat(past, new column)`` costs no more
    launches than the fused concats a preset's spelling gets; a strided copy an input where
    the inputs exceed the storage-binding limit."""
    o = n.node
    group = fusion.collect(o, set())[0]
    bindings = len(group.leaves) + 1 + len(n.status())
    if len(o.inputs) > 1 and bindings <= n.plan.target.max_storage:
        n.add(KernelLaunch(group.kernel(n.guarded),
                           [n.slot_of(x) for x in group.leaves] + [n.out] + n.status()))
        return
    ax = o.attrs["axis"]
    ost = S.strides(n.shape)
    off = 0
    for x, sl in zip(o.inputs, n.ins, strict=False):
        k = MV.strided_copy(n.wgsl, x.shape, 0, S.strides(x.shape), off * ost[ax], ost,
                            "concat", guarded=n.guarded)
        n.add(KernelLaunch(k, [sl, n.out] + n.status()))
        off += x.shape[ax]


@lowers("gather")
def _gather(n: Site) -> None:
    o, plan, t = n.node, n.plan, n.wgsl
    x, idx = o.inputs
    ax = o.attrs["axis"]
    src = n.reads[0]
    row = 4 * S.size(x.shape[1:])
    if not (src.kind == "constant" and ax == 0 and row * x.shape[0] > plan.max_binding):
        k = MV.gather(t, idx.dtype.wgsl, x.shape, idx.shape, ax)
        n.add(KernelLaunch(k, [n.ins[0], n.ins[1], n.out]))
        return
    # a table beyond the storage-binding limit (a 128k-row embedding): chunks of rows, as
    # many bound to one launch as the storage-buffer limit allows (``gather_chunks``), each
    # launch writing only the outputs whose index falls in its chunks
    per = max(1, plan.max_binding // row)
    flat = src.value.astype(src.dtype.device_np, copy=False).reshape(x.shape[0], -1)
    bounds = [(r0, min(r0 + per, x.shape[0])) for r0 in range(0, x.shape[0], per)]
    slots = []
    for c, (r0, r1) in enumerate(bounds):
        slots.append(("const", ("G", src.id, c)))
        plan.consts.setdefault(slots[-1], np.ascontiguousarray(flat[r0:r1]).reshape(-1))
    take = max(1, plan.target.max_storage - 2)
    for c0 in range(0, len(bounds), take):
        k = MV.gather_chunks(t, idx.dtype.wgsl, x.shape, idx.shape, bounds[c0:c0 + take])
        n.add(KernelLaunch(k, slots[c0:c0 + take] + [n.ins[1], n.out]))


@lowers("gather_elements")
def _gather_elements(n: Site) -> None:
    x, idx = n.node.inputs
    k = MV.gather_elements(n.wgsl, idx.dtype.wgsl, x.shape, idx.shape, n.node.attrs["axis"])
    n.add(KernelLaunch(k, [n.ins[0], n.ins[1], n.out]))


@lowers("gather_nd")
def _gather_nd(n: Site) -> None:
    x, idx = n.node.inputs
    n.add(KernelLaunch(MV.gather_nd(n.wgsl, idx.dtype.wgsl, x.shape, idx.shape),
                       [n.ins[0], n.ins[1], n.out]))


@lowers("reverse")
def _reverse(n: Site) -> None:
    n.add(KernelLaunch(MV.reverse(n.wgsl, n.shape, n.node.attrs["axes"]), [n.ins[0], n.out]))


def _unchanged_rows(n: Site, m: Node) -> None:
    """The rows a row write leaves unchanged, copied into its result by a kernel in the same
    compute pass: a copy_buffer_to_buffer would split the pass (a pipeline barrier per cache
    on NVIDIA; PERFORMANCE.md, "Knobs"), a cost of this implementation, not of the
    stateless API. Counted as kernel bytes."""
    t, shp = n.wgsl, n.shape
    pair = [n.slot_of(root(m.inputs[0])), n.slot_of(m)]
    how = n.plan.options.cache_copy
    if how == "buffer":
        n.add(CopyLaunch(*pair, n.node.dtype.itemsize * S.size(shp)))
    elif how in (None, "vec4") and t in ("f32", "f16"):
        n.add(KernelLaunch(MV.copy_vec4(S.size(shp), itemsize=n.node.dtype.itemsize), pair))
    else:
        n.add(KernelLaunch(EW.elementwise("identity", [t], [shp], t, shp), pair))


@lowers("scatter_nd")
def _scatter_nd(n: Site) -> None:
    """Row writes at one index tensor (``plan.row_writes``: a layer's K and V), one launch;
    the rows of a write not in place copied first."""
    plan, o = n.plan, n.node
    idx = o.inputs[1]
    members = plan.row_writes.get(o.id, [o])
    guarded = n.has_check and any(m.id in plan.in_place for m in members)
    updates, upd_slots = [], []
    for j, m in enumerate(members):
        mp = plan.in_place.get(m.id)
        if not (mp is not None and mp.append):
            _unchanged_rows(n, m)
        group = plan.groups.get(m.id)  # updates computed by the row write (RoPE of k)
        if group is None:
            updates.append(None)
            upd_slots.append(n.slot_of(root(m.inputs[2])))
        else:
            updates.append(group.input_source(first=1 + len(upd_slots), prefix=f"u{j}_"))
            upd_slots += [n.slot_of(leaf) for leaf in group.inner.leaves]
    k = MV.scatter_nd(n.wgsl, idx.dtype.wgsl, n.shape, idx.shape, guarded=guarded,
                      updates=updates)
    n.add(KernelLaunch(k, [n.slot_of(root(idx))] + upd_slots + [n.slot_of(m) for m in members]
                       + n.status(guarded)))


@lowers("cumulative_sum")
def _cumulative_sum(n: Site) -> None:
    a = n.node.attrs
    n.add(KernelLaunch(RD.cumulative_sum(n.wgsl, n.shape, a["axis"], a["exclusive"],
                                         a["reversed"]), [n.ins[0], n.out]))


@lowers("scatter_elements")
def _scatter_elements(n: Site) -> None:
    """The input copied, then the updates written at their indices."""
    t, shp = n.wgsl, n.shape
    idx = n.node.inputs[1]
    n.add(KernelLaunch(MV.strided_copy(t, shp, 0, S.strides(shp), 0, S.strides(shp), "copy"),
                       [n.ins[0], n.out]))
    n.add(KernelLaunch(MV.scatter_elements(t, idx.dtype.wgsl, shp, idx.shape,
                                           n.node.attrs["axis"]), [n.ins[1], n.ins[2], n.out]))


@lowers("pad")
def _pad(n: Site) -> None:
    """Edge or reflection padding, one launch (constant padding is a concat at build)."""
    a = n.node.attrs
    n.add(KernelLaunch(MV.pad(n.wgsl, n.node.inputs[0].shape, a["beginning"], n.shape,
                              a["mode"]), [n.ins[0], n.out]))


@lowers("resample2d")
def _resample2d(n: Site) -> None:
    a = n.node.attrs
    n.add(KernelLaunch(UP.resample2d(n.wgsl, n.node.inputs[0].shape, n.shape, a["axes"],
                                     a["mode"]), [n.ins[0], n.out]))


@lowers("conv_transpose2d")
def _conv_transpose2d(n: Site) -> None:
    """One launch; the filter and bias are bound as they are (any layout, no repacking)."""
    o, a = n.node, n.node.attrs
    k = UP.conv_transpose2d(n.wgsl, o.inputs[0].shape, o.inputs[1].shape, n.shape,
                            a["padding"], a["strides"], a["dilations"], a["groups"],
                            a["input_layout"], a["filter_layout"], len(o.inputs) == 3)
    n.add(KernelLaunch(k, n.ins + [n.out]))


def _too_large(plan: Plan, o: Node) -> bool:
    """An element-wise op (or fused group of them) binding more than one storage binding
    holds (a float32 [6000, 6000] add is 144 MB against 128 MiB)."""
    if o.op not in fusion.ELEMENTWISE or o.id in plan.in_place:
        return False
    ops = plan.groups[o.id].ops if o.id in plan.groups else [o]
    return any(S.size(x.shape) * x.dtype.itemsize > plan.max_binding
               for m in ops for x in (m, *m.inputs))


@claims(45, _too_large)  # before the fused group's one launch
def _split_elementwise(n: Site) -> None:
    """Each op of the group (intermediates written out) in launches of row ranges within
    the binding limit (``EW.row_chunks``), as gemv and gather split their constants; a
    range is bound at its offset (a ``("range", slot, offset, bytes)`` slot)."""
    plan = n.plan
    ops = plan.groups[n.node.id].ops if n.node.id in plan.groups else [n.node]
    for o in ops:
        if o.op not in fusion.ELEMENTWISE:
            raise NotImplementedError(f"a fused {o.op} in an element-wise group beyond the "
                                      f"{plan.max_binding}-byte storage binding limit")
        out_shape, in_shapes = EW.flat_view(o.shape, [x.shape for x in o.inputs])
        sizes = [x.dtype.itemsize for x in o.inputs] + [o.dtype.itemsize]
        chunks, by_rows = EW.row_chunks(out_shape, in_shapes, sizes, plan.max_binding)
        slots = [n.slot_of(root(x)) for x in o.inputs] + [n.slot_of(o)]
        shapes = [*in_shapes, out_shape]
        ranged = [*by_rows, True]
        for r0, r1 in chunks:
            binds, bases, part = [], [], []
            for sl, shp, e, r in zip(slots, shapes, sizes, ranged, strict=True):
                if not r:
                    binds.append(sl)
                    bases.append(0)
                    part.append(shp)
                    continue
                row = S.size(shp[1:]) * e
                start = r0 * row
                off = start // EW.OFFSET_ALIGN * EW.OFFSET_ALIGN
                binds.append(("range", sl, off, -(-(start + (r1 - r0) * row - off) // 4) * 4))
                bases.append((start - off) // e)
                part.append((r1 - r0, *shp[1:]))
            k = EW.elementwise(o.op, [x.dtype.wgsl for x in o.inputs], part[:-1],
                               o.dtype.wgsl, part[-1], attrs=o.attrs, bases=bases)
            n.add(KernelLaunch(k, binds))
