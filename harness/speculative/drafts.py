"""Layer shapes of a preset, draft tokens' inputs, and the float64 oracle a final state
is checked against (it feeds only the m accepted tokens, with `model.reference.gdn_step`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.speculative.counters import F32
from model.reference import gdn_step, l2_normalize
from model.workload import ModelConfig


@dataclass(frozen=True)
class GdnShape:
    """One GDN layer's head geometry (ORT GatedDeltaNet: state [Hv, Dv, Dk], keys at Hk)."""

    hk: int
    hv: int
    dk: int
    dv: int

    @property
    def state_bytes(self) -> int:
        return self.hv * self.dv * self.dk * F32

    @property
    def capsule_row_floats(self) -> int:
        """Floats one captured transition takes: decay [Hv], key [Hk, Dk], delta [Hv, Dv]."""
        return self.hv + self.hk * self.dk + self.hv * self.dv

    @property
    def token_input_bytes(self) -> int:
        """q, k [Hk, Dk], v [Hv, Dv], decay and beta [Hv] of one token."""
        return (2 * self.hk * self.dk + self.hv * self.dv + 2 * self.hv) * F32

    def label(self) -> str:
        return f"Hk={self.hk} Hv={self.hv} Dk={self.dk} Dv={self.dv}"


@dataclass(frozen=True)
class AttentionShape:
    kv_heads: int
    head_dim: int

    @property
    def row_bytes(self) -> int:
        """One token's K and V rows."""
        return 2 * self.kv_heads * self.head_dim * F32

    def label(self) -> str:
        return f"kv_heads={self.kv_heads} head_dim={self.head_dim}"


def layer_shapes(cfg: ModelConfig) -> tuple[dict[GdnShape, list[int]], dict[AttentionShape, list[int]]]:
    """The distinct GDN and attention shapes of a preset, with the layers that have each."""
    gdn: dict[GdnShape, list[int]] = {}
    attn: dict[AttentionShape, list[int]] = {}
    for i in cfg.gdn_layers:
        gdn.setdefault(GdnShape(cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim,
                                cfg.gdn_v_dim), []).append(i)
    for i in cfg.attention_layers:
        attn.setdefault(AttentionShape(cfg.kv_heads, cfg.head_dim), []).append(i)
    return gdn, attn


@dataclass(frozen=True)
class Draft:
    """K draft tokens' GDN inputs and the pre-verify state (float32, batch dim dropped).

    q, k raw (the kernels L2-normalise; `qn`, `kn` are the normalised float32 copies the NumPy
    kernels use); g is the log-space decay (ORT gate_activation 'none'), beta the effective
    update rate (beta_activation 'none').
    """

    shape: GdnShape
    q: np.ndarray  # [K, Hk, Dk]
    k: np.ndarray  # [K, Hk, Dk]
    v: np.ndarray  # [K, Hv, Dv]
    g: np.ndarray  # [K, Hv]
    beta: np.ndarray  # [K, Hv]
    state0: np.ndarray  # [Hv, Dv, Dk]
    qn: np.ndarray = field(repr=False, default=None)
    kn: np.ndarray = field(repr=False, default=None)

    @property
    def draft_len(self) -> int:
        return len(self.q)


def make_draft(shape: GdnShape, k: int, seed: int = 0) -> Draft:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((k, shape.hk, shape.dk), dtype=np.float32)
    kk = rng.standard_normal((k, shape.hk, shape.dk), dtype=np.float32)
    v = rng.standard_normal((k, shape.hv, shape.dv), dtype=np.float32)
    g = -rng.uniform(0.01, 1.0, (k, shape.hv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (k, shape.hv)).astype(np.float32)
    # a state as a prefix would leave it: O(1) rows, not zeros (zeros would hide decay errors)
    state0 = (0.3 * rng.standard_normal((shape.hv, shape.dv, shape.dk))).astype(np.float32)
    qn = l2_normalize(q.astype(np.float64)).astype(np.float32)
    kn = l2_normalize(kk.astype(np.float64)).astype(np.float32)
    return Draft(shape, q, kk, v, g, beta, state0, qn, kn)


def oracle_state(d: Draft, m: int) -> np.ndarray:
    """float64: the state after feeding only the first m draft tokens (`reference.gdn_step`)."""
    s = d.state0.astype(np.float64)
    q = l2_normalize(d.q.astype(np.float64))
    k = l2_normalize(d.k.astype(np.float64))
    for t in range(m):
        _, s = gdn_step(s, q[t], k[t], d.v[t].astype(np.float64), d.g[t].astype(np.float64),
                        d.beta[t].astype(np.float64), 1.0 / np.sqrt(d.shape.dk))
    return s


def rel_err(state: np.ndarray, oracle: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(oracle))), 1e-30)
    return float(np.max(np.abs(state.astype(np.float64) - oracle))) / scale
