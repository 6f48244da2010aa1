"""ORT's speculative-decoding GDN ops as WebNN ops: com.microsoft ``GatedDeltaNet`` (its
compact state updates included: ``state_update_capacity``, ``capture_count``,
``state_update_active``) and ``GatedDeltaNetStateReplay``. Semantics from the operators'
schemas (``get_all_operator_schema`` of onnxruntime 1.32), checked against ORT's CPU kernel
(tests/test_webnn_gdn_capsule.py; ORT has no CPU kernel of the replay, whose oracle there is
float64 NumPy). Only standard WebNN ops are built, so the graph runs on any WebNN
implementation: the capture count and the active flag are ordinary graph inputs that mask
the capsule (``where``), so one graph serves every acceptance. The one-launch WGSL kernels
of the same contract are ``kernels/gdn_capsule.py``. Registered into ``convert_core``'s
handler table on import (``onnx_converter`` imports this module)."""

from __future__ import annotations

import math

import numpy as np

from .convert_core import ConversionError, Converter, handles

#: ORT normalises q and k as x / sqrt(sum(x²) + eps) with this eps (qk_l2_norm = 1)
L2_EPS = 1e-12
MAX_CAPACITY = 8


def _str(attrs: dict, key: str, default: str) -> str:
    v = attrs.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


def _given(node, i: int) -> bool:
    return len(node.input) > i and bool(node.input[i])


def _f32(c: Converter, name: str):
    x = c.operand(name)
    return x if c.dtype(x) == "float32" else c.builder.cast(x, "float32")


def _l2(c: Converter, x):
    b = c.builder
    ss = b.reduce_sum(b.mul(x, x), axes=[len(c.shape(x)) - 1], keep_dimensions=True)
    return b.div(x, b.sqrt(b.add(ss, c.scalar_like(L2_EPS, ss))))


def _gates(c: Converter, node, attrs, name: str):
    """(log-space decay g, beta) in float32, [T, Hv] each, after the fused activations."""
    b = c.builder
    g, beta = _f32(c, node.input[4]), _f32(c, node.input[5])
    gate = _str(attrs, "gate_activation", "none")
    if gate in ("softplus", "qwen"):
        if not (_given(node, 7) and _given(node, 8)):
            raise ConversionError(f"GatedDeltaNet node {name!r}: softplus gates need a_log and dt_bias")
        a_log, dt_bias = _f32(c, node.input[7]), _f32(c, node.input[8])
        if c.shape(dt_bias) != c.shape(a_log):
            raise ConversionError(f"GatedDeltaNet node {name!r}: dt_bias per key dimension")
        g = b.mul(b.neg(b.exp(a_log)), b.softplus(b.add(g, dt_bias)))
    elif gate != "none":
        raise ConversionError(f"GatedDeltaNet node {name!r}: gate_activation {gate!r} "
                              "(none and softplus are converted)")
    act = _str(attrs, "beta_activation", "none")
    if act == "sigmoid":
        beta = b.sigmoid(beta)
    elif act != "none":
        raise ConversionError(f"GatedDeltaNet node {name!r}: beta_activation {act!r}")
    return g, beta


def _check(c: Converter, node, attrs, name: str) -> None:
    if _str(attrs, "update_rule", "gated_delta") != "gated_delta":
        raise ConversionError(f"GatedDeltaNet node {name!r}: only update_rule gated_delta")
    if _given(node, 3):
        raise ConversionError(f"GatedDeltaNet node {name!r}: ragged packing (cu_seqlens): "
                              "a WebNN graph has one request")
    if not all(_given(node, i) for i in (1, 2, 4, 5, 6)):
        raise ConversionError(f"GatedDeltaNet node {name!r}: needs key, value, decay, beta and "
                              "initial_state (packed QKV is not converted)")
    if len(c.shape_of(node.input[0])) != 3 or c.shape_of(node.input[6])[0] != 1:
        raise ConversionError(f"GatedDeltaNet node {name!r}: the rank-3 layout of one request")
    if len(c.shape_of(node.input[4])) != 2:
        raise ConversionError(f"GatedDeltaNet node {name!r}: decay per key dimension")


@handles("GatedDeltaNet")
def _gated_delta_net(c: Converter, node, attrs):
    """The recurrence token by token over the V-major state viewed (Hk, rep, Dv, Dk)::

        s = exp(g) S;  r = s k;  delta = beta (v - r);  S = s + delta (x) k;  o = scale S q

    (value head h reads key head h // rep), and, with a capacity C, the capsule row: for
    t < C the decay factor, the normalised key and the delta of token t where t < n =
    min(capture_count, C, T) and the capture is active, zeros elsewhere."""
    b = c.builder
    name = node.name or node.output[0]
    _check(c, node, attrs, name)
    kind = c.dtype(c.operand(node.input[0]))
    q, k, v = (_f32(c, node.input[j]) for j in range(3))
    t, hq, dk = c.shape(q)
    hk, hv, dv = c.shape(k)[1], c.shape(v)[1], c.shape(v)[2]
    if hq != hk or hv % hk:
        raise ConversionError(f"GatedDeltaNet node {name!r}: {hq} query, {hk} key and {hv} "
                              "value heads (query heads = key heads, dividing the value heads)")
    rep = hv // hk
    cap = int(attrs.get("state_update_capacity", 0))
    if not 0 <= cap <= MAX_CAPACITY or bool(cap) != _given(node, 9):
        raise ConversionError(f"GatedDeltaNet node {name!r}: state_update_capacity {cap} "
                              "(in [0, 8], capture_count given exactly when positive)")
    scale = float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(dk)
    if attrs.get("qk_l2_norm", 0):
        q, k = _l2(c, q), _l2(c, k)
    g, beta = _gates(c, node, attrs, name)
    a = b.exp(g)
    state = b.reshape(_f32(c, node.input[6]), [hk, rep, dv, dk])

    def tok(x, j: int, shape: list[int]):
        w = c.shape(x)
        return b.reshape(b.slice(x, [j] + [0] * (len(w) - 1), [1, *w[1:]]), shape)

    outs, deltas = [], []
    for j in range(t):
        kr = tok(k, j, [hk, 1, 1, dk])
        s = b.mul(state, tok(a, j, [hk, rep, 1, 1]))
        r = b.matmul(s, b.reshape(kr, [hk, 1, dk, 1]))
        delta = b.mul(b.sub(tok(v, j, [hk, rep, dv, 1]), r), tok(beta, j, [hk, rep, 1, 1]))
        state = b.add(s, b.mul(delta, kr))
        o = b.mul(b.matmul(state, tok(q, j, [hk, 1, dk, 1])), c.scalar_like(scale, state))
        outs.append(b.reshape(o, [1, hv, dv]))
        deltas.append(b.reshape(delta, [1, hv, dv]))
    y = outs[0] if t == 1 else b.concat(outs, 0)
    y = y if kind == "float32" else b.cast(y, kind)
    results = [y, b.reshape(state, [1, hv, dv, dk])]
    if cap:
        results.append(_capsule(c, node, a, k, deltas, cap, (t, hk, hv, dk, dv)))
    return results[:len(node.output)]


