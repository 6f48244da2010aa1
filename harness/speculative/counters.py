"""The bytes a speculative step moves, counted by category where they move."""

from __future__ import annotations

from dataclasses import asdict, dataclass

F32 = 4
REPLAY_METADATA_BYTES = 11 * 8  # GatedDeltaNetStateReplay's int64[11] metadata, on the CPU
CAPTURE_COUNT_BYTES = 4  # GatedDeltaNet's capture_count int32 [batch=1]


@dataclass
class SpecBytes:
    """Bytes one speculative step moves, by category, added by the operation that moves them.

    If the state lived on a device: `state_*` and `capsule_*` are device memory traffic of
    kernels, `state_copied` device→device copies (counted once, as `ByteCounters.d2d`), `h2d`
    and `d2h` what crosses the host link (control inputs only: no strategy moves a state
    across it). `inputs_read` are the draft tokens' q/k/v/decay/beta a kernel reads.
    """

    state_read: int = 0
    state_written: int = 0
    state_copied: int = 0
    capsule_written: int = 0
    capsule_read: int = 0
    inputs_read: int = 0
    h2d: int = 0
    d2h: int = 0

    @property
    def traffic(self) -> int:
        """Device memory traffic: a copy reads and writes its bytes."""
        return (self.state_read + self.state_written + 2 * self.state_copied
                + self.capsule_written + self.capsule_read + self.inputs_read)

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "traffic": self.traffic}
