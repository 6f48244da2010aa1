"""ONNX attention ops real decoder exports carry, decomposed into WebNN ops as ORT's WebNN
EP does: com.microsoft GroupQueryAttention (its shared-buffer form: the new row written
into the capacity-sized cache at ``seqlens_k``), RotaryEmbedding (com.microsoft and
ai.onnx opset 23, interleaved or halves, partial rotary), MRotaryEmbedding (Qwen's
three position rows), SimplifiedLayerNormalization
and SkipSimplifiedLayerNormalization (RMSNorm).

Attention is spelled ``matmul(q, transpose(K))``, element-wise scale and mask, softmax,
``matmul(P, V)``, with the query heads of one KV head as the rows of ``q``: the pattern
``wgpu_impl.match_attention`` fuses into the flash-decoding kernels.
"""

from __future__ import annotations

import numpy as np

from .convert_core import HOST_DTYPES, ConversionError, handles


def _inputs(node, n: int = 12) -> list[str]:
    return list(node.input) + [""] * (n - len(node.input))


def _halves(c, x, rot: int, interleaved: bool):
    """x [..., rot] -> (x1, x2): the two halves, or the even and odd elements."""
    b, s = c.builder, list(c.shape(x))
    lead = s[:-1]
    if interleaved:
        pairs = b.reshape(x, [*lead, rot // 2, 2])
        zero = [0] * (len(lead) + 2)
        one = [*[0] * (len(lead) + 1), 1]
        size = [*lead, rot // 2, 1]
        return (b.reshape(b.slice(pairs, zero, size), [*lead, rot // 2]),
                b.reshape(b.slice(pairs, one, size), [*lead, rot // 2]))
    zero = [0] * len(s)
    return (b.slice(x, zero, [*lead, rot // 2]),
            b.slice(x, [*zero[:-1], rot // 2], [*lead, rot // 2]))


def rotate(c, x4, cos, sin, rot: int, interleaved: bool):
    """Rotary embedding of ``x4`` [B, S, N, H] (its first ``rot`` features) by ``cos`` and
    ``sin`` [B, S, 1, rot/2]."""
    b = c.builder
    B, S, N, H = c.shape(x4)
    xr = x4 if rot == H else b.slice(x4, [0, 0, 0, 0], [B, S, N, rot])
    x1, x2 = _halves(c, xr, rot, interleaved)
    real = b.sub(b.mul(x1, cos), b.mul(x2, sin))
    imag = b.add(b.mul(x1, sin), b.mul(x2, cos))
    if interleaved:
        half = [B, S, N, rot // 2, 1]
        out = b.reshape(b.concat([b.reshape(real, half), b.reshape(imag, half)], 4), [B, S, N, rot])
    else:
        out = b.concat([real, imag], 3)
    if rot < H:
        out = b.concat([out, b.slice(x4, [0, 0, 0, rot], [B, S, N, H - rot])], 3)
    return out


def _rows(c, cache: str, positions, B: int, S: int):
    """cos or sin rows at ``positions`` (B*S indices): [B, S, 1, rot/2]."""
    table = c.operand(cache)
    half = c.shape(table)[-1]
    return c.builder.reshape(c.builder.gather(table, positions, axis=0), [B, S, 1, half])


def _heads(c, x, attrs, cos_name: str):
    """x as [B, S, N, H] from 3-D [B, S, N*H] or 4-D [B, N, S, H], and (B, S, H, rot)."""
    b = c.builder
    shape = list(c.shape(x))
    if len(shape) == 4:
        B, N, S, H = shape
        x4 = b.transpose(x, permutation=[0, 2, 1, 3])
    else:
        B, S, hidden = shape
        N = attrs.get("num_heads", 0)
        if not N:
            rot_given = attrs.get("rotary_embedding_dim", 0) or 2 * c.shape_of(cos_name)[-1]
            N = hidden // rot_given
        H = hidden // N
        x4 = b.reshape(x, [B, S, N, H])
    return x4, (B, S, H, attrs.get("rotary_embedding_dim", 0) or H)


def _back(c, out, shape: list[int]):
    """[B, S, N, H] back to the input's layout."""
    if len(shape) == 4:
        return c.builder.transpose(out, permutation=[0, 2, 1, 3])
    return c.builder.reshape(out, shape)


@handles("RotaryEmbedding")
def _rotary_embedding(c, node, attrs):
    """com.microsoft (input, position_ids, cos, sin) and ai.onnx 23 (input, cos, sin,
    position_ids): 3-D [B, S, N*H] or 4-D ([B, N, S, H]) input."""
    b = c.builder
    ins = _inputs(node)
    contrib = node.domain == "com.microsoft"
    x_name, pos_name, cos_name, sin_name = ((ins[0], ins[1], ins[2], ins[3]) if contrib
                                            else (ins[0], ins[3], ins[1], ins[2]))
    x = c.operand(x_name)
    x4, (B, S, H, rot) = _heads(c, x, attrs, cos_name)
    if pos_name:
        pos = c.operand(pos_name)
        if list(c.shape(pos)) == [1] and contrib and S > 1:
            raise ConversionError("RotaryEmbedding with a position offset and several tokens is "
                                  "not supported")
        pos = b.reshape(pos, [int(np.prod(c.shape(pos)))])
        cos, sin = _rows(c, cos_name, pos, B, S), _rows(c, sin_name, pos, B, S)
    else:  # ai.onnx without position_ids: the caches are already [B, S, rot/2]
        cos = b.reshape(c.operand(cos_name), [B, S, 1, rot // 2])
        sin = b.reshape(c.operand(sin_name), [B, S, 1, rot // 2])
    out = rotate(c, x4, cos, sin, rot, bool(attrs.get("interleaved", 0)))
    return _back(c, out, list(c.shape(x)))


def mrope_rows(sections: list[int], layout: int) -> np.ndarray:
    """Which of the three position rows (temporal, height, width) each rotary frequency
    takes: ``layout`` 0 in contiguous sections, 1 interleaved T H W T H W ... (Qwen3.5),
    each of height and width for its first ``3 * section`` frequencies."""
    half = sum(sections)
    if layout == 0:
        return np.repeat(np.arange(3), sections)
    rows = np.zeros(half, np.int64)
    for row in (1, 2):
        rows[row:sections[row] * 3:3] = row
    return rows


@handles("MRotaryEmbedding")
def _m_rotary_embedding(c, node, attrs):
    """Multimodal rotary (com.microsoft): positions [3, B, S]; frequency i takes its cos/sin
    at the position of row ``mrope_rows(...)[i]``, picked exactly by a one-hot sum."""
    b = c.builder
    ins = _inputs(node)
    x = c.operand(ins[0])
    x4, (B, S, H, rot) = _heads(c, x, attrs, ins[2])
    half = rot // 2
    rows = mrope_rows([int(v) for v in attrs["mrope_section"]], int(attrs.get("mrope_layout", 0)))
    if rows.size != half:
        raise ConversionError(f"MRotaryEmbedding {node.name!r}: mrope_section "
                              f"{list(attrs['mrope_section'])} does not sum to {half}")
    pos = b.reshape(c.operand(ins[1]), [3 * B * S])
    onehot = (np.arange(3)[:, None] == rows[None, :]).astype(np.float32).reshape(3, 1, half)

    def pick(cache: str):
        table = c.operand(cache)
        every = b.reshape(b.gather(table, pos, axis=0), [3, B * S, half])
        mask = c.constant(onehot.astype(HOST_DTYPES[c.dtype(table)]))
        chosen = b.reduce_sum(b.mul(every, mask), axes=[0], keep_dimensions=False)
        return b.reshape(chosen, [B, S, 1, half])

    out = rotate(c, x4, pick(ins[2]), pick(ins[3]), rot, bool(attrs.get("interleaved", 0)))
    return _back(c, out, list(c.shape(x)))


def rms_norm(c, x, scale, axis: int, eps: float):
    """x / sqrt(mean(x², axes from ``axis``) + eps) * scale, and 1/sqrt(...) (keepdims)."""
    b = c.builder
    rank = len(c.shape(x))
    axes = list(range(axis % rank, rank))
    mean = b.reduce_mean(b.mul(x, x), axes=axes, keep_dimensions=True)
    inv = b.div(c.scalar_like(1.0, x), b.sqrt(b.add(mean, c.scalar_like(eps, x))))
    return b.mul(b.mul(x, inv), scale), inv


@handles("SimplifiedLayerNormalization")
def _simplified_layer_norm(c, node, attrs):
    x = c.operand(node.input[0])
    y, inv = rms_norm(c, x, c.operand(node.input[1]), attrs.get("axis", -1),
                      attrs.get("epsilon", 1e-5))
    return [y, inv]


@handles("SkipSimplifiedLayerNormalization")
def _skip_simplified_layer_norm(c, node, attrs):
    """Outputs: normalised, mean (none: RMSNorm has no mean), 1/std, input + skip (+ bias)."""
    b = c.builder
    ins = _inputs(node)
    s = b.add(c.operand(ins[0]), c.operand(ins[1]))
    if ins[3]:
        s = b.add(s, c.operand(ins[3]))
    y, inv = rms_norm(c, s, c.operand(ins[2]), -1, attrs.get("epsilon", 1e-5))
    return [y, None, inv, s]  # a reader of the mean is named by the converter


def _scores(c, q, k, attrs, head_size: int):
    """q·kᵀ scaled (``scale``, else 1/sqrt(head size)) and soft-capped (``softcap``), as
    the attention ops define them, and the score a masked row takes (the lowest finite
    value of the scores' type: float16's where the graph attends in float16, not float32's
    rounded to -inf)."""
    b = c.builder
    scores = b.matmul(q, b.transpose(k, permutation=[0, 1, 3, 2]))
    scale = attrs.get("scale", 0.0) or 1.0 / np.sqrt(head_size)
    scores = b.mul(scores, c.scalar_like(scale, scores))
    cap = attrs.get("softcap", 0.0)
    if cap:
        scores = b.mul(b.tanh(b.div(scores, c.scalar_like(cap, scores))), c.scalar_like(cap, scores))
    lowest = float(np.finfo(HOST_DTYPES[c.dtype(scores)]).min)
    return scores, c.scalar_like(lowest, scores)


@handles("GroupQueryAttention")
def _group_query_attention(c, node, attrs):
    """S new tokens (a decode step's one, a K-token verify's K): q/k/v (or packed), rotary
    at their positions ``seqlens_k - S + 1 .. seqlens_k`` (``seqlens_k`` the last one's, as
    ORT's GroupQueryAttention takes it), their rows written into the capacity-sized past
    there (shared buffer: present is the past's shape), attention over rows 0 .. its own
    position for each query (causal inside the S), each KV head's query heads and tokens
    as the rows of one matmul."""
    b = c.builder
    ins = _inputs(node)
    what = f"GroupQueryAttention {node.name or node.output[0]!r}"
    nq, nkv = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    for i, name in ((9, "position_ids"), (10, "attention_bias"), (11, "head_sink")):
        if ins[i]:
            raise ConversionError(f"{what}: its {name} input is not supported")
    if attrs.get("smooth_softmax", 0) or attrs.get("local_window_size", -1) not in (-1, 0):
        raise ConversionError(f"{what}: smooth_softmax / local_window_size are not supported")
    if not ins[3] or not ins[4]:
        raise ConversionError(f"{what}: without a past cache (prefill) is not supported")
    q = c.operand(ins[0])
    B, S, width = c.shape(q)
    if ins[1]:
        k, v = c.operand(ins[1]), c.operand(ins[2])
        D = width // nq
    else:  # packed q|k|v
        D = width // (nq + 2 * nkv)
        q, k, v = (b.slice(q, [0, 0, o * D], [B, S, n * D])
                   for o, n in ((0, nq), (nq, nkv), (nq + nkv, nkv)))
    past_k, past_v = c.operand(ins[3]), c.operand(ins[4])
    C = c.shape(past_k)[2]
    pos = b.cast(c.operand(ins[5]), "int64")  # seqlens_k [B]: the last new token's position
    # the S tokens' positions [B, S]: seqlens_k - S + 1 .. seqlens_k
    at_s = pos if S == 1 else b.add(b.reshape(pos, [B, 1]), c.constant(
        (np.arange(S, dtype=np.int64) - (S - 1)).reshape(1, S)))
    q4, k4 = b.reshape(q, [B, S, nq, D]), b.reshape(k, [B, S, nkv, D])
    if attrs.get("do_rotary", 0):
        flat = at_s if S == 1 else b.reshape(at_s, [B * S])
        cos, sin = _rows(c, ins[7], flat, B, S), _rows(c, ins[8], flat, B, S)
        rot = 2 * c.shape(c.operand(ins[7]))[-1]
        inter = bool(attrs.get("rotary_interleaved", 0))
        q4, k4 = rotate(c, q4, cos, sin, rot, inter), rotate(c, k4, cos, sin, rot, inter)
    kh = b.transpose(k4, permutation=[0, 2, 1, 3])  # [B, nkv, S, D]
    vh = b.transpose(b.reshape(v, [B, S, nkv, D]), permutation=[0, 2, 1, 3])
    grid = np.stack(np.meshgrid(np.arange(B), np.arange(nkv), indexing="ij"), -1)
    grid = c.constant(np.repeat(grid.reshape(B, nkv, 1, 2), S, axis=2).astype(np.int64))
    at = b.expand(b.reshape(at_s, [B, 1, S, 1]), [B, nkv, S, 1])
    idx = b.concat([grid, at], 3)
    present_k, present_v = b.scatter_nd(past_k, idx, kh), b.scatter_nd(past_v, idx, vh)
    g = nq // nkv
    # a KV head's query rows: its g query heads, each with its S tokens ([B, nkv, g*S, D])
    qh = b.reshape(b.transpose(q4, permutation=[0, 2, 1, 3]), [B, nkv, g * S, D])
    scores, low = _scores(c, qh, present_k, attrs, D)  # [B, nkv, g*S, C]
    rows = c.constant(np.arange(C, dtype=np.int64).reshape(1, 1, 1, C))
    if S == 1:
        last = b.reshape(pos, [B, 1, 1, 1])
    else:  # each query row's own position: its token's (row r of a head is token r % S)
        last = b.add(b.reshape(pos, [B, 1, 1, 1]), c.constant(
            np.tile(np.arange(S, dtype=np.int64) - (S - 1), g).reshape(1, 1, g * S, 1)))
    valid = b.lesser_or_equal(rows, last)
    probs = b.softmax(b.where(valid, scores, low), 3)
    out = b.matmul(probs, present_v)  # [B, nkv, g, D]
    out = b.reshape(b.transpose(b.reshape(out, [B, nq, S, D]), permutation=[0, 2, 1, 3]),
                    [B, S, nq * D])
    return [out, present_k, present_v]


def _to_heads(c, x, heads: int):
    """[B, S, heads*D] -> [B, heads, S, D]; 4-D is taken as it is."""
    shape = c.shape(x)
    if len(shape) == 4:
        return x
    B, S, width = shape
    return c.builder.transpose(c.builder.reshape(x, [B, S, heads, width // heads]),
                               permutation=[0, 2, 1, 3])


@handles("Attention")
def _attention(c, node, attrs):
    """ai.onnx Attention (opset 23/24): 3-D or 4-D q/k/v, past appended (present = past +
    new rows), fewer KV heads than query heads, bool or additive mask, is_causal aligned
    bottom-right (offset = past rows, or nonpad_kv_seqlen - q rows), softcap; the scores
    output (qk_matmul_output) is not supported."""
    b = c.builder
    ins = _inputs(node)
    what = f"Attention {node.name or node.output[0]!r}"
    if node.domain == "com.microsoft":
        raise ConversionError(f"{what}: com.microsoft::Attention (packed weights) is not supported; "
                              "ai.onnx Attention is")
    if len(node.output) > 3 and node.output[3]:
        raise ConversionError(f"{what}: its qk_matmul_output is not supported")
    q3 = c.operand(ins[0])
    q = _to_heads(c, q3, int(attrs.get("q_num_heads", 0) or 1))
    B, Hq, Sq, D = c.shape(q)
    kv_heads = int(attrs.get("kv_num_heads", 0) or 1)
    k, v = _to_heads(c, c.operand(ins[1]), kv_heads), _to_heads(c, c.operand(ins[2]), kv_heads)
    Hkv = c.shape(k)[1]
    present_k, present_v = k, v
    past = 0
    if ins[4]:
        past = c.shape(c.operand(ins[4]))[2]
        present_k = b.concat([c.operand(ins[4]), k], 2)
        present_v = b.concat([c.operand(ins[5]), v], 2)
    T = c.shape(present_k)[2]
    kk, vv = present_k, present_v
    if Hkv != Hq:  # each KV head repeated for its query heads
        g = Hq // Hkv
        kk, vv = (b.reshape(b.expand(b.reshape(t, [B, Hkv, 1, T, c.shape(t)[3]]),
                                     [B, Hkv, g, T, c.shape(t)[3]]), [B, Hq, T, c.shape(t)[3]])
                  for t in (present_k, present_v))
    scores, low = _scores(c, q, kk, attrs, D)  # [B, Hq, Sq, T]
    if ins[3]:
        mask = c.operand(ins[3])
        if c.dtype(mask) == "uint8":  # ONNX bool: True attends
            scores = b.where(mask, scores, low)
        else:
            scores = b.add(scores, mask)
    rows = np.arange(T).reshape(1, T)
    nonpad = ins[6] if len(ins) > 6 else ""
    if nonpad:
        lens = b.reshape(b.cast(c.operand(nonpad), "int64"), [B, 1, 1, 1])
        cols = c.constant(rows.reshape(1, 1, 1, T).astype(np.int64))
        scores = b.where(b.lesser(cols, lens), scores, low)
        if attrs.get("is_causal", 0):  # j <= i + nonpad - Sq
            i = c.constant(np.arange(Sq, dtype=np.int64).reshape(1, 1, Sq, 1) - Sq)
            scores = b.where(b.lesser_or_equal(cols, b.add(i, lens)), scores, low)
    elif attrs.get("is_causal", 0):
        allowed = rows <= np.arange(Sq).reshape(Sq, 1) + past
        if not allowed.all():
            scores = b.where(c.constant(allowed.astype(np.uint8)), scores, low)
    out = b.matmul(b.softmax(scores, 3), vv)  # [B, Hq, Sq, Dv]
    if len(c.shape(q3)) == 3:
        out = b.reshape(b.transpose(out, permutation=[0, 2, 1, 3]), [B, Sq, Hq * c.shape(out)[3]])
    return [out, present_k, present_v]
