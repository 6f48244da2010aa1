"""The oracle: the decoder's math (DESIGN §5) in plain NumPy, float64 by default.

Written from the equations, not from any exported graph, so it shares no code with the
backends it checks. State layouts match the exported graphs (`workload.cache_specs`) so a
page-owned cache can be loaded from `Reference.cache_arrays()` directly.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import cache

import numpy as np

from model.cpus import USABLE_CPUS
from model.workload import ATTENTION, ModelConfig, cache_specs

L2_EPS = 1e-6  # inside the square root, as FLA; ORT GatedDeltaNet uses 1e-12 (below tolerance here)
#: a prefill's scores are built this many bytes at a time (query rows sub-chunked), so a 16k
#: context stays a few hundred MB above the cache instead of (heads, T, 16k) at once
SCORES_BLOCK_BYTES = 256 << 20
#: score blocks at least this many elements have their softmax split over threads (ufuncs
#: release the GIL); smaller ones (a single-token step) are not worth the hand-off
THREADED_SOFTMAX_MIN = 1 << 18
#: threads for a large softmax: the CPUs this process may run on
SOFTMAX_THREADS = USABLE_CPUS
#: tokens per chunk of the gated delta rule's prefill (``gdn_chunked``)
GDN_CHUNK = 64


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def causal_conv(window: np.ndarray, x: np.ndarray, taps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A causal depthwise conv over T new columns, SiLU after it (Qwen3.5's short conv).

    window: (C, K-1), the last K-1 inputs before these, oldest first (zeros at the start);
    x: (T, C); taps: (C, K), tap K-1 on the newest column. Output t is
    silu(sum_j taps[:, j] * padded[:, t + j]) over padded = [window | x^T]; the new window is
    padded's last K-1 columns. Returns (out (T, C), new window).
    """
    k = taps.shape[1]
    padded = np.concatenate([window, x.T], axis=1)  # (C, K-1+T)
    t = x.shape[0]
    y = sum(taps[:, j:j + 1] * padded[:, j:j + t] for j in range(k))  # (C, T)
    return silu(y.T), padded[:, padded.shape[1] - (k - 1):]


