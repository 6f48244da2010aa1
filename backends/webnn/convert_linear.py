"""ORT's linear-attention contrib ops (what onnxruntime-genai's Qwen3.5 hybrid export
carries) as WebNN ops: ``LinearAttention`` (the four update rules, grouped or inverse-
grouped heads), ``CausalConvWithState`` (a depthwise causal conv over the carried window,
as ``conv2d``), ``LinearAttentionGate`` and ``GatedRMSNorm``. Semantics from the
operators' schemas (``onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema``)
and checked against ORT's CPU kernels (tests/test_convert_linear.py). Registered into
``convert_core``'s handler table on import (``onnx_converter`` imports this module)."""

from __future__ import annotations

import math

import numpy as np

from .convert_core import ConversionError, Converter, handles

_RULES = ("linear", "gated", "delta", "gated_delta")


def _str(attrs: dict, key: str, default: str) -> str:
    v = attrs.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


def _given(node, i: int) -> bool:
    return len(node.input) > i and bool(node.input[i])


def _silu(b, x):
    return b.mul(x, b.sigmoid(x))


def _f32(c: Converter, name: str):
    """An input in float32: ORT's kernels compute these ops in float32 whatever the
    tensor type (float16 models included), and so does the decomposition."""
    x = c.operand(name)
    return x if c.dtype(x) == "float32" else c.builder.cast(x, "float32")


def _as(c: Converter, y, kind: str):
    """A float32 result back in the tensor type ``kind``."""
    return y if kind == "float32" else c.builder.cast(y, kind)


