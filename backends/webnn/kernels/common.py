"""What every generator returns, and the index arithmetic they share."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

WG = 64  # workgroup size of the 1-D kernels; a multiple of every GPU's SIMD width
MAX_GROUPS = 65535


@dataclass
class Kernel:
    """One compute launch: its WGSL, the access of each binding, the grid, the traffic.

    ``bindings[i]`` is ``"read"`` or ``"rw"``; the compiler binds buffer ``i`` to
    ``@binding(i)``. ``bytes`` is what the kernel reads plus writes, from shapes.
    """

    name: str
    wgsl: str
    bindings: list[str]
    groups: tuple[int, int, int]
    bytes: int


def grid(n: int, wg: int = WG) -> tuple[int, int, int]:
    """Workgroups for ``n`` items, folded into y beyond the per-dimension limit."""
    groups = max(1, -(-n // wg))
    gx = min(groups, MAX_GROUPS)
    return (gx, -(-groups // gx), 1)


def main_1d(gx: int, wg: int = WG) -> str:
    """Entry point header whose body has ``i`` (linear index) in scope."""
    return (f"@compute @workgroup_size({wg})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n"
            f"  let i = (wid.y * {gx}u + wid.x) * {wg}u + lid;\n")


def contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    out = [1] * len(shape)
    for k in range(len(shape) - 2, -1, -1):
        out[k] = out[k + 1] * shape[k + 1]
    return tuple(out)


def offset_fn(fname: str, shape: Sequence[int], strides: Sequence[int], base: int = 0) -> str:
    """WGSL ``fn fname(i: u32) -> u32``: linear index over ``shape`` to a strided offset."""
    if base == 0 and _same_layout(shape, strides):
        return f"fn {fname}(i: u32) -> u32 {{ return i; }}\n"
    body = [f"fn {fname}(i: u32) -> u32 {{", "  var r = i;", f"  var o = {base}u;"]
    dims = [(d, s) for d, s in zip(shape, strides, strict=False) if d != 1]
    for n, (d, s) in enumerate(reversed(dims)):
        last = n == len(dims) - 1
        if s != 0:
            body.append(f"  o = o + {'r' if last else f'(r % {d}u)'} * {s}u;")
        if not last:
            body.append(f"  r = r / {d}u;")
    body += ["  return o;", "}"]
    return "\n".join(body) + "\n"


def _same_layout(shape: Sequence[int], strides: Sequence[int]) -> bool:
    return all(d == 1 or s == c for d, s, c in zip(shape, strides, contiguous(shape), strict=False))


def decl(binding: int, name: str, wgsl_type: str, access: str) -> str:
    mode = "read" if access == "read" else "read_write"
    return (f"@group(0) @binding({binding}) var<storage, {mode}> {name}: "
            f"array<{wgsl_type}>;\n")


def esize(t: str) -> int:
    """Bytes of one element of WGSL scalar type ``t`` (f16: 2, the rest 4)."""
    return 2 if t == "f16" else 4


#: Bit patterns a kernel may need as f32 values that WGSL cannot write as constants: a
#: const-expression may not be NaN or infinite (a shader-creation error in Tint; naga accepts
#: it). Each is held in a private variable, declared by ``module_source`` in the kernels
#: that name it; reading a variable is a runtime expression, whose value may be either.
SPECIALS = {"sb_neg_inf": 0xFF800000, "sb_nan": 0x7FC00000}


#: Functions the element-wise expressions call (``kernels/elementwise.py``), defined by
#: ``module_source`` in every module that calls one and does not define it: a fused
#: element-wise chain is spliced into reduction, attention, gemv and gated-delta kernels
#: too, and each must carry the helpers its chain uses (RMSNorm exported as ``Pow(x, 2)``
#: feeding ReduceMean calls ``wpow`` inside the reduction).
HELPERS = {
    "wpow": """
fn wpow(a: f32, b: f32) -> f32 {
  // WGSL pow is undefined for a < 0; the spec's pow is defined for integral exponents.
  let r = pow(abs(a), b);
  if (a >= 0.0) { return r; }
  // NaN, as IEEE pow gives; a runtime value (SPECIALS): a constant NaN is invalid WGSL
  if (b != round(b)) { return bitcast<f32>(sb_nan); }
  if ((i32(b) & 1) != 0) { return -r; }
  return r;
}
""",
    "werf": """
fn werf(x: f32) -> f32 {
  // Abramowitz-Stegun 7.1.26, |error| < 1.5e-7
  let t = 1.0 / (1.0 + 0.3275911 * abs(x));
  let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t
                  - 0.284496736) * t + 0.254829592) * t * exp(-x * x);
  return select(-y, y, x >= 0.0);
}
""",
}


def with_helpers(wgsl: str) -> str:
    """``wgsl`` with the ``HELPERS`` it calls but does not define appended (once each)."""
    for name, src in HELPERS.items():
        if re.search(rf"\b{name}\s*\(", wgsl) and not re.search(rf"\bfn\s+{name}\b", wgsl):
            wgsl += src
    return wgsl


def neg_inf() -> str:
    """-infinity as an f32 runtime value (attention's running maximum starts there)."""
    return "bitcast<f32>(sb_neg_inf)"


_F16_WORD = re.compile(r"\bf16\b")
_SUBGROUP_CALL = re.compile(r"\bsubgroup[A-Z]\w*\s*\(")


def module_source(wgsl: str, enable_subgroups: bool) -> str:
    """The shader module's full source: the extensions a kernel uses enabled, the special
    values and element-wise helpers it names declared. ``enable_subgroups``: the engine's
    compiler wants ``enable subgroups;`` before subgroup builtins (Tint, as the spec
    says); naga rejects the directive and accepts the builtins without it (docs/dawn.md)."""
    wgsl = with_helpers(wgsl)
    head = "enable f16;\n" if _F16_WORD.search(wgsl) else ""
    if enable_subgroups and _SUBGROUP_CALL.search(wgsl):
        head += "enable subgroups;\n"
    for name, bits in SPECIALS.items():
        if re.search(rf"\b{name}\b", wgsl):
            head += f"var<private> {name}: u32 = {bits:#010x}u;\n"
    return head + wgsl


def zero(t: str) -> str:
    return {"f32": "0.0", "f16": "f16(0.0)", "i32": "0", "u32": "0u"}[t]
