"""One kernel for a chain of element-wise and data-movement ops (loop fusion).

A decode step of a real model is hundreds of tiny ops (RMSNorm's pow/mean/add/sqrt/div/
mul, RoPE's slice/neg/concat/mul/add, SwiGLU's sigmoid/mul/mul). One launch each costs
GPU time (a dispatch and a round trip of every intermediate through memory) and, in
wgpu-py, ~5–10 µs of CPU encoding. The compiler (``wgpu_impl/fusion.py``) groups such ops;
this module turns a group into one WGSL kernel: every op becomes a function
``v<n>(i) -> T`` giving its element at linear index ``i`` of its own shape, reading its
inputs either from another op's function (inlined) or from a bound buffer (a leaf). The
kernel writes the group's root, one thread per element.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .. import shapes as S
from .common import Kernel, decl, esize, grid, main_1d, offset_fn
from .elementwise import expression
from .reduce import COMBINE, SHORT_ROW, combined, reduced

#: where an input comes from: ("op", index into ``ops``) or ("leaf", index into ``leaves``)
Ref = tuple[str, int]


@dataclass
class FusedOp:
    """One op of a fused group: what it computes and where its inputs come from.

    ``in_shapes`` are the shapes the op sees (a reshape is a view: the linear index into
    the producer is the same)."""

    op: str
    attrs: dict
    out_type: str
    out_shape: tuple[int, ...]
    inputs: list[Ref]
    in_types: list[str]
    in_shapes: list[tuple[int, ...]]


@dataclass
class Leaf:
    """A bound buffer the group reads (an op's materialised output, an input, a constant).
    No leaf is the output buffer: the compiler never fuses into an in-place state write,
    whose reads of the old state must stay at the element each thread writes."""

    wgsl_type: str
    size: int  # elements
    param: bool = False  # not bound: its element is an argument (see ``functions``)
    name: str = "s"  # that argument's name (several params: one name each)


def _read_ref(ref: Ref, index: str, leaves: Sequence[Leaf], takes: Sequence[list[Leaf]],
              p: str = "") -> str:
    kind, k = ref
    if kind == "op":
        return f"{p}v{k}({', '.join([index] + [x.name for x in takes[k]])})"
    return leaves[k].name if leaves[k].param else f"{p}in{k}[{index}]"


def _function(n: int, op: FusedOp, leaves: Sequence[Leaf], takes: Sequence[list[Leaf]],
              p: str = "") -> str:
    """WGSL ``fn v<n>(i: u32[, s: f32 ...]) -> T`` for one op."""
    arg = "".join(f", {x.name}: {x.wgsl_type}" for x in takes[n])
    head = f"fn {p}v{n}(i: u32{arg}) -> {op.out_type} {{\n"

    def _read(ref: Ref, index: str) -> str:
        return _read_ref(ref, index, leaves, takes, p)

    shp = op.out_shape
    if op.op == "slice":
        st = S.strides(op.in_shapes[0])
        base = sum(s * d for s, d in zip(op.attrs["starts"], st, strict=True))
        steps = [d * s for d, s in zip(st, op.attrs["strides"], strict=True)]
        return (offset_fn(f"{p}o{n}", shp, steps, base) + head
                + f"  return {_read(op.inputs[0], f'{p}o{n}(i)')};\n}}\n")
    if op.op == "transpose":
        st = S.strides(op.in_shapes[0])
        perm = [st[p] for p in op.attrs["permutation"]]
        return (offset_fn(f"{p}o{n}", shp, perm) + head
                + f"  return {_read(op.inputs[0], f'{p}o{n}(i)')};\n}}\n")
    if op.op == "concat":
        ax = op.attrs["axis"]
        inner = S.size(shp[ax + 1:])
        dim = shp[ax]
        body = (f"  let c = (i / {inner}u) % {dim}u;\n  let outer = i / {inner * dim}u;\n"
                f"  let r = i % {inner}u;\n")
        start = 0
        for j, (ref, ishp) in enumerate(zip(op.inputs, op.in_shapes, strict=True)):
            e = ishp[ax]
            idx = f"(outer * {e}u + (c - {start}u)) * {inner}u + r"
            if j < len(op.inputs) - 1:
                body += f"  if (c < {start + e}u) {{ return {_read(ref, idx)}; }}\n"
            else:
                body += f"  return {_read(ref, idx)};\n"
            start += e
        return head + body + "}\n"
    if op.op in COMBINE:  # a short reduction (at most SHORT_ROW elements an output)
        return _short_reduction(n, op, head, _read, p)
    # element-wise with broadcasting
    src = ""
    body = ""
    for k, (ref, ishp) in enumerate(zip(op.inputs, op.in_shapes, strict=True)):
        src += offset_fn(f"{p}o{n}_{k}", shp, S.broadcast_strides(ishp, shp))
        body += f"  let a{k} = {_read(ref, f'{p}o{n}_{k}(i)')};\n"
    body += f"  return {expression(op.op, op.in_types, op.out_type, op.attrs)};\n"
    return src + head + body + "}\n"


def _short_reduction(n: int, op: FusedOp, head: str, read, p: str) -> str:
    """WGSL ``v<n>`` of a reduction of at most ``SHORT_ROW`` elements an output: output
    element i is its row's combine, every element read at a constant offset from the
    row's start (the kept axes in order: keep_dimensions only changes the shape)."""
    shp, axes = op.in_shapes[0], list(op.attrs["axes"])
    assert reduced(shp, axes) <= SHORT_ROW
    st = S.strides(shp)
    kept = [k for k in range(len(shp)) if k not in axes]
    offs = [sum(j * st[k] for j, k in zip(idx, axes, strict=True))
            for idx in np.ndindex(*[shp[k] for k in axes])]
    src = offset_fn(f"{p}o{n}", [shp[k] for k in kept] or [1], [st[k] for k in kept] or [0])
    body = f"  let b = {p}o{n}(i);\n"
    body += "".join(f"  let e{j} = {read(op.inputs[0], f'b + {off}u')};\n"
                    for j, off in enumerate(offs))
    acc = combined(op.op, op.out_type, [f"e{j}" for j in range(len(offs))])
    return src + head + body + f"  return {acc};\n}}\n"


def functions(ops: Sequence[FusedOp], leaves: Sequence[Leaf],
              prefix: str = "") -> tuple[str, list[str]]:
    """The WGSL functions of a group (``v<n>`` per op; the root is the last) and the
    arguments the root takes after the index, by name (empty: none). A *param* leaf is a
    value the caller computes (decode attention's q·k score, ``kernels/attention.py``; a
    gated activation's two products, ``kernels/quant_rows``): it must be read at the
    index its consumer is evaluated at, so the ops reading it (transitively) are only
    element-wise ops of the root's shape (checked by the compiler), and they take its
    value as an argument (``Leaf.name``, in leaf order) instead of loading it. ``prefix``:
    prepended to every generated name (two groups in one kernel)."""
    takes: list[list[Leaf]] = []
    for op in ops:
        need = {id(leaves[k]) for kind, k in op.inputs if kind == "leaf" and leaves[k].param}
        need |= {id(x) for kind, k in op.inputs if kind == "op" for x in takes[k]}
        takes.append([x for x in leaves if id(x) in need])
    src = "".join(_function(j, op, leaves, takes, prefix) for j, op in enumerate(ops))
    return src, [x.name for x in takes[-1]]


def leaf_decls(leaves: Sequence[Leaf], first: int, prefix: str = "") -> tuple[str, list[str]]:
    """Storage declarations ``in<k>`` of the bound leaves, from binding ``first`` on."""
    src = ""
    bindings: list[str] = []
    for k, leaf in enumerate(leaves):
        if not leaf.param:
            src += decl(first + len(bindings), f"{prefix}in{k}", leaf.wgsl_type, "read")
            bindings.append("read")
    return src, bindings


def fused(ops: Sequence[FusedOp], leaves: Sequence[Leaf], *, guarded: bool = False) -> Kernel:
    """The kernel computing ``ops[-1]`` (the root); ``ops`` in topological order.

    Bindings: the leaves in order (read), then the output (rw), then the
    capacity status when ``guarded``. Traffic counts each leaf once, at most as many
    elements as the output (a broadcast or sliced leaf is not read whole), plus the output.
    """
    root = ops[-1]
    n = S.size(root.out_shape)
    gx, gy, gz = grid(n)
    src, bindings = leaf_decls(leaves, 0)
    traffic = esize(root.out_type) * n + sum(esize(leaf.wgsl_type) * min(leaf.size, n)
                                             for leaf in leaves)
    src += decl(len(bindings), "out", root.out_type, "rw")
    bindings.append("rw")
    if guarded:
        src += decl(len(bindings), "status", "u32", "read")
        bindings.append("read")
    src += functions(ops, leaves)[0]
    src += main_1d(gx) + f"  if (i >= {n}u) {{ return; }}\n"
    if guarded:
        src += "  if (status[0] != 0u) { return; }\n"
    src += f"  out[i] = v{len(ops) - 1}(i);\n}}\n"
    name = "fused:" + "+".join(op.op for op in ops)
    return Kernel(name if len(name) <= 60 else name[:57] + "...", src, bindings, (gx, gy, gz),
                  traffic)