def _capsule(c: Converter, node, a, k, deltas: list, cap: int, dims: tuple) -> object:
    """[1, C * (Hv + Hk Dk + Hv Dv)]: decays [C, Hv], keys [C, Hk, Dk], deltas [C, Hv, Dv],
    the rows t >= n zero (``where`` on a mask made from the count and the active flag)."""
    b = c.builder
    t, hk, hv, dk, dv = dims
    rows = min(cap, t)
    count = b.cast(c.operand(node.input[9]), "float32")  # [1]
    if _given(node, 10):
        on = b.cast(b.not_equal(c.operand(node.input[10]), c.constant(np.zeros(1, np.int32))),
                    "float32")
        count = b.mul(count, on)
    mask = b.greater(b.reshape(count, [1, 1]),
                     c.constant(np.arange(rows, dtype=np.float32).reshape(rows, 1)))  # [rows, 1]
    zero = c.constant(np.zeros(1, np.float32))

    def section(x, width: int):
        x = b.where(mask, b.reshape(x, [rows, width]), zero)
        if rows < cap:
            x = b.concat([x, c.constant(np.zeros((cap - rows, width), np.float32))], 0)
        return b.reshape(x, [1, cap * width])

    dec = b.slice(a, [0, 0], [rows, hv])
    key = b.slice(k, [0, 0, 0], [rows, hk, dk])
    dl = deltas[0] if rows == 1 else b.concat(deltas[:rows], 0)
    return b.concat([section(dec, hv), section(key, hk * dk), section(dl, hv * dv)], 1)


@handles("GatedDeltaNetStateReplay")
def _state_replay(c: Converter, node, attrs):
    """destination_out: the destination backing with the state at ``destination_offset``
    replaced by the source state replayed over the first ``kept_count`` capsule
    transitions (``S = decay S + outer(key, delta)``, key head h * Hk // Hv). The metadata
    must be known at conversion time (WebNN slices take their offsets as arguments)."""
    b = c.builder
    name = node.name or node.output[0]
    md = [int(x) for x in np.asarray(c.const_input(node, 3, "metadata")).reshape(-1)]
    if len(md) != 11:
        raise ConversionError(f"GatedDeltaNetStateReplay node {name!r}: metadata must have 11 values")
    src_off, dst_off, dec_off, key_off, dl_off, hv, dv, dk, hk, cap, kept = md
    n = hv * dv * dk
    if min(hv, dv, dk, hk, cap) < 1 or not 1 <= kept <= cap or min(md[:5]) < 0:
        raise ConversionError(f"GatedDeltaNetStateReplay node {name!r}: metadata {md}")
    if key_off - dec_off != cap * hv:
        raise ConversionError(f"GatedDeltaNetStateReplay node {name!r}: decay per key "
                              "dimension is not converted")
    src, capsule, dst = (_f32(c, node.input[j]) for j in range(3))
    size = c.shape(dst)[0]
    if src_off + n > c.shape(src)[0] or dst_off + n > size or dl_off + cap * hv * dv > c.shape(capsule)[0]:
        raise ConversionError(f"GatedDeltaNetStateReplay node {name!r}: offsets past a backing")

    def part(x, off: int, shape: list[int]):
        return b.reshape(b.slice(x, [off], [int(np.prod(shape))]), shape)

    s = part(src, src_off, [hv, dv, dk])
    heads = c.constant(np.arange(hv, dtype=np.int32) * hk // hv)
    for j in range(kept):
        dec = part(capsule, dec_off + j * hv, [hv, 1, 1])
        key = b.gather(part(capsule, key_off + j * hk * dk, [hk, 1, dk]), heads, axis=0)
        dl = part(capsule, dl_off + j * hv * dv, [hv, dv, 1])
        s = b.add(b.mul(s, dec), b.mul(dl, key))
    pieces = [b.reshape(s, [n])]
    if dst_off:
        pieces.insert(0, b.slice(dst, [0], [dst_off]))
    if dst_off + n < size:
        pieces.append(b.slice(dst, [dst_off + n], [size - dst_off - n]))
    return pieces[0] if len(pieces) == 1 else b.concat(pieces, 0)
