"""Matrix products: a matrix-vector kernel for decode (M = 1) and a general batched one.

B may be given transposed (``b_t``: stored (..., N, K), the K dimension contiguous): that
is how constant weights are repacked at build time and how ``matmul(q, transpose(Kc))``
reads the key cache without materialising the transpose.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import shapes as S
from .common import WG, Kernel, contiguous, decl, grid, main_1d, offset_fn


def _batch_fn(fname: str, batch: Sequence[int], src_batch: Sequence[int], unit: int) -> str:
    st = S.broadcast_strides(src_batch, batch)
    return offset_fn(fname, batch or (1,), tuple(s * unit for s in st) or (0,))


def gemv(a_shape: Sequence[int], b_shape: Sequence[int], out_shape: Sequence[int],
         *, b_t: bool, n_off: int = 0, n_chunk: int | None = None) -> Kernel:
    """out[r, n] = sum_k A[r, k] * Bt[n, k] for M == 1 (decode).

    Requires ``b_t`` (weights (N, K) with K contiguous). A workgroup computes ``cols``
    output columns of one row: its 64 threads stride over K with vec4 loads (when K % 4 ==
    0) — adjacent threads read adjacent 16-byte words of one weight row, so loads
    coalesce — and reduce their partial sums in workgroup memory. Each weight byte is
    read exactly once per row.

    ``n_off``/``n_chunk``: this launch computes output columns [n_off, n_off + n_chunk)
    from a weight buffer holding just those rows (weights larger than the device's
    storage-binding limit, e.g. a 128k-vocabulary LM head, are split into chunks).
    """
    assert b_t
    K, N = a_shape[-1], out_shape[-1]
    nc = N if n_chunk is None else n_chunk
    batch = tuple(out_shape[:-2])
    rows = S.size(batch) * out_shape[-2]
    vw = 4 if K % 4 == 0 else 1
    vt = "vec4<f32>" if vw == 4 else "f32"
    kv = K // vw
    cols = 4 if -(-nc // 4) <= 65535 else 8
    gx = -(-nc // cols)
    src = decl(0, "a", vt, "read") + decl(1, "b", vt, "read") + decl(2, "out", "f32", "rw")
    src += _batch_fn("aoff", batch, a_shape[:-2], a_shape[-2] * K)
    src += _batch_fn("boff", batch, b_shape[:-2], nc * K)
    src += f"var<workgroup> sh: array<f32, {cols * WG}>;\n"
    src += (f"@compute @workgroup_size({WG})\n"
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, "
            "@builtin(local_invocation_index) lid: u32) {\n")
    M = out_shape[-2]
    src += f"  let row = wid.y;\n  let bi = row / {M}u;\n  let m = row % {M}u;\n"
    src += f"  let n0 = wid.x * {cols}u;\n"
    src += f"  let ab = (aoff(bi) + m * {K}u) / {vw}u;\n"
    src += f"  let bb = boff(bi) / {vw}u;\n"
    for c in range(cols):
        src += f"  var acc{c} = 0.0;\n"
        src += f"  let w{c} = bb + min(n0 + {c}u, {nc - 1}u) * {kv}u;\n"
    src += f"  for (var k = lid; k < {kv}u; k = k + {WG}u) {{\n    let x = a[ab + k];\n"
    dot = "dot(x, b[w{c} + k])" if vw == 4 else "x * b[w{c} + k]"
    for c in range(cols):
        src += f"    acc{c} = acc{c} + {dot.format(c=c)};\n"
    src += "  }\n"
    for c in range(cols):
        src += f"  sh[{c * WG}u + lid] = acc{c};\n"
    src += "  workgroupBarrier();\n"
    s = WG // 2
    while s >= 1:
        src += f"  if (lid < {s}u) {{\n"
        for c in range(cols):
            src += f"    sh[{c * WG}u + lid] = sh[{c * WG}u + lid] + sh[{c * WG}u + lid + {s}u];\n"
        src += "  }\n  workgroupBarrier();\n"
        s //= 2
    src += (f"  if (lid < {cols}u && n0 + lid < {nc}u) {{\n"
            f"    out[row * {N}u + {n_off}u + n0 + lid] = sh[lid * {WG}u];\n  }}\n}}\n")
    traffic = 4 * (S.size(a_shape) + S.size(b_shape) * nc // N + rows * nc)
    return Kernel("matmul_gemv", src, ["read", "read", "rw"], (gx, rows, 1), traffic)


def matmul(a_shape: Sequence[int], b_shape: Sequence[int], out_shape: Sequence[int],
           *, b_t: bool) -> Kernel:
    """General batched matmul, one thread per output element (adjacent threads take
    adjacent columns, so B (K, N) loads coalesce)."""
    K = a_shape[-1]
    M, N = out_shape[-2], out_shape[-1]
    batch = tuple(out_shape[:-2])
    n = S.size(out_shape)
    gx, gy, gz = grid(n)
    src = decl(0, "a", "f32", "read") + decl(1, "b", "f32", "read") + decl(2, "out", "f32", "rw")
    src += _batch_fn("aoff", batch, a_shape[:-2], M * K)
    src += _batch_fn("boff", batch, b_shape[:-2], N * K)
    src += main_1d(gx)
    src += f"  if (i >= {n}u) {{ return; }}\n"
    src += f"  let nn = i % {N}u;\n  let m = (i / {N}u) % {M}u;\n  let bi = i / {M * N}u;\n"
    src += f"  let ab = aoff(bi) + m * {K}u;\n"
    if b_t:
        src += f"  let bb = boff(bi) + nn * {K}u;\n  let bs = 1u;\n"
    else:
        src += f"  let bb = boff(bi) + nn;\n  let bs = {N}u;\n"
    src += (f"  var acc = 0.0;\n  for (var k = 0u; k < {K}u; k = k + 1u) {{\n"
            "    acc = acc + a[ab + k] * b[bb + k * bs];\n  }\n  out[i] = acc;\n}\n")
    traffic = 4 * (S.size(a_shape) + S.size(b_shape) + n)
    return Kernel("matmul", src, ["read", "read", "rw"], (gx, gy, gz), traffic)


__all__ = ["gemv", "matmul", "contiguous", "main_1d"]
