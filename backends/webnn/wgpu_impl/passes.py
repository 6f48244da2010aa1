"""The compiler's passes: where results go, what is read transposed, which element-wise chains
are computed inside their consumers, and which patterns become one launch (decode attention,
stacked and fused matrix-vector products, row writes, a gated delta net's step).

Each pass records its decisions in the plan and marks what it absorbed in the ``PassState``;
none emits a launch (``lowering`` does, from the plan).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .. import shapes as S
from ..ir import Graph, Node, reachable
from ..kernels.quant_rows import quad_scratch_bytes, quad_workgroups
from ..stateful import analyse, root
from . import fusion
from . import gemv as GV
from .match_attention import (
    attention_epilogue,
    combine_of,
    fold_row_writes,
    last2_transpose_input,
    match_attention,
    partials_slot,
)
from .match_gdn import match_gated_delta
from .match_gdn_capsule import match_capsules
from .match_q4 import head_rows, match_q4, rows_norms, rows_workgroups, stacked_rows
from .plan import Plan, Slot
from .row_stat import find_row_stat


@dataclass
class PassState:
    """The graph as the passes see it, and what they decided about its nodes."""

    nodes: list[Node]  # every reachable operand, in creation (topological) order
    dest: dict[int, Slot]  # root id -> the slot it must be computed into
    extra_copies: list[tuple[Node, Slot, str]]  # (root, output slot, name): copied out
    pinned: set[int]  # roots that must be in memory (results, state, state writers)
    writers: set[int]  # ids of the ops writing a pair's present
    no_read: set[int]  # the pairs' past inputs (never read through a fused chain)
    inlined: set[int] = field(default_factory=set)  # computed inside their consumers
    absorbed: set[int] = field(default_factory=set)  # computed by another node's launch


def place_results(plan: Plan, graph: Graph, stateful: bool) -> PassState:
    """Where the results go (outputs, hidden state, the page's inputs) and the nodes to
    compile; a result that is not an op's own output is copied out."""
    outputs, inputs, pairs = graph.outputs, graph.inputs, graph.pairs
    dest: dict[int, Slot] = {}
    extra_copies: list[tuple[Node, Slot, str]] = []
    pair_outputs = {p.output for p in pairs} if stateful else set()
    if stateful:
        for i, p in enumerate(pairs):
            past = inputs[p.input]
            dest[past.id] = ("state", i, "cur")
            plan.pairs.append(analyse(i, p, past, outputs[p.output]))
    for name, o in outputs.items():
        if name in pair_outputs:
            continue
        r = root(o)
        if r.kind == "op" and r.id not in dest:
            dest[r.id] = ("output", name)
        else:
            extra_copies.append((r, ("output", name), name))
    for name, o in inputs.items():
        if o.id not in dest:
            dest[o.id] = ("input", name)
    nodes = reachable(list(outputs.values()))
    writers = {pp.writer.id for pp in plan.pairs if pp.writer is not None}
    pinned = set(dest) | writers | {root(outputs[p.output]).id for p in pairs if stateful}
    return PassState(nodes, dest, extra_copies, pinned, writers,
                     no_read={inputs[p.input].id for p in pairs})


def fold_transposes(plan: Plan, st: PassState) -> None:
    """A matmul whose B is a transpose of the last two axes reads the transpose's input."""
    for o in st.nodes:
        if o.kind == "op" and o.op == "matmul":
            src = last2_transpose_input(root(o.inputs[1]))
            if src is not None:
                plan.fold[o.id] = src
    # a matmul reading a transpose's input directly needs that input in memory: a fusible
    # one (a float16 cache's widening cast) must not be computed only inside the transpose
    st.pinned |= {src.id for src in plan.fold.values()}


def gdn_capsules(plan: Plan, st: PassState) -> None:
    """ORT's capture and replay as ``convert_gdn`` builds them: one launch each; what the
    kernels read and write is pinned (never computed only inside a fused chain)."""
    if plan.options.gdn != "generic":
        plan.capsule = match_capsules(st.nodes, st.pinned, plan.target.max_storage,
                                      fuse=plan.options.gdn_replay != "launch")
    for m in plan.capsule.values():
        st.pinned |= {x.id for x in (*m.leaves, m.out, *m.written) if x.kind == "op"}
        st.absorbed |= {x.id for x in m.ops if x is not m.out}


def fuse_loops(plan: Plan, st: PassState) -> None:
    """Loop fusion: element-wise chains computed inside their consumers."""
    st.inlined, plan.groups = fusion.plan(st.nodes, st.pinned, st.writers,
                                          max(1, plan.target.max_storage - 3),
                                          no_read=st.no_read)


def decode_attention(plan: Plan, st: PassState) -> None:
    """QK, the score chain, softmax and probs·V in two launches."""
    opts = plan.options
    if opts.attention_matched():
        found = match_attention(st.nodes, st.inlined, plan.groups, st.pinned,
                                plan.target.shared_bytes)
        # each kept where its own variant (``attention_for`` its q rows) is a matched one
        plan.attention = {i: m for i, m in found.items() if opts.attention_matched(m.q_rows)}
        q_norms(plan, st)
    st.absorbed |= {x.id for m in plan.attention.values() for x in m.absorbed}


def q_norms(plan: Plan, st: PassState) -> None:
    """A per-row reduction q's chain reads (Qwen3.5's per-head RMS norm of q: its mean of
    squares), computed by the attention kernel reading q (``row_stat``): no launch."""
    consumers = fusion.consumers_of(st.nodes)
    taken = st.pinned | st.absorbed | st.writers
    for m in plan.attention.values():
        if m.q_chain is not None:
            m.q_norm = find_row_stat(m.q_chain, int(m.out.shape[-1]), consumers,
                                     plan.groups, taken)


def attention_epilogues(plan: Plan, st: PassState) -> None:
    """An element-wise group reading an attention's output (Qwen3.5's output gate,
    ``o · sigmoid(gate)``) written by the attention's combine (its second launch, or the
    one launch's folded combine) instead of the output
    (``match_attention.attention_epilogue``): the group has no launch of its own and the
    output is never stored."""
    consumers = fusion.consumers_of(st.nodes)
    group_of = {o.id: g for g in plan.groups.values() for o in g.ops}
    for aid, m in plan.attention.items():
        if aid in st.pinned:
            continue
        m.epilogue = attention_epilogue(m, consumers, group_of, st.absorbed | st.writers,
                                        plan.target.max_storage)
        if m.epilogue is not None:
            st.absorbed.add(m.epilogue.ops[-1].id)


def _gpu_gemv(plan: Plan) -> bool:
    """Whether the matrix-vector products are the GPU (rows) kernels the gemv passes serve."""
    return not plan.options.gemv_variant(plan.target).startswith(("cols", "legacy"))


def stack_gemvs(plan: Plan, st: PassState) -> None:
    """Matrix-vector products of one input against stacked weights: one launch."""
    if _gpu_gemv(plan):
        plan.stacked = GV.stacked_gemvs(st.nodes, plan.fold, plan.max_binding, plan.q4)
    plan.stacked_rows = stacked_rows(st.nodes, plan.q4_rows, plan.max_binding)
    # (after fusion: the output read as it lies must be in memory, not inlined)
    plan.head_rows = head_rows(plan.q4_rows, st.nodes, st.inlined)
    st.absorbed |= {x.id for g in (plan.stacked, plan.stacked_rows)
                    for ms in g.values() for x in ms[1:]}


def residual_epilogues(plan: Plan, st: PassState) -> None:
    """Residual adds folded into the matrix-vector product feeding them."""
    rows = set(plan.q4_rows) - set(plan.stacked_rows)  # several rows: every target
    gpu = _gpu_gemv(plan)
    if gpu or rows:
        plan.epilogue = GV.residual_epilogues(st.nodes, plan.fold, st.inlined, plan.groups,
                                              st.pinned | st.absorbed, set(plan.stacked),
                                              set(plan.q4) if gpu else set(), rows, gpu)
    st.absorbed |= {add.id for add, _ in plan.epilogue.values()}


def gated_epilogues(plan: Plan, st: PassState) -> None:
    """A gated MLP's activation (SwiGLU) written by the launch of its stacked 4-bit gate and
    up products (``q4_epilogue``), where the "quad" kernel runs them, or of several rows
    where they run by column, or of float ones on the rows kernel (``gemv_epilogue``); so
    is an element-wise tail read only by one 4-bit product (the logits' float16
    rounding)."""
    if plan.options.q4_gated(plan.target):
        pairs = {k: ms for k, ms in plan.stacked.items()
                 if all(m.id in plan.q4 and plan.q4[m.id].quad_fits for m in ms)}
        plan.gated = GV.gated_epilogues(st.nodes, pairs, plan.groups, st.pinned | st.absorbed,
                                          st.pinned)
        # one product read only by an element-wise tail (the head's float16 logits)
        stacked = {m.id for ms in plan.stacked.values() for m in ms}
        alone = {i for i, w in plan.q4.items() if w.quad_fits and i not in stacked
                 and i not in plan.epilogue}
        plan.gated |= GV.mapped_epilogues(st.nodes, alone, plan.groups, st.inlined,
                                          st.absorbed, st.pinned)
    if plan.options.q4_rows_gated(plan.target):  # several rows: gemm_q4_cols' pair columns
        plan.gated |= GV.gated_epilogues(st.nodes, plan.stacked_rows, plan.groups,
                                         st.pinned | st.absorbed, st.pinned)
    if _float_gated(plan):  # float weights: the rows kernel, a workgroup whole groups of 4
        pairs = {k: ms for k, ms in plan.stacked.items() if not any(m.id in plan.q4 for m in ms)}
        plan.gated |= GV.gated_epilogues(st.nodes, pairs, plan.groups, st.pinned | st.absorbed,
                                         st.pinned)
    st.absorbed |= {g.root.id for g in plan.gated.values()}


def _float_gated(plan: Plan) -> bool:
    """Whether a stacked pair of float-weight products may write its activation
    (``gemv_epilogue``): the rows kernel runs them, its workgroups holding whole groups of
    the pair's rows (``gemv.paired_rows``)."""
    return (_gpu_gemv(plan) and plan.options.gemv_gated(plan.target)
            and GV.rows_per_workgroup(plan.target, plan.options.gemv_variant(plan.target))
            % 4 == 0)


def gemv_prologues(plan: Plan, st: PassState) -> None:
    """A gemv's input vector computed by the gemv (RMSNorm's tail, SwiGLU), or in one launch
    with its reduction."""
    mode = plan.options.gemv_prologue or "launch"
    gpu_gemv = _gpu_gemv(plan)
    q4_mode = plan.options.q4_prologue or "off"
    quad = plan.options.q4_quad(plan.target)
    products, workgroups = _one_row_partials(plan, st)
    if products:  # one row: 4-bit products on the quad kernel, float ones on the rows kernel
        plan.prologue, plan.norm_stats = GV.norm_partials(
            st.nodes, st.inlined, plan.groups, st.pinned | st.absorbed, plan.epilogue,
            products, workgroups, plan.target,
            reads=partial(_reads_partials, plan),
            spread=partial(_one_row_spread, plan, quad[0] if quad else 1))
        st.absorbed |= {x.id for pro in plan.prologue.values() for x in pro.absorbed}
    if plan.q4_rows and plan.options.q4_rows_norm_partials(plan.target):  # a verify's
        pros, stats = GV.norm_partials(
            st.nodes, st.inlined, plan.groups, st.pinned | st.absorbed, plan.epilogue,
            _q4_rows_other_bindings(plan, st), partial(_q4_rows_workgroups, plan),
            plan.target)
        plan.prologue |= pros
        plan.norm_stats |= stats
        st.absorbed |= {x.id for pro in pros.values() for x in pro.absorbed}
    if q4_mode != "off" and plan.q4 and quad is not None:
        plan.prologue |= GV.gemv_prologues(st.nodes, plan.fold, st.inlined, plan.groups,
                                           st.pinned | st.absorbed, plan.target,
                                           reductions=q4_mode == "full",
                                           q4=_q4_other_bindings(plan))
        st.absorbed |= {x.id for pro in plan.prologue.values() for x in pro.absorbed}
    elif plan.q4 and quad is not None and plan.options.q4_norm_partials(plan.target):
        # norms computed where read: a per-head one too (Qwen3.5's gated norm)
        plan.prologue |= GV.gemv_prologues(st.nodes, plan.fold, st.inlined, plan.groups,
                                           st.pinned | st.absorbed, plan.target,
                                           q4=_q4_other_bindings(plan), grouped_only=True)
        st.absorbed |= {x.id for pro in plan.prologue.values() for x in pro.absorbed}
    if gpu_gemv and mode in ("full", "vector"):
        plan.prologue |= GV.gemv_prologues(st.nodes, plan.fold, st.inlined, plan.groups,
                                           st.pinned | st.absorbed, plan.target,
                                           reductions=mode == "full")
    elif gpu_gemv and mode == "launch":
        # a graph output may be such a vector (it is written anyway); a state writer not
        plan.vectors = GV.row_reductions(st.nodes, st.inlined, plan.groups,
                                         (st.pinned - set(st.dest)) | st.absorbed,
                                         st.pinned | st.absorbed, plan.target)
    st.absorbed |= {x.id for pro in plan.prologue.values() for x in pro.absorbed}
    st.absorbed |= {pro.reduce_op.id for pro in plan.vectors.values()}


def _one_row_partials(plan: Plan, st: PassState
                      ) -> tuple[dict[int, int], Callable[[Node], int | None]]:
    """(product id -> its bindings besides the input vector, a product's launch's
    workgroups or None) of the one-row products whose kernels write a norm's partial sums
    and read them (``gemv.norm_partials``): 4-bit ones on the "quad" kernel
    (``q4_norms``), float ones on the rows kernel (``gemv_norms``)."""
    quad = plan.options.q4_quad(plan.target)
    products: dict[int, int] = {}
    if plan.q4 and quad is not None and plan.options.q4_norm_partials(plan.target):
        products |= _q4_other_bindings(plan)
    if _gpu_gemv(plan) and plan.options.gemv_norm_partials(plan.target):
        products |= _float_other_bindings(plan, st)
    return products, partial(_one_row_workgroups, plan, quad[0] if quad else 1)


def _one_row_spread(plan: Plan, loads: int, p: Node) -> int:
    """The workgroups of one-row product ``p`` over all its launches (``norm_partials``'
    bound on a reader's)."""
    if p.id not in plan.q4:
        return GV.rows_spread(plan, p)
    w = plan.q4[p.id]
    return quad_workgroups(w.K, w.N, loads)


def _one_row_workgroups(plan: Plan, loads: int, p: Node) -> int | None:
    """The workgroups of one-row product ``p``'s one launch (the partial sums it writes):
    the "quad" kernel of ``loads`` loads an invocation, or the rows kernel; None where its
    weights take several launches."""
    if p.id not in plan.q4:
        return GV.rows_workgroups(plan, p)
    w = plan.q4[p.id]
    return _one_row_spread(plan, loads, p) if w.N * (w.K // 2) <= plan.max_binding else None


def _q4_rows_workgroups(plan: Plan, p: Node) -> int | None:
    """The workgroups a row of several-row 4-bit product ``p``'s one launch has (the
    partial sums it writes a row: ``match_q4.rows_workgroups``); None where its codes take
    several launches."""
    w = plan.q4_rows[p.id]
    return (rows_workgroups(plan, w, S.size(p.shape[:-1]))
            if w.N * (w.K // 2) <= plan.max_binding else None)


def _reads_partials(plan: Plan, c: Node) -> bool:
    """Whether one-row product ``c`` may compute a norm from partial sums where it reads
    it: a 4-bit one (the quad kernel reads it as it goes), a float one whose vector fits
    the rows kernel's workgroup memory beside a pair's or a norm's rows."""
    if c.id in plan.q4:
        return True
    rows = GV.rows_per_workgroup(plan.target, plan.options.gemv_variant(plan.target))
    return GV.vector_fits(c.inputs[0].shape[-1], plan.target, extra=2 * rows)


def _float_other_bindings(plan: Plan, st: PassState) -> dict[int, int]:
    """One-row float-weight product id -> the bindings its rows kernel has besides the
    input vector (weights, residual, outputs)."""
    outs = _outputs(plan, plan.stacked)
    return {o.id: 1 + (o.id in plan.epilogue) + outs.get(o.id, 1) for o in st.nodes
            if o.kind == "op" and o.op == "matmul" and o.id not in plan.q4
            and S.size(o.shape[:-1]) == 1 and S.size(o.inputs[0].shape[:-1]) == 1
            and GV.const_weight(o, plan.fold) is not None}


def _outputs(plan: Plan, stacked: dict[int, list[Node]]) -> dict[int, int]:
    """Stacked product id -> the outputs its launch binds: one where the pair writes its
    activation (``plan.gated``), else one a member."""
    return {m.id: 1 if k in plan.gated else len(ms) for k, ms in stacked.items() for m in ms}


def _q4_other_bindings(plan: Plan) -> dict[int, int]:
    """4-bit product id -> the bindings its launch has besides the input vector (codes,
    scales, zero-point terms, residual, outputs, the partial sums it writes), for the
    products the "quad" kernel runs."""
    outs = _outputs(plan, plan.stacked)
    return {i: 2 + w.zero_points + (i in plan.epilogue) + outs.get(i, 1)
            + (i in plan.norm_stats) for i, w in plan.q4.items() if w.quad_fits}


def _q4_rows_other_bindings(plan: Plan, st: PassState) -> dict[int, int]:
    """Several-row 4-bit product id -> the bindings its launch has besides the input (codes,
    scales, zero-point terms, residual, outputs), for the products whose kernel
    (``gemm_q4_quad`` or ``gemm_q4_cols``) runs with a norm's partial sums in its
    workgroup memory (``match_q4.rows_norms``)."""
    outs = _outputs(plan, plan.stacked_rows)
    rows = {o.id: S.size(o.inputs[0].shape[:-1]) for o in st.nodes if o.id in plan.q4_rows}
    return {i: 2 + w.zero_points + (i in plan.epilogue) + outs.get(i, 1)
            for i, w in plan.q4_rows.items() if rows_norms(plan, w, rows[i])}


def group_row_writes(plan: Plan, st: PassState) -> None:
    """Row writes at one index tensor (a layer's K and V): one launch."""
    if plan.options.row_writes != "separate":
        plan.row_writes = _row_write_groups(st.nodes, st.absorbed, plan.groups,
                                            plan.target.max_storage)
    st.absorbed |= {x.id for ms in plan.row_writes.values() for x in ms[1:]}


def attention_row_writes(plan: Plan, st: PassState) -> None:
    """A layer's K and V row writes (RoPE of k inside) written by its attention's first
    launch (``KernelOptions.attention_writes``), where the two-launch flash or tile kernel
    runs it and the pairs are the stateful graph's."""
    def takes_writes(q_rows: int, capacity: int) -> bool:
        """Whether the kernel lowering an attention of ``q_rows`` q rows takes its row
        writes: flash, or tile (flash where tile does not lay it out)."""
        return (plan.options.attention_for(q_rows) in (None, "flash")
                or plan.options.attention_tile(q_rows, capacity, plan.target) is not None)

    takers = {i: m for i, m in plan.attention.items() if takes_writes(m.q_rows, m.capacity)}
    if takers and plan.options.attention_writes_fold(plan.target):
        plan.attention_writes = fold_row_writes(takers, st.nodes, st.writers,
                                                plan.row_writes, plan.groups,
                                                plan.target.max_storage,
                                                one_row=plan.options.attention_writes is None)
        folded = {x.id for ks in plan.attention_writes.values() for x in ks}
        plan.row_writes = {k: ms for k, ms in plan.row_writes.items()
                           if not any(x.id in folded for x in ms)}
        write_norms(plan, st)
    st.absorbed |= {x.id for ks in plan.attention_writes.values() for x in ks}


def write_norms(plan: Plan, st: PassState) -> None:
    """A per-row reduction a folded row write's updates read (Qwen3.5's per-head RMS norm
    of k), computed by the attention's first launch writing the row (``row_stat``)."""
    consumers = fusion.consumers_of(st.nodes)
    for oid, ws in plan.attention_writes.items():
        norms = []
        for w in ws:
            g = plan.groups.get(w.id)
            inner = g.inner if g is not None else None
            found = None
            if inner is not None and inner.ops and inner.ops[-1] is root(w.inputs[2]):
                found = find_row_stat(inner, int(w.shape[-1]), consumers, plan.groups,
                                      st.pinned | st.absorbed | st.writers)
            norms.append(found)
        plan.attention[oid].write_norms = (norms[0], norms[1])
        st.absorbed |= {x.reduce.id for x in norms if x is not None}


def attention_combines(plan: Plan, st: PassState) -> None:
    """A two-launch attention's combine computed by the one product reading its output
    (``KernelOptions.attention_combine`` "product"): a one-row product with constant
    weights (the o projection) on the 4-bit "quad" or the float rows kernel, every
    workgroup combining the splits into its workgroup memory (``gemv.CombinePrologue``), so
    the combine has no launch of its own. Where the combine writes an epilogue (an output
    gate: ``attention_epilogues``) the product reads the epilogue's root and computes it
    too, each element from the combined value and the epilogue's leaves. Where the splits'
    weights, the vector and the product's own workgroup memory do not fit, or the bindings
    exceed the limit, the combine keeps its launch. Left to the adapter, a GPU's combine is
    computed so where its splits are few (``options.COMBINE_PRODUCT_SPLITS``)."""
    if not plan.options.attention_combine_product(plan.target):
        return
    quad = plan.options.q4_quad(plan.target) is not None
    other = (_q4_other_bindings(plan) if quad else {}) | (
        _float_other_bindings(plan, st) if _gpu_gemv(plan) else {})
    consumers = fusion.consumers_of(st.nodes)
    for aid, m in plan.attention.items():
        x = m.epilogue.ops[-1] if m.epilogue is not None else m.out  # the vector read
        readers = consumers.get(x.id, [])
        c = readers[0] if len(readers) == 1 else None
        K = S.size(m.out.shape)
        if (c is None or aid in st.pinned or x.id in st.pinned or c.id not in other
                or c.id in plan.prologue or c.id in plan.stacked or root(c.inputs[0]) is not x
                or c.inputs[0].shape[-1] != K or S.size(c.shape[:-1]) != 1
                or 1 + len(m.epilogue_leaves) + other[c.id] > plan.target.max_storage):
            continue
        k2 = combine_of(plan, m.out)
        if k2 is None or not plan.options.attention_combine_product(plan.target, k2.splits):
            continue
        combine = k2.rows * (k2.splits + 1) + K  # floats: the splits' weights, the vector
        if not (4 * combine + quad_scratch_bytes() <= plan.target.shared_bytes if c.id in plan.q4
                else GV.vector_fits(K, plan.target, combine)):
            continue
        plan.prologue[c.id] = GV.CombinePrologue(m.out, k2, partials_slot(m.out),
                                                 m.epilogue_kernel(), m.epilogue_leaves)
        plan.combined[aid] = c.id


def gated_delta(plan: Plan, st: PassState) -> None:
    """A gated delta net's decode step: one launch."""
    gdn = plan.options.gdn_variant(plan.target)
    if gdn is not None:
        vectors = set(plan.vectors) | {pro.reduce_op.id for pro in plan.vectors.values()}
        taken = (st.absorbed - vectors) | {*plan.attention, *plan.stacked, *plan.epilogue,
                                           *plan.prologue, *plan.row_writes}
        plan.gdn = match_gated_delta(st.nodes, st.inlined, plan.groups, st.pinned, taken,
                                     plan.target.max_storage, vectors, fold_norms=gdn[2])
        for m in plan.gdn.values():  # q's and k's norms folded in: no launch of their own
            inside = {x.id for x in m.ops}
            for root_id in [r for r in plan.vectors if r in inside]:
                plan.vectors.pop(root_id)
    st.absorbed |= {x.id for m in plan.gdn.values() for x in m.absorbed}


def q4_gemvs(plan: Plan, st: PassState) -> None:
    """Products with 4-bit constant weights read the codes (``match_q4``; of several rows:
    ``plan.q4_rows``): their dequantizeLinear is then read by nothing and never launched
    (``planning.live_steps``)."""
    if plan.options.q4_gemv != "generic":
        plan.q4 = match_q4(st.nodes)
        plan.q4_rows = match_q4(st.nodes, rows=True)


#: the passes after ``place_results``, in order: each sees what the earlier ones absorbed
PASSES = (fold_transposes, q4_gemvs, gdn_capsules, fuse_loops, decode_attention,
          attention_epilogues, stack_gemvs,
          residual_epilogues, gated_epilogues, gemv_prologues, group_row_writes,
          attention_row_writes, attention_combines, gated_delta)


#: ops the wgpu kernels run on float16 operands (WGSL f16 storage): casts, element-wise
#: ops, data movement and row writes, and a float16 K/V cast to float32 where decode
#: attention reads it (``attention.match_attention`` reads the float16 cache directly).
#: The others (matmul, softmax, reductions) the builder runs in float32 between casts
#: (``WgpuContext._widens``, ``MLGraphBuilder._widened``)
F16_OPS = fusion.FUSIBLE | {"reshape", "gather", "scatter_nd", "dequantize_linear"}


def _row_write_groups(nodes: list[Node], absorbed: set[int], groups: dict[int, Any],
                      max_storage: int) -> dict[int, list[Node]]:
    """scatter_nd ops writing same-shaped tensors at one index tensor (a layer's K and V
    rows), grouped: first id -> the group, within the storage-binding limit."""
    by_key: dict[tuple, list[Node]] = {}
    for o in nodes:
        if o.kind == "op" and o.op == "scatter_nd" and o.id not in absorbed:
            key = (root(o.inputs[1]).id, tuple(o.shape), tuple(o.inputs[2].shape),
                   o.dtype.wgsl)
            by_key.setdefault(key, []).append(o)
    out: dict[int, list[Node]] = {}
    for ms in by_key.values():
        group: list[Node] = []
        used = 2  # indices, status
        for m in ms:
            need = 1 + (len(groups[m.id].inner.leaves) if m.id in groups else 1)
            # members must not depend on each other (layer 1's K row needs layer 0's cache)
            independent = not any(g.id in _ancestors(m) for g in group)
            if group and (used + need > max_storage or not independent):
                if len(group) > 1:
                    out[group[0].id] = group
                group, used = [], 2
            group.append(m)
            used += need
        if len(group) > 1:
            out[group[0].id] = group
    return out


def _ancestors(o: Node) -> set[int]:
    """Ids of every operand ``o`` depends on."""
    seen: set[int] = set()
    stack = list(o.inputs)
    while stack:
        x = stack.pop()
        if x.id not in seen:
            seen.add(x.id)
            stack.extend(x.inputs)
    return seen
