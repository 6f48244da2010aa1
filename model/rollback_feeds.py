"""What a page feeds the deferred-commit export (``export(..., rollback="deferred")``, issue
31) and how its pairs map to the reference's state, so a speculative loop can roll a hybrid
model back to m of K verified tokens on the proposal's stateful graph with no new API.

The graph's GDN layers carry three pairs each (``cache_specs``):

- ``past_state.i`` [1, Hv, Dv, Dk]: the committed state, from before the last verify;
- ``past_state_update.i`` [1, K * row]: that verify's capsule (decays [K, Hv], normalised keys
  [K, Hk, Dk], deltas [K, Hv, Dv], ORT GatedDeltaNet's ``state_update`` layout), replayed over
  its first ``accepted_count`` tokens at the start of the next dispatch;
- ``past_conv_state.i`` [1, R, C], R = kernel - 1 + K: the conv inputs of positions
  P0 - (kernel - 1) .. P0 + K - 1 of the last dispatch at P0, oldest first; the next dispatch
  reads its window from rows ``accepted_count`` .. ``accepted_count`` + kernel - 2.

Both roll back by the one input ``accepted_count`` (int64 [1]): the kept count of the
previous verify, K after an ordinary step, 0 after a reset or after the state was loaded
(``load``). Attention KV rows roll back by position, as in every K-token graph: the page's
next dispatch is at P0 + m, the rows beyond it masked and overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.webnn.rollback_names import ACCEPTED, capsule_name
from model.workload import GDN, CacheSpec, ModelConfig, cache_specs

#: the deferred export's inputs besides the ordinary graph's (ids, positions, caches)
NAMES = (ACCEPTED,)


def capsule_row(cfg: ModelConfig) -> int:
    """Floats of one token's capsule entry: its decays, key and delta."""
    return (cfg.gdn_v_heads + cfg.gdn_qk_heads * cfg.gdn_qk_dim
            + cfg.gdn_v_heads * cfg.gdn_v_dim)


def ring_rows(cfg: ModelConfig, k: int) -> int:
    """R, the conv input rows the pair keeps: the window of kernel - 1 plus the K new."""
    return cfg.gdn_conv_kernel - 1 + k



def cache_specs_deferred(cfg: ModelConfig, capacity: int, k: int) -> list[CacheSpec]:
    """The deferred export's pairs, in graph order: the ordinary pairs (``cache_specs``,
    V-major states) with each conv window as its R rows, and each GDN layer's capsule
    after its state."""
    out: list[CacheSpec] = []
    for s in cache_specs(cfg, capacity):
        if s.input.startswith("past_conv_state."):
            s = CacheSpec(s.input, s.output, (1, ring_rows(cfg, k), cfg.gdn_conv_dim), s.kind,
                          s.layer)
        out.append(s)
        if s.input.startswith("past_state."):
            past, present = capsule_name(s.layer)
            out.append(CacheSpec(past, present, (1, k * capsule_row(cfg)), "overwrite", s.layer))
    return out


def feeds(name: str, position: int, k: int, accepted: int) -> np.ndarray:
    """The value of the deferred input ``name`` for a dispatch of K tokens at ``position``
    after the previous verify kept ``accepted`` (K after an ordinary step, 0 after a reset
    or a ``load``). ValueError for a name not in NAMES or a count outside 0..K."""
    if name != ACCEPTED:
        raise ValueError(f"{name!r} is not an input of the deferred export ({', '.join(NAMES)})")
    if not 0 <= accepted <= k:
        raise ValueError(f"accepted {accepted}: the previous verify's kept tokens, 0..{k}")
    return np.array([accepted], np.int64)


def load(cfg: ModelConfig, cache: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """The deferred pairs' values for a state in the reference's layout (``cache_specs``,
    by past name, batch dim 1, as ``Reference.cache_arrays``): the conv window in rows
    0 .. kernel - 2 of its R rows, the capsule zeros; the next dispatch's accepted_count is 0."""
    out = dict(cache)
    for i in cfg.gdn_layers:
        if cfg.gdn_conv_kernel:
            name = f"past_conv_state.{i}"
            window = np.asarray(cache[name], np.float32)[0].T  # (kernel-1, C), oldest first
            rows = np.zeros((1, ring_rows(cfg, k), cfg.gdn_conv_dim), np.float32)
            rows[0, :len(window)] = window
            out[name] = rows
        out[capsule_name(i)[0]] = np.zeros((1, k * capsule_row(cfg)), np.float32)
    return out


def committed(cfg: ModelConfig, pairs: dict[str, np.ndarray], accepted: int, k: int
              ) -> dict[str, np.ndarray]:
    """The state the deferred pairs hold once their commit is made, in the reference's
    layout (float64): each recurrent state replayed over the first ``accepted`` capsule
    tokens (S = decay S + delta key^T), each conv window rows accepted .. accepted +
    kernel - 2. What the next dispatch starts from (tests and checks)."""
    hk, hv, dk, dv = cfg.gdn_qk_heads, cfg.gdn_v_heads, cfg.gdn_qk_dim, cfg.gdn_v_dim
    out = {n: np.asarray(a, np.float64) for n, a in pairs.items()
           if not n.startswith("past_state_update.")}
    for i, kind in enumerate(cfg.layers):
        if kind != GDN:
            continue
        cap = np.asarray(pairs[capsule_name(i)[0]], np.float64).reshape(-1)
        dec = cap[:k * hv].reshape(k, hv)
        key = cap[k * hv:k * (hv + hk * dk)].reshape(k, hk, dk)
        dl = cap[k * (hv + hk * dk):].reshape(k, hv, dv)
        s = out[f"past_state.{i}"][0].copy()
        heads = np.arange(hv) * hk // hv
        for j in range(accepted):
            s = s * dec[j][:, None, None] + dl[j][:, :, None] * key[j][heads][:, None, :]
        out[f"past_state.{i}"] = s[None]
        if cfg.gdn_conv_kernel:
            name = f"past_conv_state.{i}"
            rows = out[name][0, accepted:accepted + cfg.gdn_conv_kernel - 1]
            out[name] = rows.T[None]
    return out


@dataclass(frozen=True)
class ExportDeferred:
    """statebench's deferred export's state hand-over (``load``, ``committed`` at its
    config and K), with the methods a rewritten model's ``deferred_commit.DeferredGraph``
    has, so a backend holds one of either and asks it the same two things."""

    cfg: ModelConfig
    k: int

    def load(self, cache: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return load(self.cfg, cache, self.k)

    def committed(self, pairs: dict[str, np.ndarray], accepted: int) -> dict[str, np.ndarray]:
        return committed(self.cfg, pairs, accepted, self.k)
