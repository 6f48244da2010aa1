"""Two small Llama-like decoders in the forms real exporters write, built with onnx.helper
from fresh random weights, and their oracle: ORT's CPU EP running the same graph with its
growing cache (one token a step, the present fed back as the next past).

* ``genai``: onnxruntime-genai's model builder: (Skip)SimplifiedLayerNormalization,
  com.microsoft GroupQueryAttention with do_rotary (cos/sin caches), fewer KV heads than
  query heads, seqlens_k and total_sequence_length computed from ``attention_mask``,
  presents listed key-major (every ``present.N.key``, then every value).
* ``onnx-attention``: the standard ops of opset 23: ai.onnx RotaryEmbedding and Attention
  (which appends the past itself), a bool mask from ``attention_mask``.
* ``optimum``: optimum / transformers' Llama: RMSNorm as ``Pow(x, 2)``, rotary from
  cos/sin tables gathered by ``position_ids`` (halves rotated by Slice/Neg/Concat), the
  cache grown by ``Concat(past, new)``, KV heads repeated by Expand, and the causal mask
  built from ``attention_mask`` and the past's length.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, FFN, MAX_POS = 37, 32, 4, 2, 16, 2, 48, 64
OPSET = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]


class _Graph:
    """Nodes and initializers gathered as the graph is written."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, value, dtype=np.float32) -> str:
        self.count += 1
        name = f"c{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def weight(self, *shape: int, scale: float = 0.3) -> str:
        return self.const(self.rng.standard_normal(shape) * scale)

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "",
           **attrs) -> str | list[str]:
        self.count += 1
        outs = [f"{op_type.lower()}{self.count}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, domain=domain, **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, name: str, inputs, outputs) -> onnx.ModelProto:
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        return helper.make_model(g, opset_imports=OPSET)


def _rope_tables() -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [MAX_POS, HEAD_DIM / 2] at base 10000."""
    inv = 1.0 / 10000 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    ang = np.outer(np.arange(MAX_POS), inv)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _mlp(g: _Graph, x: str) -> str:
    up = g.op("MatMul", [x, g.weight(HIDDEN, FFN)])
    act = g.op("Mul", [up, g.op("Sigmoid", [up])])
    return g.op("MatMul", [act, g.weight(FFN, HIDDEN)])


def _start(seed: int):
    """A graph with the RoPE tables, the cache shapes (past, total) and the two inputs every
    form has: input_ids and an attention_mask of the total length."""
    g = _Graph(seed)
    cos, sin = _rope_tables()
    kv = ["batch_size", KV_HEADS, "past_sequence_length", HEAD_DIM]
    kv_out = ["batch_size", KV_HEADS, "total_sequence_length", HEAD_DIM]
    inputs = [_vi("input_ids", ["batch_size", "sequence_length"], TensorProto.INT64),
              _vi("attention_mask", ["batch_size", "total_sequence_length"], TensorProto.INT64)]
    return g, g.const(cos), g.const(sin), kv, kv_out, inputs


def genai_model(seed: int = 7, interleaved: bool = False) -> onnx.ModelProto:
    """genai's form (module docstring)."""
    g, cos_c, sin_c, kv, kv_out, inputs = _start(seed)
    summed = g.op("ReduceSum", ["attention_mask", g.const([1], np.int64)], keepdims=0)
    seqlens = g.op("Cast", [g.op("Sub", [summed, g.const(1, np.int64)])], to=TensorProto.INT32)
    total = g.op("Cast", [g.op("Gather", [g.op("Shape", ["attention_mask"]),
                                          g.const(1, np.int64)], axis=0)], to=TensorProto.INT32)
    x = g.op("Gather", [g.weight(VOCAB, HIDDEN, scale=1.0), "input_ids"])
    keys, values, pasts = [], [], []
    residual, normed = None, g.op("SimplifiedLayerNormalization", [x, g.weight(HIDDEN)],
                                  domain="", axis=-1, epsilon=1e-5)
    for i in range(LAYERS):
        pk, pv = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
        pasts += [_vi(pk, kv), _vi(pv, kv)]
        q = g.op("MatMul", [normed, g.weight(HIDDEN, HEADS * HEAD_DIM)])
        k = g.op("MatMul", [normed, g.weight(HIDDEN, KV_HEADS * HEAD_DIM)])
        v = g.op("MatMul", [normed, g.weight(HIDDEN, KV_HEADS * HEAD_DIM)])
        attn = f"attn{i}"
        g.nodes.append(helper.make_node(
            "GroupQueryAttention", [q, k, v, pk, pv, seqlens, total, cos_c, sin_c],
            [attn, f"present.{i}.key", f"present.{i}.value"], domain="com.microsoft",
            num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1,
            rotary_interleaved=int(interleaved)))
        keys.append(_vi(f"present.{i}.key", kv_out))
        values.append(_vi(f"present.{i}.value", kv_out))
        o = g.op("MatMul", [attn, g.weight(HEADS * HEAD_DIM, HIDDEN)])
        residual = x if residual is None else residual
        normed, _, _, residual = g.op("SkipSimplifiedLayerNormalization",
                                      [o, residual, g.weight(HIDDEN)], n_out=4,
                                      domain="com.microsoft", epsilon=1e-5)
        m = _mlp(g, normed)
        normed, _, _, residual = g.op("SkipSimplifiedLayerNormalization",
                                      [m, residual, g.weight(HIDDEN)], n_out=4,
                                      domain="com.microsoft", epsilon=1e-5)
    g.nodes.append(helper.make_node("MatMul", [normed, g.weight(HIDDEN, VOCAB)], ["logits"]))
    # SimplifiedLayerNormalization is ai.onnx in ORT's registry (the builder writes it so)
    outputs = [_vi("logits", ["batch_size", "sequence_length", VOCAB]), *keys, *values]
    return g.model("genai-gqa", inputs + pasts, outputs)


def _rms_pow(g: _Graph, x: str) -> str:
    """RMSNorm as optimum writes it: Pow(x, 2), ReduceMean, Add eps, Sqrt, Div, Mul."""
    ms = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0)]), g.const([-1], np.int64)],
              keepdims=1)
    return g.op("Mul", [g.weight(HIDDEN), g.op("Div", [x, g.op("Sqrt", [
        g.op("Add", [ms, g.const(1e-6)])])])])


