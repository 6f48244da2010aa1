"""GDN rollback strategies: each returns the final state for acceptance m and the bytes
it moved (snapshot and recompute, dense checkpoints, compact capture and replay in NumPy or
ORT), and which of them can run here."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from harness.speculative.counters import SpecBytes
from harness.speculative.drafts import Draft, GdnShape
from harness.speculative.gdn_numpy import copy_state, gdn_verify, replay_numpy
from harness.speculative.gdn_ort import OrtVerify, WebGpuReplay, webgpu_devices

GDN_STRATEGIES = ("snapshot_recompute", "dense_checkpoints", "compact_replay",
                  "compact_replay_ort_cpu", "compact_replay_ort_webgpu")


Outcome = tuple[np.ndarray, SpecBytes]


def snapshot_recompute(d: Draft, m: int) -> Outcome:
    b = SpecBytes()
    k = d.draft_len
    snapshot = copy_state(d.state0, b)
    live, _, _ = gdn_verify(d.state0, d, k, b)  # in place on the live state
    if m == k:
        return live, b
    if m == 0:
        return copy_state(snapshot, b), b
    live, _, _ = gdn_verify(snapshot, d, m, b)  # re-feed from the snapshot into the live row
    return live, b


def dense_checkpoints(d: Draft, m: int) -> Outcome:
    b = SpecBytes()
    _, ckpt, _ = gdn_verify(d.state0, d, d.draft_len, b, checkpoints=True)
    if m == 0:
        return d.state0, b  # the live state was never written
    return copy_state(ckpt[m - 1], b), b


def compact_replay(d: Draft, m: int) -> Outcome:
    b = SpecBytes()
    k = d.draft_len
    final, _, capsule = gdn_verify(d.state0, d, k, b, capture=True)  # into the inactive row
    return _accept_compact(d, m, final, capsule, b, lambda s, c, n: replay_numpy(s, c, d.shape, k, n, b))


def _accept_compact(d: Draft, m: int, final, capsule, b: SpecBytes, replay) -> Outcome:
    """m == K: the inactive row (verify's final state) becomes live; m == 0: the source row
    stays live; otherwise replay m transitions from the source into the inactive row."""
    if m == d.draft_len:
        return final, b
    if m == 0:
        return d.state0, b
    return replay(d.state0, capsule, m), b


def compact_replay_ort(verify: OrtVerify, replayer: WebGpuReplay | None = None):
    """The compact strategy with ORT's GatedDeltaNet as the verify pass; the replay in NumPy
    (CPU EP) or with GatedDeltaNetStateReplay (`replayer`, WebGPU EP)."""

    def strategy(d: Draft, m: int) -> Outcome:
        b = SpecBytes()
        k = d.draft_len
        final, capsule = verify.run(d.state0, d, k, b)
        if replayer is None:
            return _accept_compact(d, m, final, capsule, b,
                                   lambda s, c, n: replay_numpy(s, c, d.shape, k, n, b))
        return _accept_compact(d, m, final, capsule, b, lambda s, c, n: replayer.run(s, c, n, b))

    return strategy


def gdn_strategies(sh: GdnShape, k: int) -> dict[str, tuple[Callable | None, str]]:
    """name -> (strategy, why unavailable)."""
    out: dict[str, tuple[Callable | None, str]] = {
        "snapshot_recompute": (snapshot_recompute, ""),
        "dense_checkpoints": (dense_checkpoints, ""),
        "compact_replay": (compact_replay, ""),
    }
    try:
        out["compact_replay_ort_cpu"] = (compact_replay_ort(OrtVerify(sh, k)), "")
    except Exception as exc:  # noqa: BLE001 - an EP that cannot build is a reason
        out["compact_replay_ort_cpu"] = (None, f"ORT CPU GatedDeltaNet: {type(exc).__name__}: {exc}")
    devices, why = webgpu_devices()
    if not devices:
        out["compact_replay_ort_webgpu"] = (None, why)
    else:
        try:
            out["compact_replay_ort_webgpu"] = (
                compact_replay_ort(OrtVerify(sh, k, "webgpu"), WebGpuReplay(sh, k)), "")
        except Exception as exc:  # noqa: BLE001
            out["compact_replay_ort_webgpu"] = (None, f"{type(exc).__name__}: {exc}")
    return out
