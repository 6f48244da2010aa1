"""The oracle: the decoder's math (DESIGN §5) in plain NumPy, float64 by default.

Written from the equations, not from any exported graph, so it shares no code with the
backends it checks. State layouts match the exported graphs (`workload.cache_specs`) so a
page-owned cache can be loaded from `Reference.cache_arrays()` directly.
"""

from __future__ import annotations

import numpy as np

from harness.workload import ATTENTION, ModelConfig, cache_specs

L2_EPS = 1e-6  # inside the square root, as FLA; ORT GatedDeltaNet uses 1e-12 (below tolerance here)


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


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
        """Current state as float32 arrays in the graphs' layouts (batch dim 1), by past name;
        KV caches cut to `capacity` rows when given (a smaller graph of the same model)."""
        out = {}
        for n, a in self.state.items():
            if capacity is not None and n.startswith("past_key_values."):
                a = a[:, :capacity]
            out[n] = a[None].astype(np.float32)
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
            x = x + (silu(xn @ w[p + "gate_proj"]) * (xn @ w[p + "up_proj"])) @ w[p + "down_proj"]
        self.position += t
        if not logits:
            return None
        x = rms_norm(x, w["final_norm"], cfg.rms_eps)
        head = w["embed_tokens"].T if cfg.tied_embeddings else w["lm_head"]
        return x @ head

    def _attention(self, i: int, xn: np.ndarray, positions: np.ndarray) -> np.ndarray:
        cfg, w, p = self.cfg, self.w, f"layers.{i}."
        t, d = len(positions), cfg.head_dim
        q = (xn @ w[p + "q_proj"]).reshape(t, cfg.q_heads, d)
        k = (xn @ w[p + "k_proj"]).reshape(t, cfg.kv_heads, d)
        v = (xn @ w[p + "v_proj"]).reshape(t, cfg.kv_heads, d)
        ang = rope_angles(positions, d, cfg.rope_theta)
        q, k = apply_rope(q, ang), apply_rope(k, ang)
        kc, vc = self.state[f"past_key_values.{i}.key"], self.state[f"past_key_values.{i}.value"]
        kc[:, positions] = k.transpose(1, 0, 2)
        vc[:, positions] = v.transpose(1, 0, 2)
        end = positions[-1] + 1
        rep = cfg.q_heads // cfg.kv_heads
        keys = np.repeat(kc[:, :end], rep, axis=0)  # (Hq, end, D)
        vals = np.repeat(vc[:, :end], rep, axis=0)
        scores = np.einsum("thd,hsd->hts", q, keys) / np.sqrt(d)
        causal = np.arange(end)[None, :] <= positions[:, None]  # (t, end)
        scores = np.where(causal[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = np.einsum("hts,hsd->thd", probs, vals).reshape(t, cfg.q_heads * d)
        return out @ w[p + "o_proj"]

    def _gdn(self, i: int, xn: np.ndarray, positions: np.ndarray) -> np.ndarray:
        cfg, w, p = self.cfg, self.w, f"layers.{i}."
        t = len(positions)
        hk, hv, dk, dv = cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim, cfg.gdn_v_dim
        q = l2_normalize((xn @ w[p + "q_proj"]).reshape(t, hk, dk))
        k = l2_normalize((xn @ w[p + "k_proj"]).reshape(t, hk, dk))
        v = (xn @ w[p + "v_proj"]).reshape(t, hv, dv)
        g = -np.exp(w[p + "A_log"]) * softplus(xn @ w[p + "a_proj"] + w[p + "dt_bias"])
        beta = 1.0 / (1.0 + np.exp(-(xn @ w[p + "b_proj"])))
        name = f"past_state.{i}"
        s = self.state[name]
        outs = []
        for j in range(t):
            o, s = gdn_step(s, q[j], k[j], v[j], g[j], beta[j], 1.0 / np.sqrt(dk))
            outs.append(o.reshape(-1))
        self.state[name] = s
        return np.stack(outs) @ w[p + "o_proj"]
