"""A real hybrid export's K-token graph in deferred-commit form, so a speculative loop can
keep any m of its K verified tokens with no new API (docs/speculative.md, "A real hybrid
export"): what ``model.export_deferred`` builds into statebench's own export, made here by
rewriting onnxruntime-genai's ``com.microsoft`` ops in the pinned K-token graph (after
``fixed_capacity``), every other input and output left as the export names it.

Per ``LinearAttention`` (update rule gated_delta) over the state pair ``past`` -> ``present``:

- the pair keeps the *committed* state (from before the last verify);
- a capsule pair (``rollback_names.capsule_name``: ``past_state_update.i`` ->
  ``present_state_update.i``, [1, K, row]) keeps the last verify's per-token operands as the
  node took them: log decay, key, value and beta (row = their widths);
- the dispatch first commits: the same op run over the capsule, its tokens at and past
  ``accepted_count`` zeroed (decay 0 is a factor of 1, beta 0 an update of 0: exact identity
  steps, so one graph serves every m), from the committed state; the result is the present
  state and the state the K tokens are verified from, by the export's own node.

The commit is the export's own recurrence (the node's op, its WebNN lowering
``convert_linear``'s), not a second spelling of it: what the committed state holds is by
construction what the one-token graph would have made of the kept tokens.

Per ``CausalConvWithState`` (ndim 1, channels first, no dilation) over ``past`` [1, C, W]
(W = kernel - 1): the pair keeps W + K columns, the last dispatch's window then its K new
inputs; the dispatch reads its window at columns ``accepted_count`` .. + W - 1 (a Gather)
and the pair's new value is that window and its own K inputs.

``DeferredGraph`` says what was rewritten, feeds the pairs at depth (``load``) and gives the
state the next dispatch starts from in the export's own layout (``committed``), so a
page's state check compares it with the one-token reference's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from backends.webnn.rollback_names import ACCEPTED, MAX_TOKENS, capsule_name


class DeferredError(ValueError):
    """A GDN or conv node the rewrite cannot make deferred; the message names it and why."""


@dataclass(frozen=True)
class Recurrent:
    """One LinearAttention's state pair and capsule: K-major state [1, Hkv, Dk, Dv], key
    heads Hk (state head h reads key head h // (Hkv / Hk)), decay and beta widths."""

    state: str
    capsule: str
    hkv: int
    hk: int
    dk: int
    dv: int
    decay_w: int
    beta_w: int
    #: the state's ONNX element type (float32, or float16 as a q4f16 export keeps it): the
    #: capsule's too, since it holds the node's own operands
    dtype: int = TensorProto.FLOAT

    @property
    def widths(self) -> tuple[int, int, int, int]:
        return self.decay_w, self.hk * self.dk, self.hkv * self.dv, self.beta_w

    @property
    def row(self) -> int:
        return sum(self.widths)


@dataclass(frozen=True)
class ConvWindow:
    """One CausalConvWithState's pair: ``hist`` (kernel - 1) window columns of C channels."""

    past: str
    channels: int
    hist: int


@dataclass
class DeferredGraph:
    """What ``make_deferred`` rewrote for K tokens a dispatch."""

    k: int
    recurrent: list[Recurrent] = field(default_factory=list)
    conv: list[ConvWindow] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.recurrent or self.conv)

    def describe(self) -> dict[str, list[str]]:
        """The pairs it commits by accepted_count (a point's ``details.deferred_commit``)."""
        return {"recurrent": [r.state for r in self.recurrent],
                "conv": [c.past for c in self.conv]}

    def load(self, cache: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The rewritten pairs' values for a state in the export's layout (by past name,
        batch 1): each conv window in columns 0 .. W - 1 of its W + K, each capsule zeros
        (identity steps); the next dispatch's accepted_count is 0."""
        out = dict(cache)
        for c in self.conv:
            window = np.asarray(cache[c.past])
            cols = np.zeros((1, c.channels, c.hist + self.k), window.dtype)
            cols[..., :c.hist] = window.reshape(1, c.channels, c.hist)
            out[c.past] = cols
        for r in self.recurrent:
            out[r.capsule] = np.zeros((1, self.k, r.row), helper.tensor_dtype_to_np_dtype(r.dtype))
        return out

    def committed(self, pairs: dict[str, np.ndarray], accepted: int) -> dict[str, np.ndarray]:
        """The state the pairs hold once the next dispatch commits ``accepted`` tokens, in
        the export's layout (float64; capsules left out): each recurrent state replayed over
        the capsule's first ``accepted`` tokens (gated delta rule, NumPy), each conv window
        its columns ``accepted`` .. ``accepted`` + W - 1. Checks and tests."""
        capsules = {r.capsule for r in self.recurrent}
        out = {n: np.asarray(a, np.float64) for n, a in pairs.items() if n not in capsules}
        for r in self.recurrent:
            if r.state not in out:
                continue
            cap = np.asarray(pairs[r.capsule], np.float64).reshape(self.k, r.row)
            s = out[r.state].reshape(r.hkv, r.dk, r.dv).copy()
            heads = np.arange(r.hkv) // (r.hkv // r.hk)
            for j in range(accepted):
                g, key, v, beta = np.split(cap[j], np.cumsum(r.widths)[:-1])
                a = np.exp(g).reshape(r.hkv, -1, 1)  # per head (1) or per key dim (Dk)
                key = key.reshape(r.hk, r.dk)[heads]  # [Hkv, Dk]
                s = s * a
                retrieved = np.einsum("hd,hdv->hv", key, s)
                upd = (v.reshape(r.hkv, r.dv) - retrieved) * np.broadcast_to(beta, (r.hkv,))[:, None]
                s = s + key[:, :, None] * upd[:, None, :]
            out[r.state] = s.reshape(1, r.hkv, r.dk, r.dv)
        for c in self.conv:
            if c.past in out:
                out[c.past] = out[c.past][..., accepted:accepted + c.hist]
        return out


def gdn_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes whose state a token overwrites: LinearAttention and CausalConvWithState
    reading a graph input (a pair's past)."""
    inputs = {i.name for i in model.graph.input}
    return [n for n in model.graph.node if n.domain == "com.microsoft"
            and ((n.op_type == "LinearAttention" and len(n.input) > 3 and n.input[3] in inputs)
                 or (n.op_type == "CausalConvWithState" and len(n.input) > 3
                     and n.input[3] in inputs))]


def make_deferred(model: onnx.ModelProto, k: int) -> DeferredGraph:
    """Rewrite ``model`` (pinned for K tokens at batch 1, ``fixed_capacity.fixed_model``;
    changed in place) into deferred-commit form (module docstring). An empty
    ``DeferredGraph`` where the model has no such node (nothing changed). DeferredError
    naming the first node that cannot be rewritten (nothing changed then)."""
    nodes = gdn_nodes(model)
    done = DeferredGraph(k)
    if not nodes:
        return done
    if not 1 < k <= MAX_TOKENS:
        raise DeferredError(f"a deferred commit of K = {k}: 2 .. {MAX_TOKENS} tokens a verify")
    plans = [(n, _plan(model, n, k)) for n in nodes]  # every check before any change
    capsules = [p.capsule for _, p in plans if isinstance(p, Recurrent)]
    if len(set(capsules)) != len(capsules):
        raise DeferredError(f"two LinearAttention states would share a capsule pair "
                            f"({', '.join(capsules)}): their names' layer numbers repeat")
    g = model.graph
    g.input.append(helper.make_tensor_value_info(ACCEPTED, TensorProto.INT64, [1]))
    for node, plan in plans:
        if isinstance(plan, Recurrent):
            _rewrite_recurrent(model, node, plan, k)
            done.recurrent.append(plan)
        else:
            _rewrite_conv(model, node, plan, k)
            done.conv.append(plan)
    return done


def try_deferred(model: onnx.ModelProto, k: int) -> tuple[DeferredGraph | None, str]:
    """``make_deferred`` for a backend: (what was rewritten, or None where nothing was, "")
    or (None, why the rewrite refused, in the words a rollback refusal gives)."""
    try:
        done = make_deferred(model, k)
    except DeferredError as exc:
        return None, f"the deferred-commit rewrite: {exc}"
    return (done or None), ""


# -- planning (checks and widths; nothing changed) -----------------------------------------


def _attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _dims(vi: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]


def _plan(model: onnx.ModelProto, node: onnx.NodeProto, k: int) -> Recurrent | ConvWindow:
    g = model.graph
    name = node.name or node.output[0]
    inputs = {i.name: i for i in g.input}
    outputs = {o.name for o in g.output}
    past = inputs[node.input[3]]
    shape = _dims(past)
    if len(node.output) < 2 or node.output[1] not in outputs:
        raise DeferredError(f"{node.op_type} {name!r}: its new state is not a graph output")
    if any(node.output[1] in n.input or node.input[3] in n.input
           for n in g.node if n is not node):
        raise DeferredError(f"{node.op_type} {name!r}: its state is read by another node "
                            "(the rewrite changes what the pair holds)")
    dtype = past.type.tensor_type.elem_type
    if dtype not in (TensorProto.FLOAT, TensorProto.FLOAT16):
        raise DeferredError(f"{node.op_type} {name!r}: a float32 or float16 state only")
    if min(shape, default=-1) < 1 or shape[0] != 1:
        raise DeferredError(f"{node.op_type} {name!r}: {node.input[3]} is not pinned at batch 1 "
                            f"({shape})")
    attrs = _attrs(node)
    if node.op_type == "CausalConvWithState":
        if (attrs.get("ndim", 1) != 1 or attrs.get("state_window", 0)
                or attrs.get("channels_last", 0) or attrs.get("dilation", 1) != 1):
            raise DeferredError(f"CausalConvWithState {name!r}: ndim 1, channels first, no "
                                f"dilation or state window only ({attrs})")
        if len(shape) != 3:
            raise DeferredError(f"CausalConvWithState {name!r}: state of rank {len(shape)}")
        return ConvWindow(node.input[3], shape[1], shape[2])
    if attrs.get("update_rule", "gated_delta") != "gated_delta" or attrs.get("state_window", 0):
        raise DeferredError(f"LinearAttention {name!r}: update rule gated_delta without a "
                            f"state window only ({attrs})")
    if len(node.input) < 6 or not (node.input[4] and node.input[5]):
        raise DeferredError(f"LinearAttention {name!r}: gated_delta needs decay and beta")
    if len(shape) != 4:
        raise DeferredError(f"LinearAttention {name!r}: state of rank {len(shape)}")
    _, hkv, dk, dv = shape
    widths = _Widths(model)
    kw, vw, gw, bw = (widths.of(node.input[j]) for j in (1, 2, 4, 5))
    missing = [w for w, v in (("key", kw), ("value", vw), ("decay", gw), ("beta", bw)) if v is None]
    if missing:
        raise DeferredError(f"LinearAttention {name!r}: the width of its {', '.join(missing)} "
                            "is not known from the graph (traced to a projection, Split or "
                            "Reshape)")
    hk = kw // dk
    if kw % dk or hkv % hk or vw != hkv * dv or gw not in (hkv, hkv * dk) or bw not in (1, hkv):
        raise DeferredError(f"LinearAttention {name!r}: key {kw}, value {vw}, decay {gw} and "
                            f"beta {bw} wide for a state [{hkv}, {dk}, {dv}]")
    layer = re.search(r"\d+", node.input[3])
    past_cap = capsule_name(int(layer.group()) if layer else len(g.input))[0]
    if past_cap in inputs:
        raise DeferredError(f"LinearAttention {name!r}: the graph already has {past_cap!r}")
    return Recurrent(node.input[3], past_cap, hkv, hk, dk, dv, gw, bw, dtype)


class _Widths:
    """The last dimension of a value, traced back through what makes it: a MatMul by a
    weight, a Split by constant sizes, a Reshape to a constant positive last dimension,
    LinearAttentionGate (decay: its ``a``'s width, beta: its ``b``'s), and ops that keep the
    first input's width (elementwise, normalisations, activations)."""

    KEEP = frozenset({"Add", "Sub", "Mul", "Div", "Cast", "Identity", "Sigmoid", "Softplus",
                      "Neg", "Exp", "LpNormalization", "SimplifiedLayerNormalization",
                      "LayerNormalization"})

    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.producers = {o: n for n in g.node for o in n.output}
        self.consts = {t.name: t for t in g.initializer}
        self.consts.update({n.output[0]: a.t for n in g.node if n.op_type == "Constant"
                            for a in n.attribute if a.name == "value"})
        self.inputs = {i.name: _dims(i) for i in g.input}

    def _const(self, name: str) -> np.ndarray | None:
        t = self.consts.get(name)
        if t is None or t.data_location == TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(t)

    def of(self, name: str) -> int | None:
        for _ in range(32):
            if name in self.inputs:
                last = self.inputs[name][-1] if self.inputs[name] else -1
                return last if last > 0 else None
            node = self.producers.get(name)
            if node is None:
                t = self.consts.get(name)
                return int(t.dims[-1]) if t is not None and t.dims else None
            op = node.op_type
            if op == "MatMul" and node.input[1] in self.consts:
                return int(self.consts[node.input[1]].dims[-1])
            if op == "MatMulNBits":
                return next((int(a.i) for a in node.attribute if a.name == "N"), None)
            if op == "Split":
                sizes = (self._const(node.input[1]) if len(node.input) > 1 and node.input[1]
                         else next((list(a.ints) for a in node.attribute if a.name == "split"),
                                   None))
                if sizes is None:
                    return None
                return int(np.asarray(sizes).reshape(-1)[list(node.output).index(name)])
            if op == "Reshape":
                target = self._const(node.input[1])
                if target is not None and target.size and int(target.reshape(-1)[-1]) > 0:
                    return int(target.reshape(-1)[-1])
                return None
            if op == "LinearAttentionGate":
                name = node.input[0] if list(node.output).index(name) == 0 else node.input[3]
                continue
            if op not in self.KEEP:
                return None
            name = node.input[0]
        return None


# -- the rewrites ----------------------------------------------------------------------------


class _Nodes:
    """New nodes and constants of one rewrite, named under ``base``, inserted before ``at``."""

    def __init__(self, model: onnx.ModelProto, base: str) -> None:
        self.g, self.base, self.nodes, self.n = model.graph, base, [], 0

    def name(self, what: str) -> str:
        self.n += 1
        return f"{self.base}.{what}.{self.n}"

    def const(self, value: np.ndarray, what: str = "const") -> str:
        name = self.name(what)
        self.g.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, domain: str = "",
           **attrs) -> str:
        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, domain=domain,
                                           **attrs))
        return out

    def insert_before(self, node: onnx.NodeProto) -> None:
        at = list(self.g.node).index(node)
        for j, n in enumerate(self.nodes):
            self.g.node.insert(at + j, n)


