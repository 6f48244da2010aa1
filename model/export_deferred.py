"""The standard flavour's GDN layer in deferred-commit form (``export(..., rollback=
"deferred")``, issue 31): a K-token verify step that can be rolled back to any m of its K
tokens with no new API, as ``backends/webnn/rollback.py`` does at one layer, here in the
preset's own graph and in standard ops only (``export.STANDARD_OPS``), so ORT's CPU EP and
onnx.reference run the very graph a page converts.

Per GDN layer, before its own K tokens, the dispatch commits the previous verify: the
capsule pair (``past_state_update.i``) masked past ``accepted_count`` (decay 1, delta 0:
exact identity steps, so one graph serves every m) and replayed onto the committed state
(``past_state.i``), ``S = decay S + delta key^T`` token by token, spelled as
``convert_gdn`` builds ORT's GatedDeltaNetStateReplay (``wgpu_impl/match_gdn_capsule``
lowers it to one launch). The result is ``present_state.i``, from which the K tokens run
as ORT's GatedDeltaNet with a full capture (the capture's one launch): their outputs, and
their decays, keys and deltas as the new capsule; the K-token state itself is not kept.
The conv window is committed the same way: the pair keeps the last dispatch's kernel - 1
window rows and K new rows, and the window is read back at row ``accepted_count``
(``model.rollback_feeds``). Attention is the ordinary K-token graph's (rows by position).

Built on ``export._Builder`` (passed in, so this module imports nothing of ``export``).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from model.rollback_feeds import ACCEPTED, capsule_name, capsule_row

#: the export's L2 norm epsilon (inside the square root, as ``model.reference``)
L2_EPS = 1e-6


def declare(b) -> dict[str, str]:
    """The accepted count input and what every GDN layer shares: the count as float32
    (the capsule mask) and the conv window's row indices (count + 0 .. kernel - 2)."""
    cfg = b.cfg
    b.input(ACCEPTED, TensorProto.INT64, [1])
    ctx = {"acc_f": b.cast(ACCEPTED, TensorProto.FLOAT)}
    if cfg.gdn_conv_kernel:
        taps = b.const(np.arange(cfg.gdn_conv_kernel - 1), np.int64)
        ctx["window"] = b.binary("Add", ACCEPTED, taps)
    return ctx


def _slice(b, x: str, start: int, end: int, axis: int) -> str:
    shape = list(b.shape_of(x))
    shape[axis] = end - start
    return b.op("Slice", [x, b.const([start], np.int64), b.const([end], np.int64),
                          b.const([axis], np.int64)], shape, b.shapes[x][1])


def gdn_layer(b, ctx: dict[str, str], i: int, xn: str) -> str:
    """One GDN layer of K tokens, committing the previous verify first (module docstring)."""
    cfg, p, t = b.cfg, f"layers.{i}.", b.tokens
    hk, hv, dk, dv = cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim, cfg.gdn_v_dim
    q, k, v = (b.project(xn, p + n) for n in ("q_proj", "k_proj", "v_proj"))
    if cfg.gdn_conv_kernel:
        q, k, v = _conv(b, ctx, i, q, k, v)
    eps = b.const(L2_EPS)

    def l2(x: str) -> str:
        x = b.reshape(x, [t, hk, dk])
        ss = b.op("ReduceSum", [b.binary("Mul", x, x), b.const([-1], np.int64)], [t, hk, 1],
                  keepdims=1)
        return b.binary("Div", x, b.unary("Sqrt", b.binary("Add", ss, eps)))

    qn, kn = l2(q), l2(k)
    v = b.reshape(v, [t, hv, dv])
    neg_a = b.unary("Neg", b.unary("Exp", b.weight(p + "A_log")))
    a = b.project(xn, p + "a_proj")
    g = b.binary("Mul", neg_a, b.unary("Softplus", b.binary("Add", a, b.weight(p + "dt_bias"))))
    decay = b.unary("Exp", b.reshape(g, [t, hv]))
    beta = b.reshape(b.unary("Sigmoid", b.project(xn, p + "b_proj")), [t, hv])
    _commit(b, ctx, i)
    y, capsule = _verify(b, i, qn, kn, v, decay, beta)
    b.op("Concat", capsule, [1, t * capsule_row(cfg)], axis=1, out=capsule_name(i)[1])
    return b.project(b.reshape(y, [1, t, hv * dv]), p + "o_proj")