def _layer_start(g: _Graph, x: str, i: int, kv: list, pasts: list) -> tuple[str, str, str]:
    """Layer ``i``'s past names (their inputs added to ``pasts``) and its normed input."""
    pk, pv = f"past_key_values.{i}.key", f"past_key_values.{i}.value"
    pasts += [_vi(pk, kv), _vi(pv, kv)]
    return pk, pv, _rms_pow(g, x)


def _rotate_half(g: _Graph, x: str) -> str:
    half = HEAD_DIM // 2
    x1 = g.op("Slice", [x, g.const([0], np.int64), g.const([half], np.int64),
                        g.const([3], np.int64)])
    x2 = g.op("Slice", [x, g.const([half], np.int64), g.const([HEAD_DIM], np.int64),
                        g.const([3], np.int64)])
    return g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)


def optimum_model(seed: int = 11) -> onnx.ModelProto:
    """optimum's form (module docstring)."""
    g = _Graph(seed)
    cos, sin = _rope_tables()
    cos_full, sin_full = np.concatenate([cos, cos], 1), np.concatenate([sin, sin], 1)
    kv = ["batch_size", KV_HEADS, "past_sequence_length", HEAD_DIM]
    grown = "past_sequence_length + sequence_length"  # as optimum names it
    kv_out = ["batch_size", KV_HEADS, grown, HEAD_DIM]
    inputs = [_vi("input_ids", ["batch_size", "sequence_length"], TensorProto.INT64),
              _vi("attention_mask", ["batch_size", grown], TensorProto.INT64),
              _vi("position_ids", ["batch_size", "sequence_length"], TensorProto.INT64)]
    low = float(np.finfo(np.float32).min)
    # cos/sin [B, 1, S, D] at the positions
    cos4 = g.op("Unsqueeze", [g.op("Gather", [g.const(cos_full), "position_ids"]),
                              g.const([1], np.int64)])
    sin4 = g.op("Unsqueeze", [g.op("Gather", [g.const(sin_full), "position_ids"]),
                              g.const([1], np.int64)])
    # the mask: padding from attention_mask, causal from the past's length
    past_len = g.op("Gather", [g.op("Shape", ["past_key_values.0.key"]), g.const(2, np.int64)],
                    axis=0)
    seq = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const(1, np.int64)], axis=0)
    total = g.op("Add", [past_len, seq])
    keys_at = g.op("Range", [g.const(0, np.int64), total, g.const(1, np.int64)])
    query_at = g.op("Unsqueeze", [g.op("Range", [past_len, total, g.const(1, np.int64)]),
                                  g.const([1], np.int64)])
    causal = g.op("LessOrEqual", [keys_at, query_at])  # [S, T]
    pad = g.op("Mul", [g.op("Sub", [g.const(1.0), g.op("Cast", ["attention_mask"],
                                                          to=TensorProto.FLOAT)]),
                       g.const(low)])
    pad4 = g.op("Unsqueeze", [pad, g.const([1, 2], np.int64)])  # [B, 1, 1, T]
    bias = g.op("Where", [causal, pad4, g.const(low)])
    x = g.op("Gather", [g.weight(VOCAB, HIDDEN, scale=1.0), "input_ids"])
    pasts, presents = [], []
    for i in range(LAYERS):
        pk, pv, h = _layer_start(g, x, i, kv, pasts)

        def heads(w: str, n: int, h: str = h) -> str:
            r = g.op("Reshape", [g.op("MatMul", [h, w]), g.const([0, 0, n, HEAD_DIM], np.int64)])
            return g.op("Transpose", [r], perm=[0, 2, 1, 3])

        q = heads(g.weight(HIDDEN, HEADS * HEAD_DIM), HEADS)
        k = heads(g.weight(HIDDEN, KV_HEADS * HEAD_DIM), KV_HEADS)
        v = heads(g.weight(HIDDEN, KV_HEADS * HEAD_DIM), KV_HEADS)
        rope = lambda t: g.op("Add", [g.op("Mul", [t, cos4]),  # noqa: E731
                                      g.op("Mul", [_rotate_half(g, t), sin4])])
        q, k = rope(q), rope(k)
        g.nodes += [helper.make_node("Concat", [pk, k], [f"present.{i}.key"], axis=2),
                    helper.make_node("Concat", [pv, v], [f"present.{i}.value"], axis=2)]
        presents += [_vi(f"present.{i}.key", kv_out), _vi(f"present.{i}.value", kv_out)]

        def repeat(t: str) -> str:  # [B, kv, T, D] -> [B, H, T, D]
            shape = g.op("Shape", [t])
            b_, t_ = (g.op("Gather", [shape, g.const([j], np.int64)], axis=0) for j in (0, 2))
            big = g.op("Concat", [b_, g.const([KV_HEADS, HEADS // KV_HEADS], np.int64), t_,
                                  g.const([HEAD_DIM], np.int64)], axis=0)
            e = g.op("Expand", [g.op("Unsqueeze", [t, g.const([2], np.int64)]), big])
            flat = g.op("Concat", [b_, g.const([HEADS], np.int64), t_,
                                   g.const([HEAD_DIM], np.int64)], axis=0)
            return g.op("Reshape", [e, flat])

        kt = g.op("Transpose", [repeat(f"present.{i}.key")], perm=[0, 1, 3, 2])
        s = g.op("Mul", [g.op("MatMul", [q, kt]), g.const(1 / np.sqrt(HEAD_DIM))])
        p = g.op("Softmax", [g.op("Add", [s, bias])], axis=-1)
        o = g.op("Transpose", [g.op("MatMul", [p, repeat(f"present.{i}.value")])],
                 perm=[0, 2, 1, 3])
        o = g.op("Reshape", [o, g.const([0, 0, HEADS * HEAD_DIM], np.int64)])
        x = g.op("Add", [x, g.op("MatMul", [o, g.weight(HEADS * HEAD_DIM, HIDDEN)])])
        x = g.op("Add", [x, _mlp(g, _rms_pow(g, x))])
    g.nodes.append(helper.make_node("MatMul", [_rms_pow(g, x), g.weight(HIDDEN, VOCAB)],
                                    ["logits"]))
    outputs = [_vi("logits", ["batch_size", "sequence_length", VOCAB]), *presents]
    return g.model("optimum-llama", inputs + pasts, outputs)


def onnx_attention_model(seed: int = 13) -> onnx.ModelProto:
    """The standard ops' form (opset 23): ai.onnx RotaryEmbedding on 3-D q/k at
    position_ids, ai.onnx Attention appending the past itself (present = past + 1 row),
    fewer KV heads, is_causal, a bool mask from attention_mask."""
    g, cos_c, sin_c, kv, kv_out, inputs = _start(seed)
    inputs.append(_vi("position_ids", ["batch_size", "sequence_length"], TensorProto.INT64))
    keep = g.op("Unsqueeze", [g.op("Greater", ["attention_mask", g.const(0, np.int64)]),
                              g.const([1, 2], np.int64)])  # [B, 1, 1, T] bool
    x = g.op("Gather", [g.weight(VOCAB, HIDDEN, scale=1.0), "input_ids"])
    pasts, presents = [], []
    for i in range(LAYERS):
        pk, pv, h = _layer_start(g, x, i, kv, pasts)
        q = g.op("MatMul", [h, g.weight(HIDDEN, HEADS * HEAD_DIM)])
        k = g.op("MatMul", [h, g.weight(HIDDEN, KV_HEADS * HEAD_DIM)])
        v = g.op("MatMul", [h, g.weight(HIDDEN, KV_HEADS * HEAD_DIM)])
        q = g.op("RotaryEmbedding", [q, cos_c, sin_c, "position_ids"], num_heads=HEADS)
        k = g.op("RotaryEmbedding", [k, cos_c, sin_c, "position_ids"], num_heads=KV_HEADS)
        o = f"attn{i}"
        g.nodes.append(helper.make_node(
            "Attention", [q, k, v, keep, pk, pv], [o, f"present.{i}.key", f"present.{i}.value"],
            q_num_heads=HEADS, kv_num_heads=KV_HEADS, is_causal=1))
        presents += [_vi(f"present.{i}.key", kv_out), _vi(f"present.{i}.value", kv_out)]
        x = g.op("Add", [x, g.op("MatMul", [o, g.weight(HEADS * HEAD_DIM, HIDDEN)])])
        x = g.op("Add", [x, _mlp(g, _rms_pow(g, x))])
    g.nodes.append(helper.make_node("MatMul", [_rms_pow(g, x), g.weight(HIDDEN, VOCAB)],
                                    ["logits"]))
    outputs = [_vi("logits", ["batch_size", "sequence_length", VOCAB]), *presents]
    model = g.model("onnx-attention", inputs + pasts, outputs)
    del model.opset_import[:]
    model.opset_import.extend([helper.make_opsetid("", 23)])
    return model


def ort_oracle(path, tokens: list[int]) -> list[np.ndarray]:
    """Each step's logits from ORT's CPU EP on the graph as written: the cache grows a row
    a step, fed back by name (past_key_values.N.X <- present.N.X)."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    past = {n: np.zeros((1, KV_HEADS, 0, HEAD_DIM), np.float32)
            for n in names if n.startswith("past_key_values.")}
    out = []
    for t, tok in enumerate(tokens):
        feeds = {"input_ids": np.array([[tok]], np.int64),
                 "attention_mask": np.ones((1, t + 1), np.int64),
                 "position_ids": np.array([[t]], np.int64), **past}
        feeds = {k: v for k, v in feeds.items() if k in names}
        outs = [o.name for o in sess.get_outputs()]
        got = dict(zip(outs, sess.run(outs, feeds), strict=True))
        out.append(got["logits"].reshape(-1))
        past = {n: got[n.replace("past_key_values.", "present.")] for n in past}
    return out


def ort_greedy(path, prompt: list[int], new: int) -> list[int]:
    seq, tokens = list(prompt), []
    for _ in range(new):
        tokens.append(int(np.argmax(ort_oracle(path, seq)[-1])))
        seq.append(tokens[-1])
    return tokens
