"""The GDN operations of the NumPy strategies, each adding the bytes it moves to a
`SpecBytes`: a whole-state copy, the verify pass (with checkpoints or a compact capsule) and
the capsule's replay."""

from __future__ import annotations

import numpy as np

from harness.speculative.counters import CAPTURE_COUNT_BYTES, F32, REPLAY_METADATA_BYTES, SpecBytes
from harness.speculative.drafts import Draft, GdnShape


def copy_state(src: np.ndarray, b: SpecBytes) -> np.ndarray:
    """A device→device copy of a whole state (snapshot, restore, keep a checkpoint)."""
    out = src.copy()
    b.state_copied += out.nbytes
    return out


def gdn_verify(state: np.ndarray, d: Draft, n: int, b: SpecBytes, checkpoints: bool = False,
               capture: bool = False) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Feed draft tokens 0..n-1 in one dispatch (float32 NumPy, the GDN recurrence).

    Reads `state` once and the n tokens' inputs; writes the final state, or with
    `checkpoints` the state after every token into a [n, Hv, Dv, Dk] buffer (the last is the
    final state); with `capture` also the compact capsule (capacity n, ORT's layout).
    Returns (final state, checkpoints or None, capsule or None); `state` is not modified.
    """
    sh = d.shape
    rep = sh.hv // sh.hk
    b.state_read += state.nbytes
    b.inputs_read += n * sh.token_input_bytes
    s = state.copy()  # registers of the kernel: not traffic
    ckpt = np.empty((n,) + state.shape, np.float32) if checkpoints else None
    capsule = np.zeros(n * sh.capsule_row_floats, np.float32) if capture else None
    decay_c, key_c, delta_c = capsule_views(capsule, sh, n) if capture else (None, None, None)
    for t in range(n):
        kk = np.repeat(d.kn[t], rep, axis=0)  # [Hv, Dk]
        decay = np.exp(d.g[t])
        s *= decay[:, None, None]
        delta = d.beta[t][:, None] * (d.v[t] - np.einsum("hvk,hk->hv", s, kk))
        s += delta[:, :, None] * kk[:, None, :]
        if checkpoints:
            ckpt[t] = s
        if capture:
            decay_c[t], key_c[t], delta_c[t] = decay, d.kn[t], delta
    if checkpoints:
        b.state_written += ckpt.nbytes
    else:
        b.state_written += s.nbytes
    if capture:
        b.capsule_written += capsule.nbytes
        b.h2d += CAPTURE_COUNT_BYTES
    return s, ckpt, capsule


def capsule_views(capsule: np.ndarray, sh: GdnShape, capacity: int):
    """decay [C, Hv], key [C, Hk, Dk], delta [C, Hv, Dv] views of one struct-of-arrays row."""
    a = capacity * sh.hv
    b = a + capacity * sh.hk * sh.dk
    return (capsule[:a].reshape(capacity, sh.hv), capsule[a:b].reshape(capacity, sh.hk, sh.dk),
            capsule[b:b + capacity * sh.hv * sh.dv].reshape(capacity, sh.hv, sh.dv))


def replay_numpy(source: np.ndarray, capsule: np.ndarray, sh: GdnShape, capacity: int,
                 kept: int, b: SpecBytes) -> np.ndarray:
    """GatedDeltaNetStateReplay's contract in NumPy: from the pre-verify `source` [Hv, Dv, Dk],
    `S *= decay[t, h]; S[h, v, i] += key[t, hk, i] * delta[t, h, v]` for t < kept, hk =
    h * Hk // Hv, into a new (destination) state. Reads the source and `kept` capsule rows
    (never the unused tail), writes the destination.
    """
    decay, key, delta = capsule_views(capsule, sh, capacity)
    hk_of = np.arange(sh.hv) * sh.hk // sh.hv
    s = source.copy()
    b.state_read += source.nbytes
    for t in range(kept):
        s *= decay[t][:, None, None]
        s += delta[t][:, :, None] * key[t][hk_of][:, None, :]
    b.capsule_read += kept * sh.capsule_row_floats * F32
    b.state_written += s.nbytes
    b.h2d += REPLAY_METADATA_BYTES  # kept_count and offsets, the only host input
    return s