@handles("LinearAttention")
def _linear_attention(c: Converter, node, attrs):
    """The recurrence token by token over the 4-D state (B, H_kv, d_k, d_v)::

        s = exp(g) * S                      (gated rules; S otherwise)
        r = k^T s                           (delta rules: the retrieval, (1, d_v))
        S' = s + k (x) beta * (v - r)       (delta rules; s + k (x) v otherwise)
        o = scale * q^T S'

    Query heads share a key/value head (H_q = n H_kv: q head h reads kv head h // n) or,
    inverse, a query head serves n key/value heads (H_kv = n H_q: kv head h reads q head
    h // n); the output has max(H_q, H_kv) heads. The key may have fewer heads than the
    value and the state (its width over d_k, as ORT's kernel reads it): state head h reads
    key head h // (H_kv / H_k)."""
    b = c.builder
    name = node.name or node.output[0]
    rule = _str(attrs, "update_rule", "gated_delta")
    if rule not in _RULES:
        raise ConversionError(f"LinearAttention node {name!r}: update_rule {rule!r}")
    if attrs.get("state_window", 0):
        raise ConversionError(f"LinearAttention node {name!r}: state_window is not supported")
    hq, hkv = int(attrs["q_num_heads"]), int(attrs["kv_num_heads"])
    kind = c.dtype(c.operand(node.input[0]))
    q, k, v = (_f32(c, node.input[j]) for j in range(3))
    bsz, t, qw = c.shape(q)
    dk = qw // hq
    dv = c.shape(v)[2] // hkv
    hk = c.shape(k)[2] // dk  # genai's Qwen3.5: as many key heads as query heads
    if (hq % hkv and hkv % hq) or hkv % hk:
        raise ConversionError(f"LinearAttention node {name!r}: {hq} query heads, {hk} key "
                              f"heads and {hkv} value heads (the fewer must divide the more)")
    scale = float(attrs.get("scale", 0.0)) or 1.0 / math.sqrt(dk)
    if _given(node, 3):
        state_kind, state = c.dtype(c.operand(node.input[3])), _f32(c, node.input[3])
    else:
        state_kind, state = kind, c.constant(np.zeros((bsz, hkv, dk, dv), np.float32))
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    decay = _f32(c, node.input[4]) if gated and _given(node, 4) else None
    beta = _f32(c, node.input[5]) if delta and _given(node, 5) else None
    for what, op in (("decay", decay), ("beta", beta)):
        if (gated if what == "decay" else delta) and op is None:
            raise ConversionError(f"LinearAttention node {name!r}: {rule} needs {what}")
    per_key = decay is not None and c.shape(decay)[2] == hkv * dk
    beta_heads = c.shape(beta)[2] if beta is not None else 0

    # the state viewed (B, hg, n, d_k, d_v): state head h = a * n + i; a key (or query) of
    # hg heads is read by broadcasting over n (what the fused kernel's match takes as grouped
    # heads), one of other head counts through expand
    hg = min(hk, hkv)
    n = hkv // hg

    def token(x, j: int, shape: list[int]):
        if t > 1:
            x = b.slice(x, [0, j, 0], [bsz, 1, c.shape(x)[2]])
        return b.reshape(x, shape)

    def per_head(x, j: int, heads: int):
        """Token j of ``x`` (``heads`` heads of d_k) for each state head, (B, hg, n|1, 1, d_k):
        state head h reads head h // (H_kv / heads)."""
        if heads == hg:
            return token(x, j, [bsz, hg, 1, 1, dk])
        xj = token(x, j, [bsz, heads, 1, 1, dk])
        if hkv // heads > 1:
            xj = b.expand(xj, [bsz, heads, hkv // heads, 1, dk])
        return b.reshape(xj, [bsz, hg, n, 1, dk])

    state = b.reshape(state, [bsz, hg, n, dk, dv])
    outs = []
    for j in range(t):
        kr = per_head(k, j, hk)
        kc = b.reshape(kr, [*c.shape(kr)[:3], dk, 1])
        vj = token(v, j, [bsz, hg, n, 1, dv])
        s = state
        if gated:
            g = token(decay, j, [bsz, hg, n, dk if per_key else 1, 1])
            s = b.mul(s, b.exp(g))
        if delta:
            bj = token(beta, j, [bsz, hg, n, 1, 1] if beta_heads > 1 else [bsz, 1, 1, 1, 1])
            upd = b.mul(b.sub(vj, b.matmul(kr, s)), bj)
        else:
            upd = vj
        state = b.add(s, b.mul(kc, upd))
        # query heads h = kv head * r + i, or (inverse) kv head h reads query head h // r
        qj = (token(q, j, [bsz, hg, n, hq // hkv, dk]) if hq >= hkv else per_head(q, j, hq))
        o = b.matmul(qj, state)
        if scale != 1.0:
            o = b.mul(o, c.scalar_like(scale, o))
        outs.append(b.reshape(o, [bsz, 1, max(hq, hkv) * dv]))
    out = outs[0] if t == 1 else b.concat(outs, 1)
    return [_as(c, out, kind), _as(c, b.reshape(state, [bsz, hkv, dk, dv]), state_kind)]


@handles("CausalConvWithState")
def _causal_conv(c: Converter, node, attrs):
    """A depthwise conv over ``concat(past_state, input)`` along the sequence (WebNN
    ``conv2d`` with groups = channels on a height-1 view), SiLU after where asked; the new
    state is the window's last (k - 1) * dilation positions."""
    b = c.builder
    name = node.name or node.output[0]
    if attrs.get("ndim", 1) != 1 or attrs.get("state_window", 0):
        raise ConversionError(f"CausalConvWithState node {name!r}: only ndim 1 without a "
                              "state window is supported")
    act = _str(attrs, "activation", "none")
    if act not in ("none", "silu", "swish"):
        raise ConversionError(f"CausalConvWithState node {name!r}: activation {act!r}")
    last = bool(attrs.get("channels_last", 0))
    dil = int(attrs.get("dilation", 1))
    kind = c.dtype(c.operand(node.input[0]))
    x, w = _f32(c, node.input[0]), _f32(c, node.input[1])
    if last:  # (B, L, d...) -> (B, C, L)
        xs = c.shape(x)
        x = b.transpose(b.reshape(x, [xs[0], xs[1], int(np.prod(xs[2:]))]), [0, 2, 1])
    bsz, ch, length = c.shape(x)
    kern = c.shape(w)[2]
    hist = (kern - 1) * dil
    if _given(node, 3):
        past = _f32(c, node.input[3])
        if last:
            ps = c.shape(past)
            past = b.transpose(b.reshape(past, [ps[0], ps[1], ch]), [0, 2, 1])
    else:
        past = c.constant(np.zeros((bsz, ch, hist), np.float32))
    window = b.concat([past, x], 2)
    y = b.conv2d(b.reshape(window, [bsz, ch, 1, length + hist]),
                 b.reshape(w, [ch, 1, 1, kern]), dilations=[1, dil], groups=ch,
                 bias=_f32(c, node.input[2]) if _given(node, 2) else None)
    y = b.reshape(y, [bsz, ch, length])
    if act != "none":
        y = _silu(b, y)
    present = b.slice(window, [0, 0, length], [bsz, ch, hist])
    if last:
        y = b.reshape(b.transpose(y, [0, 2, 1]), list(c.shape_of(node.input[0])))
        present = b.transpose(present, [0, 2, 1])
        present = b.reshape(present, list(c.shape_of(node.input[3])) if _given(node, 3)
                            else c.shape(present))
    return [_as(c, y, kind), _as(c, present, kind)]


@handles("LinearAttentionGate")
def _linear_attention_gate(c: Converter, node, attrs):
    """decay = decay_scale * softplus(a + dt_bias) and beta = sigmoid(b), in float32."""
    b = c.builder
    kind = c.dtype(c.operand(node.input[0]))
    decay = b.mul(b.softplus(b.add(_f32(c, node.input[0]), _f32(c, node.input[1]))),
                  _f32(c, node.input[2]))
    outs = [_as(c, decay, kind)]
    if _given(node, 3):
        outs.append(_as(c, b.sigmoid(_f32(c, node.input[3])), kind))
    return outs


@handles("GatedRMSNorm")
def _gated_rms_norm(c: Converter, node, attrs):
    """Y = X / sqrt(mean(X², over each group of C) + eps) * scale * act(gate), C the
    length of ``scale``."""
    b = c.builder
    kind = c.dtype(c.operand(node.input[0]))
    x, scale, gate = (_f32(c, node.input[j]) for j in range(3))
    act = _str(attrs, "activation", "silu")
    if act not in ("silu", "swish", "sigmoid"):
        raise ConversionError(f"GatedRMSNorm node {node.name or node.output[0]!r}: activation "
                              f"{act!r}")
    eps = float(attrs.get("epsilon", 1e-5))
    shp = list(c.shape(x))
    group = c.shape(scale)[0]
    xg = b.reshape(x, shp[:-1] + [shp[-1] // group, group])
    ms = b.reduce_mean(b.mul(xg, xg), axes=[len(shp)], keep_dimensions=True)
    y = b.mul(b.div(xg, b.sqrt(b.add(ms, c.scalar_like(eps, ms)))), scale)
    g = b.sigmoid(gate) if act == "sigmoid" else _silu(b, gate)
    return _as(c, b.mul(b.reshape(y, shp), g), kind)
