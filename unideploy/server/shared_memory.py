"""Triton's system shared memory extension: tensors passed through POSIX shared memory.

A client on the same machine creates a segment (``/dev/shm/KEY``), registers a window of it under a
region name, and names region, offset and size in place of an input's bytes, or of where an output
is to be written. The request then carries no tensor bytes: the server reads the input from the
segment and writes the output into it (``tritonclient.utils.shared_memory`` makes such segments;
``perf_analyzer --shared-memory system`` uses them).

CUDA shared memory (device memory a client exports with cudaIpcGetMemHandle) is the same extension
for tensors in GPU memory: its regions (``server.cuda_shared_memory``) share the names, the window
checks, the reads and the writes with the system ones.

Shared memory is a way into the server's address space, so: registering is authorized like
inference; a key is a plain shared-memory name (letters, digits, ``._-``, one optional leading
``/``), never a path; the segment is opened without following links; every read and write is
checked against the registered window; an operator can turn the extension off
(``--shared-memory off``). A segment is read and written through the descriptor registration
opened (``preadv``, ``pwrite``), never by the CPU through a mapping: the client owns the segment
and may shrink it at any time (``ftruncate``; tritonclient's ``create_shared_memory_region`` does
when a key is made again smaller), and a mapping read past a segment's new end killed the whole
server with SIGBUS. A read or write the segment no longer holds is refused instead (400). For a
model on a GPU a segment is mapped and page-locked (``SystemRegion.reaches_gpu``), and only the
GPU's copy engine reads that mapping, from the locked pages, each copy checked against the
segment's size first. An input is
checked as its request arrives and read when its batch is merged, straight into the batch
(``RegionInput``, ``server.unread``), in a CUDA region as in a system one: as with Triton, a client
must not rewrite an input's window before its response comes.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unideploy.errors import InputError
from unideploy.runtimes import cuda_api
from unideploy.runtimes.pinned import lock_pages, unlock_pages
from unideploy.server import codec
from unideploy.server.cuda_shared_memory import CudaRegion
from unideploy.server.errors import BadRequest, NotFound
from unideploy.server.unread import Unread

log = logging.getLogger("unideploy.server")
SHM_ROOT = "/dev/shm"  # where Linux keeps POSIX shared memory (shm_open's names)
# Each region holds a descriptor (a CUDA one a device mapping) until unregistered: without a bound,
# a client registering regions in a loop would take every descriptor the process may open, and the
# server could accept no connection
MAX_REGIONS = 1024
KEY = re.compile(r"/?[A-Za-z0-9][A-Za-z0-9._-]{0,254}")
REGION_NAME = re.compile(r"[^\x00/]{1,255}")


class RegionInput(Unread):
    """An input in a registered region, read where it is wanted (``unread``)."""

    def __init__(
        self, regions: SharedMemoryRegions, place: Placement, name: str, shape: Sequence[int], dtype: np.dtype
    ) -> None:
        super().__init__(shape, dtype)
        self.regions, self.place, self.name = regions, place, name

    def _into(self, out: memoryview) -> None:
        self.regions.read_into(self.place, out, self.name)

    def reaches_gpu(self, device: int) -> bool:
        return self.regions.reaches_gpu(self.place, device)

    @contextlib.contextmanager
    def on_gpu(self, device: int) -> Iterator[int]:
        """Where GPU ``device`` copies the input from; the region stays open until the block ends."""
        with self.regions.using(self.place, f"input '{self.name}'") as region:
            if not region.reaches_gpu(device):
                raise BadRequest(
                    f"shared memory region '{self.place.region}' was registered again, as other memory, while "
                    f"input '{self.name}' waited to be read",
                    "a region must stay registered as it is until the responses of the requests naming it have come",
                )
            yield region.gpu_source(self.place.offset, self.nbytes)


@dataclass
class SystemRegion:
    """A window of a client's POSIX shared-memory segment, held open until unregistered; for a GPU,
    its segment mapped and page-locked once asked (``reaches_gpu``)."""

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int  # the segment as registration opened it (the one registered, even if the key is reused)
    gpu_problem: str | None = None  # why the GPU cannot copy from the segment, once that was tried
    _mapped: mmap.mmap | None = field(default=None, repr=False)
    _locked: int | None = field(default=None, repr=False)  # the mapping's address, page-locked
    _locking: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reaches_gpu(self, device: int) -> bool:
        """Whether the GPU's copy engine can read the segment directly: mapped here and page-locked
        (``cudaHostRegister``) on first ask. The CPU never reads that mapping (a segment the client
        shrinks would kill the server with SIGBUS there); the copy engine reads the locked pages,
        each copy checked against the segment's size first (``gpu_source``). Where the pages cannot
        be locked, ``gpu_problem`` says why and the window is read through the descriptor."""
        with self._locking:
            if self._locked is None and self.gpu_problem is None:
                self.gpu_problem = self._lock_for_gpu()
                if self.gpu_problem is not None:
                    log.warning(
                        "shared memory region '%s' is read on the host, not copied by GPU %d: %s",
                        self.name,
                        device,
                        self.gpu_problem,
                    )
        return self._locked is not None

    def _lock_for_gpu(self) -> str | None:
        try:
            size = os.fstat(self.fd).st_size
        except OSError as exc:
            return f"the segment cannot be read: {exc.strerror}"
        if size < self.offset + self.byte_size:
            return f"the segment holds {size} bytes, less than the region"
        try:
            mapped = mmap.mmap(self.fd, size)
        except (OSError, ValueError) as exc:
            return f"the segment cannot be mapped: {exc}"
        address = np.frombuffer(mapped, np.uint8).ctypes.data  # the array goes at once: nothing reads it
        why_not = lock_pages(address, size)
        if why_not is not None:
            mapped.close()
            return why_not
        self._mapped, self._locked = mapped, address
        return None

    def gpu_source(self, start: int, nbytes: int) -> int:
        """Where the GPU copies ``nbytes`` from ``start`` of the window (only where ``reaches_gpu``):
        refused as a read through the descriptor is, where the segment no longer holds them."""
        at = self.offset + start
        if self._io(os.fstat, self.fd).st_size < at + nbytes:
            raise self._shrunk(at + nbytes)
        assert self._locked is not None
        return self._locked + at

    def into(self, start: int, out: memoryview) -> None:
        """``len(out)`` bytes from ``start``, copied into ``out``."""
        done, at, nbytes = 0, self.offset + start, len(out)
        while done < nbytes:
            got = self._io(os.preadv, self.fd, [out[done:]], at + done)
            if not got:  # the segment ends before the window does
                raise self._shrunk(at + nbytes)
            done += got

    def write(self, start: int, blob: bytes) -> None:
        at = self.offset + start
        if self._io(os.fstat, self.fd).st_size < at + len(blob):  # never grow a segment the client shrank
            raise self._shrunk(at + len(blob))
        done = 0
        while done < len(blob):
            done += self._io(os.pwrite, self.fd, memoryview(blob)[done:], at + done)

    def _shrunk(self, needed: int) -> BadRequest:
        size = self._io(os.fstat, self.fd).st_size
        return BadRequest(
            f"shared memory region '{self.name}' needs {needed} bytes of segment '{self.key}', which now holds "
            f"{size}: the segment was made smaller after the region was registered",
            "unregister the region and register it again once the segment has its size",
        )

    def _io(self, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as exc:
            raise BadRequest(f"shared memory region '{self.name}' (segment '{self.key}'): {exc.strerror}") from None

    def close(self) -> None:
        if self._locked is not None:
            unlock_pages(self._locked)
            self._locked = None
        if self._mapped is not None:
            self._mapped.close()
        os.close(self.fd)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


Region = SystemRegion | CudaRegion
KINDS: dict[str, type] = {"system": SystemRegion, "cuda": CudaRegion}


@dataclass(frozen=True)
class Placement:
    """Where one tensor lives: a region, an offset into it and a byte count."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass(frozen=True)
