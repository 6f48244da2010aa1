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
``snapshot`` (copy the recurrent state before the verify, copy it back and re-feed the
m accepted tokens padded with identity tokens: the naive baseline) and ``cpu_replay``
(onnxruntime-genai's ``ReplayStateUpdates`` on WebGPU today: the state to the host, NumPy
replay, the state back).

``cpu_replay`` runs a third graph, ``capture``: the verify with GatedDeltaNet's capture
(capacity and count K) and the recurrent state the page's own, as genai's fixed-state pool
binds its direct banks: two MLTensors, the verify reading the active bank and writing the
inactive one, the capsule an ordinary output (KV and conv stay pairs, by position). At
``accept(m)``: m = K publishes the written bank (genai's commit flips banks); m = 0 keeps
the active one (nothing to replay); 0 < m < K is genai's ``ReplayStateUpdates``
(``ReplayStateUpdatesOnCpu`` on the staged views): the pre-verify state and the capsule read
back (``read_tensors``: one round trip, buffer copy and map), ``replay_host`` (float32,
genai's order of operations), the result written into the inactive bank (``write_tensor``:
the library stages it, its copy submitted before the next dispatch) and the banks flipped.

The deferred and extension ways' replay can also run alone, for measuring it against that
host round trip: ``replay_launches`` (the graph's own launches that make it: the capsule
masked by the count, then ``gdn_replay``), ``begin_replay`` / ``encode_replay`` (recorded
into a compute pass of the caller's, bound as a dispatch binds them) and ``replay_now``
(the last accept committed now; the next dispatch then replays nothing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from .kernels.gdn_capsule import capsule_floats

F = TensorProto.FLOAT
WAYS = ("deferred", "extension", "snapshot", "cpu_replay")
#: the graph each way runs (``model``'s ``form``)
FORM = {"deferred": "deferred", "extension": "deferred", "snapshot": "plain", "cpu_replay": "capture"}


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


def _form(form: bool | str) -> str:
    """``model``'s form: "plain", "deferred" or "capture" (True: deferred, False: plain)."""
    if isinstance(form, bool):
        return "deferred" if form else "plain"
    if form not in ("plain", "deferred", "capture"):
        raise ValueError(f"form {form!r}: plain, deferred or capture")
    return form


def model(sh: Layer, k: int, form: bool | str) -> onnx.ModelProto:
    """The K-token verify graph of one hybrid layer (module docstring). ``capture``: the
    recurrent state an ordinary input and output (the page's banks), GatedDeltaNet writing
    the capsule (capacity and count K) as an ordinary output, no replay."""
    form = _form(form)
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
    if form == "plain":
        nodes.append(helper.make_node("GatedDeltaNet", gdn_ins + ["past_state.0"],
                                      ["output", "present_state.0"], domain="com.microsoft", **attrs))
    elif form == "capture":
        outs.append(_vi("present_capsule.0", F, [1, k * sh.row]))
        inits.append(helper.make_tensor("count", TensorProto.INT32, [1], [k]))
        nodes.append(helper.make_node("GatedDeltaNet", gdn_ins + ["past_state.0", "", "", "count"],
                                      ["output", "present_state.0", "present_capsule.0"],
                                      domain="com.microsoft", state_update_capacity=k, **attrs))
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


def pairs(form: bool | str) -> list:
    """The graph's KV pairs (input, output); ``capture`` leaves the recurrent state (and its
    capsule) to the page."""
    from . import MLKVCachePair

    form = _form(form)
    names = [("past_key_values.0.key", "present.0.key"), ("past_key_values.0.value", "present.0.value"),
             ("past_conv_state.0", "present_conv_state.0")]
    if form != "capture":
        names.append(("past_state.0", "present_state.0"))
    if form == "deferred":
        names.append(("past_capsule.0", "present_capsule.0"))
    return [MLKVCachePair(input=a, output=b) for a, b in names]


def identity_tokens(x: dict[str, np.ndarray], m: int) -> dict[str, np.ndarray]:
    """The first m tokens of ``x`` then K - m tokens that leave the recurrent state exactly
    as it is (decay exp(0) = 1, beta 0: delta 0); their KV and conv rows land beyond P + m."""
    out = {n: a.copy() for n, a in x.items()}
    out["decay"][m:] = 0.0
    out["beta"][m:] = 0.0
    return out


def replay_host(state: np.ndarray, capsule: np.ndarray, kept: int, sh: Layer, capacity: int,
                count: int | None = None, tokens: int | None = None) -> np.ndarray:
    """genai's ``ReplayStateUpdatesOnCpu`` for a GatedDeltaNet state, in NumPy: from the
    pre-verify ``state`` (V-major [Hv, Dv, Dk], any shape of that size), ``kept``
    transitions of the compact capsule row (ORT's ``state_update`` layout: decays [C, Hv],
    then keys [C, Hk, Dk], then deltas [C, Hv, Dv], C = ``capacity``; value head h reads key
    head h Hk / Hv), each ``S = decay S + outer(delta, key)`` in float32 in genai's order
    (scale, then add). Only the first min(``count``, C, ``tokens``) transitions are valid
    (each None: C); ``kept`` past them is refused. Returns a new float32 [Hv, Dv, Dk]."""
    hv, hk, dk, dv, c = sh.hv, sh.hk, sh.dk, sh.dv, capacity
    valid = min(c if count is None else count, c, c if tokens is None else tokens)
    if not 0 <= kept <= valid:
        raise ValueError(f"replay of {kept} transitions: {valid} valid in the capsule")
    cap = np.asarray(capsule, np.float32).reshape(-1)
    if cap.size != capsule_floats(hv, hk, dk, dv, c):
        raise ValueError(f"capsule of {cap.size} floats: {capsule_floats(hv, hk, dk, dv, c)} at C = {c}")
    decay = cap[:c * hv].reshape(c, hv)
    key = cap[c * hv:c * (hv + hk * dk)].reshape(c, hk, dk)
    delta = cap[c * (hv + hk * dk):].reshape(c, hv, dv)
    heads = np.arange(hv) * hk // hv
    s = np.array(state, np.float32).reshape(hv, dv, dk)  # a copy: genai's destination
    step = np.empty_like(s)
    for t in range(kept):
        s *= decay[t][:, None, None]
        np.multiply(delta[t][:, :, None], key[t][heads][:, None, :], out=step)
        s += step
    return s


class Session:
    """One way of speculative decoding over one hybrid layer on a WebNN context: ``verify``
    K drafted tokens at the position, ``accept`` m of them. The state is hidden (PROPOSAL);
    ``peek`` (tests and checks only) reads it through the implementation."""

    def __init__(self, ctx, sh: Layer, k: int, way: str) -> None:
        from .onnx_converter import convert

        if way not in WAYS:
            raise ValueError(f"way {way!r}: one of {', '.join(WAYS)}")
        self.ctx, self.sh, self.k, self.way = ctx, sh, k, way
        form = FORM[way]
        self.cg = convert(model(sh, k, form), ctx, use_stateful=True, kv_cache_pairs=pairs(form))
        self.graph = self.cg.graph
        self.position = 0
        self.accepted = k  # the first verify commits nothing: its capsule is zeros
        self._last: dict[str, np.ndarray] | None = None
        self._snapshot = None
        self._acc = None
        self.split: dict[str, float] | None = None  # cpu_replay: the last host replay's parts, ms
        self.tensors = {n: ctx.create_tensor(data_type=d, shape=list(s), writable=True)
                        for n, (d, s) in self.graph.inputs.items() if n != "past_state.0"}
        self.outs = {n: ctx.create_tensor(data_type=d, shape=list(s), readable=True)
                     for n, (d, s) in self.graph.outputs.items() if n != "present_state.0"}
        self.banks: list = []
        self._active = 0
        if form == "capture":  # the page's two banks: the verify reads one, writes the other
            d, shape = self.graph.inputs["past_state.0"]
            self.banks = [ctx.create_tensor(data_type=d, shape=list(shape), readable=True,
                                            writable=True) for _ in range(2)]

    @property
    def state_bytes(self) -> int:
        """Bytes of the recurrent state (float32 [Hv, Dv, Dk])."""
        return 4 * self.sh.hv * self.sh.dv * self.sh.dk

    @property
    def capsule_bytes(self) -> int:
        """Bytes of one verify's capsule (capacity K)."""
        return 4 * self.k * self.sh.row

    def reset(self) -> None:
        """Back to position 0 with a zero state (KV, conv and the recurrent state)."""
        self.ctx.reset_kv_cache(self.graph)
        self.position, self.accepted, self._acc, self._last = 0, self.k, None, None
        if self.banks:
            self.ctx.write_tensor(self.banks[self._active], np.zeros(self.state_bytes // 4, np.float32))

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
        ins, outs = self.tensors, self.outs
        if self.banks:
            ins = {**ins, "past_state.0": self.banks[self._active]}
            outs = {**outs, "present_state.0": self.banks[self._active ^ 1]}
        ctx.dispatch(self.graph, ins, outs)
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
        elif self.way == "cpu_replay":
            if m == self.k:
                self._active ^= 1  # the verify's bank: genai's commit flips banks
            elif m:
                self.replay_state_updates(m)
            # m = 0: the pre-verify bank stays active (nothing to replay)
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

    # -- cpu_replay: genai's ReplayStateUpdates, staged through the host
    def replay_state_updates(self, kept: int) -> None:
        """The pre-verify state (the active bank) and the verify's capsule read back in one
        round trip (``read_tensors``: copies into mapped staging, one map), ``kept``
        transitions replayed in NumPy (``replay_host``), the state written into the inactive
        bank (``write_tensor``) and the banks flipped: what genai's WebGPU
        ``ReplayStateUpdates`` does (stage the views to the CPU, ``ReplayStateUpdatesOnCpu``,
        copy the destination back). ``split``: the three parts' wall times, ms."""
        ctx, src, dst = self.ctx, self.banks[self._active], self.banks[self._active ^ 1]
        t0 = time.perf_counter()
        state, capsule = ctx.read_tensors([src, self.outs["present_capsule.0"]])
        t1 = time.perf_counter()
        new = replay_host(state, capsule, kept, self.sh, self.k, count=self.k, tokens=self.k)
        t2 = time.perf_counter()
        ctx.write_tensor(dst, new)
        t3 = time.perf_counter()
        self._active ^= 1
        self.split = {"read": (t1 - t0) * 1e3, "replay": (t2 - t1) * 1e3, "write": (t3 - t2) * 1e3}

    # -- the deferred replay alone (measuring it: harness.speculative.webnn_rollback)
    def replay_launches(self) -> list[int]:
        """The plan's launches (indices) that make the deferred and extension ways' replay:
        the ``gdn_replay`` kernel (``S = decay S + outer(delta, key)`` over the capsule, in
        place on the pre-verify state) and, before it, the launches that produce what it
        reads (the capsule masked by the accepted count: one fused launch). The conv window
        has no replay (it rolls back by position). Empty for the other ways."""
        launches = self.graph._plan.launches

        def slots(la) -> list[tuple]:
            out = la.slots if hasattr(la, "slots") else [la.src, la.dst]
            return [s[1] if s[0] == "range" else s for s in out]

        found = [i for i, la in enumerate(launches)
                 if getattr(getattr(la, "kernel", None), "name", "") == "gdn_replay"]
        if not found:
            if self.way in ("deferred", "extension"):
                raise NotImplementedError(
                    "the replay is computed by the verify's capture launch (KernelOptions."
                    "gdn_replay 'fused'); a context made with gdn_replay='launch' has it alone")
            return []
        want = {s for i in found for s in slots(launches[i]) if s[0] == "temp"}
        for j in range(found[0] - 1, -1, -1):  # the nearest earlier writer of each temp
            hit = want.intersection(slots(launches[j]))
            if hit:
                found.append(j)
                want = (want - hit) | ({s for s in slots(launches[j]) if s[0] == "temp"} - hit)
        found.sort()
        if any(not hasattr(launches[i], "kernel") for i in found):
            raise NotImplementedError("a replay with a buffer copy (not in place)")
        return found

    def begin_replay(self) -> None:
        """Before ``encode_replay``: the last ``accept``'s count where the replay reads it
        (deferred: the page's ``accepted`` input, written as the next dispatch writes it;
        extension: ``rollback_state`` has written it), the staged writes submitted and the
        last dispatch settled (its capacity status read: the replay is guarded by it)."""
        if self.way not in ("deferred", "extension"):
            raise ValueError(f"way {self.way!r} has no device replay")
        ctx = self.ctx
        if self.way == "deferred":
            ctx.write_tensor(self.tensors["accepted"], np.array([self.accepted], np.int32))
        ctx._settle_through(None, {})
        ctx._staged.flush()
        ctx._forget_copies()

    def encode_replay(self, enc, n: int = 1, timestamp_writes: dict | None = None) -> None:
        """Record the replay's own launches (``replay_launches``: the graph's pipelines,
        bound to the tensors and state buffers a dispatch of this session binds) ``n`` times
        back to back into one compute pass of the command encoder ``enc``; ``timestamp_writes``
        as ``begin_compute_pass`` takes it. n > 1 (timing only) replays the replayed state
        again: the state is then no longer the session's."""
        ctx, g = self.ctx, self.graph
        bound = {"input": self.tensors, "output": self.outs}
        cmds = []
        for i in self.replay_launches():
            la, (pipe, layout, bg) = g._plan.launches[i], g._items[i]
            if bg is None:
                bg = ctx._bind_group(g, layout, la.slots, bound, g._parity)
            cmds.append((pipe, bg, la.kernel.groups))
        cp = enc.begin_compute_pass(timestamp_writes=timestamp_writes)
        for _ in range(n):
            for pipe, bg, groups in cmds:
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, bg)
                cp.dispatch_workgroups(*groups)
        cp.end()

    def replay_now(self) -> None:
        """Commit the last ``accept`` now, by the replay's own launches alone in one submit
        (``begin_replay``, ``encode_replay``), instead of at the next dispatch; that dispatch
        then replays nothing (its count 0). The state it leaves is what the next dispatch's
        replay would have left (tests check it against float64)."""
        self.begin_replay()
        ctx = self.ctx
        enc = ctx._device.create_command_encoder()
        self.encode_replay(enc)
        ctx._submit([enc.finish()])
        if self.way == "deferred":
            self.accepted = 0
        else:
            self.rollback_state(0)

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
        ctx = self.ctx
        if self.banks:  # the page's own bank, read without counting
            saved = ctx.counters.snapshot()
            state = ctx.read_tensor(self.banks[self._active])
            ctx.counters.d2h = saved.d2h
        else:
            state = ctx._peek_state(self.graph, "past_state.0")
        return {"state": state, "conv": ctx._peek_state(self.graph, "past_conv_state.0")}
