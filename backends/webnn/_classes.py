# ruff: noqa: E501  (the "# IDL:" lines are quoted verbatim from the spec)
"""The WebNN interfaces as in the IDL (webmachinelearning/webnn ``index.bs``), in Python.

Naming follows wgpu-py: class names kept, camelCase methods become snake_case, descriptor
dictionaries become keyword arguments, an ``# IDL:`` line above each method. The graph
builder and every check the spec makes at the API boundary live here; device work is done
by the wgpu implementation (``wgpu_impl``) that subclasses :class:`MLContext`.

Points where the stateful-graph proposal (webnn issue 966) is implemented are marked
``PROPOSAL``; deviations from the spec are marked ``DEVIATION``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from backends.webnn.counters import ByteCounters

from . import composites, ir, op_limits
from . import shapes as S
from .dtypes import DTYPES, DType, dtype, packed_bytes, packed_words, to_device
from .errors import InvalidStateError

_serial = itertools.count(1)

ELEMENTWISE_BINARY = ("add", "sub", "mul", "div", "pow", "max", "min")
ELEMENTWISE_UNARY = (
    "sqrt", "exp", "log", "neg", "abs", "sigmoid", "softplus", "tanh", "relu",
    "reciprocal", "cos", "sin", "floor", "ceil", "erf", "gelu", "identity", "tan", "sign",
    "round_even",
)
COMPARISON = ("equal", "not_equal", "greater", "lesser", "lesser_or_equal", "greater_or_equal")
LOGICAL = ("logical_and", "logical_or", "logical_xor", "logical_not", "is_nan", "is_infinite")
#: what dequantizeLinear reads and quantizeLinear writes (int4/uint4: packed constants, or
#: one element a 32-bit word elsewhere, as int8 and uint8: ``dtypes``)
QUANTIZED = ("int4", "uint4", "int8", "uint8", "int32")
#: the only ops taking int4/uint4 operands here
TAKES_PACKED = ("dequantize_linear", "quantize_linear")
FLOAT_ONLY = ("sqrt", "exp", "log", "sigmoid", "softplus", "tanh", "cos", "sin", "erf",
              "gelu", "reciprocal", "floor", "ceil", "softmax", "tan", "round_even")


# IDL: dictionary MLKVCachePair { required DOMString input; required DOMString output; };
@dataclass(frozen=True)
class MLKVCachePair:
    """PROPOSAL: one (graph input, graph output) pair whose state the graph keeps."""

    input: str
    output: str


class MLOperand:
    """A node of the graph under construction (IDL: ``MLOperand``)."""

    def __init__(self, builder: MLGraphBuilder, kind: str, dt: DType, shape: tuple[int, ...],
                 op: str = "", inputs: tuple[MLOperand, ...] = (),
                 attrs: dict[str, Any] | None = None, name: str = "",
                 value: np.ndarray | None = None) -> None:
        self._builder = builder
        self._id = next(_serial)
        self._kind = kind  # "input" | "constant" | "op"
        self._dtype = dt
        self._shape = shape
        self._op = op
        self._inputs = inputs
        self._attrs = attrs or {}
        self._name = name
        self._value = value

    # IDL: readonly attribute MLOperandDataType dataType;
    @property
    def data_type(self) -> str:
        return self._dtype.name

    # IDL: readonly attribute FrozenArray<unsigned long> shape;
    @property
    def shape(self) -> list[int]:
        return list(self._shape)

    def __repr__(self) -> str:
        what = self._name or self._op or self._kind
        return f"<MLOperand {what} {self._dtype.name}{list(self._shape)}>"


class MLGraphBuilder:
    """Records operations with their inferred shapes; ``build`` hands them to the context.

    DEVIATION: ``build`` may be called more than once (the current spec makes it one-shot);
    statebench uses this to show that two graphs built from the same operands never share
    state.
    """

    # IDL: constructor(MLContext context);
    def __init__(self, context: MLContext) -> None:
        if not isinstance(context, MLContext):
            raise TypeError("MLGraphBuilder needs an MLContext")
        context._check_alive()
        self._context = context
        self._input_names: set[str] = set()
        #: ids of the casts rounding a widened op's float32 result to float16 (``_widened``)
        self._narrowed: set[int] = set()
        self._wides: dict[int, MLOperand] = {}  # float16 operand id -> its float32 widening

    # -- helpers ----------------------------------------------------------------------
    def _own(self, *ops: MLOperand) -> None:
        for o in ops:
            if not isinstance(o, MLOperand):
                raise TypeError(f"expected an MLOperand, got {type(o).__name__}")
            if o._builder is not self:
                raise TypeError("operand belongs to another MLGraphBuilder")

    def _node(self, op: str, inputs: Sequence[MLOperand], dt: DType, shape: tuple[int, ...],
              **attrs: Any) -> MLOperand:
        self._own(*inputs)
        packed = [x for x in inputs if x._dtype.packed]
        if packed and op not in TAKES_PACKED:
            # the spec's opSupportLimits() may leave a type out of an op's list
            raise TypeError(f"{op} does not take {packed[0]._dtype.name} operands here; "
                            "only dequantizeLinear and quantizeLinear do")
        op_limits.check(op, inputs)  # what opSupportLimits() reports
        if any(x._dtype.name == "float16" for x in inputs) and (
                self._context._widens(op) or self._stays_wide(op, inputs)):
            return self._widened(op, inputs, dt, shape, attrs)
        return MLOperand(self, "op", dt, shape, op=op, inputs=tuple(inputs), attrs=attrs)

    def _stays_wide(self, op: str, inputs: Sequence[MLOperand]) -> bool:
        """Whether a float16 op the context has kernels for continues a float32 chain: it
        reads a widened op's rounded result and otherwise only constants (an attention
        score's scale and mask value), so it reads the float32 value instead and the
        chain stays float32 until its last op (one rounding, not one an op)."""
        if op in ("cast", "scatter_nd", "gather", "dequantize_linear"):
            return False
        halves = [x for x in inputs if x._dtype.name == "float16"]
        return (any(x._id in self._narrowed for x in halves)
                and all(x._id in self._narrowed or x._kind == "constant" for x in halves))

    def _wide(self, x: MLOperand) -> MLOperand:
        """``x`` (float16) as float32: a widened op's float32 value before its rounding, a
        constant widened once, a transpose or reshape of float16 data made of the widened
        data (so a matmul still sees the transpose it folds), else a cast."""
        f32 = dtype("float32")
        if x._id in self._narrowed:
            return x._inputs[0]
        if x._id not in self._wides:  # one widening an operand (q, k, v read one row)
            if x._kind == "constant":
                w = MLOperand(self, "constant", f32, x._shape, value=x._value.astype(np.float32))
            elif x._kind == "op" and x._op in ("transpose", "reshape"):
                w = MLOperand(self, "op", f32, x._shape, op=x._op,
                              inputs=(self._wide(x._inputs[0]),), attrs=x._attrs)
            else:
                w = MLOperand(self, "op", f32, x._shape, op="cast", inputs=(x,))
            self._wides[x._id] = w
        return self._wides[x._id]

    def _widened(self, op: str, inputs: Sequence[MLOperand], dt: DType,
                 shape: tuple[int, ...], attrs: dict[str, Any]) -> MLOperand:
        """``op`` on float16 operands as the context runs it: in float32 between casts
        (its float16 operands widened exactly, a float16 result rounded once at the end:
        ``_wide``, ``_stays_wide``)."""
        wide = tuple(self._wide(x) if x._dtype.name == "float16" else x for x in inputs)
        f32 = dtype("float32")
        out = MLOperand(self, "op", f32 if dt.name == "float16" else dt, shape, op=op,
                        inputs=wide, attrs=attrs)
        if dt.name != "float16":
            return out
        narrow = MLOperand(self, "op", dt, shape, op="cast", inputs=(out,))
        self._narrowed.add(narrow._id)
        return narrow

    def _dtype(self, name: str) -> DType:
        """A data type this builder's context supports (TypeError otherwise: the spec's
        check against ``opSupportLimits()``)."""
        dt = dtype(name)
        why = self._context._unsupported(dt)
        if why:
            raise TypeError(why)
        return dt

    @staticmethod
    def _same_type(*ops: MLOperand) -> DType:
        types = {o._dtype.name for o in ops}
        if len(types) != 1:
            raise TypeError(f"operands must have the same data type, got {sorted(types)}")
        return ops[0]._dtype

    # -- sources ----------------------------------------------------------------------
    # IDL: MLOperand input(USVString name, MLOperandDescriptor descriptor);
    def input(self, name: str, *, data_type: str, shape: Sequence[int]) -> MLOperand:
        if not isinstance(name, str) or not name:
            raise TypeError("input name must be a non-empty string")
        if name in self._input_names:
            raise TypeError(f"duplicate input name {name!r}")
        dt = self._dtype(data_type)  # int4/uint4: written packed by the page (``dtypes``)
        self._input_names.add(name)
        return MLOperand(self, "input", dt, S.check_shape(shape), name=name)

    # IDL: MLOperand constant(MLOperandDescriptor descriptor, AllowSharedBufferSource buffer);
    def constant(self, *, data_type: str, shape: Sequence[int], value: Any) -> MLOperand:
        dt = self._dtype(data_type)
        shp = S.check_shape(shape)
        if dt.packed:  # the spec's buffer: two elements a byte, kept as device words
            return MLOperand(self, "constant", dt, shp,
                             value=packed_words(value, dt, S.size(shp)))
        arr = np.asarray(value)
        if arr.size == 1 and S.size(shp) != 1:
            raise TypeError("constant value size does not match its shape")
        to_device(arr, dt, S.size(shp))  # size and int64 range checks
        # the spec copies the page's buffer at this call; a read-only array (a memory-mapped
        # weight file) cannot change afterwards, so it is kept by reference
        host = (arr.astype(dt.host, copy=False) if not arr.flags.writeable
                else np.array(arr, dtype=dt.host)).reshape(shp)
        return MLOperand(self, "constant", dt, shp, value=host)

    # -- element-wise -----------------------------------------------------------------
    def _binary(self, op: str, a: MLOperand, b: MLOperand) -> MLOperand:
        self._own(a, b)
        dt = self._same_type(a, b)
        return self._node(op, (a, b), dt, S.broadcast(a._shape, b._shape))

    def _unary(self, op: str, x: MLOperand) -> MLOperand:
        self._own(x)
        if op in FLOAT_ONLY and not x._dtype.is_float:
            raise TypeError(f"{op} needs a float input, got {x._dtype.name}")
        if op in ("neg", "sign") and x._dtype.wgsl == "u32":
            raise TypeError(f"{op} needs a signed input")
        return self._node(op, (x,), x._dtype, x._shape)

    # IDL: MLOperand add(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def add(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._binary("add", a, b)

    # IDL: MLOperand sub(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def sub(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._binary("sub", a, b)

    # IDL: MLOperand mul(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def mul(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._binary("mul", a, b)

    # IDL: MLOperand div(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def div(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._binary("div", a, b)

    # IDL: MLOperand pow(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def pow(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._binary("pow", a, b)

    # IDL: MLOperand max(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def max(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._binary("max", a, b)

    # IDL: MLOperand min(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def min(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._binary("min", a, b)

    def _compare(self, op: str, a: MLOperand, b: MLOperand) -> MLOperand:
        self._own(a, b)
        self._same_type(a, b)
        return self._node(op, (a, b), dtype("uint8"), S.broadcast(a._shape, b._shape))

    # IDL: MLOperand equal(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def equal(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._compare("equal", a, b)

    # IDL: MLOperand notEqual(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def not_equal(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._compare("not_equal", a, b)

    # IDL: MLOperand greater(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def greater(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._compare("greater", a, b)

    # IDL: MLOperand greaterOrEqual(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def greater_or_equal(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._compare("greater_or_equal", a, b)

    # IDL: MLOperand lesser(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def lesser(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._compare("lesser", a, b)

    # IDL: MLOperand lesserOrEqual(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def lesser_or_equal(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._compare("lesser_or_equal", a, b)

    # IDL: MLOperand logicalNot(MLOperand a, optional MLOperatorOptions options = {});
    def logical_not(self, a: MLOperand) -> MLOperand:
        self._own(a)
        if a._dtype.name != "uint8":
            raise TypeError("logical_not needs a uint8 input")
        return self._node("logical_not", (a,), a._dtype, a._shape)

    def _logical(self, op: str, a: MLOperand, b: MLOperand) -> MLOperand:
        self._own(a, b)
        if a._dtype.name != "uint8" or b._dtype.name != "uint8":
            raise TypeError(f"{op} needs uint8 inputs")
        return self._node(op, (a, b), a._dtype, S.broadcast(a._shape, b._shape))

    # IDL: MLOperand logicalAnd(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def logical_and(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._logical("logical_and", a, b)

    # IDL: MLOperand logicalOr(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def logical_or(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._logical("logical_or", a, b)

    # IDL: MLOperand logicalXor(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def logical_xor(self, a: MLOperand, b: MLOperand) -> MLOperand:
        return self._logical("logical_xor", a, b)

    # IDL: MLOperand isNaN(MLOperand a, optional MLOperatorOptions options = {});
    def is_nan(self, a: MLOperand) -> MLOperand:
        self._own(a)
        if not a._dtype.is_float:
            raise TypeError(f"is_nan needs a float input, got {a._dtype.name}")
        return self._node("is_nan", (a,), dtype("uint8"), a._shape)

    # IDL: MLOperand isInfinite(MLOperand a, optional MLOperatorOptions options = {});
    def is_infinite(self, a: MLOperand) -> MLOperand:
        self._own(a)
        if not a._dtype.is_float:
            raise TypeError(f"is_infinite needs a float input, got {a._dtype.name}")
        return self._node("is_infinite", (a,), dtype("uint8"), a._shape)

    # IDL: MLOperand sqrt(MLOperand input, optional MLOperatorOptions options = {});
    def sqrt(self, x: MLOperand) -> MLOperand:
        return self._unary("sqrt", x)

    # IDL: MLOperand exp(MLOperand input, optional MLOperatorOptions options = {});
    def exp(self, x: MLOperand) -> MLOperand:
        return self._unary("exp", x)

    # IDL: MLOperand log(MLOperand input, optional MLOperatorOptions options = {});
    def log(self, x: MLOperand) -> MLOperand:
        return self._unary("log", x)

    # IDL: MLOperand neg(MLOperand input, optional MLOperatorOptions options = {});
    def neg(self, x: MLOperand) -> MLOperand:
        return self._unary("neg", x)

    # IDL: MLOperand abs(MLOperand input, optional MLOperatorOptions options = {});
    def abs(self, x: MLOperand) -> MLOperand:
        return self._unary("abs", x)

    # IDL: MLOperand sigmoid(MLOperand input, optional MLOperatorOptions options = {});
    def sigmoid(self, x: MLOperand) -> MLOperand:
        return self._unary("sigmoid", x)

    # IDL: MLOperand softplus(MLOperand input, optional MLOperatorOptions options = {});
    def softplus(self, x: MLOperand) -> MLOperand:
        return self._unary("softplus", x)

    # IDL: MLOperand tanh(MLOperand input, optional MLOperatorOptions options = {});
    def tanh(self, x: MLOperand) -> MLOperand:
        return self._unary("tanh", x)

    # IDL: MLOperand relu(MLOperand input, optional MLOperatorOptions options = {});
    def relu(self, x: MLOperand) -> MLOperand:
        return self._unary("relu", x)

    # IDL: MLOperand reciprocal(MLOperand input, optional MLOperatorOptions options = {});
    def reciprocal(self, x: MLOperand) -> MLOperand:
        return self._unary("reciprocal", x)

    # IDL: MLOperand cos(MLOperand input, optional MLOperatorOptions options = {});
    def cos(self, x: MLOperand) -> MLOperand:
        return self._unary("cos", x)

    # IDL: MLOperand sin(MLOperand input, optional MLOperatorOptions options = {});
    def sin(self, x: MLOperand) -> MLOperand:
        return self._unary("sin", x)

    # IDL: MLOperand floor(MLOperand input, optional MLOperatorOptions options = {});
    def floor(self, x: MLOperand) -> MLOperand:
        return self._unary("floor", x)

    # IDL: MLOperand ceil(MLOperand input, optional MLOperatorOptions options = {});
    def ceil(self, x: MLOperand) -> MLOperand:
        return self._unary("ceil", x)

    # IDL: MLOperand erf(MLOperand input, optional MLOperatorOptions options = {});
    def erf(self, x: MLOperand) -> MLOperand:
        return self._unary("erf", x)

    # IDL: MLOperand gelu(MLOperand input, optional MLOperatorOptions options = {});
    def gelu(self, x: MLOperand) -> MLOperand:
        return self._unary("gelu", x)

    # IDL: MLOperand tan(MLOperand input, optional MLOperatorOptions options = {});
    def tan(self, x: MLOperand) -> MLOperand:
        return self._unary("tan", x)

    # IDL: MLOperand sign(MLOperand input, optional MLOperatorOptions options = {});
    def sign(self, x: MLOperand) -> MLOperand:
        """1 where x > 0, -1 where x < 0, else 0 (a NaN too)."""
        return self._unary("sign", x)

    # IDL: MLOperand roundEven(MLOperand input, optional MLOperatorOptions options = {});
    def round_even(self, x: MLOperand) -> MLOperand:
        """Halves to the even neighbour: WGSL's ``round``."""
        return self._unary("round_even", x)

    # IDL: MLOperand identity(MLOperand input, optional MLOperatorOptions options = {});
    def identity(self, x: MLOperand) -> MLOperand:
        return self._unary("identity", x)

    # IDL: MLOperand where(MLOperand condition, MLOperand trueValue, MLOperand falseValue, optional MLOperatorOptions options = {});
    def where(self, condition: MLOperand, true_value: MLOperand,
              false_value: MLOperand) -> MLOperand:
        self._own(condition, true_value, false_value)
        if condition._dtype.name != "uint8":
            raise TypeError("where's condition must be uint8")
        dt = self._same_type(true_value, false_value)
        shp = S.broadcast(condition._shape, true_value._shape, false_value._shape)
        return self._node("where", (condition, true_value, false_value), dt, shp)

    # IDL: MLOperand cast(MLOperand input, MLOperandDataType type, optional MLOperatorOptions options = {});
    def cast(self, x: MLOperand, data_type: str) -> MLOperand:
        """A cast to int8 or uint8 keeps the lowest 8 bits (``wrap``: their words are 32-bit
        on the device, ``dtypes``)."""
        self._own(x)
        dt = self._dtype(data_type)
        wrap = {"wrap": dt.name} if dt.name in ("int8", "uint8") and dt != x._dtype else {}
        return self._node("cast", (x,), dt, x._shape, **wrap)

    # IDL: MLOperand clamp(MLOperand input, optional MLClampOptions options = {});
    def clamp(self, x: MLOperand, *, min_value: float | None = None,
              max_value: float | None = None) -> MLOperand:
        """DEVIATION: lowered to max and min with constants (the spec's emulation)."""
        return composites.clamp(self, x, min_value, max_value)

    # IDL: MLOperand leakyRelu(MLOperand input, optional MLLeakyReluOptions options = {});
    def leaky_relu(self, x: MLOperand, *, alpha: float = 0.01) -> MLOperand:
        """DEVIATION: lowered to ``max(x, 0) + alpha * min(x, 0)`` (the spec's emulation)."""
        return composites.leaky_relu(self, x, alpha)

    # IDL: MLOperand elu(MLOperand input, optional MLEluOptions options = {});
    def elu(self, x: MLOperand, *, alpha: float = 1.0) -> MLOperand:
        """DEVIATION: lowered to ``max(x, 0) + alpha * (exp(min(x, 0)) - 1)`` (the spec's
        emulation; float16 computed in float32, rounded once)."""
        return composites.elu(self, x, alpha)

    # IDL: MLOperand hardSigmoid(MLOperand input, optional MLHardSigmoidOptions options = {});
    def hard_sigmoid(self, x: MLOperand, *, alpha: float = 0.2, beta: float = 0.5) -> MLOperand:
        """DEVIATION: lowered to ``max(min(alpha * x + beta, 1), 0)`` (the spec's emulation)."""
        return composites.hard_sigmoid(self, x, alpha, beta)

    # IDL: MLOperand hardSwish(MLOperand input, optional MLOperatorOptions options = {});
    def hard_swish(self, x: MLOperand) -> MLOperand:
        """DEVIATION: lowered to ``x * max(0, min(6, x + 3)) / 6`` (the spec's emulation)."""
        return composites.hard_swish(self, x)

    # IDL: MLOperand softsign(MLOperand input, optional MLOperatorOptions options = {});
    def softsign(self, x: MLOperand) -> MLOperand:
        """DEVIATION: lowered to ``x / (1 + abs(x))`` (the spec's emulation)."""
        return composites.softsign(self, x)

    # IDL: MLOperand linear(MLOperand input, optional MLLinearOptions options = {});
    def linear(self, x: MLOperand, *, alpha: float = 1.0, beta: float = 0.0) -> MLOperand:
        """DEVIATION: lowered to ``alpha * x + beta`` (the spec's emulation)."""
        return composites.linear(self, x, alpha, beta)

    # IDL: MLOperand prelu(MLOperand input, MLOperand slope, optional MLOperatorOptions options = {});
    def prelu(self, x: MLOperand, slope: MLOperand) -> MLOperand:
        """DEVIATION: lowered to ``max(x, 0) + slope * min(x, 0)``, broadcast both ways (the
        spec's emulation)."""
        return composites.prelu(self, x, slope)

    # -- matrix products -------------------------------------------------------------
    # IDL: MLOperand matmul(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    def matmul(self, a: MLOperand, b: MLOperand) -> MLOperand:
        self._own(a, b)
        dt = self._same_type(a, b)
        if not dt.is_float:
            raise TypeError("matmul needs float inputs")
        return self._node("matmul", (a, b), dt, S.matmul(a._shape, b._shape))

    # IDL: MLOperand gemm(MLOperand a, MLOperand b, optional MLGemmOptions options = {});
    def gemm(self, a: MLOperand, b: MLOperand, *, c: MLOperand | None = None,
             alpha: float = 1.0, beta: float = 1.0, a_transpose: bool = False,
             b_transpose: bool = False) -> MLOperand:
        """Lowered to transpose/matmul/mul/add at build time (same math as the spec)."""
        self._own(a, b)
        if len(a._shape) != 2 or len(b._shape) != 2:
            raise TypeError("gemm needs 2-D inputs")
        a2 = self.transpose(a) if a_transpose else a
        b2 = self.transpose(b) if b_transpose else b
        y = self.matmul(a2, b2)
        if alpha != 1.0:
            y = self.mul(y, self.constant(data_type=y.data_type, shape=[1], value=[alpha]))
        if c is not None:
            self._own(c)
            if not S.unidirectional(c._shape, y._shape):
                raise TypeError("gemm's c does not broadcast to the output")
            cc = c if beta == 1.0 else self.mul(
                c, self.constant(data_type=c.data_type, shape=[1], value=[beta]))
            y = self.add(y, cc)
        return y

    # IDL: MLOperand dequantizeLinear(MLOperand input, MLOperand scale, MLOperand zeroPoint, optional MLOperatorOptions options = {});
    def dequantize_linear(self, x: MLOperand, scale: MLOperand,
                          zero_point: MLOperand) -> MLOperand:
        """(input - zeroPoint) * scale. ``scale`` and ``zeroPoint`` have one shape; padded
        with leading 1s to the input's rank, each of its dimensions divides the input's:
        the quotient is that axis' block size (1 where they are equal, the whole axis where
        the scale's is 1: per-tensor and per-axis are blocks too)."""
        self._own(x, scale, zero_point)
        if x._dtype.name not in QUANTIZED:
            raise TypeError(f"dequantizeLinear input must be one of {', '.join(QUANTIZED)}, "
                            f"got {x._dtype.name}")
        if not scale._dtype.is_float:
            raise TypeError(f"dequantizeLinear scale must be float, got {scale._dtype.name}")
        if zero_point._dtype.name != x._dtype.name:
            raise TypeError(f"zeroPoint must be {x._dtype.name} as the input, got "
                            f"{zero_point._dtype.name}")
        if scale._shape != zero_point._shape:
            raise TypeError(f"scale {list(scale._shape)} and zeroPoint "
                            f"{list(zero_point._shape)} must have one shape")
        if len(scale._shape) > len(x._shape):
            raise TypeError("scale's rank exceeds the input's")
        blocks(x._shape, scale._shape)
        return self._node("dequantize_linear", (x, scale, zero_point), scale._dtype, x._shape)

    # IDL: MLOperand quantizeLinear(MLOperand input, MLOperand scale, MLOperand zeroPoint, optional MLOperatorOptions options = {});
    def quantize_linear(self, x: MLOperand, scale: MLOperand,
                        zero_point: MLOperand) -> MLOperand:
        """clamp(roundEven(input / scale) + zeroPoint) to zeroPoint's type (saturating), the
        scale's blocks as dequantizeLinear's. An int4/uint4 result is one element a device
        word (``dtypes``): read packed by the page, or read by dequantizeLinear."""
        self._own(x, scale, zero_point)
        if not x._dtype.is_float:
            raise TypeError(f"quantizeLinear input must be float, got {x._dtype.name}")
        if scale._dtype != x._dtype:
            raise TypeError(f"quantizeLinear scale must be {x._dtype.name} as the input, got "
                            f"{scale._dtype.name}")
        if zero_point._dtype.name not in QUANTIZED:
            raise TypeError(f"quantizeLinear zeroPoint must be one of {', '.join(QUANTIZED)}, "
                            f"got {zero_point._dtype.name}")
        if scale._shape != zero_point._shape:
            raise TypeError(f"scale {list(scale._shape)} and zeroPoint "
                            f"{list(zero_point._shape)} must have one shape")
        if len(scale._shape) > len(x._shape):
            raise TypeError("scale's rank exceeds the input's")
        blocks(x._shape, scale._shape)
        return self._node("quantize_linear", (x, scale, zero_point), zero_point._dtype,
                          x._shape)

    # -- normalisation and reductions ---------------------------------------------------
    # IDL: MLOperand softmax(MLOperand input, unsigned long axis, optional MLOperatorOptions options = {});
    def softmax(self, x: MLOperand, axis: int) -> MLOperand:
        self._own(x)
        if not x._dtype.is_float:
            raise TypeError("softmax needs a float input")
        return self._node("softmax", (x,), x._dtype, x._shape,
                          axis=S.axis(axis, len(x._shape)))

    # IDL: MLOperand layerNormalization(MLOperand input, optional MLLayerNormalizationOptions options = {});
    def layer_normalization(self, x: MLOperand, *, scale: MLOperand | None = None,
                            bias: MLOperand | None = None, axes: Sequence[int] | None = None,
                            epsilon: float = 1e-5) -> MLOperand:
        """DEVIATION: lowered to reductions and element-wise ops (the spec's emulation)."""
        return composites.layer_normalization(self, x, scale, bias, axes, epsilon)

    # IDL: MLOperand batchNormalization(MLOperand input, MLOperand mean, MLOperand variance, optional MLBatchNormalizationOptions options = {});
    def batch_normalization(self, x: MLOperand, mean: MLOperand, variance: MLOperand, *,
                            scale: MLOperand | None = None, bias: MLOperand | None = None,
                            axis: int = 1, epsilon: float = 1e-5) -> MLOperand:
        """DEVIATION: lowered to element-wise ops (the spec's emulation, any rank and axis)."""
        return composites.batch_normalization(self, x, mean, variance, scale, bias, axis,
                                              epsilon)

    # IDL: MLOperand instanceNormalization(MLOperand input, optional MLInstanceNormalizationOptions options = {});
    def instance_normalization(self, x: MLOperand, *, scale: MLOperand | None = None,
                               bias: MLOperand | None = None, epsilon: float = 1e-5,
                               layout: str = "nchw") -> MLOperand:
        """DEVIATION: lowered to reductions over the spatial axes and element-wise ops (the
        spec's emulation)."""
        return composites.instance_normalization(self, x, scale, bias, epsilon, layout)

    def _reduce(self, op: str, x: MLOperand, axes: Sequence[int] | None,
                keep_dimensions: bool) -> MLOperand:
        self._own(x)
        if op == "reduce_mean" and not x._dtype.is_float:
            raise TypeError("reduce_mean needs a float input")
        axs = S.axes(axes, len(x._shape))
        shp = tuple(1 if i in axs else d for i, d in enumerate(x._shape)
                    if keep_dimensions or i not in axs)
        return self._node(op, (x,), x._dtype, shp, axes=axs)

    # IDL: MLOperand reduceMean(MLOperand input, optional MLReduceOptions options = {});
    def reduce_mean(self, x: MLOperand, axes: Sequence[int] | None = None,
                    keep_dimensions: bool = False) -> MLOperand:
        return self._reduce("reduce_mean", x, axes, keep_dimensions)

    # IDL: MLOperand reduceSum(MLOperand input, optional MLReduceOptions options = {});
    def reduce_sum(self, x: MLOperand, axes: Sequence[int] | None = None,
                   keep_dimensions: bool = False) -> MLOperand:
        return self._reduce("reduce_sum", x, axes, keep_dimensions)

    # IDL: MLOperand reduceProduct(MLOperand input, optional MLReduceOptions options = {});
    def reduce_product(self, x: MLOperand, axes: Sequence[int] | None = None,
                       keep_dimensions: bool = False) -> MLOperand:
        return self._reduce("reduce_product", x, axes, keep_dimensions)

    # IDL: MLOperand reduceSumSquare(MLOperand input, optional MLReduceOptions options = {});
    def reduce_sum_square(self, x: MLOperand, axes: Sequence[int] | None = None,
                          keep_dimensions: bool = False) -> MLOperand:
        """DEVIATION: lowered to reduceSum(x * x), the square computed by the reduction."""
        return composites.reduce_sum_square(self, x, axes, keep_dimensions)

    # IDL: MLOperand reduceL2(MLOperand input, optional MLReduceOptions options = {});
    def reduce_l2(self, x: MLOperand, axes: Sequence[int] | None = None,
                  keep_dimensions: bool = False) -> MLOperand:
        """DEVIATION: lowered to sqrt(reduceSumSquare(x)) (the spec's emulation)."""
        return composites.reduce_l2(self, x, axes, keep_dimensions)

    # IDL: MLOperand reduceLogSumExp(MLOperand input, optional MLReduceOptions options = {});
    def reduce_log_sum_exp(self, x: MLOperand, axes: Sequence[int] | None = None,
                           keep_dimensions: bool = False) -> MLOperand:
        """DEVIATION: lowered to max + log(reduceSum(exp(x - max))), the spec's emulation
        made safe from overflow."""
        return composites.reduce_log_sum_exp(self, x, axes, keep_dimensions)

    def _arg(self, op: str, x: MLOperand, axis: int, keep_dimensions: bool,
             output_data_type: str) -> MLOperand:
        """The spec's "create an argMin/argMax operation" steps: ``axis`` an unsigned long
        below the input's rank (rank 0 has none), the output int32 or int64."""
        self._own(x)
        op_limits.check(op, [x])
        r = len(x._shape)
        if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < r:
            raise TypeError(f"{op}: axis {axis!r} is not in [0, {r})")
        if output_data_type not in op_limits.TABLE[op].output:
            raise TypeError(f"{op}: outputDataType {output_data_type!r} is not int32 or int64")
        dt = self._dtype(output_data_type)
        if x._shape[axis] > np.iinfo(dt.host).max:
            raise TypeError(f"{op}: axis {axis} of {x._shape[axis]} exceeds {dt.name}")
        shp = tuple(1 if i == axis else d for i, d in enumerate(x._shape)
                    if keep_dimensions or i != axis)
        return self._node(op, (x,), dt, shp, axis=axis)

    # IDL: MLOperand argMin(MLOperand input, [EnforceRange] unsigned long axis, optional MLArgMinMaxOptions options = {});
    def arg_min(self, x: MLOperand, axis: int, *, keep_dimensions: bool = False,
                output_data_type: str = "int32") -> MLOperand:
        """The index of the smallest element along ``axis``: a tie gives the first index
        (the spec leaves it to the implementation), a NaN wins (NumPy's argmin)."""
        return self._arg("arg_min", x, axis, keep_dimensions, output_data_type)

    # IDL: MLOperand argMax(MLOperand input, [EnforceRange] unsigned long axis, optional MLArgMinMaxOptions options = {});
    def arg_max(self, x: MLOperand, axis: int, *, keep_dimensions: bool = False,
                output_data_type: str = "int32") -> MLOperand:
        """The index of the largest element along ``axis``: a tie gives the first index,
        a NaN wins (NumPy's argmax)."""
        return self._arg("arg_max", x, axis, keep_dimensions, output_data_type)

    # IDL: MLOperand reduceL1(MLOperand input, optional MLReduceOptions options = {});
    def reduce_l1(self, x: MLOperand, axes: Sequence[int] | None = None,
                  keep_dimensions: bool = False) -> MLOperand:
        """DEVIATION: lowered to reduceSum(abs(x)) (the spec's emulation)."""
        return composites.reduce_l1(self, x, axes, keep_dimensions)

    # IDL: MLOperand reduceLogSum(MLOperand input, optional MLReduceOptions options = {});
    def reduce_log_sum(self, x: MLOperand, axes: Sequence[int] | None = None,
                       keep_dimensions: bool = False) -> MLOperand:
        """DEVIATION: lowered to log(reduceSum(x)) (the spec's emulation)."""
        return composites.reduce_log_sum(self, x, axes, keep_dimensions)

    # IDL: MLOperand reduceMax(MLOperand input, optional MLReduceOptions options = {});
    def reduce_max(self, x: MLOperand, axes: Sequence[int] | None = None,
                   keep_dimensions: bool = False) -> MLOperand:
        return self._reduce("reduce_max", x, axes, keep_dimensions)

    # IDL: MLOperand reduceMin(MLOperand input, optional MLReduceOptions options = {});
    def reduce_min(self, x: MLOperand, axes: Sequence[int] | None = None,
                   keep_dimensions: bool = False) -> MLOperand:
        return self._reduce("reduce_min", x, axes, keep_dimensions)

    # -- data movement ---------------------------------------------------------------
    # IDL: MLOperand reshape(MLOperand input, sequence<[EnforceRange] unsigned long> newShape, optional MLOperatorOptions options = {});
    def reshape(self, x: MLOperand, new_shape: Sequence[int]) -> MLOperand:
        self._own(x)
        shp = S.check_shape(new_shape)
        if S.size(shp) != S.size(x._shape):
            raise TypeError(f"cannot reshape {list(x._shape)} to {list(shp)}")
        return self._node("reshape", (x,), x._dtype, shp)

    # IDL: MLOperand transpose(MLOperand input, optional MLTransposeOptions options = {});
    def transpose(self, x: MLOperand, permutation: Sequence[int] | None = None) -> MLOperand:
        self._own(x)
        r = len(x._shape)
        perm = tuple(range(r - 1, -1, -1)) if permutation is None else tuple(permutation)
        if sorted(perm) != list(range(r)):
            raise TypeError(f"invalid permutation {list(perm)} for rank {r}")
        return self._node("transpose", (x,), x._dtype, tuple(x._shape[p] for p in perm),
                          permutation=perm)

    # IDL: MLOperand concat(sequence<MLOperand> inputs, [EnforceRange] unsigned long axis, optional MLOperatorOptions options = {});
    def concat(self, inputs: Sequence[MLOperand], axis: int) -> MLOperand:
        if not inputs:
            raise TypeError("concat needs at least one input")
        self._own(*inputs)
        dt = self._same_type(*inputs)
        r = len(inputs[0]._shape)
        ax = S.axis(axis, r)
        for o in inputs:
            if len(o._shape) != r or any(o._shape[i] != inputs[0]._shape[i]
                                         for i in range(r) if i != ax):
                raise TypeError("concat inputs differ outside the axis")
        shp = list(inputs[0]._shape)
        shp[ax] = sum(o._shape[ax] for o in inputs)
        return self._node("concat", tuple(inputs), dt, tuple(shp), axis=ax)

    # IDL: MLOperand slice(MLOperand input, sequence<[EnforceRange] unsigned long> starts, sequence<[EnforceRange] unsigned long> sizes, optional MLSliceOptions options = {});
    def slice(self, x: MLOperand, starts: Sequence[int], sizes: Sequence[int],
              strides: Sequence[int] | None = None) -> MLOperand:
        """``sizes`` is the window read on each axis; with ``strides`` the output has
        ``ceil(sizes / strides)`` elements there (``shapes.slice_shape``)."""
        self._own(x)
        shp = S.slice_shape(x._shape, starts, sizes, strides)
        sd = tuple(int(s) for s in strides) if strides is not None else (1,) * len(shp)
        return self._node("slice", (x,), x._dtype, shp, starts=tuple(int(s) for s in starts),
                          strides=sd)

    # IDL: MLOperand gather(MLOperand input, MLOperand indices, optional MLGatherOptions options = {});
    def gather(self, x: MLOperand, indices: MLOperand, axis: int = 0) -> MLOperand:
        self._own(x, indices)
        if indices._dtype.name not in ("int32", "int64", "uint32"):
            raise TypeError("gather indices must be int32, int64 or uint32")
        ax = S.axis(axis, len(x._shape))
        shp = x._shape[:ax] + indices._shape + x._shape[ax + 1:]
        return self._node("gather", (x, indices), x._dtype, shp, axis=ax)

    # IDL: MLOperand gatherElements(MLOperand input, MLOperand indices, optional MLGatherOptions options = {});
    def gather_elements(self, x: MLOperand, indices: MLOperand, axis: int = 0) -> MLOperand:
        """out[c] = input[c with c[axis] = indices[c]]: ``indices`` of the input's rank and
        its shape outside ``axis`` (an unsigned long). Indices as ``gather``'s: negative ones
        count from the end, out-of-range ones are clamped."""
        self._own(x, indices)
        if indices._dtype.name not in ("int32", "int64", "uint32"):
            raise TypeError("gatherElements indices must be int32, int64 or uint32")
        r = len(x._shape)
        ax = _unsigned_axis("gatherElements", axis, r)
        if len(indices._shape) != r or any(d != x._shape[i] for i, d in enumerate(indices._shape)
                                           if i != ax):
            raise TypeError(f"gatherElements indices {list(indices._shape)} must be the input's "
                            f"{list(x._shape)} outside axis {ax}")
        return self._node("gather_elements", (x, indices), x._dtype, indices._shape, axis=ax)

    # IDL: MLOperand gatherND(MLOperand input, MLOperand indices, optional MLOperatorOptions options = {});
    def gather_nd(self, x: MLOperand, indices: MLOperand) -> MLOperand:
        """The slices of ``input`` at the index tuples along ``indices``' last axis (k of the
        input's leading axes): shape indices[:-1] + input[k:]. Negative indices count from
        the end, out-of-range ones are clamped (as ``gather``)."""
        self._own(x, indices)
        if indices._dtype.name not in ("int32", "int64", "uint32"):
            raise TypeError("gatherND indices must be int32, int64 or uint32")
        if not x._shape or not indices._shape:
            raise TypeError("gatherND input and indices need a rank of at least 1")
        k = indices._shape[-1]
        if k > len(x._shape):
            raise TypeError(f"gatherND index tuples of {k} exceed the input's rank "
                            f"{len(x._shape)}")
        return self._node("gather_nd", (x, indices), x._dtype,
                          indices._shape[:-1] + x._shape[k:])

    # IDL: MLOperand reverse(MLOperand input, optional MLReverseOptions options = {});
    def reverse(self, x: MLOperand, axes: Sequence[int] | None = None) -> MLOperand:
        """The input with the order along ``axes`` (unsigned, distinct; default all) reversed;
        ``axes=[]`` copies it."""
        self._own(x)
        r = len(x._shape)
        axs = tuple(range(r)) if axes is None else tuple(
            _unsigned_axis("reverse", a, r) for a in axes)
        if len(set(axs)) != len(axs):
            raise TypeError(f"reverse: duplicate axes {list(axs)}")
        return self._node("reverse", (x,), x._dtype, x._shape, axes=tuple(sorted(axs)))

    # IDL: MLOperand expand(MLOperand input, sequence<[EnforceRange] unsigned long> newShape, optional MLOperatorOptions options = {});
    def expand(self, x: MLOperand, new_shape: Sequence[int]) -> MLOperand:
        self._own(x)
        shp = S.check_shape(new_shape)
        if not S.unidirectional(x._shape, shp):
            raise TypeError(f"cannot expand {list(x._shape)} to {list(shp)}")
        return self._node("expand", (x,), x._dtype, shp)

    # IDL: MLOperand scatterND(MLOperand input, MLOperand indices, MLOperand updates, optional MLOperatorOptions options = {});
    def scatter_nd(self, x: MLOperand, indices: MLOperand, updates: MLOperand) -> MLOperand:
        self._own(x, indices, updates)
        if indices._dtype.name not in ("int32", "int64", "uint32"):
            raise TypeError("scatter_nd indices must be int32, int64 or uint32")
        self._same_type(x, updates)
        k = indices._shape[-1]
        if k > len(x._shape):
            raise TypeError("scatter_nd index tuples longer than the input's rank")
        want = indices._shape[:-1] + x._shape[k:]
        if tuple(updates._shape) != want:
            raise TypeError(f"scatter_nd updates must have shape {list(want)}")
        return self._node("scatter_nd", (x, indices, updates), x._dtype, x._shape)

    # IDL: MLOperand scatterElements(MLOperand input, MLOperand indices, MLOperand updates, optional MLScatterOptions options = {});
    def scatter_elements(self, x: MLOperand, indices: MLOperand, updates: MLOperand,
                         axis: int = 0) -> MLOperand:
        self._own(x, indices, updates)
        if indices._dtype.name not in ("int32", "int64", "uint32"):
            raise TypeError("scatter_elements indices must be int32, int64 or uint32")
        self._same_type(x, updates)
        ax = S.axis(axis, len(x._shape))
        if indices._shape != updates._shape or len(indices._shape) != len(x._shape):
            raise TypeError("scatter_elements indices and updates must have one shape, of the "
                            "input's rank")
        if any(d > x._shape[i] for i, d in enumerate(indices._shape) if i != ax):
            raise TypeError("scatter_elements indices exceed the input outside the axis")
        return self._node("scatter_elements", (x, indices, updates), x._dtype, x._shape,
                          axis=ax)

    # IDL: MLOperand cumulativeSum(MLOperand input, unsigned long axis, optional MLCumulativeSumOptions options = {});
    def cumulative_sum(self, x: MLOperand, axis: int, *, exclusive: bool = False,
                       reversed: bool = False) -> MLOperand:
        self._own(x)
        if x._dtype.wgsl not in ("f32", "f16", "i32", "u32") or x._dtype.name == "uint8":
            raise TypeError(f"cumulative_sum does not take {x._dtype.name}")
        return self._node("cumulative_sum", (x,), x._dtype, x._shape,
                          axis=S.axis(axis, len(x._shape)), exclusive=bool(exclusive),
                          reversed=bool(reversed))

    # -- ops lowered to others at build time (composites.py: the spec's own decompositions) --
    # IDL: MLOperand triangular(MLOperand input, optional MLTriangularOptions options = {});
    def triangular(self, x: MLOperand, *, upper: bool = True, diagonal: int = 0) -> MLOperand:
        """DEVIATION: lowered to ``where`` with a constant mask."""
        return composites.triangular(self, x, upper, diagonal)

    # IDL: MLOperand tile(MLOperand input, sequence<unsigned long> repetitions, optional MLOperatorOptions options = {});
    def tile(self, x: MLOperand, repetitions: Sequence[int]) -> MLOperand:
        """DEVIATION: lowered to reshape/expand/reshape."""
        return composites.tile(self, x, repetitions)

    # IDL: MLOperand pad(MLOperand input, sequence<[EnforceRange] unsigned long> beginningPadding, sequence<[EnforceRange] unsigned long> endingPadding, optional MLPadOptions options = {});
    def pad(self, x: MLOperand, beginning_padding: Sequence[int], ending_padding: Sequence[int],
            *, mode: str = "constant", value: float = 0) -> MLOperand:
        """DEVIATION: "constant" lowered to concat with constant blocks; "edge" and
        "reflection" are one kernel each."""
        return composites.pad(self, x, beginning_padding, ending_padding, mode, value)

    # IDL: sequence<MLOperand> split(MLOperand input, (unsigned long or sequence<unsigned long>) splits, optional MLSplitOptions options = {});
    def split(self, x: MLOperand, splits: int | Sequence[int], axis: int = 0) -> list[MLOperand]:
        """Lowered to slices."""
        return composites.split(self, x, splits, axis)

    # IDL: MLOperand conv2d(MLOperand input, MLOperand filter, optional MLConv2dOptions options = {});
    def conv2d(self, x: MLOperand, filter: MLOperand, *,
               padding: Sequence[int] = (0, 0, 0, 0), strides: Sequence[int] = (1, 1),
               dilations: Sequence[int] = (1, 1), groups: int = 1,
               bias: MLOperand | None = None) -> MLOperand:
        """DEVIATION: depthwise only (``groups`` = input channels = output channels, layouts
        "nchw" and "oihw"), lowered to pad, strided slices, mul and add per filter tap."""
        return composites.conv2d(self, x, filter, padding, strides, dilations, groups, bias)

    #: the most a window extent, dilation or padding may be here: the kernel's window
    #: arithmetic is in 32-bit integers (the spec lets an implementation bound dimensions)
    _POOL_MAX = 1 << 30

    def _pool(self, op: str, x: MLOperand, window_dimensions: Sequence[int] | None,
              padding: Sequence[int] | None, strides: Sequence[int] | None,
              dilations: Sequence[int] | None, layout: str, output_shape_rounding: str,
              output_sizes: Sequence[int] | None, rounding_type: str | None) -> MLOperand:
        """The spec's "create a pooling operation" steps: a 4-D input, the options checked
        (TypeError), the output shape computed. Two steps are not followed, as WPT's
        validation tests and browsers do not: padding is kept where outputSizes is given
        (the spec resets it to zeros), and outputSizes may be >= strides (the spec's
        "not smaller than strides" check would reject WPT's own valid cases)."""
        self._own(x)
        op_limits.check(op, [x])
        if layout not in ("nchw", "nhwc"):
            raise TypeError(f"{op}: layout {layout!r} is not 'nchw' or 'nhwc'")
        if rounding_type is not None:  # the member's name before outputShapeRounding
            output_shape_rounding = rounding_type
        if output_shape_rounding not in ("floor", "ceil"):
            raise TypeError(f"{op}: outputShapeRounding {output_shape_rounding!r} is not "
                            "'floor' or 'ceil'")
        nb, h, w, c = x._shape if layout == "nhwc" else (x._shape[0], *x._shape[2:],
                                                          x._shape[1])
        win = S.ulongs("windowDimensions", (h, w) if window_dimensions is None
                       else window_dimensions, 2)
        pad = S.ulongs("padding", (0, 0, 0, 0) if padding is None else padding, 4)
        st = S.ulongs("strides", (1, 1) if strides is None else strides, 2)
        dil = S.ulongs("dilations", (1, 1) if dilations is None else dilations, 2)
        sizes = None if output_sizes is None else S.ulongs("outputSizes", output_sizes, 2)
        for what, v in (("windowDimensions", win), ("strides", st), ("dilations", dil)):
            if 0 in v:
                raise TypeError(f"{op}: {what} {list(v)} has a 0")
        if max(*pad, (win[0] - 1) * dil[0], (win[1] - 1) * dil[1]) > self._POOL_MAX:
            raise TypeError(f"{op}: windows or padding beyond {self._POOL_MAX} are not "
                            "supported by this implementation")
        oh, ow = S.pool2d((h, w), win, pad, st, dil, output_shape_rounding, sizes)
        shp = (nb, oh, ow, c) if layout == "nhwc" else (nb, c, oh, ow)
        if S.size(shp) * x._dtype.itemsize > self._context._max_tensor_bytes():
            raise TypeError(f"{op}: an output of {list(shp)} exceeds the context's "
                            "maxTensorByteLength")
        return self._node(op, (x,), x._dtype, shp, layout=layout, window=win, padding=pad,
                          strides=st, dilations=dil)

    # IDL: MLOperand averagePool2d(MLOperand input, optional MLPool2dOptions options = {});
    def average_pool2d(self, x: MLOperand, *, window_dimensions: Sequence[int] | None = None,
                       padding: Sequence[int] | None = None,
                       strides: Sequence[int] | None = None,
                       dilations: Sequence[int] | None = None, layout: str = "nchw",
                       output_shape_rounding: str = "floor",
                       output_sizes: Sequence[int] | None = None,
                       rounding_type: str | None = None) -> MLOperand:
        """The mean of each window's elements inside the input: padding is not counted in
        the divisor (WPT's expected values). ``rounding_type``: outputShapeRounding's
        former name, which WPT's older files use."""
        return self._pool("average_pool2d", x, window_dimensions, padding, strides, dilations,
                          layout, output_shape_rounding, output_sizes, rounding_type)

    # IDL: MLOperand l2Pool2d(MLOperand input, optional MLPool2dOptions options = {});
    def l2_pool2d(self, x: MLOperand, *, window_dimensions: Sequence[int] | None = None,
                  padding: Sequence[int] | None = None, strides: Sequence[int] | None = None,
                  dilations: Sequence[int] | None = None, layout: str = "nchw",
                  output_shape_rounding: str = "floor",
                  output_sizes: Sequence[int] | None = None,
                  rounding_type: str | None = None) -> MLOperand:
        """The L2 norm (square root of the sum of squares) of each window's elements."""
        return self._pool("l2_pool2d", x, window_dimensions, padding, strides, dilations,
                          layout, output_shape_rounding, output_sizes, rounding_type)

    # IDL: MLOperand maxPool2d(MLOperand input, optional MLPool2dOptions options = {});
    def max_pool2d(self, x: MLOperand, *, window_dimensions: Sequence[int] | None = None,
                   padding: Sequence[int] | None = None, strides: Sequence[int] | None = None,
                   dilations: Sequence[int] | None = None, layout: str = "nchw",
                   output_shape_rounding: str = "floor",
                   output_sizes: Sequence[int] | None = None,
                   rounding_type: str | None = None) -> MLOperand:
        """The largest of each window's elements (NaN where one is, as ``Math.max``)."""
        return self._pool("max_pool2d", x, window_dimensions, padding, strides, dilations,
                          layout, output_shape_rounding, output_sizes, rounding_type)
    # IDL: MLOperand convTranspose2d(MLOperand input, MLOperand filter, optional MLConvTranspose2dOptions options = {});
    def conv_transpose2d(self, x: MLOperand, filter: MLOperand, *,
                         padding: Sequence[int] = (0, 0, 0, 0), strides: Sequence[int] = (1, 1),
                         dilations: Sequence[int] = (1, 1),
                         output_padding: Sequence[int] = (0, 0),
                         output_sizes: Sequence[int] | None = None, groups: int = 1,
                         input_layout: str = "nchw", filter_layout: str = "iohw",
                         bias: MLOperand | None = None) -> MLOperand:
        """One kernel: each output element gathers the input taps that land on it
        (``kernels.upsample.conv_transpose2d``), any layout read in place; float16 computed
        in float32, rounded once."""
        ops = (x, filter) if bias is None else (x, filter, bias)
        self._own(*ops)
        op_limits.check("conv_transpose2d", ops)
        dt = self._same_type(*ops)
        shp, fsize, osize = S.conv_transpose2d(
            x._shape, filter._shape, padding, strides, dilations, output_padding,
            output_sizes, groups, input_layout, filter_layout)
        oc = fsize[1] * int(groups)
        if bias is not None and bias._shape != (oc,):
            raise TypeError(f"convTranspose2d bias must have shape [{oc}], got "
                            f"{list(bias._shape)}")
        return self._node("conv_transpose2d", ops, dt, shp,
                          padding=S.ulongs("padding", padding, 4),
                          strides=S.ulongs("strides", strides, 2),
                          dilations=S.ulongs("dilations", dilations, 2), groups=int(groups),
                          input_layout=input_layout, filter_layout=filter_layout)

    # IDL: MLOperand resample2d(MLOperand input, optional MLResample2dOptions options = {});
    def resample2d(self, x: MLOperand, *, mode: str = "nearest-neighbor",
                   scales: Sequence[float] | None = None, sizes: Sequence[int] | None = None,
                   axes: Sequence[int] | None = None) -> MLOperand:
        """One kernel, an invocation per output element, on the spec's half-pixel
        coordinates (``kernels.upsample.resample2d``; nearest's indices in exact integer
        arithmetic, so its ties go to the smaller index as WPT pins)."""
        self._own(x)
        if mode not in ("nearest-neighbor", "linear"):
            raise TypeError(f"resample2d mode {mode!r} is not nearest-neighbor or linear")
        op_limits.check("resample2d", [x])
        shp, ax = S.resample2d(x._shape, scales, sizes, axes)
        return self._node("resample2d", (x,), x._dtype, shp, mode=mode, axes=ax)

    # -- build ---------------------------------------------------------------------------
    # IDL: Promise<MLGraph> build(MLNamedOperands outputs, optional MLBuildOptions options = {});
    def build(self, outputs: Mapping[str, MLOperand], *, use_stateful: bool = False,
              kv_cache_pairs: Sequence[MLKVCachePair] = ()) -> MLGraph:
        """Validate the outputs and the KV pairs, then let the context compile.

        PROPOSAL: ``use_stateful`` and ``kv_cache_pairs`` are ``MLBuildOptions`` members.
        Pairs are validated the same way whether or not the backend grants state, so a
        page sees the same errors everywhere.
        """
        self._context._check_alive()
        if not isinstance(outputs, Mapping) or not outputs:
            raise TypeError("build needs a non-empty record of named outputs")
        for name, op in outputs.items():
            if not isinstance(name, str) or not name:
                raise TypeError("output names must be non-empty strings")
            self._own(op)
            if op._kind != "op":
                raise TypeError(f"output {name!r} is an input or constant operand")
        pairs = [p if isinstance(p, MLKVCachePair) else MLKVCachePair(**p)
                 for p in kv_cache_pairs]
        if pairs and not use_stateful:
            # PROPOSAL decision: pairs mean nothing without the request; ignoring them
            # would let a page believe it has state.
            raise TypeError("kv_cache_pairs given without use_stateful=True")
        inputs = _graph_inputs(outputs.values())
        seen_in: set[str] = set()
        seen_out: set[str] = set()
        for p in pairs:
            if p.input not in inputs:
                raise TypeError(f"KV pair names unknown graph input {p.input!r}")
            if p.output not in outputs:
                raise TypeError(f"KV pair names unknown graph output {p.output!r}")
            if p.input in seen_in:
                raise TypeError(f"graph input {p.input!r} is in two KV pairs")
            if p.output in seen_out:
                raise TypeError(f"graph output {p.output!r} is in two KV pairs")
            seen_in.add(p.input)
            seen_out.add(p.output)
            i, o = inputs[p.input], outputs[p.output]
            if i._dtype != o._dtype or i._shape != o._shape:
                raise TypeError(
                    f"KV pair {p.input!r} -> {p.output!r}: descriptors differ "
                    f"({i.data_type}{list(i._shape)} vs {o.data_type}{list(o._shape)})")
        return self._context._build(_frozen(outputs, inputs, pairs), bool(use_stateful))


