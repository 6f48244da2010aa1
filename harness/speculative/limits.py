"""What a `statebench speculative` run may ask for, checked before anything is allocated: a draft
length ORT's capsule can hold, and sizes whose arrays fit in this machine's memory."""

from __future__ import annotations

from harness.draft_limits import MAX_DRAFT
from harness.memory import available_memory_bytes
from harness.metrics import human_bytes
from harness.speculative.counters import F32
from harness.speculative.drafts import layer_shapes
from model.errors import UserError
from model.workload import ModelConfig, preset

#: the small objects a measurement makes besides its arrays (rows, cells, closures, and what
#: the process allocates meanwhile: 1 MiB was 0.2 MB short on a fresh 2-core box)
SLACK_BYTES = 4 << 20


def attention_peak_bytes(row_bytes: int, k: int, depth: int) -> int:
    """An attention shape's arrays alive at once: the prefix's K and V rows, the cache a
    strategy returned, the cache being timed and the oracle's rows, each up to depth + K rows,
    and the K draft rows."""
    return (4 * (depth + k) + k) * row_bytes + SLACK_BYTES


def gdn_peak_bytes(state_bytes: int, capsule_row_bytes: int, k: int) -> int:
    """A GDN shape's arrays alive at once: the state, its float64 oracle (two states' bytes),
    a live copy and a snapshot, K checkpoints returned and K being timed, and the capsule."""
    return (2 * k + 5) * state_bytes + k * capsule_row_bytes + SLACK_BYTES


def peak_bytes(cfg: ModelConfig, k: int, depth: int) -> tuple[int, int]:
    """(attention, GDN) bytes the measurement holds at once for the preset's largest layer
    shapes: the layers are measured one shape at a time."""
    gdn, attn = layer_shapes(cfg)
    return (max((attention_peak_bytes(sh.row_bytes, k, depth) for sh in attn), default=0),
            max((gdn_peak_bytes(sh.state_bytes, sh.capsule_row_floats * F32, k) for sh in gdn),
                default=0))


def check_args(preset_name: str, k: int, reps: int, depth: int) -> ModelConfig:
    """The preset, after refusing a K, repetition count or depth the run cannot do, with one
    line saying which flag and why."""
    cfg = preset(preset_name)
    if not 1 <= k <= MAX_DRAFT:
        raise UserError(f"--k {k}: draft length must be in 1..{MAX_DRAFT} "
                        f"(ORT GatedDeltaNet's state_update_capacity is at most {MAX_DRAFT})")
    if reps < 1:
        raise UserError(f"--reps {reps}: must be at least 1")
    if depth < 1:
        raise UserError(f"--depth {depth}: must be at least 1")
    attention, gdn = peak_bytes(cfg, k, depth)
    available = available_memory_bytes()
    if available is not None and max(attention, gdn) > available:
        flag = f"--depth {depth}" if attention >= gdn else f"--preset {cfg.name}"
        raise UserError(f"{flag}: the measurement would hold about {human_bytes(max(attention, gdn))}"
                        f" at once, more than the {human_bytes(available)} of memory available here")
    return cfg
