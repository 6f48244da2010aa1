"""4-bit matrix-vector products: ``matmul(one row, dequantizeLinear(4-bit constant W, scale,
zeroPoint))`` run by ``kernels/quant.gemv_q4``, which reads the codes and dequantises in
registers. The dequantizeLinear then has no launch (nothing else reads it), so no float
weights are written: a q4 decode step streams half a byte a weight plus its block's scale.

Matched where W is a 2-D int4/uint4 constant (K, N) with K a multiple of 8, its scale and
zero point are constants of shape (K / block, N) with the block a multiple of 8 (a code word
never straddles two blocks), and the product's input is a single row; a product of several
rows (a K-token verify, a prefill chunk) runs ``kernels/quant.gemm_q4_rows`` the same way,
its rows a tile at a time (``plan.q4_rows``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from .. import shapes as S
from .._classes import blocks
from ..dtypes import pack_nibbles, unpack_nibbles
from ..ir import Node
from ..kernels import quant as QK
from ..kernels import quant_quad_rows as QQ
from ..kernels import quant_rows as QR
from ..stateful import root
from . import gemv as GV
from .launches import Deferred, KernelLaunch, Slot
from .lowerings import Site, claims


@dataclass
class Q4Weight:
    """A matched product's weights: the dequantizeLinear and its constant operands."""

    dq: Node
    K: int
    N: int
    block: int
    zero_points: bool  # any zero point non-zero (else the kernel leaves its term out)
    #: uint4 codes whose zero points are all 8 (MatMulNBits' default: genai's exports): the
    #: codes minus 8 are int4 values, so they run as signed codes without zero points, their
    #: nibbles flipped at upload (``repack_codes``): no zero-point term read a block
    centred: bool = False

    @property
    def format(self) -> tuple[int, bool, bool]:
        """What one kernel needs alike across stacked products."""
        return (self.block, self.signed, self.zero_points)

    @property
    def f16_weights(self) -> bool:
        """The dequantised weights are float16 (float16 scales): a float16 graph's product,
        which may multiply in float16 (``_h`` kernels); a float32 one keeps float32's
        precision."""
        return self.dq.inputs[1].value.dtype == np.float16

    @property
    def f16_scales(self) -> bool:
        """Every scale is a float16 value (a float16 model's, or float32 ones that are):
        the several-rows kernel may read them as float16 pairs, losing nothing."""
        s = self.dq.inputs[1].value
        return s.dtype == np.float16 or bool(np.array_equal(
            s.astype(np.float16).astype(s.dtype), s))

    @property
    def quad_fits(self) -> bool:
        """The four-rows-a-load kernel (``quant_rows.gemv_q4_quad``) takes these weights: a
        16-byte load of 32 codes never straddles a block or the row's end."""
        return self.block % 32 == 0 and self.K % 32 == 0

    @property
    def codes(self) -> Node:
        return self.dq.inputs[0]

    @property
    def signed(self) -> bool:
        return self.codes.dtype.name == "int4" or self.centred


def match_q4(nodes: list[Node], rows: bool = False) -> dict[int, Q4Weight]:
    """matmul id -> its 4-bit weights, for every product the kernel can run: of one input
    row, or with ``rows`` of several (a K-token graph's, ``gemm_q4_rows``)."""
    out: dict[int, Q4Weight] = {}
    for o in nodes:
        if o.kind != "op" or o.op != "matmul" or o.dtype.name != "float32":
            continue
        a, b = o.inputs
        dq = widened(root(b))
        m = S.size(a.shape[:-1])
        if (dq.kind != "op" or dq.op != "dequantize_linear" or len(dq.shape) != 2
                or tuple(b.shape) != tuple(dq.shape) or (m < 2 if rows else m != 1)):
            continue
        codes, scale, zp = dq.inputs
        if (codes.dtype.name not in ("int4", "uint4")
                or any(x.kind != "constant" for x in (codes, scale, zp))):
            continue
        K, N = dq.shape
        bk, bn = blocks(dq.shape, scale.shape)
        if bn != 1 or K % 8 or bk % 8:
            continue
        zps = _nibbles(zp, zp.dtype.name == "int4")
        centred = codes.dtype.name == "uint4" and bool(np.all(zps == 8))
        out[o.id] = Q4Weight(dq, K, N, bk, bool(np.any(zps)) and not centred, centred)
    return out


