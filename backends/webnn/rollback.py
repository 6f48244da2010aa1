"""Rolling a stateful graph back to m of K verified tokens (issue 31 item 3), at the scale
of one hybrid layer: a gated-delta layer (its recurrent state and its conv window) and an
attention layer's KV rows, as ONNX graphs converted by ``onnx_converter`` (the capture and
the replay then one launch each, ``wgpu_impl/match_gdn_capsule``).

Two graphs, both ordinary stateful graphs of the proposal (``kvCachePairs``):

- ``plain``: the K-token verify step: the KV rows and the conv inputs written at the page's
  positions (ScatterND), the recurrent state updated by GatedDeltaNet in place.
- ``deferred``: the same step with a deferred commit: the recurrent pair holds the
  pre-verify state and a second pair the verify's capsule (GatedDeltaNet with
  ``state_update_capacity`` K); the next dispatch takes the accepted count m of the last
  verify as an ordinary input, masks the capsule past m (decay 1, delta 0: exact identity
  steps) and replays it (GatedDeltaNetStateReplay, K transitions) before its own tokens.

The KV rows and the conv window roll back by position in both: the conv state is kept as
rows of its inputs at ``position mod R`` (R = kernel - 1 + K), read back through the page's
indices, so the next write at P + m leaves the rows beyond unread. The ways this module
runs (``Way``): ``deferred`` (no new API), ``extension`` (``rollback_state``: the commit
at the next dispatch made by the implementation, the capsule its own: beyond the proposal)
and ``snapshot`` (copy the recurrent state before the verify, copy it back and re-feed the
m accepted tokens padded with identity tokens: the naive baseline).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from .kernels.gdn_capsule import capsule_floats

F = TensorProto.FLOAT
WAYS = ("deferred", "extension", "snapshot")


@dataclass(frozen=True)
class Layer:
    """One hybrid layer's state geometry."""

    hk: int
    hv: int
    dk: int
    dv: int
    conv_dim: int
    kernel: int
    kv_width: int  # K and V rows: kv heads x head dim, one attention head group
    capacity: int  # KV rows

    @property
    def row(self) -> int:
        return capsule_floats(self.hv, self.hk, self.dk, self.dv, 1)

    def ring(self, k: int) -> int:
        return self.kernel - 1 + k


def _vi(name: str, dtype: int, shape: list[int]):
    return helper.make_tensor_value_info(name, dtype, shape)


