"""A product read apart by last-axis slices and reshapes (genai's packed q, gate, k and v)
split into one product per part (``wgpu_impl/split_columns``): the parts' values against
NumPy float64 on fresh random data, with float and 4-bit weights, one row and several, and
no slice launched where the split applies."""

from __future__ import annotations

import numpy as np
import pytest

from backends.webnn import MLGraphBuilder

RNG = np.random.default_rng()
H, D, KV = 3, 8, 8  # heads of q and gate (interleaved a head), k's and v's widths


def _pack(values: np.ndarray) -> np.ndarray:
    """The spec's uint4 buffer: low nibble first."""
    flat = (values.reshape(-1).astype(np.int64) & 0xF).astype(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)


def _weights(b, k: int, n: int, quantized: bool) -> tuple[object, np.ndarray]:
    """(the weights operand (K, N), their float64 values): float, or uint4 codes with
    block scales and zero points along K (blocks of 8)."""
    if not quantized:
        w = RNG.standard_normal((k, n)).astype(np.float32)
        return b.constant(data_type="float32", shape=[k, n], value=w), w.astype(np.float64)
    codes = RNG.integers(0, 16, (k, n))
    zp = RNG.integers(0, 16, (k // 8, n))
    scale = RNG.uniform(0.05, 0.2, (k // 8, n)).astype(np.float32)
    dq = b.dequantize_linear(
        b.constant(data_type="uint4", shape=[k, n], value=_pack(codes)),
        b.constant(data_type="float32", shape=[k // 8, n], value=scale),
        b.constant(data_type="uint4", shape=[k // 8, n], value=_pack(zp)))
    want = (codes - np.repeat(zp, 8, 0)) * np.repeat(scale.astype(np.float64), 8, 0)
    return dq, want


def _parts(b, y, rows: int, overlap: bool) -> dict[str, object]:
    """genai's split: q and gate interleaved a head, k and v after them, each read by an
    element-wise op (``overlap``: k read again by a slice across its boundary with v)."""
    qg = b.reshape(b.slice(y, [0, 0, 0], [1, rows, 2 * H * D]), [1, rows, H, 2 * D])
    q = b.reshape(b.slice(qg, [0, 0, 0, 0], [1, rows, H, D]), [1, rows, H * D])
    g = b.reshape(b.slice(qg, [0, 0, 0, D], [1, rows, H, D]), [1, rows, H * D])
    k = b.slice(y, [0, 0, 2 * H * D], [1, rows, KV])
    v = b.reshape(b.slice(y, [0, 0, 2 * H * D + KV], [1, rows, KV]), [1, rows, 2, KV // 2])
    out = {"q": b.mul(q, q), "g": b.sigmoid(g), "k": b.exp(k), "v": b.neg(v)}
    if overlap:
        out["kv"] = b.abs(b.slice(y, [0, 0, 2 * H * D + KV // 2], [1, rows, KV]))
    return out


def _want(y: np.ndarray, rows: int, overlap: bool) -> dict[str, np.ndarray]:
    qg = y[:, :, :2 * H * D].reshape(1, rows, H, 2 * D)
    k0 = 2 * H * D
    out = {"q": qg[..., :D].reshape(1, rows, -1) ** 2,
           "g": 1 / (1 + np.exp(-qg[..., D:].reshape(1, rows, -1))),
           "k": np.exp(y[:, :, k0:k0 + KV]),
           "v": -y[:, :, k0 + KV:k0 + 2 * KV].reshape(1, rows, 2, KV // 2)}
    if overlap:
        out["kv"] = np.abs(y[:, :, k0 + KV // 2:k0 + KV // 2 + KV])
    return out


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("overlap", [False, True])
def test_a_product_read_apart_computes_its_parts(ctx, quantized, rows, overlap):
    """Each part as the packed product's slices computed it; split (no slice launched)
    unless two parts read one column (``overlap``: the product kept whole)."""
    k, n = 32, 2 * H * D + 2 * KV
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, rows, k])
    w, w64 = _weights(b, k, n, quantized)
    outs = _parts(b, b.matmul(x, w), rows, overlap)
    g = b.build(outs)
    xv = RNG.standard_normal((1, rows, k)).astype(np.float32)
    t = ctx.create_tensor(data_type="float32", shape=[1, rows, k], writable=True)
    ctx.write_tensor(t, xv)
    tout = {name: ctx.create_tensor(data_type="float32", shape=o.shape, readable=True)
            for name, o in outs.items()}
    ctx.dispatch(g, {"x": t}, tout)
    got = dict(zip(tout, ctx.read_tensors(list(tout.values())), strict=True))
    names = [la.kernel.name for la in g._plan.launches]
    g.destroy()
    want = _want(xv.astype(np.float64) @ w64, rows, overlap)
    for name, v in want.items():
        np.testing.assert_allclose(got[name], v, rtol=1e-4, atol=1e-4 * np.abs(v).max(),
                                   err_msg=name)
    assert ("slice" in " ".join(names)) == overlap, names