def head_rows(q4_rows: dict[int, Q4Weight], nodes: list[Node],
              inlined: set[int]) -> dict[int, tuple[Node, int]]:
    """Several-row products whose rows are attention's output through a transpose (the
    token axis moved before the heads: (1, *heads, M, *rest) -> (1, M, *heads, *rest),
    reshaped to (1, M, heads · D), D the rest's size): matmul id -> (the attention
    output, D). ``gemm_q4_rows`` reads it
    as it lies (``head_d``), so the transpose has no launch where nothing else reads it;
    an output computed only inside a fused chain (``inlined``) is not in memory to read."""
    by_id = {o.id: o for o in nodes}
    out: dict[int, tuple[Node, int]] = {}
    for i in q4_rows:
        o = by_id[i]
        t = root(o.inputs[0])
        if t.kind != "op" or t.op != "transpose":
            continue
        src, perm = t.inputs[0], tuple(t.attrs["permutation"])
        n, p = len(src.shape), perm[1] if len(perm) > 2 else 0
        if (p < 2 or src.shape[0] != 1 or src.dtype.name != "float32" or root(src).id in inlined
                or perm != (0, p, *range(1, p), *range(p + 1, n))):
            continue
        M, D = src.shape[p], S.size(src.shape[p + 1:])
        if D % 4 or M != S.size(o.inputs[0].shape[:-1]) or S.size(src.shape[1:p]) * D != \
                o.inputs[0].shape[-1]:
            continue
        out[i] = (root(src), D)
    return out


def rows_quad(plan: Any, w: Q4Weight, M: int, norms: bool = False) -> bool:
    """Whether a product of ``M`` rows of weights ``w`` runs on the one-token quad layout
    (``quant_quad_rows.gemm_q4_quad``): asked for (``q4_rows`` "quad"), a 16-byte load
    within a block, signed or zero-point-free codes, and its sums (``norms``: and a norm's
    reductions and partial sums) within the adapter's workgroup memory."""
    t = plan.target
    return (plan.options.q4_rows_quad(t) and w.quad_fits and not w.zero_points
            and QQ.shared_bytes(w.K, M, t.subgroup, norms=norms) <= t.shared_bytes)


def rows_by_cols(plan: Any) -> tuple[int, int | None] | None:
    """(columns an invocation, columns a slice-group or None) of the several-row products
    ``quant.gemm_q4_cols`` runs: by column as asked (``q4_cols``), or where "quad" was
    asked and the weights do not allow it; None where they run ``gemm_q4_rows``."""
    opts = plan.options
    return opts.q4_cols(plan.target) or ((1, None) if opts.q4_rows_quad(plan.target) else None)


def rows_norms(plan: Any, w: Q4Weight, M: int) -> bool:
    """Whether a product of ``M`` rows of weights ``w`` runs a kernel that writes a norm's
    partial sums and reads them (``gemv.norm_partials``): the quad layout with them
    within workgroup memory (``rows_quad``), else by column with them within it."""
    if rows_quad(plan, w, M, norms=True):
        return True
    by_cols = rows_by_cols(plan)
    return by_cols is not None and QK.cols_shared_bytes(
        M, per_thread=by_cols[0], norms=True) <= plan.target.shared_bytes


def rows_workgroups(plan: Any, w: Q4Weight, M: int) -> int:
    """The workgroups of the kernel a residual product of ``M`` rows writing a norm's
    partials runs (``rows_norms``): how many partial sums a row it writes."""
    if rows_quad(plan, w, M, norms=True):
        return QQ.workgroups(w.K, w.N, M)
    by_cols = rows_by_cols(plan)
    assert by_cols is not None, "norm partials need the quad layout or by column"
    return QK.cols_workgroups(w.K, w.N, w.block, *by_cols)


