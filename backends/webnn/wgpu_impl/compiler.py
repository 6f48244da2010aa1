"""Graph → ordered list of launches (kernels and buffer copies) with their storage slots.

Pure planning, no device calls: the context turns slots into buffers and launches into
pipelines and bind groups once, at build time. The graph is first
simplified (``rewrite``: duplicate ops merged); the work is done in passes
(``passes``: where results go, fusion and matching), planning (``planning``: the order and
the in-place decision) and lowering (``lowering``: the launches); the launches and slots
are described in ``plan``.
"""

from __future__ import annotations

from ..ir import Graph
from . import lowering, passes, planning, rewrite, split_columns
from .match_attention import NotInPlace
from .options import KernelOptions
from .plan import Plan
from .target import Target


def compile_graph(graph: Graph, stateful: bool, max_binding: int = 1 << 27,
                  target: Target | None = None, options: KernelOptions | None = None) -> Plan:
    """The plan of a built graph (``ir.Graph``, as ``MLGraphBuilder.build`` hands it over):
    its launches in order and the slots they bind, for ``target`` under ``options`` (the
    context's; None: every knob per adapter); ``stateful``: the pairs' state is kept."""
    graph = rewrite.simplified(graph)  # one op per value, no copy that moves nothing
    graph = split_columns.split_products(graph)  # a packed product's parts apart
    options = options or KernelOptions()
    plan = Plan(max_binding=max_binding, target=target or Target(), options=options)
    state = passes.place_results(plan, graph, stateful)
    for run_pass in passes.PASSES:
        run_pass(plan, state)
    steps, check = planning.op_steps(plan, state)
    order = planning.place_state(plan, state, steps, check, graph.outputs)
    planning.live_steps(order, state.dest)
    try:
        lowering.lower_steps(plan, order, state.dest)
    except NotInPlace:  # a row write folded into attention needs its pair in place
        return compile_graph(graph, stateful, max_binding, target,
                             options.replace(attention_writes="off"))
    return plan
