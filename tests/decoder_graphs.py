"""Small but real decoders in each exporter's naming scheme (``tests.test_inspect.SCHEMES``),
built with onnx.helper from random weights of a fixed seed, and their oracle: the same
decoder in float64 NumPy over the whole sequence, with no cache (full causal attention,
the recurrent state and conv window summed from every earlier token, at each step).

Each decoder: token embedding (plus a position embedding where the scheme feeds
position_ids: optimum ``[B, S]``, transformers Qwen's multimodal ``[3, B, S]``), one
attention layer whose cache grows by Concat (masked by attention_mask where the scheme
feeds it: optimum, genai), a recurrent state ``S' = decay S + v kᵀ`` read by a query, a
conv window shifted by one column where the scheme has one, and logits over a vocabulary
no projection width equals."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.test_inspect import CONV, DH, DK, DV, SCHEMES, D, H, K

VOCAB, MAX_POS, DECAY = 11, 32, 0.9
#: scheme -> (feeds attention_mask, position_ids rank or 0)
FEEDS = {"optimum": (True, 2), "transformers": (False, 3), "genai": (True, 0)}


def weights(seed: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"emb": (VOCAB, D), "pos": (MAX_POS, D), "wq": (D, H * DH), "wk": (D, H * DH),
              "wv": (D, H * DH), "wo": (H * DH, D), "wsk": (D, DK), "wsv": (D, DV),
              "wsq": (D, DK), "wr": (DV, D), "wc": (D, CONV), "wconv": (CONV, K),
              "wcp": (CONV, D), "wlm": (D, VOCAB)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def decoder_model(scheme: str, seed: int = 16, attention: bool = True) -> onnx.ModelProto:
    """The decoder for one decode step in ``scheme``'s names and inputs; ``attention``
    False leaves out the attention layer (and its growing cache and mask): state that is
    only overwritten."""
    (pk, ok_, pv, ov), (past, total), states = SCHEMES[scheme]
    mask, pos_rank = FEEDS[scheme]
    mask = mask and attention
    w = weights(seed)
    consts = dict(shape4=np.array([0, 1, H, DH], np.int64),
                  shape3=np.array([0, 1, H * DH], np.int64), decay=np.float32(DECAY),
                  scale=np.float32(1 / np.sqrt(DH)), one=np.array([1], np.int64),
                  big=np.array([K], np.int64), axis2=np.array([2], np.int64),
                  shape_col=np.array([0, CONV, 1], np.int64),
                  shape_k=np.array([0, 1, 1, DK], np.int64),
                  shape_q=np.array([0, 1, DK, 1], np.int64),
                  shape_v=np.array([0, 1, DV, 1], np.int64),
                  shape_r=np.array([0, 1, DV], np.int64), shape_c=np.array([0, 1, CONV], np.int64),
                  fone=np.float32(1), neg=np.float32(-1e4), zero=np.array(0, np.int64),
                  axes12=np.array([1, 2], np.int64), axes2=np.array([2], np.int64))
    n = helper.make_node
    nodes = [n("Gather", ["emb", "input_ids"], ["tok"])]
    inputs = [_vi("input_ids", ["batch_size", "sequence_length"], TensorProto.INT64)]
    if pos_rank:
        shape = ["batch_size", "sequence_length"]
        inputs.append(_vi("position_ids", [3, *shape] if pos_rank == 3 else shape,
                          TensorProto.INT64))
        pos = "position_ids"
        if pos_rank == 3:  # text positions: all three sections alike; take the first
            nodes.append(n("Gather", ["position_ids", "zero"], ["pos_t"], axis=0))
            pos = "pos_t"
        nodes += [n("Gather", ["pos", pos], ["pe"]), n("Add", ["tok", "pe"], ["x"])]
    else:
        nodes.append(n("Identity", ["tok"], ["x"]))
    for x in ("q", "k", "v") if attention else ():
        nodes += [n("MatMul", ["x", f"w{x}"], [f"{x}2"]),
                  n("Reshape", [f"{x}2", "shape4"], [f"{x}4"]),
                  n("Transpose", [f"{x}4"], [f"{x}h"], perm=[0, 2, 1, 3])]
    if attention:
        nodes += [n("Concat", [pk, "kh"], [ok_], axis=2), n("Concat", [pv, "vh"], [ov], axis=2),
                  n("Transpose", [ok_], ["kt"], perm=[0, 1, 3, 2]),
                  n("MatMul", ["qh", "kt"], ["s0"]), n("Mul", ["s0", "scale"], ["s1"])]
    scores = "s1"
    if mask:
        inputs.append(_vi("attention_mask", ["batch_size", total], TensorProto.INT64))
        nodes += [n("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
                  n("Sub", ["fone", "mf"], ["mi"]), n("Mul", ["mi", "neg"], ["mb"]),
                  n("Unsqueeze", ["mb", "axes12"], ["mb4"]), n("Add", ["s1", "mb4"], ["s2"])]
        scores = "s2"
    if attention:
        nodes += [n("Softmax", [scores], ["p"], axis=-1), n("MatMul", ["p", ov], ["o"]),
                  n("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
                  n("Reshape", ["ot", "shape3"], ["o3"]), n("MatMul", ["o3", "wo"], ["attn"]),
                  n("Add", ["x", "attn"], ["h"])]
    else:
        nodes.append(n("Identity", ["x"], ["h"]))
    rs_in, rs_out = states["recurrent"]
    nodes += [n("MatMul", ["h", "wsk"], ["sk"]), n("Reshape", ["sk", "shape_k"], ["sk4"]),
              n("MatMul", ["h", "wsv"], ["sv"]), n("Reshape", ["sv", "shape_v"], ["sv4"]),
              n("Mul", ["sv4", "sk4"], ["outer"]), n("Mul", [rs_in, "decay"], ["kept"]),
              n("Add", ["kept", "outer"], [rs_out]),
              n("MatMul", ["h", "wsq"], ["sq"]), n("Reshape", ["sq", "shape_q"], ["sq4"]),
              n("MatMul", [rs_out, "sq4"], ["read"]), n("Reshape", ["read", "shape_r"], ["read3"]),
              n("MatMul", ["read3", "wr"], ["rp"]), n("Add", ["h", "rp"], ["h2"])]
    kv = ["batch_size", H, past, DH]
    inputs += [_vi(pk, kv), _vi(pv, kv)] if attention else []
    state_in = [_vi(rs_in, ["batch_size", 1, DV, DK])]
    state_out = [_vi(rs_out, ["batch_size", 1, DV, DK])]
    last = "h2"
    if "conv" in states:
        cin, cout = states["conv"]
        nodes += [n("MatMul", ["h2", "wc"], ["c"]), n("Reshape", ["c", "shape_col"], ["ccol"]),
                  n("Slice", [cin, "one", "big", "axis2"], ["cshift"]),
                  n("Concat", ["cshift", "ccol"], [cout], axis=2),
                  n("Mul", [cout, "wconv"], ["cw"]),
                  n("ReduceSum", ["cw", "axes2"], ["cy"], keepdims=0),
                  n("Reshape", ["cy", "shape_c"], ["cy3"]), n("MatMul", ["cy3", "wcp"], ["cp"]),
                  n("Add", ["h2", "cp"], ["h3"])]
        state_in.insert(0, _vi(cin, ["batch_size", CONV, K]))
        state_out.insert(0, _vi(cout, ["batch_size", CONV, K]))
        last = "h3"
    nodes.append(n("MatMul", [last, "wlm"], ["logits"]))
    kv_out = [_vi(ok_, ["batch_size", H, total, DH]), _vi(ov, ["batch_size", H, total, DH])]
    outputs = [_vi("logits", ["batch_size", "sequence_length", VOCAB]),
               *(kv_out if attention else []), *state_out]
    inits = [numpy_helper.from_array(np.asarray(a), k) for k, a in {**w, **consts}.items()]
    g = helper.make_graph(nodes, f"{scheme}-decoder", inputs + state_in, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def oracle_logits(scheme: str, tokens: list[int], seed: int = 16,
                  attention: bool = True) -> np.ndarray:
    """The last position's logits after ``tokens``, float64, the whole sequence at once."""
    w = {k: v.astype(np.float64) for k, v in weights(seed).items()}
    _, pos_rank = FEEDS[scheme]
    T = len(tokens)
    x = w["emb"][tokens] + (w["pos"][:T] if pos_rank else 0)
    heads = lambda a: a.reshape(T, H, DH).transpose(1, 0, 2)  # noqa: E731
    q, k, v = heads(x @ w["wq"]), heads(x @ w["wk"]), heads(x @ w["wv"])
    s = q @ k.transpose(0, 2, 1) / np.sqrt(DH)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    h = x + (p @ v).transpose(1, 0, 2).reshape(T, H * DH) @ w["wo"] if attention else x
    sk, sv, sq = h @ w["wsk"], h @ w["wsv"], h @ w["wsq"]
    h2 = np.empty_like(h)
    for i in range(T):
        state = sum(DECAY ** (i - j) * np.outer(sv[j], sk[j]) for j in range(i + 1))
        h2[i] = h[i] + (state @ sq[i]) @ w["wr"]
    last = h2
    if "conv" in SCHEMES[scheme][2]:
        c = np.vstack([np.zeros((K - 1, CONV)), h2 @ w["wc"]])  # zeros before the first token
        last = np.stack([h2[i] + (c[i:i + K].T * w["wconv"]).sum(1) @ w["wcp"] for i in range(T)])
    return (last @ w["wlm"])[-1]