def _unsigned_axis(op: str, axis: int, rank: int) -> int:
    """An IDL unsigned long axis below ``rank`` (TypeError otherwise: no negative axes)."""
    if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < rank:
        raise TypeError(f"{op}: axis {axis!r} is not in [0, {rank})")
    return axis


def blocks(shape: Sequence[int], scale_shape: Sequence[int]) -> tuple[int, ...]:
    """dequantizeLinear's block size per axis of ``shape`` (TypeError where a scale
    dimension does not divide the input's)."""
    pad = (1,) * (len(shape) - len(scale_shape)) + tuple(scale_shape)
    if any(d % s for d, s in zip(shape, pad, strict=True)):
        raise TypeError(f"scale shape {list(scale_shape)} does not divide the input shape "
                        f"{list(shape)} into blocks")
    return tuple(d // s for d, s in zip(shape, pad, strict=True))


def _frozen(outputs: Mapping[str, MLOperand], inputs: dict[str, MLOperand],
            pairs: list[MLKVCachePair]) -> ir.Graph:
    """The graph as the context compiles it (``ir``): one frozen node an operand the
    outputs reach, made in creation order (an operand's inputs are older), sharing the
    constants' arrays."""
    seen: dict[int, MLOperand] = {}
    stack = list(outputs.values())
    while stack:
        o = stack.pop()
        if o._id not in seen:
            seen[o._id] = o
            stack.extend(o._inputs)
    nodes: dict[int, ir.Node] = {}
    for i in sorted(seen):
        o = seen[i]
        nodes[i] = ir.node(i, o._kind, o._dtype, o._shape, o._op,
                           tuple(nodes[x._id] for x in o._inputs), o._attrs, o._name, o._value)
    return ir.Graph(MappingProxyType({n: nodes[o._id] for n, o in outputs.items()}),
                    MappingProxyType({n: nodes[o._id] for n, o in inputs.items()}),
                    tuple(pairs), tuple(nodes.values()))


def _graph_inputs(outputs: Any) -> dict[str, MLOperand]:
    """The input operands the outputs depend on (the graph's input interface)."""
    found: dict[str, MLOperand] = {}
    seen: set[int] = set()
    stack = list(outputs)
    while stack:
        o = stack.pop()
        if o._id in seen:
            continue
        seen.add(o._id)
        if o._kind == "input":
            found[o._name] = o
        stack.extend(o._inputs)
    return found


class MLTensor:
    """A device buffer with a descriptor (IDL: ``MLTensor``)."""

    def __init__(self, context: MLContext, dt: DType, shape: tuple[int, ...],
                 readable: bool, writable: bool) -> None:
        self._context = context
        self._dtype = dt
        self._shape = shape
        self._readable = readable
        self._writable = writable
        self._destroyed = False
        self._serial = next(_serial)

    # IDL: readonly attribute MLOperandDataType dataType;
    @property
    def data_type(self) -> str:
        return self._dtype.name

    # IDL: readonly attribute FrozenArray<unsigned long> shape;
    @property
    def shape(self) -> list[int]:
        return list(self._shape)

    # IDL: readonly attribute boolean readable;
    @property
    def readable(self) -> bool:
        return self._readable

    # IDL: readonly attribute boolean writable;
    @property
    def writable(self) -> bool:
        return self._writable

    # IDL: undefined destroy();
    def destroy(self) -> None:
        self._destroyed = True

    def __repr__(self) -> str:
        return f"<MLTensor {self._dtype.name}{list(self._shape)}>"


class MLGraph:
    """A compiled graph (IDL: ``MLGraph``)."""

    def __init__(self, context: MLContext) -> None:
        self._context = context
        self._destroyed = False
        self._is_stateful = False
        # statebench extension: the interface the page binds (pairs removed when stateful)
        self.inputs: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.outputs: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.in_place: dict[str, bool] = {}
        self.pairs: list[MLKVCachePair] = []
        #: the last two bindings ``dispatch`` checked, (inputs, outputs) as item tuples: a
        #: page that binds the same tensors every step, or ping-pongs two sets (its caches,
        #: a chained decode's ids), is checked once per set (each still not destroyed)
        self._checked: tuple[tuple[tuple, tuple], ...] = ()

    # IDL: readonly attribute boolean isStateful;  (PROPOSAL)
    @property
    def is_stateful(self) -> bool:
        return self._is_stateful

    # IDL: undefined destroy();
    def destroy(self) -> None:
        self._destroyed = True


class MLContext:
    """Validation of the spec's rules; the device work is in a subclass."""

    def __init__(self) -> None:
        self._destroyed = False
        self.counters = ByteCounters()

    def _check_alive(self) -> None:
        if self._destroyed:
            raise InvalidStateError("the MLContext is destroyed")

    def _check_tensor(self, t: Any, what: str) -> MLTensor:
        if not isinstance(t, MLTensor):
            raise TypeError(f"{what} is not an MLTensor")
        if t._context is not self:
            raise TypeError(f"{what} belongs to another MLContext")
        if t._destroyed:
            raise TypeError(f"{what} is destroyed")
        return t

    # IDL: MLOpSupportLimits opSupportLimits();
    def op_support_limits(self) -> dict:
        """The spec's ``MLOpSupportLimits`` with snake_case members: what the builder checks
        (``op_limits.TABLE``), for the data types this context has."""
        self._check_alive()
        have = frozenset(n for n, dt in DTYPES.items() if not self._unsupported(dt))
        return op_limits.support_limits(have, self._max_tensor_bytes())

    # IDL: Promise<MLTensor> createTensor(MLTensorDescriptor descriptor);
    def create_tensor(self, *, data_type: str, shape: Sequence[int], readable: bool = False,
                      writable: bool = False) -> MLTensor:
        self._check_alive()
        dt = dtype(data_type)  # int4/uint4: the page's buffers are packed (``dtypes``)
        why = self._unsupported(dt)
        if why:
            raise TypeError(why)
        shp = S.check_shape(shape)
        if S.size(shp) * dt.itemsize > self._max_tensor_bytes():
            raise TypeError(f"a {dt.name}{list(shp)} tensor exceeds this context's "
                            f"maxTensorByteLength of {self._max_tensor_bytes()} bytes")
        return self._create_tensor(dt, shp, bool(readable), bool(writable))

    # IDL: undefined writeTensor(MLTensor tensor, AllowSharedBufferSource sourceData);
    def write_tensor(self, tensor: MLTensor, data: Any) -> None:
        self._check_alive()
        self._check_tensor(tensor, "tensor")
        if not tensor._writable:
            raise TypeError("write_tensor needs a tensor created with writable=True")
        self._write_tensor(tensor, to_device(data, tensor._dtype, S.size(tensor._shape)))

    # IDL: Promise<ArrayBuffer> readTensor(MLTensor tensor);
    def read_tensor(self, tensor: MLTensor) -> np.ndarray:
        return self.read_tensors([tensor])[0]

    def read_tensors(self, tensors: Sequence[MLTensor],
                     outputs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """statebench extension: what a page gets from
        ``Promise.all(tensors.map(t => context.readTensor(t)))``. The reads are concurrent
        there, so an implementation may serve them with one device round trip; a
        synchronous ``read_tensor`` per tensor could not. ``outputs``: the page's own arrays
        to read into (IDL ``readTensor(tensor, outputData)``: no allocation per read), one
        per tensor, of its element type and size; they are returned."""
        self._check_alive()
        for t in tensors:
            self._check_tensor(t, "tensor")
            if not t._readable:
                raise TypeError("reading a tensor needs it created with readable=True")
        if outputs is not None:
            if len(outputs) != len(tensors):
                raise TypeError(f"{len(outputs)} output arrays for {len(tensors)} tensors")
            for t, a in zip(tensors, outputs, strict=True):
                size = (packed_bytes(t._dtype, S.size(t._shape)) if t._dtype.packed
                        else S.size(t._shape))  # int4/uint4: the spec's packed buffer
                if (not isinstance(a, np.ndarray) or a.dtype != t._dtype.host
                        or a.size != size or not a.flags.c_contiguous
                        or not a.flags.writeable):
                    raise TypeError(f"outputData must be a writable contiguous {t.data_type} "
                                    f"array of {size} elements")
        return self._read_tensors(list(tensors), None if outputs is None else list(outputs))

    # IDL: undefined dispatch(MLGraph graph, MLNamedTensors inputs, MLNamedTensors outputs, optional MLOperatorOptions options = {});
    def dispatch(self, graph: MLGraph, inputs: Mapping[str, MLTensor],
                 outputs: Mapping[str, MLTensor]) -> None:
        self._check_alive()
        if not isinstance(graph, MLGraph) or graph._context is not self:
            raise TypeError("graph belongs to another MLContext")
        if graph._destroyed:
            raise InvalidStateError("the MLGraph is destroyed")
        binding = (tuple(inputs.items()), tuple(outputs.items()))
        if binding in graph._checked and not any(
                t._destroyed for items in binding for _, t in items):
            self._dispatch(graph, dict(inputs), dict(outputs))  # checked at an earlier step
            return
        for what, bound, want in (("input", inputs, graph.inputs),
                                  ("output", outputs, graph.outputs)):
            if set(bound) != set(want):
                hidden = set(bound) & {p.input if what == "input" else p.output
                                       for p in graph.pairs} if graph.is_stateful else set()
                if hidden:
                    # PROPOSAL behaviour 2: paired names leave the interface.
                    raise TypeError(f"{what}s {sorted(hidden)} are KV-cache pairs of a "
                                    "stateful graph and cannot be bound")
                raise TypeError(f"graph {what}s are {sorted(want)}, bound {sorted(bound)}")
            for name, t in bound.items():
                self._check_tensor(t, f"{what} {name!r}")
                dt, shp = want[name]
                if t._dtype.name != dt or t._shape != shp:
                    raise TypeError(f"{what} {name!r}: tensor is {t.data_type}"
                                    f"{list(t._shape)}, graph wants {dt}{list(shp)}")
        tensors = list(inputs.values()) + list(outputs.values())
        if len({id(t) for t in tensors}) != len(tensors):
            raise TypeError("the same MLTensor is bound more than once")
        graph._checked = (binding, *[c for c in graph._checked if c != binding][:1])
        self._dispatch(graph, dict(inputs), dict(outputs))

    # IDL: undefined resetKVCache(MLGraph graph);  (PROPOSAL)
    def reset_kv_cache(self, graph: MLGraph) -> None:
        """Zero the graph's hidden state.

        PROPOSAL decisions: a graph of another context is a TypeError (as in dispatch); a
        destroyed graph or one that is not stateful (never asked, or not granted) is an
        InvalidStateError, since it has no state to reset.
        """
        self._check_alive()
        if not isinstance(graph, MLGraph) or graph._context is not self:
            raise TypeError("graph belongs to another MLContext")
        if graph._destroyed:
            raise InvalidStateError("the MLGraph is destroyed")
        if not graph.is_stateful:
            raise InvalidStateError("reset_kv_cache on a graph that is not stateful")
        self._reset(graph)

    # IDL: undefined destroy();
    def destroy(self) -> None:
        self._destroyed = True

    # -- implemented by the backend ----------------------------------------------------
    def _unsupported(self, dt: DType) -> str:
        """Why this context cannot hold tensors of ``dt`` ("" if it can)."""
        return ""

    def _max_tensor_bytes(self) -> int:
        """The most bytes one tensor may hold (``opSupportLimits().maxTensorByteLength``)."""
        return 1 << 31

    def _widens(self, op: str) -> bool:
        """Whether this context runs ``op`` on float16 operands in float32 between casts
        (``MLGraphBuilder._widened``) rather than in float16 kernels of its own."""
        return False

    def _create_tensor(self, dt: DType, shape: tuple[int, ...], readable: bool,
                       writable: bool) -> MLTensor:
        raise NotImplementedError

    def _write_tensor(self, tensor: MLTensor, data: np.ndarray) -> None:
        raise NotImplementedError

    def _read_tensors(self, tensors: list[MLTensor],
                      outputs: list[np.ndarray] | None = None) -> list[np.ndarray]:
        raise NotImplementedError

    def _dispatch(self, graph: MLGraph, inputs: dict[str, MLTensor],
                  outputs: dict[str, MLTensor]) -> None:
        raise NotImplementedError

    def _reset(self, graph: MLGraph) -> None:
        raise NotImplementedError

    def _build(self, graph: ir.Graph, use_stateful: bool) -> MLGraph:
        """Compile ``graph`` (``ir``: public and frozen, the backend reads no operand)."""
        raise NotImplementedError

