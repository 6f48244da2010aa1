"""The float64 oracle against itself and against the equations written out as loops."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from model import reference
from model.reference import (
    Reference,
    apply_rope,
    causal_attention,
    causal_conv,
    gdn_chunked,
    gdn_step,
    l2_normalize,
    rope_angles,
)
from model.workload import Workload, cache_specs, preset, token_stream


@pytest.fixture(scope="module")
def tiny():
    return Workload.build(preset("tiny"), seed=7)


def test_prefill_equals_steps(tiny):
    cfg, cap = tiny.config, 20
    tokens = token_stream(cfg, 13, seed=1)
    batched = Reference(cfg, tiny.weights, cap)
    stepped = Reference(cfg, tiny.weights, cap)
    # two batches (the second starts from a non-empty cache) against one token at a time
    logits_b = np.concatenate([batched.prefill(tokens[:8]), batched.prefill(tokens[8:])])
    logits_s = np.stack([stepped.step(int(t)) for t in tokens])
    np.testing.assert_allclose(logits_b, logits_s, rtol=1e-10, atol=1e-10)
    for name, arr in batched.state.items():
        np.testing.assert_allclose(arr, stepped.state[name], rtol=1e-10, atol=1e-12)
    assert batched.position == stepped.position == len(tokens)


def test_cache_arrays_have_the_graph_layouts(tiny):
    cap = 9
    ref = Reference(tiny.config, tiny.weights, cap)
    ref.prefill(token_stream(tiny.config, 4, seed=2))
    arrays = ref.cache_arrays()
    specs = cache_specs(tiny.config, cap)
    assert list(arrays) == [s.input for s in specs]
    for s in specs:
        assert arrays[s.input].shape == s.shape and arrays[s.input].dtype == np.float32
        if s.kind == "append":  # rows past the depth are still empty
            assert not arrays[s.input][:, :, 4:].any() and arrays[s.input][:, :, :4].all()


@pytest.mark.parametrize("t", [1, 2, 6])
def test_causal_conv_equals_the_equation(t):
    """Each channel: silu of the dot product of its K taps with the K latest inputs (the
    window before the first new one, zeros at the start); the new window is the K-1 latest.
    Fewer new columns than K-1 keep part of the old window (transformers' prefill got
    this wrong for short prompts)."""
    rng = np.random.default_rng(20 + t)
    c, k = 5, 4
    window = rng.standard_normal((c, k - 1))
    x = rng.standard_normal((t, c))
    taps = rng.standard_normal((c, k))
    out, new = causal_conv(window, x, taps)
    history = [window[:, j] for j in range(k - 1)] + list(x)
    for step in range(t):
        latest = np.stack(history[step:step + k], axis=1)  # (C, K), oldest first
        y = np.array([np.dot(taps[ch], latest[ch]) for ch in range(c)])
        np.testing.assert_allclose(out[step], y / (1 + np.exp(-y)), rtol=1e-12)
    np.testing.assert_array_equal(new, np.stack(history[-(k - 1):], axis=1))


def test_gdn_layer_state_includes_the_conv_window(tiny):
    """The conv window is state: after a prefill it holds the last K-1 conv inputs (the
    concatenated q/k/v projections of the last tokens), and a reset clears it."""
    cfg = tiny.config
    ref = Reference(cfg, tiny.weights, 8)
    tokens = token_stream(cfg, 5, seed=3)
    ref.prefill(tokens)
    w = ref.w
    i = cfg.gdn_layers[0]
    x = w["embed_tokens"][tokens[-(cfg.gdn_conv_kernel - 1):]]
    xn = reference.rms_norm(x, w[f"layers.{i}.input_norm"], cfg.rms_eps)
    qkv = np.concatenate([xn @ w[f"layers.{i}.{n}"] for n in ("q_proj", "k_proj", "v_proj")], -1)
    np.testing.assert_allclose(ref.state[f"past_conv_state.{i}"], qkv.T, rtol=1e-12)
    ref.reset()
    assert not ref.state[f"past_conv_state.{i}"].any()


def test_capacity_overflow_raises(tiny):
    ref = Reference(tiny.config, tiny.weights, 3)
    ref.prefill(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="capacity"):
        ref.step(4)


def _attention_naive(q, keys, values, start):
    """Causal grouped-query attention one (head, query) at a time, float64, as in DESIGN §5."""
    t, hq, d = q.shape
    rep = hq // keys.shape[0]
    out = np.zeros((t, hq, d))
    for h in range(hq):
        k, v = keys[h // rep].astype(np.float64), values[h // rep].astype(np.float64)
        for j in range(t):
            visible = start + j + 1  # keys 0 .. own position
            scores = np.array([q[j, h] @ k[s] for s in range(visible)]) / np.sqrt(d)
            probs = np.exp(scores - scores.max())
            probs /= probs.sum()
            out[j, h] = sum(probs[s] * v[s] for s in range(visible))
    return out


@pytest.mark.parametrize("start,t", [(0, 6), (11, 7), (11, 1), (40, 9)])
@pytest.mark.parametrize("tiny_blocks", [False, True])
@pytest.mark.parametrize("q_dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_causal_attention_equals_the_equation(monkeypatch, start, t, tiny_blocks, q_dtype, tol):
    hq, hkv, d = 6, 2, 8
    if tiny_blocks:  # two query positions per scores block, each block's softmax on 3 threads
        monkeypatch.setattr(reference, "SCORES_BLOCK_BYTES", 2 * hq * (start + t) * 8)
        monkeypatch.setattr(reference, "THREADED_SOFTMAX_MIN", 1)
        monkeypatch.setattr(reference, "SOFTMAX_THREADS", 3)
    rng = np.random.default_rng(start + t)
    q = (rng.standard_normal((t, hq, d)) * 2).astype(q_dtype)
    keys = rng.standard_normal((hkv, start + t, d)).astype(np.float32)  # as the cache holds them
    values = rng.standard_normal((hkv, start + t, d)).astype(np.float32)
    out = causal_attention(q, keys, values, start)
    assert out.shape == (t, hq, d) and out.dtype == q_dtype  # the inputs' promoted dtype
    np.testing.assert_allclose(out, _attention_naive(q, keys, values, start), rtol=tol, atol=tol)


def _gdn_naive(state_kv, q, k, v, g, beta, scale):
    """The recurrence as written in DESIGN §5, K-major S (Dk, Dv) per head, scalar loops."""
    hv, dk, dv = state_kv.shape
    rep = hv // q.shape[0]
    new = np.empty_like(state_kv)
    out = np.zeros((hv, dv))
    for h in range(hv):
        j = h // rep
        decay = np.exp(g[h])
        for c in range(dv):
            retrieved = sum(decay * state_kv[h, i, c] * k[j, i] for i in range(dk))
            delta = beta[h] * (v[h, c] - retrieved)
            for i in range(dk):
                new[h, i, c] = decay * state_kv[h, i, c] + k[j, i] * delta
        for c in range(dv):
            out[h, c] = scale * sum(new[h, i, c] * q[j, i] for i in range(dk))
    return out, new


def test_gdn_step_equals_the_equation():
    rng = np.random.default_rng(3)
    hk, hv, dk, dv = 2, 6, 5, 4
    state = rng.standard_normal((hv, dv, dk))  # V-major, as the graphs carry it
    for _ in range(3):
        q = l2_normalize(rng.standard_normal((hk, dk)))
        k = l2_normalize(rng.standard_normal((hk, dk)))
        v = rng.standard_normal((hv, dv))
        g = -rng.uniform(0.01, 3.0, hv)
        beta = rng.uniform(0, 1, hv)
        out, new = gdn_step(state, q, k, v, g, beta, 0.37)
        out_n, new_kv = _gdn_naive(state.transpose(0, 2, 1), q, k, v, g, beta, 0.37)
        np.testing.assert_allclose(out, out_n, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(new, new_kv.transpose(0, 2, 1), rtol=1e-12, atol=1e-12)
        state = new


@pytest.mark.parametrize("t,chunk,dtype,tol", [(1, 64, np.float64, 1e-12),
                                               (150, 64, np.float64, 1e-10),
                                               (37, 8, np.float64, 1e-10),
                                               (200, 64, np.float32, 2e-4)])
def test_gdn_chunked_equals_token_by_token(t, chunk, dtype, tol):
    """The chunked (WY-form) prefill against gdn_step applied token by token: outputs and
    final state, chunks that do not divide T, strong and weak decay, a non-zero start."""
    rng = np.random.default_rng()
    hk, hv, dk, dv = 2, 6, 16, 8
    state = rng.standard_normal((hv, dv, dk))
    q = l2_normalize(rng.standard_normal((t, hk, dk)))
    k = l2_normalize(rng.standard_normal((t, hk, dk)))
    v = rng.standard_normal((t, hv, dv))
    g = -rng.uniform(0.001, 4.0, (t, hv))
    beta = rng.uniform(0, 1, (t, hv))
    want_s, want_o = state, []
    for j in range(t):
        o, want_s = gdn_step(want_s, q[j], k[j], v[j], g[j], beta[j], 0.3)
        want_o.append(o)
    got_o, got_s = gdn_chunked(state.astype(dtype), q.astype(dtype), k.astype(dtype),
                               v.astype(dtype), g.astype(dtype), beta.astype(dtype), 0.3,
                               chunk=chunk)
    assert got_o.shape == (t, hv, dv) and got_s.shape == state.shape
    scale = max(1.0, float(np.abs(want_s).max()))
    np.testing.assert_allclose(got_o, np.stack(want_o), rtol=tol, atol=tol * scale)
    np.testing.assert_allclose(got_s, want_s, rtol=tol, atol=tol * scale)


def test_l2_normalize_has_eps_inside_the_root():
    x = np.full((1, 4), 1e-4)  # |x|^2 = 4e-8
    np.testing.assert_allclose(l2_normalize(x), x / np.sqrt(4e-8 + 1e-6))
    y = np.random.default_rng(0).standard_normal((3, 8)) * 10
    np.testing.assert_allclose(np.linalg.norm(l2_normalize(y), axis=-1), 1.0, rtol=1e-8)


def test_rope_properties():
    rng = np.random.default_rng(4)
    d, theta = 16, 10000.0
    x = rng.standard_normal((1, 3, d))
    y = rng.standard_normal((1, 3, d))
    at = lambda p: rope_angles(np.array([p]), d, theta)  # noqa: E731
    # position 0 is the identity; rotations keep the norm
    np.testing.assert_allclose(apply_rope(x, at(0)), x)
    np.testing.assert_allclose(np.linalg.norm(apply_rope(x, at(37)), axis=-1),
                               np.linalg.norm(x, axis=-1))
    # rotations compose: R(a) R(b) = R(a + b)
    np.testing.assert_allclose(apply_rope(apply_rope(x, at(5)), at(9)), apply_rope(x, at(14)))
    # scores depend only on the relative position
    s1 = np.sum(apply_rope(x, at(12)) * apply_rope(y, at(4)), axis=-1)
    s2 = np.sum(apply_rope(x, at(108)) * apply_rope(y, at(100)), axis=-1)
    np.testing.assert_allclose(s1, s2, rtol=1e-9)
    # rotate-half pairs dimension i with i + d/2 (not interleaved neighbours)
    e = np.zeros((1, 1, d))
    e[0, 0, 0] = 1.0
    r = apply_rope(e, at(1))[0, 0]
    assert r[0] == pytest.approx(np.cos(1.0)) and r[d // 2] == pytest.approx(np.sin(1.0))
    assert np.count_nonzero(r) == 2


def test_f16kv_rounds_each_cache_row_once_as_it_is_written():
    """'+f16kv': the reference's KV rows are float16 values (the model's float16 cache),
    the GDN state is not rounded, prefill still equals stepping, and `cache_arrays` hands
    the caches out as float16 without loss."""
    wl = Workload.build(preset("tiny+f16kv"), seed=7)
    cfg, cap = wl.config, 12
    tokens = token_stream(cfg, 9, seed=1)
    batched, stepped = Reference(cfg, wl.weights, cap), Reference(cfg, wl.weights, cap)
    batched.prefill(tokens)
    for t in tokens:
        stepped.step(int(t))
    arrays = batched.cache_arrays()
    for s in cache_specs(cfg, cap):
        a = batched.state[s.input]
        if s.kind == "append":
            assert arrays[s.input].dtype == np.float16
            np.testing.assert_array_equal(a, a.astype(np.float16).astype(np.float64))
            np.testing.assert_array_equal(arrays[s.input][0], a)  # lossless
            # batched and stepped rows may round to neighbouring float16 values
            step = np.spacing(np.abs(a).astype(np.float16)).astype(np.float64)
            assert np.all(np.abs(a - stepped.state[s.input]) <= step)
        else:
            assert arrays[s.input].dtype == np.float32
            assert not np.array_equal(a, a.astype(np.float16).astype(np.float64))
    # the same weights with a float32 cache: a different function, by about the rounding
    plain = Reference(dataclasses.replace(cfg, kv_cache="float32"), wl.weights, cap)
    plain.prefill(tokens[:-1])
    a, b = plain.step(int(tokens[-1])), Reference(cfg, wl.weights, cap)
    b.prefill(tokens[:-1])
    diff = np.abs(a - b.step(int(tokens[-1]))).max() / np.abs(a).max()
    assert 1e-7 < diff < 1e-3