def _set_shape(vi: onnx.ValueInfoProto, dims: list[int]) -> None:
    shape = vi.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        shape.dim.add().dim_value = d


def _rewrite_recurrent(model: onnx.ModelProto, node: onnx.NodeProto, r: Recurrent,
                       k: int) -> None:
    g = model.graph
    past_cap, present_cap = r.capsule, r.capsule.replace("past_", "present_", 1)
    present_state = node.output[1]
    b = _Nodes(model, f"deferred.{r.state}")
    np_dtype = helper.tensor_dtype_to_np_dtype(r.dtype)
    g.input.append(helper.make_tensor_value_info(past_cap, r.dtype, [1, k, r.row]))
    g.output.append(helper.make_tensor_value_info(present_cap, r.dtype, [1, k, r.row]))
    # the commit: the capsule's tokens at and past accepted_count zeroed (identity steps)
    dropped = b.op("LessOrEqual", [b.op("Cast", [ACCEPTED], to=TensorProto.FLOAT),
                                   b.const(np.arange(k, dtype=np.float32).reshape(1, k, 1),
                                           "token")])
    masked = b.op("Where", [dropped, b.const(np.zeros(1, np_dtype), "zero"), past_cap])
    ends = np.cumsum((0, *r.widths))
    sections = [b.op("Slice", [masked, b.const(np.array([lo], np.int64)),
                               b.const(np.array([hi], np.int64)),
                               b.const(np.array([2], np.int64))])
                for lo, hi in zip(ends[:-1], ends[1:], strict=True)]
    g_c, k_c, v_c, beta_c = sections
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    hq = int(attrs["q_num_heads"])
    q0 = b.const(np.zeros((1, k, hq * r.dk), np_dtype), "query")
    b.nodes.append(helper.make_node(
        "LinearAttention", [q0, k_c, v_c, r.state, g_c, beta_c],
        [b.name("commit_out"), present_state], name=f"{b.base}.commit", domain="com.microsoft",
        **attrs))
    # the verify: the export's node from the committed state, its K-token state dropped;
    # its operands are the new capsule
    node.input[3] = present_state
    node.output[1] = b.name("verified_state")
    pieces = [b.op("Reshape", [node.input[j], b.const(np.array([1, k, w], np.int64), "shape")])
              for j, w in zip((4, 1, 2, 5), r.widths, strict=True)]
    b.op("Concat", pieces, present_cap, axis=2)
    b.insert_before(node)


def _rewrite_conv(model: onnx.ModelProto, node: onnx.NodeProto, c: ConvWindow, k: int) -> None:
    g = model.graph
    b = _Nodes(model, f"deferred.{c.past}")
    present = node.output[1]
    for vi in [*g.input, *g.output]:
        if vi.name in (c.past, present):
            _set_shape(vi, [1, c.channels, c.hist + k])
    cols = b.op("Add", [ACCEPTED, b.const(np.arange(c.hist, dtype=np.int64), "taps")])
    window = b.op("Gather", [c.past, cols], axis=2)
    node.input[3] = window
    node.output[1] = b.name("conv_state")
    b.op("Concat", [window, node.input[0]], present, axis=2)
    b.insert_before(node)