def stacked_rows(nodes: list[Node], q4_rows: dict[int, Q4Weight],
                 max_binding: int) -> dict[int, list[Node]]:
    """Several-row 4-bit products of one input (a K-token graph's q, k and v; its gate and
    up), grouped as ``gemv.stacked_gemvs`` groups one-row ones: first matmul id -> the
    group, of one format and within the binding limit (the stacked codes)."""
    by_input: dict[tuple, list[Node]] = {}
    for o in nodes:
        w = q4_rows.get(o.id)
        if w is None:
            continue
        a = o.inputs[0]
        by_input.setdefault((root(a).id, tuple(a.shape), w.format), []).append(o)
    out: dict[int, list[Node]] = {}
    for ms in by_input.values():
        group: list[Node] = []
        for o in ms:
            w = q4_rows[o.id]
            if (w.K // 2) * (sum(q4_rows[m.id].N for m in group) + w.N) > max_binding:
                break
            group.append(o)
        if len(group) > 1:
            out[group[0].id] = group
    return out


def widened(o: Node) -> Node:
    """The float16 dequantizeLinear a float32 ``cast`` of it reads (a float16 model's
    product, widened by the builder: ``MLGraphBuilder._widened``), else ``o``: the kernel
    reads the codes and scales alike, the float16 scales widened exactly at upload."""
    if o.kind == "op" and o.op == "cast" and o.inputs[0].dtype.name == "float16":
        src = root(o.inputs[0])
        if src.kind == "op" and src.op == "dequantize_linear":
            return src
    return o


def _nibbles(o: Node, signed: bool) -> np.ndarray:
    """A packed constant's elements (int8), in its shape."""
    raw = np.ascontiguousarray(o.value).view(np.uint8).reshape(-1)
    nib = unpack_nibbles(raw)[:S.size(o.shape)]
    vals = (nib.astype(np.int8) ^ 8) - 8 if signed else nib.astype(np.int8)
    return vals.reshape(o.shape)


#: ``repack_codes(pairs=True)``: the element of its word each nibble holds (elements 2m and
#: 2m + 1 in nibbles m and m + 4: one shift and mask yields the pair, ``quant_rows._unpack_half_fns``)
PAIR_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])


def repack_codes(w: Q4Weight, n0: int, nc: int, pairs: bool = False) -> np.ndarray:
    """Codes of columns [n0, n0 + nc) as (nc, K), eight a u32 word (made at upload): element
    k in nibble k % 8 of word k / 8, or with ``pairs`` in ``PAIR_ORDER`` within the word;
    ``centred`` codes flipped (c ^ 8 is the int4 nibble of c - 8)."""
    codes = _nibbles(w.codes, False)[:, n0:n0 + nc]  # raw nibbles, (K, nc)
    if w.centred:
        codes = codes ^ 8
    rows = np.ascontiguousarray(codes.T)  # (nc, K)
    if pairs:
        rows = np.ascontiguousarray(rows.reshape(nc, -1, 8)[:, :, PAIR_ORDER].reshape(nc, -1))
    packed = pack_nibbles(rows)  # (nc, K/2)
    return np.ascontiguousarray(packed).reshape(-1).view(np.uint32)


def repack_scales(w: Q4Weight, n0: int, nc: int, zero_terms: bool) -> np.ndarray:
    """Columns [n0, n0 + nc) as (nc, K/block) float32: the scales, or -zeroPoint · scale."""
    s = w.dq.inputs[1].value.astype(np.float32).reshape(-1, w.N)[:, n0:n0 + nc]
    if zero_terms:
        zp = _nibbles(w.dq.inputs[2], w.signed).reshape(-1, w.N)[:, n0:n0 + nc]
        s = -zp.astype(np.float32) * s
    return np.ascontiguousarray(s.T).reshape(-1)


def by_load(values: Any, cols: int, word: int) -> np.ndarray:
    """The (cols, per-column) 32-bit values made by ``values()`` laid out load by load,
    then column (``word`` values a load): ``quant.gemm_q4_cols``' coalesced layout."""
    v = values().reshape(cols, -1, word)
    return np.ascontiguousarray(v.transpose(1, 0, 2)).reshape(-1)