def oracle_greedy(scheme: str, prompt: list[int], new: int, seed: int = 16,
                  attention: bool = True) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(new):
        out.append(int(np.argmax(oracle_logits(scheme, seq, seed, attention))))
        seq.append(out[-1])
    return out


#: GroupQueryAttention's head size (ORT's CPU kernel rotates multiples of 16)
GDH = 16


def gqa_weights(seed: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {"emb": (VOCAB, D), "wq": (D, H * GDH), "wk": (D, GDH), "wv": (D, GDH),
              "wo": (H * GDH, D), "wlm": (D, VOCAB)}
    return {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in shapes.items()}


def _rotary_tables(rows: int = MAX_POS) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches ``[rows, GDH/2]`` as exporters write them (base 10000)."""
    inv = 1.0 / 10000 ** (np.arange(0, GDH, 2) / GDH)
    angles = np.arange(rows)[:, None] * inv[None, :]
    return np.cos(angles), np.sin(angles)


def gqa_decoder_model(seed: int = 16, mask: bool = True, rows: int = MAX_POS) -> onnx.ModelProto:
    """genai's kind of attention layer: ORT's GroupQueryAttention (H query heads, one kv
    head, rotary from cos/sin caches of ``rows`` rows), its lengths from the attention_mask
    as genai computes them (``mask`` False: fed seqlens_k and total_sequence_length, as
    statebench's own export); the cache grows inside GQA (present = past + 1 row)."""
    w = gqa_weights(seed)
    cos, sin = _rotary_tables(rows)
    consts = dict(cos_cache=cos.astype(np.float32), sin_cache=sin.astype(np.float32),
                  one=np.array([1], np.int64),
                  idx1=np.array(1, np.int64))
    n = helper.make_node
    nodes = [n("Gather", ["emb", "input_ids"], ["x"]), n("MatMul", ["x", "wq"], ["q"]),
             n("MatMul", ["x", "wk"], ["k"]), n("MatMul", ["x", "wv"], ["v"])]
    inputs = [_vi("input_ids", ["batch_size", "sequence_length"], TensorProto.INT64)]
    if mask:
        inputs.append(_vi("attention_mask", ["batch_size", "total_sequence_length"],
                          TensorProto.INT64))
        nodes += [n("ReduceSum", ["attention_mask", "one"], ["len"], keepdims=0),
                  n("Sub", ["len", "one"], ["len1"]),
                  n("Cast", ["len1"], ["seqlens_k"], to=TensorProto.INT32),
                  n("Shape", ["attention_mask"], ["mshape"]),
                  n("Gather", ["mshape", "idx1"], ["total"]),
                  n("Cast", ["total"], ["total_sequence_length"], to=TensorProto.INT32)]
    else:
        inputs += [_vi("seqlens_k", ["batch_size"], TensorProto.INT32),
                   _vi("total_sequence_length", [], TensorProto.INT32)]
    kv = ["batch_size", 1, "past_sequence_length", "kv_cache_dim"]  # genai's head dim symbol
    inputs += [_vi("past_key_values.0.key", kv), _vi("past_key_values.0.value", kv)]
    nodes += [n("GroupQueryAttention",
                ["q", "k", "v", "past_key_values.0.key", "past_key_values.0.value", "seqlens_k",
                 "total_sequence_length", "cos_cache", "sin_cache"],
                ["attn_o", "present.0.key", "present.0.value"], domain="com.microsoft",
                num_heads=H, kv_num_heads=1, do_rotary=1),
              n("MatMul", ["attn_o", "wo"], ["attn"]), n("Add", ["x", "attn"], ["h"]),
              n("MatMul", ["h", "wlm"], ["logits"])]
    total = ["batch_size", 1, "total_sequence_length", "kv_cache_dim"]
    outputs = [_vi("logits", ["batch_size", "sequence_length", VOCAB]),
               _vi("present.0.key", total), _vi("present.0.value", total)]
    inits = [numpy_helper.from_array(np.asarray(a), k) for k, a in {**w, **consts}.items()]
    g = helper.make_graph(nodes, "gqa-decoder", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21),
                                               helper.make_opsetid("com.microsoft", 1)])