class Placed:
    """An input a request placed in shared memory, as decoded: read by the process that holds the
    regions (the dataplane's), which with front-end processes is not the one that decoded it."""

    place: Placement
    datatype: Any
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Written:
    """An output the dataplane wrote into a client's region: what its response entry names in
    place of the tensor's bytes."""

    place: Placement
    datatype: str
    shape: tuple[int, ...]
    byte_size: int

    def parameters(self) -> dict[str, Any]:
        """The output's response parameters, as Triton names them (offset only when not 0)."""
        found: dict[str, Any] = {"shared_memory_region": self.place.region, "shared_memory_byte_size": self.byte_size}
        if self.place.offset:
            found["shared_memory_offset"] = self.place.offset
        return found


class SharedMemoryRegions:
    """The regions registered with one server, of both kinds (system and CUDA) under one set of
    names, as Triton keeps them; all methods may be called from any thread."""

    def __init__(self, mode: str = "system", max_regions: int = MAX_REGIONS) -> None:
        if mode == "cuda" and (why := cuda_api.problem()):  # refused before any port opens
            raise InputError(
                f"--shared-memory cuda needs a CUDA GPU: {why}",
                "start the server with --shared-memory system, or on a GPU machine with the gpu extra",
            )
        self.mode, self.max_regions = mode, max_regions
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()  # guards the names; a region is never closed while it is read or written
        # reads and writes run outside the lock (``using``): the regions in use, by id, with how
        # many users; unregistered ones close when their last user is done
        self._users: dict[int, int] = {}
        self._retired: dict[int, Region] = {}

    def extensions(self) -> tuple[str, ...]:
        """The server metadata's names for the extensions this mode offers."""
        return {"off": (), "system": ("system_shared_memory",)}.get(
            self.mode, ("system_shared_memory", "cuda_shared_memory")
        )

    def _require_on(self, kind: str = "system") -> None:
        if self.mode == "off":
            raise BadRequest(
                "shared memory is turned off on this server",
                "send tensor bytes in the request, or start it with --shared-memory system (or cuda)",
            )
        if kind == "cuda" and self.mode != "cuda":
            raise BadRequest(
                "CUDA shared memory is turned off on this server",
                "use system shared memory, or start the server on a GPU machine with --shared-memory cuda",
            )

    def register(self, name: str, key: Any, offset: Any, byte_size: Any) -> None:
        """A system region: ``key``, ``offset`` and ``byte_size`` as a client sent them, checked here."""
        self._require_on()
        _check_name(name)
        if not isinstance(key, str) or not KEY.fullmatch(key) or key.strip("/") in (".", ".."):
            raise BadRequest(
                f"shared memory key {str(key)[:80]!r} is not a plain shared-memory name",
                "a key is what shm_open takes: letters, digits, '.', '_' and '-', with one optional leading '/'",
            )
        _check_sizes(offset=offset, byte_size=byte_size)
        with self._lock:
            self._check_free(name)
            path = os.path.join(SHM_ROOT, key.lstrip("/"))
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            except OSError as exc:
                raise BadRequest(
                    f"shared memory key '{key}' cannot be opened: {exc.strerror}",
                    "create the segment first (tritonclient.utils.shared_memory.create_shared_memory_region)",
                ) from None
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                os.close(fd)
                raise BadRequest(
                    f"shared memory region '{name}' ({offset} + {byte_size} bytes) is larger than the "
                    f"{size}-byte segment '{key}'"
                )
            self._regions[name] = SystemRegion(name, key, offset, byte_size, fd)

    def register_cuda(self, name: str, raw_handle: Any, device_id: Any, byte_size: Any) -> None:
        """A CUDA region: the device memory ``raw_handle`` (cudaIpcMemHandle_t's 64 bytes) exports."""
        self._require_on("cuda")
        _check_name(name)
        _check_sizes(byte_size=byte_size)
        with self._lock:
            self._check_free(name)
            self._regions[name] = CudaRegion.open(name, raw_handle, device_id, byte_size)

    def _check_free(self, name: str) -> None:
        if name in self._regions:
            raise BadRequest(
                f"shared memory region '{name}' is already registered", "unregister it first, or use another name"
            )
        if len(self._regions) >= self.max_regions:
            raise BadRequest(
                f"this server already holds {len(self._regions)} shared memory regions, the most it registers",
                "unregister the regions no longer used (or all of a client's at once: unregister without a name)",
            )

    def _of_kind(self, name: str | None, kind: str) -> list[str]:
        """The names of the ``kind`` regions ``name`` asks for (all of them when it is None or empty)."""
        if not name:
            return [n for n, r in self._regions.items() if isinstance(r, KINDS[kind])]
        found = self._regions.get(name)
        if found is None:
            raise NotFound(f"no shared memory region '{name}' is registered")
        if not isinstance(found, KINDS[kind]):
            other = next(k for k, region_type in KINDS.items() if isinstance(found, region_type))
            raise NotFound(
                f"shared memory region '{name}' is {other} shared memory, not {kind}",
                f"use the {other}sharedmemory endpoints (or the {other.capitalize()}SharedMemory calls) for it",
            )
        return [name]

    def unregister(self, name: str | None = None, kind: str = "system") -> None:
        """One region of ``kind``, or every region of it when ``name`` is None or empty."""
        with self._lock:
            for each in self._of_kind(name, kind):
                self._retire(self._regions.pop(each))

    def _retire(self, region: Region) -> None:
        """Close ``region`` now, or once its last read ends (under the lock)."""
        if id(region) in self._users:
            self._retired[id(region)] = region
        else:
            region.close()

    def status(self, name: str | None = None, kind: str = "system") -> list[dict[str, Any]]:
        with self._lock:
            return [self._regions[n].status() for n in self._of_kind(name, kind)]

    def _window(self, place: Placement, what: str) -> Region:
        """The region ``place`` lies in, checked against its window."""
        region = self._regions.get(place.region)
        if region is None:
            raise BadRequest(
                f"{what} names shared memory region '{place.region}', which is not registered",
                "register it first (v2/systemsharedmemory/region/NAME/register, or cudasharedmemory)",
            )
        if place.offset < 0 or place.byte_size < 0 or place.offset + place.byte_size > region.byte_size:
            raise BadRequest(
                f"{what}: offset {place.offset} + {place.byte_size} bytes falls outside shared memory region "
                f"'{place.region}' ({region.byte_size} bytes)"
            )
        return region

    def input(self, place: Placement, datatype: Any, shape: Sequence[int], name: str) -> np.ndarray | Unread:
        """Input ``name`` in its region, checked against the region and its byte count: an ``Unread``
        the batch thread copies straight into the merged batch, or, for text (BYTES, parsed here)
        and empty tensors, an array of its own."""
        self._require_on()
        if datatype == codec.BYTES or not place.byte_size:
            return codec.from_bytes(self._read(place, name), datatype, shape, name)
        with self._lock:  # an unknown region or a window outside it is refused as the request arrives
            self._window(place, f"input '{name}'")
        found = RegionInput(self, place, name, shape, codec.sized_dtype(place.byte_size, datatype, shape, name))
        if not found.ndim:  # a scalar is part of the merge key, which reads its value
            return found.read()
        return found

    def _read(self, place: Placement, name: str) -> memoryview:
        out = np.empty(place.byte_size, np.uint8).data
        self.read_into(place, out, name)
        return out

    def read_into(self, place: Placement, out: memoryview, name: str) -> None:
        """Input ``name``'s bytes from its region into ``out``: refused where the region is gone or
        its segment no longer holds the window."""
        with self.using(place, f"input '{name}'") as region:
            region.into(place.offset, out)

    def reaches_gpu(self, place: Placement, device: int) -> bool:
        """Whether GPU ``device`` can copy the region ``place`` lies in (False where it is gone)."""
        try:
            with self.using(place, "a batch in GPU memory") as region:
                return region.reaches_gpu(device)
        except BadRequest:  # unregistered meanwhile: the read fails it, with the reason
            return False

    @contextlib.contextmanager
    def using(self, place: Placement, what: str) -> Iterator[Region]:
        """The region ``place`` lies in, checked against its window and open until the block ends,
        even if it is unregistered meanwhile (then closed at the end). Reads and writes run outside
        the lock: two batch threads read at once, and the event loop never waits for a read."""
        with self._lock:
            region = self._window(place, what)
            self._users[id(region)] = self._users.get(id(region), 0) + 1
        try:
            yield region
        finally:
            with self._lock:
                if left := self._users.pop(id(region)) - 1:
                    self._users[id(region)] = left
                elif (retired := self._retired.pop(id(region), None)) is not None:
                    retired.close()

    def write(self, place: Placement, array: np.ndarray, name: str) -> Written:
        """Output ``name`` into its region."""
        self._require_on()
        blob = codec.to_bytes(array)
        with self.using(place, f"output '{name}'") as region:
            if len(blob) > place.byte_size:
                raise BadRequest(
                    f"output '{name}' has {len(blob)} bytes, more than the {place.byte_size} given for it in "
                    f"shared memory region '{place.region}'"
                )
            region.write(place.offset, blob)
        return Written(place, codec.v2_datatype(array), tuple(array.shape), len(blob))

    def close(self) -> None:
        with self._lock:
            while self._regions:
                self._retire(self._regions.popitem()[1])


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not REGION_NAME.fullmatch(name):
        raise BadRequest(f"shared memory region name {str(name)[:80]!r} is not a name")


def _check_sizes(**sizes: Any) -> None:
    for what, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadRequest(f"shared memory {what} {value!r} is not a whole number of bytes")
    if sizes.get("byte_size") == 0:
        raise BadRequest("shared memory byte_size is 0: a region holds at least one byte")


def placement(params: Any, get: Any, what: str) -> Placement | None:
    """The shared-memory placement a tensor's parameters name, or None: ``get(params, key)`` reads
    one parameter (a JSON object or a gRPC parameter map)."""
    region = get(params, "shared_memory_region")
    if region is None:
        return None
    size, offset = get(params, "shared_memory_byte_size"), get(params, "shared_memory_offset")
    if not isinstance(region, str) or not isinstance(size, int) or isinstance(size, bool):
        raise BadRequest(f"{what}: shared_memory_region needs a name and shared_memory_byte_size a byte count")
    if offset is not None and (not isinstance(offset, int) or isinstance(offset, bool)):
        raise BadRequest(f"{what}: shared_memory_offset {offset!r} is not a byte count")
    return Placement(region, size, offset or 0)
