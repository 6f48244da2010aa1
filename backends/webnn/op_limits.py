"""What each op takes here: per operand its data types, and the ranks (the spec's tensor
limits tables, as this implementation supports them).

One table serves both sides: ``MLGraphBuilder`` checks every node it records against it
(``check``: TypeError otherwise, the spec's "allowed data types" steps), and
``MLContext.op_support_limits()`` reports it (``support_limits``), so the two cannot
drift. Keys are the builder's op names; ``OpLimits.member`` is the spec's
``MLOpSupportLimits`` member. Ops the builder lowers to others (clamp, layerNormalization,
pad, ...) are checked at their entry too, and again as the ops they become.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: the most dimensions an operand may have: kernels index any rank; ``tile`` views a rank-r
#: input as rank 2r
MAX_RANK = 16

FLOAT = frozenset({"float32", "float16"})
#: every unpacked type (int8 and uint8 live in 32-bit words on the device: ``dtypes``)
ANY = FLOAT | {"int32", "int64", "uint32", "int8", "uint8"}
#: what arithmetic takes: int8 only moves and casts here (its sums would not wrap at 8 bits)
NUMERIC = ANY - {"int8"}
SIGNED = FLOAT | {"int32", "int64"}
INDEX = frozenset({"int32", "int64", "uint32"})
BOOL = frozenset({"uint8"})
SUMMABLE = FLOAT | {"int32", "int64", "uint32"}
#: dequantizeLinear's input and quantizeLinear's output (int4/uint4: packed constants, or
#: one element a 32-bit word elsewhere: ``dtypes``)
QUANTIZED = frozenset({"int4", "uint4", "int8", "uint8", "int32"})
#: graph inputs, constants and outputs: every type (int4/uint4 move packed at the host
#: boundary; only the two ops above take them)
IO = ANY | {"int4", "uint4"}


@dataclass(frozen=True)
class OpLimits:
    """One op's tensor limits: ``inputs`` as (the spec's operand name, data types) in the
    builder's operand order; ``output``: its data types, None for "same as the first
    input"; ``ranks``: (min, max) of every operand, or per operand in ``operand_ranks``
    (the inputs', then the output's) where they differ; ``variadic``: one entry for all
    inputs (concat)."""

    member: str
    inputs: tuple[tuple[str, frozenset[str]], ...]
    output: frozenset[str] | None = None
    ranks: tuple[int, int] = (0, MAX_RANK)
    variadic: bool = False
    operand_ranks: tuple[tuple[int, int], ...] = ()

    def rank_range(self, k: int) -> tuple[int, int]:
        """(min, max) rank of operand ``k`` (``len(inputs)``: the output)."""
        return self.operand_ranks[k] if self.operand_ranks else self.ranks


def _single(member: str, types: frozenset[str] = ANY, **kw: Any) -> OpLimits:
    return OpLimits(member, (("input", types),), **kw)


def _binary(member: str, types: frozenset[str] = NUMERIC, **kw: Any) -> OpLimits:
    return OpLimits(member, (("a", types), ("b", types)), **kw)


TABLE: dict[str, OpLimits] = {
    **{op: _binary(m) for op, m in (("add", "add"), ("sub", "sub"), ("mul", "mul"),
                                    ("div", "div"), ("pow", "pow"), ("max", "max"),
                                    ("min", "min"))},
    **{op: _binary(m, ANY, output=BOOL) for op, m in (
        ("equal", "equal"), ("not_equal", "notEqual"), ("greater", "greater"),
        ("greater_or_equal", "greaterOrEqual"), ("lesser", "lesser"),
        ("lesser_or_equal", "lesserOrEqual"))},
    "logical_and": _binary("logicalAnd", BOOL),
    "logical_or": _binary("logicalOr", BOOL),
    "logical_xor": _binary("logicalXor", BOOL),
    "logical_not": OpLimits("logicalNot", (("a", BOOL),)),
    "is_nan": OpLimits("isNaN", (("a", FLOAT),), output=BOOL),
    "is_infinite": OpLimits("isInfinite", (("a", FLOAT),), output=BOOL),
    **{op: _single(m, FLOAT) for op, m in (
        ("sqrt", "sqrt"), ("exp", "exp"), ("log", "log"), ("sigmoid", "sigmoid"),
        ("softplus", "softplus"), ("tanh", "tanh"), ("reciprocal", "reciprocal"),
        ("cos", "cos"), ("sin", "sin"), ("floor", "floor"), ("ceil", "ceil"), ("erf", "erf"),
        ("gelu", "gelu"), ("leaky_relu", "leakyRelu"), ("softmax", "softmax"), ("tan", "tan"),
        ("round_even", "roundEven"))},
    "neg": _single("neg", SIGNED),
    "sign": _single("sign", SIGNED),
    "abs": _single("abs", NUMERIC),
    "relu": _single("relu", NUMERIC),
    "clamp": _single("clamp", NUMERIC),
    "identity": _single("identity"),
    "cast": _single("cast", output=ANY),
    "where": OpLimits("where", (("condition", BOOL), ("trueValue", ANY), ("falseValue", ANY))),
    "matmul": _binary("matmul", FLOAT, ranks=(2, MAX_RANK)),
    "gemm": OpLimits("gemm", (("a", FLOAT), ("b", FLOAT), ("c", FLOAT)), ranks=(0, 2)),
    "dequantize_linear": OpLimits(
        "dequantizeLinear", (("input", QUANTIZED), ("scale", FLOAT), ("zeroPoint", QUANTIZED)),
        output=FLOAT),
    "quantize_linear": OpLimits(
        "quantizeLinear", (("input", FLOAT), ("scale", FLOAT), ("zeroPoint", QUANTIZED)),
        output=QUANTIZED),
    **{op: _single(m, FLOAT) for op, m in (
        ("elu", "elu"), ("hard_sigmoid", "hardSigmoid"), ("hard_swish", "hardSwish"),
        ("softsign", "softsign"), ("linear", "linear"))},
    "prelu": OpLimits("prelu", (("input", SIGNED), ("slope", SIGNED))),
    "batch_normalization": OpLimits(
        "batchNormalization", (("input", FLOAT), ("mean", FLOAT), ("variance", FLOAT),
                               ("scale", FLOAT), ("bias", FLOAT)),
        operand_ranks=((1, MAX_RANK),) + ((1, 1),) * 4 + ((1, MAX_RANK),)),
    "instance_normalization": OpLimits(
        "instanceNormalization", (("input", FLOAT), ("scale", FLOAT), ("bias", FLOAT)),
        operand_ranks=((4, 4), (1, 1), (1, 1), (4, 4))),
    "layer_normalization": OpLimits(
        "layerNormalization", (("input", FLOAT), ("scale", FLOAT), ("bias", FLOAT))),
    **{op: _single(m, FLOAT) for op, m in (
        ("reduce_mean", "reduceMean"), ("reduce_l2", "reduceL2"), ("reduce_log_sum", "reduceLogSum"),
        ("reduce_log_sum_exp", "reduceLogSumExp"))},
    **{op: _single(m, SUMMABLE) for op, m in (
        ("reduce_sum_square", "reduceSumSquare"), ("reduce_product", "reduceProduct"),
        ("reduce_l1", "reduceL1"))},
    # uint8 sums, maxima and minima: comparison results counted (masks) by exported graphs
    "reduce_sum": _single("reduceSum", SUMMABLE | BOOL),
    "reduce_max": _single("reduceMax", NUMERIC),
    "reduce_min": _single("reduceMin", NUMERIC),
    "cumulative_sum": _single("cumulativeSum", SUMMABLE),
    **{op: _single(m, output=frozenset({"int32", "int64"}),
                   operand_ranks=((1, MAX_RANK), (0, MAX_RANK - 1)))
       for op, m in (("arg_min", "argMin"), ("arg_max", "argMax"))},
    "reshape": _single("reshape"),
    "transpose": _single("transpose"),
    "slice": _single("slice"),
    "expand": _single("expand"),
    "pad": _single("pad"),
    "tile": _single("tile"),
    "triangular": _single("triangular", ranks=(2, MAX_RANK)),
    "concat": OpLimits("concat", (("inputs", ANY),), variadic=True),
    "split": OpLimits("split", (("input", ANY),)),
    "gather": OpLimits("gather", (("input", ANY), ("indices", INDEX))),
    "gather_elements": OpLimits("gatherElements", (("input", ANY), ("indices", INDEX)),
                                ranks=(1, MAX_RANK)),
    "gather_nd": OpLimits("gatherND", (("input", ANY), ("indices", INDEX)),
                          operand_ranks=((1, MAX_RANK), (1, MAX_RANK), (0, MAX_RANK))),
    "reverse": _single("reverse"),
    "scatter_nd": OpLimits("scatterND", (("input", ANY), ("indices", INDEX), ("updates", ANY))),
    "scatter_elements": OpLimits("scatterElements",
                                 (("input", ANY), ("indices", INDEX), ("updates", ANY))),
    # maxPool2d takes any type (a maximum cannot overflow, so int8 too); the others float
    **{op: _single(m, FLOAT, ranks=(4, 4)) for op, m in (
        ("average_pool2d", "averagePool2d"), ("l2_pool2d", "l2Pool2d"))},
    "max_pool2d": _single("maxPool2d", ANY, ranks=(4, 4)),
    "conv2d": OpLimits("conv2d", (("input", FLOAT), ("filter", FLOAT), ("bias", FLOAT)),
                       ranks=(1, 4)),
    "conv_transpose2d": OpLimits(
        "convTranspose2d", (("input", FLOAT), ("filter", FLOAT), ("bias", FLOAT)),
        operand_ranks=((4, 4), (4, 4), (1, 1), (4, 4))),
    "resample2d": _single("resample2d", FLOAT, ranks=(4, 4)),
}


def check(op: str, operands: Sequence[Any]) -> None:
    """TypeError where an operand's data type or rank is not in ``op``'s limits
    (``operands``: MLOperands, or None for an absent optional one)."""
    lim = TABLE[op]
    for k, x in enumerate(operands):
        if x is None:
            continue
        name, types = lim.inputs[0 if lim.variadic else k]
        dt, rank = x._dtype.name, len(x._shape)
        if dt not in types:
            raise TypeError(f"{lim.member}: {name} of data type {dt} is not supported; it "
                            f"takes {', '.join(sorted(types))}")
        lo, hi = lim.rank_range(0 if lim.variadic else k)
        if not lo <= rank <= hi:
            raise TypeError(f"{lim.member}: {name} of rank {rank} is not supported; it "
                            f"takes ranks {lo} to {hi}")


def _tensor(types: Iterable[str], available: frozenset[str], ranks: tuple[int, int]) -> dict:
    return {"data_types": sorted(t for t in types if t in available),
            "rank_range": {"min": ranks[0], "max": ranks[1]}}


def support_limits(available: frozenset[str], max_tensor_bytes: int) -> dict:
    """The ``MLOpSupportLimits`` dictionary (snake_case members, as the Python mirror names
    them): per op its operands' and output's limits, filtered to the data types this
    context has (``available``); inputs, constants and outputs of a graph take ``IO``."""
    out: dict[str, Any] = {
        "preferred_input_layout": "nchw",
        "max_tensor_byte_length": int(max_tensor_bytes),
        "input": _tensor(IO, available, (0, MAX_RANK)),
        "constant": _tensor(IO, available, (0, MAX_RANK)),
        "output": _tensor(IO, available, (0, MAX_RANK)),
    }
    for lim in TABLE.values():
        member = {_snake(name): _tensor(types, available, lim.rank_range(k))
                  for k, (name, types) in enumerate(lim.inputs)}
        first = lim.inputs[0][1]
        member["outputs" if lim.member == "split" else "output"] = _tensor(
            first if lim.output is None else lim.output, available,
            lim.rank_range(len(lim.inputs)))
        out[_snake(lim.member)] = member
    return out


def _snake(name: str) -> str:
    """camelCase -> snake_case, as the Python mirror names methods (``isNaN`` -> ``is_nan``,
    ``scatterND`` -> ``scatter_nd``)."""
    out = ""
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out += "_"
        out += ch.lower()
    return out
