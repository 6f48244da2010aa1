"""Speculative decoding with compact state updates (DESIGN §8): strategies, bytes, time, checks.

A draft of K tokens is verified in one dispatch; m ≤ K are accepted; the state must end as if
only the m accepted tokens had been fed. Per layer kind:

GDN layers (recurrent state S [Hv, Dv, Dk], overwritten by every token):
- `snapshot_recompute`: copy S before verify; verify in place; when m < K, re-feed the m
  accepted tokens from the snapshot (m == 0: copy the snapshot back).
- `dense_checkpoints`: the verify pass writes the state after every token to a [K, ...]
  checkpoint buffer and leaves the live state alone; keep checkpoint m (one state copy).
- `compact_replay`: the verify pass reads S from one state row, writes its final state to the
  other (inactive) row and captures per-token (decay, key, delta) in a capsule (ORT
  GatedDeltaNet's `state_update`); m == K keeps the final row, m == 0 keeps the source row,
  otherwise `S *= decay_t; S += outer(key_t, delta_t)` is replayed for t < m from the source row
  into the inactive row (ORT GatedDeltaNetStateReplay). No whole-state copy at all.
  Engines: NumPy (float32), ORT's GatedDeltaNet on the CPU EP as the verify pass (its capsule
  replayed in NumPy), and the whole thing on ORT's WebGPU EP (GatedDeltaNet then
  GatedDeltaNetStateReplay), only where the WebGPU plugin EP finds a device.

Attention layers (KV rows, appended): the verify pass appends K rows after the valid length P;
the accepted rows are the first m of them, so checkpoints and compact capture roll back by
moving the valid length to P + m (no bytes); snapshot-and-recompute re-feeds the m tokens,
which rewrites their rows and re-reads the P + m valid rows.

Bytes are counted where they move, in `SpecBytes`, by the functions that move them
(`copy_state`, `gdn_verify`, `replay_numpy`, ...); tests check them against the closed forms.
Every final state is checked against a float64 oracle that feeds only the m accepted tokens
with `model.reference.gdn_step`.

One module per job, in the order they build on each other: `counters` (SpecBytes), `drafts`
(layer shapes, draft inputs, the float64 oracle), `gdn_numpy` and `gdn_ort` (the engines),
`gdn_rollback` and `attention_rollback` (the strategies), `limits` (what a run may ask for),
`measure` (the plain-data result) and `render` (tables and notes). The names below are the
package's public face, used by `harness.commands.speculative` and the tests.
"""

from harness.draft_limits import MAX_DRAFT
from harness.speculative.attention_rollback import (
    ATTENTION_STRATEGIES,
    AttentionDraft,
    KVCache,
    attention_oracle,
    attention_strategy,
    make_attention_draft,
)
from harness.speculative.counters import CAPTURE_COUNT_BYTES, F32, REPLAY_METADATA_BYTES, SpecBytes
from harness.speculative.drafts import (
    AttentionShape,
    Draft,
    GdnShape,
    layer_shapes,
    make_draft,
    oracle_state,
    rel_err,
)
from harness.speculative.gdn_numpy import capsule_views, copy_state, gdn_verify, replay_numpy
from harness.speculative.gdn_ort import (
    OrtVerify,
    WebGpuReplay,
    replay_metadata,
    replay_model,
    verify_model,
    webgpu_devices,
)
from harness.speculative.gdn_rollback import (
    GDN_STRATEGIES,
    Outcome,
    compact_replay,
    compact_replay_ort,
    dense_checkpoints,
    gdn_strategies,
    snapshot_recompute,
)
from harness.speculative.limits import check_args, peak_bytes
from harness.speculative.measure import (
    SCHEMA,
    TOLERANCE,
    Cell,
    LayerResult,
    measure,
    measure_attention,
    measure_gdn,
)
from harness.speculative.render import SHORT, notes, tables

__all__ = [
    "ATTENTION_STRATEGIES", "CAPTURE_COUNT_BYTES", "F32", "GDN_STRATEGIES", "MAX_DRAFT",
    "REPLAY_METADATA_BYTES", "SCHEMA", "SHORT", "TOLERANCE", "AttentionDraft", "AttentionShape",
    "Cell", "Draft", "GdnShape", "KVCache", "LayerResult", "OrtVerify", "Outcome", "SpecBytes",
    "WebGpuReplay", "attention_oracle", "attention_strategy", "capsule_views", "check_args",
    "compact_replay", "compact_replay_ort", "copy_state", "dense_checkpoints", "gdn_strategies",
    "gdn_verify", "layer_shapes", "make_attention_draft", "make_draft", "measure",
    "measure_attention", "measure_gdn", "notes", "oracle_state", "peak_bytes", "rel_err",
    "replay_metadata", "replay_model", "replay_numpy", "snapshot_recompute", "tables",
    "verify_model", "webgpu_devices",
]