def model(sh: Layer, k: int, deferred: bool) -> onnx.ModelProto:
    """The K-token verify graph of one hybrid layer (module docstring)."""
    n = sh.hv * sh.dv * sh.dk
    r = sh.ring(k)
    ins = [_vi("query", F, [k, sh.hk, sh.dk]), _vi("key", F, [k, sh.hk, sh.dk]),
           _vi("value", F, [k, sh.hv, sh.dv]), _vi("decay", F, [k, sh.hv]), _vi("beta", F, [k, sh.hv]),
           _vi("conv_x", F, [k, sh.conv_dim]), _vi("conv_rows", TensorProto.INT64, [k, 1]),
           _vi("conv_read", TensorProto.INT64, [k * (sh.kernel - 1)]),
           _vi("kv_rows", TensorProto.INT64, [k, 1]), _vi("new_k", F, [k, sh.kv_width]),
           _vi("new_v", F, [k, sh.kv_width]), _vi("attn_q", F, [k, sh.kv_width]),
           _vi("attn_mask", F, [k, sh.capacity]),
           _vi("past_key_values.0.key", F, [sh.capacity, sh.kv_width]),
           _vi("past_key_values.0.value", F, [sh.capacity, sh.kv_width]),
           _vi("past_conv_state.0", F, [r, sh.conv_dim]),
           _vi("past_state.0", F, [1, sh.hv, sh.dv, sh.dk])]
    outs = [_vi("output", F, [k, sh.hv, sh.dv]), _vi("attn_out", F, [k, sh.kv_width]),
            _vi("conv_window", F, [k * (sh.kernel - 1), sh.conv_dim]),
            _vi("present.0.key", F, [sh.capacity, sh.kv_width]),
            _vi("present.0.value", F, [sh.capacity, sh.kv_width]),
            _vi("present_conv_state.0", F, [r, sh.conv_dim]),
            _vi("present_state.0", F, [1, sh.hv, sh.dv, sh.dk])]
    nodes = [helper.make_node("ScatterND", ["past_key_values.0.key", "kv_rows", "new_k"], ["present.0.key"]),
             helper.make_node("ScatterND", ["past_key_values.0.value", "kv_rows", "new_v"],
                              ["present.0.value"]),
             helper.make_node("Transpose", ["present.0.key"], ["kt"], perm=[1, 0]),
             helper.make_node("MatMul", ["attn_q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "attn_scale"], ["qks"]),
             helper.make_node("Add", ["qks", "attn_mask"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "present.0.value"], ["attn_out"]),
             helper.make_node("ScatterND", ["past_conv_state.0", "conv_rows", "conv_x"],
                              ["present_conv_state.0"]),
             helper.make_node("Gather", ["present_conv_state.0", "conv_read"], ["conv_window"], axis=0)]
    inits = [helper.make_tensor("attn_scale", F, [], [1.0 / np.sqrt(sh.kv_width)])]
    gdn_ins = ["query", "key", "value", "", "decay", "beta"]
    attrs = {"qk_l2_norm": 1}
    if not deferred:
        nodes.append(helper.make_node("GatedDeltaNet", gdn_ins + ["past_state.0"],
                                      ["output", "present_state.0"], domain="com.microsoft", **attrs))
    else:
        row = sh.row
        ins += [_vi("accepted", TensorProto.INT32, [1]), _vi("past_capsule.0", F, [1, k * row])]
        outs.append(_vi("present_capsule.0", F, [1, k * row]))
        tok = np.concatenate([np.repeat(np.arange(k), sh.hv), np.full(k * sh.hk * sh.dk, -1),
                              np.repeat(np.arange(k), sh.hv * sh.dv)]).astype(np.float32)
        fill = np.concatenate([np.ones(k * sh.hv), np.zeros(k * (row - sh.hv))]).astype(np.float32)
        md = [0, 0, 0, k * sh.hv, k * (sh.hv + sh.hk * sh.dk), sh.hv, sh.dv, sh.dk, sh.hk, k, k]
        inits += [helper.make_tensor("tok", F, [1, k * row], tok),
                  helper.make_tensor("fill", F, [1, k * row], fill),
                  helper.make_tensor("md", TensorProto.INT64, [11], md),
                  helper.make_tensor("flat", TensorProto.INT64, [1], [n]),
                  helper.make_tensor("cap_flat", TensorProto.INT64, [1], [k * row]),
                  helper.make_tensor("state_shape", TensorProto.INT64, [4], [1, sh.hv, sh.dv, sh.dk]),
                  helper.make_tensor("count", TensorProto.INT32, [1], [k])]
        nodes += [helper.make_node("Cast", ["accepted"], ["acc_f"], to=F),
                  helper.make_node("Less", ["tok", "acc_f"], ["kept"]),
                  helper.make_node("Where", ["kept", "past_capsule.0", "fill"], ["masked"]),
                  helper.make_node("Reshape", ["masked", "cap_flat"], ["masked_flat"]),
                  helper.make_node("Reshape", ["past_state.0", "flat"], ["s_flat"]),
                  helper.make_node("GatedDeltaNetStateReplay", ["s_flat", "masked_flat", "s_flat", "md"],
                                   ["committed"], domain="com.microsoft"),
                  helper.make_node("Reshape", ["committed", "state_shape"], ["present_state.0"]),
                  helper.make_node("GatedDeltaNet", gdn_ins + ["present_state.0", "", "", "count"],
                                   ["output", "verified", "present_capsule.0"], domain="com.microsoft",
                                   state_update_capacity=k, **attrs)]
    graph = helper.make_graph(nodes, "hybrid_layer", ins, outs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def pairs(deferred: bool) -> list:
    """The graph's KV pairs (input, output)."""
    from . import MLKVCachePair

    names = [("past_key_values.0.key", "present.0.key"), ("past_key_values.0.value", "present.0.value"),
             ("past_conv_state.0", "present_conv_state.0"), ("past_state.0", "present_state.0")]
    if deferred:
        names.append(("past_capsule.0", "present_capsule.0"))
    return [MLKVCachePair(input=a, output=b) for a, b in names]


def identity_tokens(x: dict[str, np.ndarray], m: int) -> dict[str, np.ndarray]:
    """The first m tokens of ``x`` then K - m tokens that leave the recurrent state exactly
    as it is (decay exp(0) = 1, beta 0: delta 0); their KV and conv rows land beyond P + m."""
    out = {n: a.copy() for n, a in x.items()}
    out["decay"][m:] = 0.0
    out["beta"][m:] = 0.0
    return out


class Session:
    """One way of speculative decoding over one hybrid layer on a WebNN context: ``verify``
    K drafted tokens at the position, ``accept`` m of them. The state is hidden (PROPOSAL);
    ``peek`` (tests and checks only) reads it through the implementation."""

    def __init__(self, ctx, sh: Layer, k: int, way: str) -> None:
        from .onnx_converter import convert

        if way not in WAYS:
            raise ValueError(f"way {way!r}: one of {', '.join(WAYS)}")
        self.ctx, self.sh, self.k, self.way = ctx, sh, k, way
        deferred = way != "snapshot"
        self.cg = convert(model(sh, k, deferred), ctx, use_stateful=True, kv_cache_pairs=pairs(deferred))
        self.graph = self.cg.graph
        self.position = 0
        self.accepted = k  # the first verify commits nothing: its capsule is zeros
        self._last: dict[str, np.ndarray] | None = None
        self._snapshot = None
        self._acc = None
        self.tensors = {n: ctx.create_tensor(data_type=d, shape=list(s), writable=True)
                        for n, (d, s) in self.graph.inputs.items()}
        self.outs = {n: ctx.create_tensor(data_type=d, shape=list(s), readable=True)
                     for n, (d, s) in self.graph.outputs.items()}

    # -- the page's inputs at a position
    def _feeds(self, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sh, k, p = self.sh, self.k, self.position
        pos = p + np.arange(k)
        if pos[-1] >= sh.capacity:
            raise ValueError(f"positions {p}..{pos[-1]} past the KV capacity {sh.capacity}")
        r = sh.ring(k)
        taps = np.arange(sh.kernel - 1)  # the window of token j: positions j+1-(kernel-1) .. j
        read = ((pos[:, None] - (sh.kernel - 2) + taps[None, :]) % r).reshape(-1)
        mask = np.where(np.arange(sh.capacity)[None, :] <= pos[:, None], 0.0, -np.inf)
        f = {**x, "conv_rows": (pos % r).reshape(k, 1).astype(np.int64),
             "conv_read": read.astype(np.int64), "kv_rows": pos.reshape(k, 1).astype(np.int64),
             "attn_mask": mask.astype(np.float32)}
        if "accepted" in self.graph.inputs:
            f["accepted"] = np.array([self.accepted], np.int32)
        return f

    def _dispatch(self, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ctx = self.ctx
        for n, a in self._feeds(x).items():
            if n == "accepted" and self.way == "extension":
                continue  # the implementation's own word (rollback_state)
            ctx.write_tensor(self.tensors[n], a)
        ctx.dispatch(self.graph, self.tensors, self.outs)
        return {n: np.asarray(ctx.read_tensor(self.outs[n])) for n in ("output", "attn_out")}

    def verify(self, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One verify dispatch of K drafted tokens at the current position."""
        if self.way == "snapshot":
            self._snapshot = self._copy_state(None)
        elif self.way == "extension" and self._acc is None:
            self.rollback_state(self.k)
        self._last = x
        return self._dispatch(x)

    def accept(self, m: int) -> None:
        """m of the last K accepted: the state must end as if only those were fed."""
        if not 0 <= m <= self.k or self._last is None:
            raise ValueError(f"accept({m}) after a verify of {self.k}")
        if self.way == "deferred":
            self.accepted = m  # an ordinary input of the next dispatch
        elif self.way == "extension":
            self.rollback_state(m)
        elif m < self.k:  # snapshot: restore, then re-feed the m accepted tokens
            self._copy_state(self._snapshot)
            if m:
                self._dispatch(identity_tokens(self._last, m))
        self.position += m
        self._last = None

    # -- EXTENSION (beyond the proposal): MLContext.rollbackState(graph, keptTokens)
    def rollback_state(self, kept: int) -> None:
        """The state of ``graph`` ends as if only the first ``kept`` tokens of its last
        dispatch were fed; the implementation keeps the capsule and the pre-verify state
        (here: the deferred graph's own pairs) and commits at the next dispatch, the count
        in a word of its own the page never binds."""
        ctx = self.ctx
        if self._acc is None:
            self._acc = self.tensors["accepted"]
        ctx.write_tensor(self._acc, np.array([kept], np.int32))

    # -- snapshot / restore: an opaque copy of the recurrent state, device to device
    def _copy_state(self, handle):
        ctx, g = self.ctx, self.graph
        pp = next(p for p in g._plan.pairs if p.pair.input == "past_state.0")
        buf = ctx._resolve(g, ("state", pp.index, "cur"), {}, g._parity)
        if handle is None:
            handle = ctx._device.create_buffer(size=buf.size, usage=buf.usage)
            src, dst = buf, handle
        else:
            src, dst = handle, buf
        ctx._staged.flush()
        enc = ctx._device.create_command_encoder()
        enc.copy_buffer_to_buffer(src, 0, dst, 0, buf.size)
        ctx._submit([enc.finish()])
        ctx.counters.d2d += buf.size
        return handle

    def peek(self) -> dict[str, np.ndarray]:
        """Tests only: the committed recurrent state and the conv rows (hidden)."""
        return {"state": self.ctx._peek_state(self.graph, "past_state.0"),
                "conv": self.ctx._peek_state(self.graph, "past_conv_state.0")}
