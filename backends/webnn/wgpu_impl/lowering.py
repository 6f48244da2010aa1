"""Lowering: each planned step to its launches (WGSL kernels generated for its shapes, or
buffer copies), and each operand to the storage slot those launches bind."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .. import shapes as S
from .._classes import MLOperand, blocks
from ..kernels import Kernel
from ..kernels import elementwise as EW
from ..kernels import matmul as MM
from ..kernels import movement as MV
from ..kernels import quant as QK
from ..kernels import quant_rows as QR
from ..kernels import reduce as RD
from ..stateful import PairPlan, root
from . import fusion
from . import gemv as GV
from . import match_q4 as MQ
from .options import COLS, ROWS_VARIANT
from .plan import CopyLaunch, Deferred, KernelLaunch, Plan, Slot
from .planning import Step
from .target import Target


def lower_steps(plan: Plan, order: list[Step], dest: dict[int, Slot]) -> None:
    """Append the launches of every live step, in order; operands without a destination
    get a constant or an intermediate slot."""

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

    appends = [pp for pp in plan.pairs if pp.append]
    for st in order:
        if not st.live:
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
            pp = plan.in_place.get(st.node._id)
            _lower(plan, st.node, st.reads, slot_of, pp, plan.has_check)


def _gemv_rows(t: Target, variant: str, a_shape: Any, b_shape: Any, shp: Any, n0: int,
               chunk: int | None, residual: bool = False,
               splits: list[int] | None = None,
               prologue: MM.VectorSource | None = None, f16_weights: bool = False) -> Kernel:
    if variant == "legacy":
        return MM.gemv(a_shape, b_shape, shp, b_t=True, n_off=n0, n_chunk=chunk)
    m = ROWS_VARIANT.fullmatch(variant)
    lanes = int(m.group(1) or 32) if m else 32
    depth = int(m.group(3) or 4) if m else 4
    if t.cpu and variant == "cols":
        lanes = 8
    sub = None if m and m.group(2) else t.subgroup
    return MM.gemv_rows(a_shape, b_shape, shp, n_off=n0, n_chunk=chunk, lanes=lanes,
                        wg=max(256, lanes), subgroup=sub, residual=residual, splits=splits,
                        prologue=prologue, depth=depth, f16_weights=f16_weights,
                        f16_wide=bool(m and m.group(4)))


def _f16_weights(how: str | None, variant: str, K: int, values: list[np.ndarray]) -> bool:
    """Whether a constant-weight gemv streams float16 weights (``how``: the gemv_weights
    option): the rows kernels only, K a multiple of 4."""
    if how == "f32" or not variant.startswith("rows") or K % 4:
        return False
    return how == "f16" or all(GV.f16_exact(v) for v in values)


def _weights(count: int, rows: Callable[[], np.ndarray], half: bool) -> Deferred:
    """``count`` weights of (N, K) rows as uploaded: float32, or float16 two to a u32."""
    return Deferred(count // 2, partial(GV.packed_f16, rows)) if half else Deferred(count, rows)


def _attention_one(plan: Plan, o: MLOperand) -> tuple[Any, int, int] | None:
    """The one-launch decode attention where ``KernelOptions.attention`` asks for it
    ("flash1", "lanes1[_uN]") and it applies, else None."""
    if plan.options.attention == "flash1":
        return plan.attention[o._id].one_launch(plan.target.shared_bytes,
                                                plan.options.attention_splits,
                                                plan.target.max_storage)
    if (got := _attention_lanes(plan, o, True)) is not None:
        return got[0][0], got[1], got[2]
    return None


def _attention_lanes(plan: Plan, o: MLOperand, fold: bool) -> tuple[list, int, int] | None:
    """The lane-group decode attention (``attention_lanes``) where ``KernelOptions.attention``
    asks for it with (``fold``) or without the combine folded in and it applies, else None."""
    how = plan.options.attention_lanes()
    if how is None or how[0] != fold:
        return None
    return plan.attention[o._id].lanes(plan.target.shared_bytes, plan.options.attention_splits,
                                       plan.target.subgroup, fold, how[1],
                                       plan.target.max_storage)


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
    if o._id in plan.stacked and o._id not in plan.q4:
        group = plan.stacked[o._id]
        parts = [GV.const_weight(m, plan.fold) for m in group]
        sizes = [m._shape[-1] for m in group]
        K = o._inputs[0]._shape[-1]
        variant = plan.options.gemv_variant(plan.target)
        half = _f16_weights(plan.options.gemv_weights, variant, K,
                            [src._value for src, _, _ in parts])
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
        lanes, shared, _ = plan.options.gdn_variant(plan.target) or (32, False, True)
        old, new = slot_of(m.state_in), slot_of(m.state_out)
        in_place = old == new  # the paired state updated where it lies (each row by its lanes)
        guarded = has_check and m.state_out._id in plan.in_place
        k = m.kernel(in_place, guarded, lanes, None if shared else plan.target.subgroup)
        add(KernelLaunch(k, ins[in_place:] + [new, out_slot] + ([("status",)] if guarded else [])))
    elif o._id in plan.attention and (one := _attention_one(plan, o)) is not None:
        k1, parts, counters = one  # one launch: the combine folded in (``flash_decode_one``)
        part, cnt = ("temp", ("flash", o._id)), ("const", ("flash_count", o._id))
        plan.temps[part] = parts
        plan.consts.setdefault(cnt, np.zeros(counters, np.uint32))  # zero; left zero
        add(KernelLaunch(k1, ins + [part, out_slot, cnt]))
    elif o._id in plan.attention:
        if (two := _attention_lanes(plan, o, False)) is not None:
            (k1, k2), parts, _ = two
        else:
            k1, k2, parts = plan.attention[o._id].kernels(plan.target.shared_bytes,
                                                          plan.options.attention_splits,
                                                          plan.options.f16_loads)
        part = ("temp", ("flash", o._id))
        plan.temps[part] = parts
        add(KernelLaunch(k1, ins + [part]))
        add(KernelLaunch(k2, [part, out_slot]))
    elif o._id in plan.vectors:
        vec = plan.vectors[o._id]
        count = S.size(shp)
        traffic = 4 * (sum(S.size(x._shape) for x in vec.leaves) + count)
        add(KernelLaunch(MM.computed_vector(vec.source(), count, traffic, count // shp[-1],
                                            subgroup=plan.target.subgroup,
                                            unrolled=plan.options.row_vector != "loop"),
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
    elif o._id in plan.q4:
        _lower_q4(plan, plan.stacked.get(o._id, [o]), ins[0], slot_of)
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
            variant = plan.options.gemv_variant(plan.target)
            half = _f16_weights(plan.options.gemv_weights, variant, K, [src._value])
            per = max(8, (plan.max_binding // (4 * K)) // 8 * 8)
            for c, n0 in enumerate(range(0, N, per)):
                nc = min(per, N - n0)
                chunk = None if nc == N else nc
                rows = partial(GV.weight_rows, src, b_shape, b_t, n0, nc)
                if variant.startswith("cols"):
                    # k-major, interleaved by column (kernels/matmul.py gemv_cols)
                    slot = ("const", ("C", src._id, c))
                    plan.consts.setdefault(slot, Deferred(nc * K, partial(GV.interleave, rows, nc, K)))
                    ncols, wg, ng = COLS.get(variant, COLS["cols"])
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
            k = _gemv_rows(plan.target, plan.options.gemv_variant(plan.target, cols_ok=False),
                           a._shape, b_shape, shp, 0, None)
            add(KernelLaunch(k, [ins[0], ins[1], out_slot]))
        elif 1 < M <= 8 and b_t and plan.options.attention != "generic":
            add(KernelLaunch(MM.matmul_bt_small_m(a._shape, b_shape, shp),
                             [ins[0], ins[1], out_slot]))
        elif (M <= 8 and not b_t and a._shape[-1] >= 256
              and plan.options.attention != "generic"):
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
                            S.strides(shp), "transpose", guarded=guarded)
        add(KernelLaunch(k, [ins[0], out_slot] + ([("status",)] if guarded else [])))
    elif op == "slice":
        x = o._inputs[0]
        st = S.strides(x._shape)
        base = sum(s * d for s, d in zip(o._attrs["starts"], st, strict=False))
        k = MV.strided_copy(t, shp, base, [d * s for d, s in zip(st, o._attrs["strides"], strict=False)],
                            0, S.strides(shp), "slice", guarded=guarded)
        add(KernelLaunch(k, [ins[0], out_slot] + ([("status",)] if guarded else [])))
    elif op == "concat":
        ax = o._attrs["axis"]
        ost = S.strides(shp)
        off = 0
        for x, sl in zip(o._inputs, ins, strict=False):
            k = MV.strided_copy(t, x._shape, 0, S.strides(x._shape), off * ost[ax], ost,
                                "concat", guarded=guarded)
            add(KernelLaunch(k, [sl, out_slot] + ([("status",)] if guarded else [])))
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
                # on NVIDIA; PERFORMANCE.md, "Knobs"), a cost of this implementation, not
                # of the stateless API. Counted as kernel bytes.
                pair = [slot_of(root(m._inputs[0])), slot_of(m)]
                how = plan.options.cache_copy
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
    elif op == "cumulative_sum":
        a = o._attrs
        add(KernelLaunch(RD.cumulative_sum(t, shp, a["axis"], a["exclusive"], a["reversed"]),
                         [ins[0], out_slot]))
    elif op == "scatter_elements":
        _, idx, _ = o._inputs
        add(KernelLaunch(MV.strided_copy(t, shp, 0, S.strides(shp), 0, S.strides(shp), "copy"),
                         [ins[0], out_slot]))
        add(KernelLaunch(MV.scatter_elements(t, idx._dtype.wgsl, shp, idx._shape,
                                             o._attrs["axis"]), [ins[1], ins[2], out_slot]))
    else:
        raise NotImplementedError(f"op {op!r}")


def _lower_q4(plan: Plan, members: list[MLOperand], a_slot: Slot, slot_of: Any) -> None:
    """One-row products with 4-bit weights: codes, scales (and zero-point terms) repacked
    by column at upload. One product: a launch per chunk of columns within the binding
    limit, a residual add written by it (``plan.epilogue``). Several (``plan.stacked``):
    their columns stacked, one launch writing each output."""
    ws = [plan.q4[m._id] for m in members]
    w0 = ws[0]
    K, N = w0.K, sum(w.N for w in ws)
    per = N if len(ws) > 1 else max(8, (plan.max_binding // (K // 2)) // 8 * 8)
    lanes = 8 if plan.target.cpu else 32
    multi = plan.options.q4_multi(plan.target)  # the several-rows kernel, where the block allows it
    if multi is not None and (w0.block % 32 or multi[0] > multi[1]):
        multi = None
    wide = plan.options.q4_wide(plan.target)  # all loads in flight, where the block allows it
    if wide is not None and (w0.block % 32 or wide[0] > QR.wide_lanes(K, wide[1])):
        wide = None
    quad = plan.options.q4_quad(plan.target)  # 4 rows' codes a load, where the block allows
    if quad is not None and not w0.quad_fits:
        quad = None
    dst, res = plan.epilogue.get(members[0]._id, (members[0], None))  # (the add, residual)
    a_slots, source = _gemv_input(plan, members[0], [a_slot], slot_of)
    assert source is None or quad is not None, "a 4-bit prologue needs the quad kernel"
    gated = plan.gated.get(members[0]._id)  # the pair writes its activation, rows paired
    assert gated is None or (quad is not None and len(ws) == 2), "a gated pair needs quad"
    # float16 products (``_h``) only on float16 weights: a float32 graph's product keeps
    # float32's precision (its tolerance is 1e-3, not the float16 one)
    half = all(w.f16_weights for w in ws) and any(v is not None and v[-1]
                                                  for v in (multi, wide, quad))
    outs = ([slot_of(gated.root)] if gated is not None
            else [slot_of(m) for m in members] if len(ws) > 1 else [slot_of(dst)])
    for c, n0 in enumerate(range(0, N, per)):
        nc = min(per, N - n0)
        parts = [(w, 0, w.N) for w in ws] if len(ws) > 1 else [(w0, n0, nc)]
        key = (members[0]._id, c)
        slots = [("const", ("Q4", *key)), ("const", ("Q4S", *key))]
        # quad: 4 rows interleaved (padded to a multiple of 4)
        rows_n = -(-nc // QR.QUAD) * QR.QUAD if quad is not None else nc

        def laid(make: Callable[[], np.ndarray], nc: int = nc) -> Callable[[], np.ndarray]:
            if gated is not None:
                make = partial(MQ.paired_rows, make, nc // 2)
            return partial(MQ.interleave_rows, make, nc) if quad is not None else make

        plan.consts.setdefault(slots[0], Deferred(rows_n * K // 8, laid(partial(
            _stacked, [partial(MQ.repack_codes, *p, pairs=half) for p in parts]))))
        blocks_n = rows_n * (K // w0.block)
        half_scales = (multi or wide or quad) is not None and all(w.f16_scales for w in ws)
        scales = laid(partial(_stacked, [partial(MQ.repack_scales, *p, False) for p in parts]))
        plan.consts.setdefault(slots[1], Deferred((blocks_n + 1) // 2, partial(
            MQ.packed_half, scales)) if half_scales else Deferred(blocks_n, scales))
        if w0.zero_points:
            slots.append(("const", ("Q4Z", *key)))
            plan.consts.setdefault(slots[2], Deferred(blocks_n, laid(partial(
                _stacked, [partial(MQ.repack_scales, *p, True) for p in parts]))))
        common = dict(signed=w0.signed, zero_points=w0.zero_points,
                      subgroup=plan.target.subgroup, residual=res is not None,
                      n_off=n0 if len(ws) == 1 else 0,
                      splits=[w.N for w in ws] if len(ws) > 1 and gated is None else None,
                      half_out=dst._dtype.wgsl == "f16" and gated is None)
        if quad is not None:
            k = QR.gemv_q4_quad(K, nc, w0.block, loads=quad[0], half_scales=half_scales,
                                half=half, prologue=source,
                                gated=gated.output() if gated is not None else None, **common)
        elif wide is not None:
            k = QR.gemv_q4_wide(K, nc, w0.block, rows=wide[0], loads=wide[1],
                                half_scales=half_scales, half=half, **common)
        elif multi is not None:
            rows, lanes_m, groups, unroll, _ = multi
            k = QR.gemv_q4_multi(K, nc, w0.block, rows=rows, lanes=lanes_m, groups=groups,
                                 unroll=unroll, half_scales=half_scales, half=half, **common)
        else:
            k = QK.gemv_q4(K, nc, w0.block, lanes=lanes, wg=256, **common)
        plan.launches.append(KernelLaunch(k, a_slots + slots + (
            [slot_of(res)] if res is not None else []) + outs))


def _stacked(parts: list[Callable[[], np.ndarray]]) -> np.ndarray:
    """The stacked contents of several repacked constants (made at upload)."""
    return np.concatenate([p() for p in parts])