def gqa_oracle_logits(tokens: list[int], seed: int = 16) -> np.ndarray:
    """`gqa_decoder_model`'s last logits after ``tokens``, float64, the whole sequence at
    once: rotary (halves, not interleaved) on q and k, every query head on the one kv head."""
    w = {k: v.astype(np.float64) for k, v in gqa_weights(seed).items()}
    cos, sin = _rotary_tables(len(tokens))
    x = w["emb"][tokens]
    T, half = len(tokens), GDH // 2

    def rotate(a: np.ndarray) -> np.ndarray:  # [T, DH]
        a1, a2 = a[:, :half], a[:, half:]
        return np.concatenate([a1 * cos - a2 * sin, a2 * cos + a1 * sin], axis=1)

    k, v = rotate(x @ w["wk"]), x @ w["wv"]
    q = x @ w["wq"]
    heads = []
    for h in range(H):
        s = rotate(q[:, h * GDH:(h + 1) * GDH]) @ k.T / np.sqrt(GDH)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append((p / p.sum(-1, keepdims=True)) @ v)
    h = x + np.concatenate(heads, axis=1) @ w["wo"]
    return (h @ w["wlm"])[-1]


def save_decoders(directory, seed: int = 16) -> dict:
    """Each scheme's decoder and the GQA one saved in ``directory``: name -> path."""
    out = {}
    for name in [*SCHEMES, "gqa"]:
        out[name] = directory / f"{name}.onnx"
        model = gqa_decoder_model(seed) if name == "gqa" else decoder_model(name, seed)
        onnx.save(model, str(out[name]))
    return out