def _conv(b, ctx: dict[str, str], i: int, q: str, k: str, v: str) -> tuple[str, str, str]:
    """silu(causal conv) of the K new rows over the committed window: the window gathered
    from the pair at rows accepted .. accepted + kernel - 2, the K rows appended, which is
    the pair's new value (R rows); output t the taps' sum over rows t .. t + kernel - 1."""
    cfg, t = b.cfg, b.tokens
    c, kernel = cfg.gdn_conv_dim, cfg.gdn_conv_kernel
    past, present = f"past_conv_state.{i}", f"present_conv_state.{i}"
    qkv = b.op("Concat", [q, k, v], [1, t, c], axis=-1)
    window = b.op("Gather", [past, ctx["window"]], [1, kernel - 1, c], axis=1)
    full = b.op("Concat", [window, qkv], [1, kernel - 1 + t, c], axis=1, out=present)
    taps = b.weight(f"layers.{i}.conv1d")
    y = None
    for j in range(kernel):
        tap = b.reshape(_slice(b, taps, j, j + 1, 1), [c])
        term = b.binary("Mul", _slice(b, full, j, j + t, 1), tap)
        y = term if y is None else b.binary("Add", y, term)
    y = b.binary("Mul", y, b.unary("Sigmoid", y))
    qk = cfg.gdn_qk_heads * cfg.gdn_qk_dim
    return tuple(_slice(b, y, lo, hi, 2) for lo, hi in ((0, qk), (qk, 2 * qk), (2 * qk, c)))


def _commit(b, ctx: dict[str, str], i: int) -> None:
    """``present_state.i``: the committed state replayed over the capsule's first
    ``accepted_count`` tokens (the rest masked to identity steps)."""
    cfg, t = b.cfg, b.tokens
    hk, hv, dk, dv = cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim, cfg.gdn_v_dim
    row, n = capsule_row(cfg), hv * dv * dk
    # each capsule element's token (keys: -1, never masked: an identity step ignores them)
    # and its identity value (decays 1, deltas 0)
    tok = np.concatenate([np.repeat(np.arange(t), hv), np.full(t * hk * dk, -1),
                          np.repeat(np.arange(t), hv * dv)]).astype(np.float32)
    fill = np.concatenate([np.ones(t * hv), np.zeros(t * (row - hv))]).astype(np.float32)
    dropped = b.op("LessOrEqual", [ctx["acc_f"], b.const(tok.reshape(1, -1), np.float32)],
                   [1, t * row], TensorProto.BOOL)
    masked = b.op("Where", [dropped, b.const(fill.reshape(1, -1), np.float32),
                            capsule_name(i)[0]], [1, t * row], TensorProto.FLOAT)
    cap = b.reshape(masked, [t * row])
    s = b.reshape(_slice(b, b.reshape(f"past_state.{i}", [n]), 0, n, 0), [hv, dv, dk])
    heads = b.const(np.arange(hv) * hk // hv, np.int64)
    keys, deltas = t * hv, t * (hv + hk * dk)
    for j in range(t):
        dec = b.reshape(_slice(b, cap, j * hv, (j + 1) * hv, 0), [hv, 1, 1])
        key = b.reshape(_slice(b, cap, keys + j * hk * dk, keys + (j + 1) * hk * dk, 0),
                        [hk, 1, dk])
        key = b.op("Gather", [key, heads], [hv, 1, dk], TensorProto.FLOAT, axis=0)
        dl = b.reshape(_slice(b, cap, deltas + j * hv * dv, deltas + (j + 1) * hv * dv, 0),
                       [hv, dv, 1])
        s = b.binary("Add", b.binary("Mul", s, dec), b.binary("Mul", dl, key))
    b.reshape(s, [1, hv, dv, dk], out=f"present_state.{i}")


def _verify(b, i: int, q: str, k: str, v: str, decay: str, beta: str
            ) -> tuple[str, list[str]]:
    """The K tokens from ``present_state.i`` (q, k [K, Hk, Dk] normalised, v [K, Hv, Dv],
    decay and beta [K, Hv]), the state viewed (Hk, rep, Dv, Dk) so value head j * rep + r
    reads key head j: the outputs [K, Hv, Dv] and the capsule's three sections."""
    cfg, t = b.cfg, b.tokens
    hk, hv, dk, dv = cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim, cfg.gdn_v_dim
    rep = hv // hk
    scale = b.const(1.0 / np.sqrt(dk))

    def token(x: str, j: int, shape: list[int]) -> str:
        return b.reshape(_slice(b, x, j, j + 1, 0), shape)

    state = b.reshape(f"present_state.{i}", [hk, rep, dv, dk])
    outs, deltas = [], []
    for j in range(t):
        kr = token(k, j, [hk, 1, 1, dk])
        s = b.binary("Mul", state, token(decay, j, [hk, rep, 1, 1]))
        r = b.matmul(s, b.reshape(kr, [hk, 1, dk, 1]))
        d = b.binary("Mul", b.binary("Sub", token(v, j, [hk, rep, dv, 1]), r),
                     token(beta, j, [hk, rep, 1, 1]))
        state = b.binary("Add", s, b.binary("Mul", d, kr))
        o = b.binary("Mul", b.matmul(state, token(q, j, [hk, 1, dk, 1])), scale)
        outs.append(b.reshape(o, [1, hv, dv]))
        deltas.append(b.reshape(d, [1, hv, dv]))
    y = outs[0] if t == 1 else b.op("Concat", outs, [t, hv, dv], axis=0)
    dl = deltas[0] if t == 1 else b.op("Concat", deltas, [t, hv, dv], axis=0)
    sections = [b.reshape(x, [1, t * w]) for x, w in ((decay, hv), (k, hk * dk), (dl, hv * dv))]
    return y, sections
