"""Tensors between a front end and the model process: shared-memory slots the front end owns.

A front end copies a request's decoded input tensors into a *slot* (a POSIX shared-memory segment,
``/dev/shm/unideploy-frontend-PID-N``) and sends the model process where each lies (``Slotted``).
The model process maps the slot once and runs the model on views of it; it writes the outputs
into the same slot after the inputs, when they fit (``Inline`` bytes in the answer otherwise), and
the front end encodes the response from views of them before the slot is reused. That is one copy
of each tensor on each side and no pickled array: what issue 44 asked for. A slot's name is
unlinked once the model process has mapped it, so a killed front end leaves nothing in /dev/shm
but slots no request had reached yet, which the next front end's start removes.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from unideploy.package.files import temp_prefix
from unideploy.server.unread import Unaligned

SHM_ROOT = Path("/dev/shm")
PREFIX = "unideploy-frontend-"
MIN_SLOT_BYTES = 64 * 1024
KEPT_FREE = 16  # idle slots a front end keeps for reuse; more are given back to the system
ALIGN = 64


def aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Slotted:
    """A tensor in a slot: where it starts, its dtype (``numpy.dtype.str``) and shape."""

    offset: int
    dtype: str
    shape: tuple[int, ...]

    def view(self, mapped: mmap.mmap) -> np.ndarray:
        return np.ndarray(self.shape, np.dtype(self.dtype), buffer=mapped, offset=self.offset)


@dataclass(frozen=True)
class Inline:
    """An output that did not fit its slot, carried in the answer as bytes."""

    data: bytes
    dtype: str
    shape: tuple[int, ...]

    def view(self) -> np.ndarray:
        return np.frombuffer(self.data, np.dtype(self.dtype)).reshape(self.shape)


def put(mapped: mmap.mmap, offset: int, array: np.ndarray | Unaligned) -> Slotted:
    """Copy ``array`` into ``mapped`` at ``offset`` (the one copy of its side)."""
    placed = Slotted(offset, array.dtype.str, tuple(array.shape))
    if isinstance(array, Unaligned):
        array.into(placed.view(mapped))
    else:
        placed.view(mapped)[...] = array
    return placed


class Slot:
    """One shared-memory segment a front end created; ``mapped`` is its memory."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name, self.capacity = name, capacity
        fd = os.open(SHM_ROOT / name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, capacity)
            self.mapped = mmap.mmap(fd, capacity)
        finally:
            os.close(fd)
        self.linked = True  # its name is in /dev/shm until the model process has mapped it

    def unlink(self) -> None:
        if self.linked:
            (SHM_ROOT / self.name).unlink(missing_ok=True)
            self.linked = False


class SlotPool:
    """A front end's slots: taken for a request, given back once its response is encoded."""

    def __init__(self) -> None:
        self._prefix = temp_prefix(SHM_ROOT, PREFIX, "")  # also removes what dead front ends left
        self._made = 0
        self._free: list[Slot] = []
        self.retired: list[str] = []  # slots given back to the system, for the model process to unmap

    def take(self, size: int) -> Slot:
        """A free slot of at least ``size`` bytes (the smallest), or a new one of twice that
        (room for the outputs after the inputs) rounded up to a power of two."""
        fitting = [s for s in self._free if s.capacity >= size]
        if fitting:
            slot = min(fitting, key=lambda s: s.capacity)
            self._free.remove(slot)
            return slot
        self._made += 1
        capacity = max(MIN_SLOT_BYTES, 1 << (2 * size - 1).bit_length())
        return Slot(f"{self._prefix}{self._made}", capacity)

    def give(self, slot: Slot) -> None:
        self._free.append(slot)
        if len(self._free) > KEPT_FREE:
            dropped = min(self._free, key=lambda s: s.capacity)
            self._free.remove(dropped)
            self._retire(dropped)

    def _retire(self, slot: Slot) -> None:
        slot.unlink()
        self.retired.append(slot.name)  # its memory goes once the model process unmaps it too

    def close(self) -> None:
        for slot in self._free:
            slot.unlink()
        self._free.clear()


class SlotMaps:
    """The model process's mappings of one front end's slots, by name."""

    def __init__(self, pid: int) -> None:
        self.prefix = f"{PREFIX}{pid}-"
        self._mapped: dict[str, mmap.mmap] = {}

    def get(self, name: str) -> mmap.mmap:
        found = self._mapped.get(name)
        if found is None:
            if not name.startswith(self.prefix) or "/" in name:
                raise ValueError(f"slot {name!r} is not one of this front end's")
            fd = os.open(SHM_ROOT / name, os.O_RDWR | os.O_NOFOLLOW)
            try:
                found = self._mapped[name] = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
        return found

    def forget(self, name: str) -> None:
        """Drop a retired slot's mapping (it unmaps once no view of it is left)."""
        self._mapped.pop(name, None)
