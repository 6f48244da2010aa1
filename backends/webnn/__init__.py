"""WebNN (webmachinelearning/webnn ``index.bs``) in Python, on wgpu-py, with the
stateful-graph proposal (webnn issue 966; DESIGN §2, §3).

    from backends.webnn import ml, MLGraphBuilder, MLKVCachePair
    context = ml.create_context()            # state_support=False: no state; timing=True;
                                             # options=KernelOptions(...): kernel variants
    builder = MLGraphBuilder(context)
    ...
    graph = builder.build({"y": y}, use_stateful=True,
                          kv_cache_pairs=[MLKVCachePair(input="past", output="present")])
    graph.is_stateful; graph.in_place        # {pair input name: in place or two buffers}
    context.dispatch(graph, {"x": t}, {"y": out}); context.read_tensor(out)
    context.reset_kv_cache(graph)

Ops: input, constant, add, sub, mul, div, pow, max, min, equal, greater, greater_or_equal,
lesser, lesser_or_equal, logical_not, logical_and, logical_or, logical_xor, is_nan,
is_infinite, sqrt, exp, log, neg, abs, sign, sigmoid, softplus, tanh, tan, relu, reciprocal,
cos, sin, floor, ceil, round_even, erf, gelu, identity, where, cast, matmul, gemm, softmax,
reduce_mean, reduce_sum, reduce_max, reduce_min, arg_min, arg_max, cumulative_sum, reshape,
transpose, concat, slice, split, gather, gather_elements, gather_nd, reverse, expand, tile,
pad, triangular, scatter_nd, scatter_elements, conv2d, conv_transpose2d, resample2d,
average_pool2d, l2_pool2d, max_pool2d, dequantize_linear, quantize_linear; lowered at build
(``composites.py``): clamp, leaky_relu, elu, hard_sigmoid, hard_swish, softsign, linear,
prelu, layer_normalization, batch_normalization, instance_normalization, reduce_l1,
reduce_l2, reduce_log_sum, reduce_log_sum_exp, reduce_sum_square.

Data types: float32, float16 (where the adapter has 'shader-f16'), int32, int64, uint32,
int8, uint8, int4, uint4.

Deviations (each marked DEVIATION in the code):
- int64 is stored as int32 on the device; values outside int32 raise DataError on write.
- uint8 (comparison results, where's condition) is stored as uint32 on the device.
- MLGraphBuilder.build may be called more than once.
- build is synchronous (the spec's Promise); so are create_tensor and read_tensor.
- gemm is lowered to transpose/matmul/mul/add; triangular (where with a constant mask),
  tile (reshape/expand), pad (concat of constant blocks; "constant" mode only), split
  (slices) and conv2d (depthwise only: pad, a strided slice times the weight per filter
  tap, summed) are lowered at build time too (``composites.py``).
- arg_min / arg_max give the first of tied indices (the spec leaves ties to the
  implementation) and a NaN wins (NumPy's argmin/argmax); the spec's element-wise
  emulations (elu, hard_sigmoid, hard_swish, softsign, linear, prelu, batch_normalization,
  instance_normalization) run in float32 for float16 operands, rounded once.
- average_pool2d / l2_pool2d / max_pool2d skip window taps in the padding (the average's
  divisor counts the taps inside the input, as WPT expects); padding is kept where
  output_sizes is given and output_sizes may be >= strides, as WPT's validation tests have
  it (the spec's steps say otherwise); an all-padding window gives 0.
- int4/uint4: constants are kept packed; any other int4/uint4 operand is one element a
  32-bit word on the device, packed only at the host boundary (write_tensor takes and
  read_tensor returns the spec's packed buffer). Only quantize_linear (zeroPoint, output) and
  dequantize_linear (input, zeroPoint) take them, besides graph inputs and outputs.
- Out-of-range gather, gather_elements and gather_nd indices are clamped; out-of-range scatter_nd tuples and
  scatter_elements indices are skipped (implementation-defined in the spec); negative ones
  count from the end.
- statebench extensions: MLGraph.inputs/outputs (the bound interface), MLGraph.in_place,
  MLGraph.device_bytes, MLGraph.launches (the wgpu graph's launches a dispatch),
  MLContext.counters (bytes moved, ByteCounters with snapshot() and
  reset()), MLContext.gpu_time_ns / gpu_time_reason, and create_context(options=...): the
  wgpu implementation's kernel variants and modes (``wgpu_impl.options.KernelOptions``),
  kept by the context as MLContext.options; create_context(engine=...): the WebGPU engine
  ("wgpu": wgpu-native, "dawn": Dawn; docs/dawn.md), and MLContext.engine_info (the engine,
  its version, its native API, the features it lacks), and
  ``backends.webnn.host_link.HostLink`` (the context's staged write and read paths on a
  caller's own device buffers).

Implementation notes: kernels are WGSL generated per shape at build time; a dispatch is
one command encoder and one queue.submit; reshapes are views; matmul with M == 1 and
constant weights uses a matrix-vector kernel on weights repacked (N, K) at build time,
split into chunks beyond the device's storage-binding limit (as are large gather tables);
matmul(q, transpose(k)) reads k in place; intermediate buffers are reused by liveness.
A stateful graph with append pairs reads back a 4-byte capacity status per dispatch
(counted in d2h; see FINDINGS.md).

Proposal decisions are listed in backends/webnn/FINDINGS.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._classes import (
    ByteCounters,
    MLContext,
    MLGraph,
    MLGraphBuilder,
    MLKVCachePair,
    MLOperand,
    MLTensor,
)
from .errors import (
    DataError,
    DOMException,
    InvalidStateError,
    NotSupportedError,
    OperationError,
)

if TYPE_CHECKING:
    from .wgpu_impl.options import KernelOptions


class ML:
    """IDL: ``interface ML`` (``navigator.ml``)."""

    # IDL: Promise<MLContext> createContext(optional MLContextOptions options = {});
    def create_context(self, *, state_support: bool = True, timing: bool = False,
                       power_preference: str = "high-performance",
                       options: KernelOptions | None = None,
                       engine: str = "wgpu") -> MLContext:
        """A WebGPU-backed context. ``state_support=False`` acts as a backend without the
        proposal (use_stateful never granted); ``timing=True`` records GPU time;
        ``options`` (statebench extension, implementation-specific) picks kernel variants
        and modes (None: each per adapter); ``engine``: "wgpu" (wgpu-native) or "dawn"
        (Dawn, through wgpudawn; ``engines.py``)."""
        from .wgpu_impl import WgpuContext

        return WgpuContext(state_support=state_support, timing=timing,
                           power_preference=power_preference, options=options, engine=engine)


ml = ML()

__all__ = [
    "ml", "ML", "MLContext", "MLGraph", "MLGraphBuilder", "MLKVCachePair", "MLOperand",
    "MLTensor", "ByteCounters", "DOMException", "InvalidStateError", "OperationError",
    "NotSupportedError", "DataError",
]
