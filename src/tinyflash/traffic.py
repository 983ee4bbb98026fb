"""Counting main-memory (HBM) traffic.

:class:`HBMCounter` is handed to :func:`tinyflash.blocked_attention` (argument ``io``), which
reports each tile it reads from or writes to main memory exactly as the GPU kernel moves them.
"""

from __future__ import annotations

from collections import defaultdict


class HBMCounter:
    """Bytes read from and written to main memory, per tensor name."""

    def __init__(self):
        self.reads = defaultdict(int)  # name -> bytes
        self.writes = defaultdict(int)  # name -> bytes

    def read(self, name: str, tile) -> None:
        self.reads[name] += int(tile.size) * tile.dtype.itemsize

    def write(self, name: str, tile) -> None:
        self.writes[name] += int(tile.size) * tile.dtype.itemsize

    @property
    def bytes_read(self) -> int:
        return sum(self.reads.values())

    @property
    def bytes_written(self) -> int:
        return sum(self.writes.values())

    @property
    def total(self) -> int:
        return self.bytes_read + self.bytes_written

    def __repr__(self) -> str:
        return f"HBMCounter(reads={dict(self.reads)}, writes={dict(self.writes)})"
