"""The one byte-counter type (DESIGN §7), shared by the WebNN context and every backend."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class ByteCounters:
    """Bytes moved, by category, added at the call that moves them."""

    h2d: int = 0  # host -> device uploads (write_tensor, write_buffer, OrtValue updates)
    d2h: int = 0  # device -> host downloads (read_tensor, status readbacks, outputs to host)
    d2d: int = 0  # device -> device copies outside kernels (copy_buffer_to_buffer, ORT copies)
    kernel: int = 0  # bytes kernels read + write, from the graph's shapes

    def reset(self) -> None:
        for name in _NAMES:
            setattr(self, name, 0)

    def snapshot(self) -> ByteCounters:
        """A frozen-in-time copy (attribute access, e.g. `snapshot().kernel`)."""
        # by name: copy.copy (and asdict, which deep-copies) cost µs, twice a decode step
        return ByteCounters(self.h2d, self.d2h, self.d2d, self.kernel)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def add(self, other: ByteCounters) -> None:
        # by name, not dataclasses.fields: a page adds twice a decode step
        self.h2d += other.h2d
        self.d2h += other.d2h
        self.d2d += other.d2d
        self.kernel += other.kernel

    def since(self, before: ByteCounters) -> ByteCounters:
        """What was counted after `before` was taken."""
        return ByteCounters(self.h2d - before.h2d, self.d2h - before.d2h,
                            self.d2d - before.d2d, self.kernel - before.kernel)


#: the counters' names, in field order
_NAMES = tuple(f.name for f in fields(ByteCounters))
assert _NAMES == ("h2d", "d2h", "d2d", "kernel"), "ByteCounters.add and .since name each counter"
