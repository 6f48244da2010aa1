"""The one byte-counter type (DESIGN §7), shared by the WebNN context and every backend."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields


@dataclass
class ByteCounters:
    """Bytes moved, by category, added at the call that moves them."""

    h2d: int = 0  # host -> device uploads (write_tensor, write_buffer, OrtValue updates)
    d2h: int = 0  # device -> host downloads (read_tensor, status readbacks, outputs to host)
    d2d: int = 0  # device -> device copies outside kernels (copy_buffer_to_buffer, ORT copies)
    kernel: int = 0  # bytes kernels read + write, from the graph's shapes

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)

    def snapshot(self) -> ByteCounters:
        """A frozen-in-time copy (attribute access, e.g. `snapshot().kernel`)."""
        return copy.copy(self)  # not asdict: it deep-copies, twice a decode step

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def add(self, other: ByteCounters) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def since(self, before: ByteCounters) -> ByteCounters:
        """What was counted after `before` was taken."""
        return ByteCounters(**{f.name: getattr(self, f.name) - getattr(before, f.name)
                               for f in fields(self)})