def interleave_rows(values: Any, rows: int, width: int = 4) -> np.ndarray:
    """The (rows, per-row) 32-bit values made by ``values()`` (codes, scales) with ``width``
    rows interleaved element by element, rows padded with zeros to a multiple of ``width``
    (``quant_rows.gemv_q4_quad``: one 16-byte load is a code word of each of 4 rows)."""
    v = values().reshape(rows, -1)
    pad = -rows % width
    if pad:
        v = np.concatenate([v, np.zeros((pad, v.shape[1]), v.dtype)])
    return np.ascontiguousarray(v.reshape(-1, width, v.shape[1]).transpose(0, 2, 1)).reshape(-1)


def paired_columns(values: Any, half: int) -> np.ndarray:
    """The (2 · half, per-column) 32-bit values made by ``values()`` for two stacked
    products of ``half`` columns each, interleaved column by column: column n of the first,
    then column n of the second (``quant.gemm_q4_cols`` with ``gated``: a pair's two sums in
    neighbouring invocations)."""
    v = values().reshape(2, half, -1)
    return np.ascontiguousarray(v.transpose(1, 0, 2)).reshape(-1)


def packed_half(values: Any) -> np.ndarray:
    """Float32 values made by ``values()`` (float16 ones) as float16, two to a u32 word, the
    count padded to even (``gemv_q4_multi`` half_scales)."""
    v = values().astype(np.float16)
    if v.size % 2:
        v = np.append(v, np.float16(0))
    return v.view(np.uint32)


# -- lowering ------------------------------------------------------------------------------
def lower_q4(plan: Any, members: list[Node], a_slot: Slot, slot_of: Any) -> None:
    """One-row products with 4-bit weights: codes, scales (and zero-point terms) repacked
    by column at upload. One product: a launch per chunk of columns within the binding
    limit, a residual add written by it (``plan.epilogue``). Several (``plan.stacked``):
    their columns stacked, one launch writing each output."""
    ws = [plan.q4[m.id] for m in members]
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
    dst, res = plan.epilogue.get(members[0].id, (members[0], None))  # (the add, residual)
    a_slots, source = GV.gemv_input(plan, members[0], [a_slot], slot_of)
    assert source is None or quad is not None, "a 4-bit prologue needs the quad kernel"
    gated = plan.gated.get(members[0].id)  # the pair writes its activation, rows paired
    assert gated is None or (quad is not None and len(ws) == len(gated.pair)), \
        "a gated product needs quad"
    paired = gated is not None and len(ws) == 2  # else one product: its group, row by row
    stats = plan.norm_stats.get(members[0].id)  # partial sums for the next norm's readers
    assert stats is None or (quad is not None and res is not None and per >= N), \
        "norm partials need the quad kernel, a residual and one launch"
    if stats is not None:
        plan.temps[stats.slot] = stats.count
    # float16 products (``_h``) only on float16 weights: a float32 graph's product keeps
    # float32's precision (its tolerance is 1e-3, not the float16 one)
    half = all(w.f16_weights for w in ws) and any(v is not None and v[-1]
                                                  for v in (multi, wide, quad))
    extra = source.group_bytes if source is not None else 0  # a per-head norm's values
    # the input as two int8 parts (about 2^-16 of a block's largest input): as ``half``, only
    # on float16 weights; no zero points, the parts in workgroup memory
    ints = (quad is not None and plan.options.q4_quad_ints(plan.target)
            and all(w.f16_weights for w in ws) and not w0.zero_points
            and QR.int8_fits(K, plan.target.shared_bytes - extra))
    outs = ([slot_of(gated.root)] if gated is not None
            else [slot_of(m) for m in members] if len(ws) > 1 else [slot_of(dst)])
    for c, n0 in enumerate(range(0, N, per)):
        nc = min(per, N - n0)
        parts = [(w, 0, w.N) for w in ws] if len(ws) > 1 else [(w0, n0, nc)]
        key = (members[0].id, c)
        slots = [("const", ("Q4", *key)), ("const", ("Q4S", *key))]
        # quad: 4 rows interleaved (padded to a multiple of 4)
        rows_n = -(-nc // QR.QUAD) * QR.QUAD if quad is not None else nc

        def laid(make: Callable[[], np.ndarray], nc: int = nc) -> Callable[[], np.ndarray]:
            if paired:
                make = partial(GV.paired_rows, make, nc // 2)
            return partial(interleave_rows, make, nc) if quad is not None else make

        plan.consts.setdefault(slots[0], Deferred(rows_n * K // 8, laid(partial(
            _stacked, [partial(repack_codes, *p, pairs=half) for p in parts]))))
        blocks_n = rows_n * (K // w0.block)
        half_scales = (multi or wide or quad) is not None and all(w.f16_scales for w in ws)
        scales = laid(partial(_stacked, [partial(repack_scales, *p, False) for p in parts]))
        plan.consts.setdefault(slots[1], Deferred((blocks_n + 1) // 2, partial(
            packed_half, scales)) if half_scales else Deferred(blocks_n, scales))
        if w0.zero_points:
            slots.append(("const", ("Q4Z", *key)))
            plan.consts.setdefault(slots[2], Deferred(blocks_n, laid(partial(
                _stacked, [partial(repack_scales, *p, True) for p in parts]))))
        common = dict(signed=w0.signed, zero_points=w0.zero_points,
                      subgroup=plan.target.subgroup, residual=res is not None,
                      n_off=n0 if len(ws) == 1 else 0,
                      splits=[w.N for w in ws] if len(ws) > 1 and gated is None else None,
                      half_out=dst.dtype.wgsl == "f16" and gated is None)
        if quad is not None:
            k = QR.gemv_q4_quad(K, nc, w0.block, loads=quad[0], half_scales=half_scales,
                                half=half, ints=ints, prologue=source,
                                shared_input=(plan.options.q4_norm_shared(plan.target) and source is not None
                                              and 8 * K + extra <= plan.target.shared_bytes),
                                gated=gated.output() if paired else None,
                                mapped=gated.output() if gated and not paired else None,
                                stats=stats.output() if stats is not None else None,
                                **common)
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
            [slot_of(res)] if res is not None else []) + outs + (
            [stats.slot] if stats is not None else [])))


