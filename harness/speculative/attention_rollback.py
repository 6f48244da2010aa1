"""Attention layers' rollback: the verify pass appends K rows after the valid length P;
checkpoints and compact capture roll back by moving the valid length to P + m, snapshot and
recompute re-feeds the m accepted tokens."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.speculative.counters import SpecBytes
from harness.speculative.drafts import AttentionShape

ATTENTION_STRATEGIES = ("snapshot_recompute", "dense_checkpoints", "compact_replay")


@dataclass
class KVCache:
    """K and V rows [kv_heads, capacity, head_dim] and the valid length."""

    k: np.ndarray
    v: np.ndarray
    length: int

    def append(self, k_rows: np.ndarray, v_rows: np.ndarray, b: SpecBytes) -> None:
        """Attention for the new tokens: writes their rows, reads every valid row (P + n)."""
        n = k_rows.shape[1]
        b.inputs_read += k_rows.nbytes + v_rows.nbytes
        self.k[:, self.length:self.length + n] = k_rows
        self.v[:, self.length:self.length + n] = v_rows
        self.length += n
        b.state_written += k_rows.nbytes + v_rows.nbytes
        b.state_read += self.k[:, :self.length].nbytes + self.v[:, :self.length].nbytes

    def truncate(self, length: int) -> None:
        """Rollback: the rows stay where they are; only the valid length moves (no bytes)."""
        self.length = length


@dataclass(frozen=True)
class AttentionDraft:
    shape: AttentionShape
    prefix_k: np.ndarray  # [kv_heads, P, head_dim]
    prefix_v: np.ndarray
    k: np.ndarray  # [kv_heads, K, head_dim]
    v: np.ndarray

    @property
    def draft_len(self) -> int:
        return self.k.shape[1]

    def fresh_cache(self) -> KVCache:
        kvh, p, hd = self.prefix_k.shape
        cap = p + self.draft_len
        c = KVCache(np.zeros((kvh, cap, hd), np.float32), np.zeros((kvh, cap, hd), np.float32), p)
        c.k[:, :p], c.v[:, :p] = self.prefix_k, self.prefix_v
        return c


def make_attention_draft(shape: AttentionShape, k: int, depth: int, seed: int = 0) -> AttentionDraft:
    rng = np.random.default_rng(seed)

    def rows(n):
        return rng.standard_normal((shape.kv_heads, n, shape.head_dim), dtype=np.float32)

    return AttentionDraft(shape, rows(depth), rows(depth), rows(k), rows(k))


def attention_oracle(d: AttentionDraft, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The valid K and V rows after feeding the prefix and only the first m draft tokens."""
    return (np.concatenate([d.prefix_k, d.k[:, :m]], axis=1),
            np.concatenate([d.prefix_v, d.v[:, :m]], axis=1))


def attention_strategy(name: str) -> Callable[[AttentionDraft, int], tuple[KVCache, SpecBytes]]:
    def run(d: AttentionDraft, m: int) -> tuple[KVCache, SpecBytes]:
        b = SpecBytes()
        c = d.fresh_cache()
        p = c.length
        c.append(d.k, d.v, b)  # verify: K rows after the valid length
        if name == "snapshot_recompute":
            if m == d.draft_len:
                return c, b
            # the "snapshot" of an append cache is its valid length: rows < P are never written
            c.truncate(p)
            if m:
                c.append(d.k[:, :m], d.v[:, :m], b)  # re-feed the accepted tokens
        else:  # checkpoints and compact capture: the K new rows are their own checkpoints
            c.truncate(p + m)
        return c, b

    return run