def l2_normalize(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def rope_angles(positions: np.ndarray, head_dim: int, theta: float) -> np.ndarray:
    """(T, head_dim/2) angles pos * theta^(-2i/d)."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    return np.asarray(positions, np.float64)[:, None] * inv_freq[None, :]


def apply_rope(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE. x: (T, heads, D); angles: (T, D/2)."""
    half = x.shape[-1] // 2
    cos = np.cos(angles)[:, None, :]
    sin = np.sin(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def gdn_step(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
             g: np.ndarray, beta: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """One token of the gated delta rule, in ORT GatedDeltaNet's V-major layout.

    state: (Hv, Dv, Dk) = S^T per head; q, k: (Hk, Dk) already L2-normalised; v: (Hv, Dv);
    g (log decay), beta: (Hv,). Value head h reads q/k head h // (Hv/Hk).
    S_t = exp(g) S + k (beta (v - exp(g) S^T k))^T,  o = scale S_t^T q.
    Returns (o (Hv, Dv), new state).
    """
    hv, hk = v.shape[0], k.shape[0]
    rep = hv // hk
    kk = np.repeat(k, rep, axis=0)  # (Hv, Dk)
    qq = np.repeat(q, rep, axis=0)
    decayed = state * np.exp(g)[:, None, None]
    retrieved = np.einsum("hvk,hk->hv", decayed, kk)
    delta = beta[:, None] * (v - retrieved)
    new = decayed + delta[:, :, None] * kk[:, None, :]
    out = scale * np.einsum("hvk,hk->hv", new, qq)
    return out, new


def gdn_chunked(state: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                g: np.ndarray, beta: np.ndarray, scale: float,
                chunk: int = GDN_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """T tokens of the gated delta rule at once: ``gdn_step`` applied in order, computed
    chunk by chunk with matrix products (the WY form of the delta rule) instead of T
    passes over the state. A long prefill of hybrid-1b was memory-bound on those passes
    (2 MB of state per layer, read and written several times per token).

    state: (Hv, Dv, Dk) as in ``gdn_step``; q, k: (T, Hk, Dk); v: (T, Hv, Dv); g, beta:
    (T, Hv). Returns (o (T, Hv, Dv), new state).

    Per head, with S (Dk, Dv), G the running sum of g inside a chunk and γ = exp(G):
    S_t = γ_t S_0 + Σ_{i≤t} (γ_t/γ_i) k_i u_iᵀ, where the pseudo-values U solve the unit
    lower-triangular system (I + diag(β) A) U = diag(β) (V - diag(γ) K S_0), with
    A_ti = (γ_t/γ_i) k_t·k_i for i < t; then O = scale (diag(γ) Q S_0 + (M ∘ Q Kᵀ) U) with
    M_ti = γ_t/γ_i for i ≤ t, and S_C = γ_C S_0 + Kᵀ diag(γ_C/γ) U.
    """
    hv, hk = v.shape[1], k.shape[1]
    rep = hv // hk
    S = state.transpose(0, 2, 1).copy()  # (Hv, Dk, Dv)
    kk = np.repeat(k, rep, axis=1).transpose(1, 0, 2)  # (Hv, T, Dk)
    qq = np.repeat(q, rep, axis=1).transpose(1, 0, 2)
    vv = v.transpose(1, 0, 2)
    gg, bb = g.T, beta.T  # (Hv, T)
    t_all = v.shape[0]
    out = np.empty((hv, t_all, v.shape[2]), np.result_type(S, vv))
    for c0 in range(0, t_all, chunk):
        sl = slice(c0, min(t_all, c0 + chunk))
        K, Q, V, b = kk[:, sl], qq[:, sl], vv[:, sl], bb[:, sl]
        n = K.shape[1]
        G = np.cumsum(gg[:, sl], axis=1)
        incl = np.tri(n, dtype=bool)  # i <= t
        diff = np.where(incl, G[:, :, None] - G[:, None, :], -np.inf)
        M = np.exp(diff)  # γ_t/γ_i below and on the diagonal, 0 above
        A = np.tril((K @ K.transpose(0, 2, 1)) * M, -1)
        gam = np.exp(G)[:, :, None]
        lhs = np.eye(n, dtype=A.dtype) + b[:, :, None] * A
        rhs = b[:, :, None] * (V - gam * (K @ S))
        U = np.linalg.solve(lhs, rhs)
        out[:, sl] = scale * (gam * (Q @ S) + ((Q @ K.transpose(0, 2, 1)) * M) @ U)
        tail = np.exp(G[:, -1:] - G)[:, :, None]  # γ_C/γ_i
        S = np.exp(G[:, -1])[:, None, None] * S + K.transpose(0, 2, 1) @ (tail * U)
    return out.transpose(1, 0, 2), S.transpose(0, 2, 1)


@cache
def _softmax_pool() -> ThreadPoolExecutor:
    """One pool for the process: BLAS already spreads the matmuls, these the softmax passes."""
    return ThreadPoolExecutor(max_workers=SOFTMAX_THREADS, thread_name_prefix="ref-softmax")


def _exp_rows(s: np.ndarray) -> np.ndarray:
    """exp(s - row max) in place on a 2-D block; returns the row sums (n, 1)."""
    np.subtract(s, s.max(axis=-1, keepdims=True), out=s)
    np.exp(s, out=s)
    return s.sum(axis=-1, keepdims=True)


def _softmax_unnormalised(s: np.ndarray) -> np.ndarray:
    """Overwrite s (..., n) with exp(s - row max) and return the row sums (..., 1).

    Dividing the (rows, D) output by the sums instead of the (rows, n) probabilities saves a
    full pass; large blocks are cut into row slices run on threads.
    """
    if not s.flags.c_contiguous:
        raise ValueError("scores must be C-contiguous (they are overwritten through a 2-D view)")
    flat = s.reshape(-1, s.shape[-1])
    if s.size < THREADED_SOFTMAX_MIN or SOFTMAX_THREADS == 1:
        return _exp_rows(flat).reshape(*s.shape[:-1], 1)
    parts = np.array_split(flat, min(len(flat), 2 * SOFTMAX_THREADS))
    sums = list(_softmax_pool().map(_exp_rows, parts))
    return np.concatenate(sums).reshape(*s.shape[:-1], 1)


def _to_float16(x: np.ndarray) -> np.ndarray:
    """x rounded to the nearest float16 values (round to nearest even), in x's dtype."""
    return x.astype(np.float16).astype(x.dtype)


def project(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w`` in the weights' precision. A float32 reference (large models) keeps float64
    activations (RoPE angles are float64) but multiplies by its float32 weights in float32
    BLAS: NumPy would otherwise convert the whole weight matrix to float64 on every call,
    which made the MLP most of a long prefill. A float64 reference is unchanged."""
    if w.dtype == np.float32 and x.dtype != np.float32:
        return x.astype(np.float32) @ w
    return x @ w


def causal_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int) -> np.ndarray:
    """softmax(q k^T / sqrt(D), causal) v for T queries at positions start .. start+T-1.

    q: (T, Hq, D); keys, values: (Hkv, start+T, D); q head h reads kv head h // (Hq/Hkv).
    Returns (T, Hq, D) in the inputs' promoted dtype (as einsum would give).

    Grouped heads are matmuls of (Hkv, rows, D) q against (Hkv, end, D) keys (BLAS, no
    repeated K/V); keys before `start` are visible to every query, so only the last T
    columns are masked; query rows are taken a block at a time to bound the scores' memory.
    """
    t, hq, d = q.shape
    hkv = keys.shape[0]
    rep = hq // hkv
    if keys.shape[1] != start + t or values.shape[:2] != keys.shape[:2]:
        raise ValueError(f"keys/values {keys.shape}/{values.shape} must cover positions 0..{start + t - 1}")
    dtype = np.result_type(q, keys, values)
    # (Hkv, T*rep, D): row j*rep + r is position start + j of q head kv*rep + r
    qg = (q.astype(dtype) / dtype.type(np.sqrt(d))).reshape(t, hkv, rep, d).transpose(1, 0, 2, 3)
    qg = qg.reshape(hkv, t * rep, d)
    kt = keys.astype(dtype, copy=False).transpose(0, 2, 1)
    vals = values.astype(dtype, copy=False)
    out = np.empty((hkv, t * rep, d), dtype)
    per_block = max(1, SCORES_BLOCK_BYTES // (hq * (start + t) * dtype.itemsize))
    for j0 in range(0, t, per_block):
        j1 = min(t, j0 + per_block)
        rows, end = slice(j0 * rep, j1 * rep), start + j1
        s = np.matmul(qg[:, rows], kt[:, :, :end])  # (Hkv, n, end)
        query = j0 + np.arange((j1 - j0) * rep) // rep  # each row's offset from start
        future = np.arange(j1)[None, :] > query[:, None]  # (n, j1): the diagonal block only
        np.copyto(s[:, :, start:], -np.inf, where=future)
        sums = _softmax_unnormalised(s)
        block = out[:, rows]
        np.matmul(s, vals[:, :end], out=block)
        block /= sums
    return out.reshape(hkv, t, rep, d).transpose(1, 0, 2, 3).reshape(t, hq, d)


class Reference:
    """The decoder with a fixed-capacity cache; `step` feeds one token, `prefill` many."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], capacity: int,
                 dtype: type = np.float64) -> None:
        self.cfg, self.capacity, self.dtype = cfg, capacity, dtype
        self.w = {n: np.asarray(a, dtype) for n, a in weights.items()}
        self.reset()

    def reset(self) -> None:
        self.position = 0
        specs = cache_specs(self.cfg, self.capacity)
        self.state = {s.input: np.zeros(s.shape[1:], self.dtype) for s in specs}

    def cache_arrays(self, capacity: int | None = None) -> dict[str, np.ndarray]:
        """Current state in the graphs' layouts and data types (batch dim 1), by past name;
        KV caches cut to `capacity` rows when given (a smaller graph of the same model)."""
        out = {}
        dtypes = {s.input: s.dtype for s in cache_specs(self.cfg, 1)}
        for n, a in self.state.items():
            if capacity is not None and n.startswith("past_key_values."):
                a = a[:, :capacity]
            out[n] = a[None].astype(dtypes[n])  # float16 KV caches: exact (rows are rounded)
        return out

    def save(self) -> tuple[int, dict[str, np.ndarray]]:
        """A copy of (position, state) to `restore` after looking ahead."""
        return self.position, {n: a.copy() for n, a in self.state.items()}

    def restore(self, saved: tuple[int, dict[str, np.ndarray]]) -> None:
        self.position, state = saved
        self.state = {n: a.copy() for n, a in state.items()}

    def step(self, token: int) -> np.ndarray:
        """Logits (vocab,) after feeding one token."""
        return self.prefill(np.array([token]))[-1]

    def step_tokens(self, tokens: np.ndarray) -> np.ndarray:
        """Logits (K, vocab) after feeding K tokens at positions P .. P+K-1 in one batch:
        the oracle of a K-token graph (``model.export``'s tokens), causal inside the K."""
        return self.prefill(np.asarray(tokens).reshape(-1))

    def prefill(self, tokens: np.ndarray, logits: bool = True) -> np.ndarray | None:
        """Feed tokens in one batch (causal); returns logits (T, vocab), or None when
        `logits` is False (reaching depth: the LM head is most of a long prefill's work)."""
        cfg, w = self.cfg, self.w
        t = len(tokens)
        if self.position + t > self.capacity:
            raise ValueError(f"capacity {self.capacity} exceeded at position {self.position + t}")
        positions = np.arange(self.position, self.position + t)
        x = w["embed_tokens"][np.asarray(tokens)]
        for i, kind in enumerate(cfg.layers):
            p = f"layers.{i}."
            xn = rms_norm(x, w[p + "input_norm"], cfg.rms_eps)
            mixer = self._attention if kind == ATTENTION else self._gdn
            x = x + mixer(i, xn, positions)
            xn = rms_norm(x, w[p + "post_norm"], cfg.rms_eps)
            x = x + project(silu(project(xn, w[p + "gate_proj"])) * project(xn, w[p + "up_proj"]),
                            w[p + "down_proj"])
        self.position += t
        if not logits:
            return None
        x = rms_norm(x, w["final_norm"], cfg.rms_eps)
        head = w["lm_head"] if cfg.separate_head else w["embed_tokens"].T
        return project(x, head)

    def _attention(self, i: int, xn: np.ndarray, positions: np.ndarray) -> np.ndarray:
        cfg, w, p = self.cfg, self.w, f"layers.{i}."
        t, d = len(positions), cfg.head_dim
        q = project(xn, w[p + "q_proj"]).reshape(t, cfg.q_heads, d)
        k = project(xn, w[p + "k_proj"]).reshape(t, cfg.kv_heads, d)
        v = project(xn, w[p + "v_proj"]).reshape(t, cfg.kv_heads, d)
        ang = rope_angles(positions, d, cfg.rope_theta)
        q, k = apply_rope(q, ang), apply_rope(k, ang)
        kc, vc = self.state[f"past_key_values.{i}.key"], self.state[f"past_key_values.{i}.value"]
        if cfg.kv_cache == "float16":
            # the cache is a float16 tensor of the model: each row is rounded as it is
            # written, and attention (the current token's own row too) reads the rounded rows
            k, v = _to_float16(k), _to_float16(v)
        kc[:, positions] = k.transpose(1, 0, 2)
        vc[:, positions] = v.transpose(1, 0, 2)
        end = positions[-1] + 1
        # in the cache's precision: a float32 reference attends in float32 (RoPE's float64
        # angles would otherwise make every score float64, at twice the cost)
        out = causal_attention(q.astype(kc.dtype, copy=False), kc[:, :end], vc[:, :end],
                               int(positions[0]))
        out = out.reshape(t, cfg.q_heads * d)
        return project(out, w[p + "o_proj"])

    def _gdn(self, i: int, xn: np.ndarray, positions: np.ndarray) -> np.ndarray:
        cfg, w, p = self.cfg, self.w, f"layers.{i}."
        t = len(positions)
        hk, hv, dk, dv = cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim, cfg.gdn_v_dim
        qkv = np.concatenate([project(xn, w[p + n]) for n in ("q_proj", "k_proj", "v_proj")],
                             axis=-1)
        if cfg.gdn_conv_kernel:
            conv = f"past_conv_state.{i}"
            qkv, window = causal_conv(self.state[conv], qkv, w[p + "conv1d"])
            self.state[conv] = window.astype(self.dtype, copy=False)
        qk = hk * dk
        q = l2_normalize(qkv[:, :qk].reshape(t, hk, dk))
        k = l2_normalize(qkv[:, qk:2 * qk].reshape(t, hk, dk))
        v = qkv[:, 2 * qk:].reshape(t, hv, dv)
        g = -np.exp(w[p + "A_log"]) * softplus(project(xn, w[p + "a_proj"]) + w[p + "dt_bias"])
        beta = 1.0 / (1.0 + np.exp(-project(xn, w[p + "b_proj"])))
        name = f"past_state.{i}"
        o, s = gdn_chunked(self.state[name], q, k, v, g, beta, 1.0 / np.sqrt(dk))
        self.state[name] = s.astype(self.dtype, copy=False)
        return project(o.reshape(t, hv * dv).astype(self.dtype, copy=False), w[p + "o_proj"])