def lower_q4_rows(plan: Any, members: list[Node], a_slot: Slot, slot_of: Any) -> None:
    """Products of several rows with 4-bit weights (``gemm_q4_rows``): the codes and
    scales repacked by column at upload as for one row. One product: a launch per chunk of
    columns within the binding limit; several of one input (``plan.stacked_rows``): their
    columns stacked, one launch writing each output."""
    ws = [plan.q4_rows[m.id] for m in members]
    w0, M = ws[0], S.size(members[0].inputs[0].shape[:-1])
    K, N = w0.K, sum(w.N for w in ws)
    per = N if len(ws) > 1 else max(8, (plan.max_binding // (K // 2)) // 8 * 8)
    lanes = 8 if plan.target.cpu else 32
    a_slots, source = GV.gemv_input(plan, members[0], [a_slot], slot_of)
    stats = plan.norm_stats.get(members[0].id)  # partial sums for the next norm's readers
    # the quad layout where the weights allow it, else by column
    quad = rows_quad(plan, w0, M, norms=source is not None or stats is not None)
    by_cols = rows_by_cols(plan)
    by_col = by_cols is not None and not quad
    per_thread, cols = by_cols or (1, None)
    dst, res = plan.epilogue.get(members[0].id, (members[0], None))  # (the add, residual)
    assert quad or by_col or (source is None and stats is None), \
        "a norm's partials need the quad layout or by column"
    assert stats is None or (res is not None and per >= N), \
        "norm partials need a residual and one launch"
    if stats is not None:
        plan.temps[stats.slot] = stats.size
    heads = plan.head_rows.get(members[0].id)  # the rows read through a transpose
    gated = plan.gated.get(members[0].id)  # the pair writes its activation, columns paired
    assert gated is None or ((by_col or quad) and len(ws) == 2), \
        "a gated pair of rows runs by column or on the quad layout"
    half_scales = quad and all(w.f16_scales for w in ws)
    # float16 products by column (``q4_rows`` "_h") only on float16 weights, as ``lower_q4``
    half = by_col and plan.options.q4_cols_half(plan.target) and all(
        w.f16_weights for w in ws)
    outs = ([slot_of(gated.root)] if gated is not None
            else [slot_of(m) for m in members] if len(ws) > 1 else [slot_of(dst)])
    for c, n0 in enumerate(range(0, N, per)):
        nc = min(per, N - n0)
        parts = [(w, 0, w.N) for w in ws] if len(ws) > 1 else [(w0, n0, nc)]
        key = ("Q4Q" if quad else "Q4CH" if half else "Q4C" if by_col else "Q4R",
               members[0].id, c)
        slots = [("const", (*key, "codes")), ("const", (*key, "scales"))]
        word = 4 if w0.block % 32 == 0 else 1  # u32 words a code load
        # quad: 4 columns interleaved (padded to a multiple of 4)
        cols_n = -(-nc // QR.QUAD) * QR.QUAD if quad else nc

        def laid(make: Callable[[], np.ndarray], per_col: int,
                 nc: int = nc) -> Callable[[], np.ndarray]:
            if quad:
                if gated is not None:
                    make = partial(GV.paired_rows, make, nc // 2)
                return partial(interleave_rows, make, nc)
            if gated is not None:
                make = partial(paired_columns, make, nc // 2)
            return partial(by_load, make, nc, per_col) if by_col else make

        plan.consts.setdefault(slots[0], Deferred(cols_n * K // 8, laid(partial(
            _stacked, [partial(repack_codes, *p, pairs=half) for p in parts]), word)))
        scales = laid(partial(_stacked, [partial(repack_scales, *p, False) for p in parts]), 1)
        blocks_n = cols_n * (K // w0.block)
        plan.consts.setdefault(slots[1], Deferred((blocks_n + 1) // 2, partial(
            packed_half, scales)) if half_scales else Deferred(blocks_n, scales))
        if w0.zero_points:
            slots.append(("const", (*key, "zero")))
            plan.consts.setdefault(slots[2], Deferred(nc * (K // w0.block), laid(partial(
                _stacked, [partial(repack_scales, *p, True) for p in parts]), 1)))
        common = dict(signed=w0.signed, zero_points=w0.zero_points,
                      n_off=n0 if len(ws) == 1 else 0, width=N,
                      splits=[w.N for w in ws] if len(ws) > 1 and gated is None else None,
                      residual=res is not None, half_out=dst.dtype.wgsl == "f16",
                      head_d=heads[1] if heads is not None else None)
        if gated is not None:
            common["gated"] = gated.output()  # (its output type decides the kernel's half_out)
        if quad:
            common.pop("zero_points")  # none: the quad layout runs without them
            k = QQ.gemm_q4_quad(K, nc, w0.block, M, subgroup=plan.target.subgroup,
                                half_scales=half_scales, prologue=source,
                                stats=stats.output() if stats is not None else None, **common)
            plan.launches.append(KernelLaunch(k, [*a_slots, *slots, *(
                [slot_of(res)] if res is not None else []), *outs, *(
                [stats.slot] if stats is not None else [])]))
            continue
        k = (QK.gemm_q4_cols(K, nc, w0.block, M, per_thread=per_thread,
                             subgroup=plan.target.subgroup, prologue=source,
                             stats=stats.output() if stats is not None else None, half=half,
                             **QK.cols_shape(K, nc, w0.block, per_thread, cols), **common)
             if by_col else
             QK.gemm_q4_rows(K, nc, w0.block, M, lanes=lanes, subgroup=plan.target.subgroup,
                             **common))
        plan.launches.append(KernelLaunch(k, [*a_slots, *slots, *(
            [slot_of(res)] if res is not None else []), *outs, *(
            [stats.slot] if stats is not None else [])]))


@claims(61, lambda plan, o: o.id in plan.q4_rows)
def _lower_q4_rows_site(n: Site) -> None:
    """A 4-bit product of several rows."""
    lower_q4_rows(n.plan, n.plan.stacked_rows.get(n.node.id, [n.node]), n.ins[0],
                  n.slot_of)


def _stacked(parts: list[Callable[[], np.ndarray]]) -> np.ndarray:
    """The stacked contents of several repacked constants (made at upload)."""
    return np.concatenate([p() for p in parts])


@claims(60, lambda plan, o: o.id in plan.q4)
def _lower_q4_site(n: Site) -> None:
    """A 4-bit product, alone or with the products stacked on its input."""
    lower_q4(n.plan, n.plan.stacked.get(n.node.id, [n.node]), n.ins[0], n.slot_of)
