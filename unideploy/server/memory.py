"""Memory the server has freed, given back to the system.

glibc keeps what a program frees in its heaps for reuse and returns to the system only what sits
at a heap's top. Loading a model (its protobuf, ONNX Runtime's graph work), retiring one, and a
burst of merged batches leave tens of megabytes resident that are free: a server's RSS after a
load depended on which heap the load had used (measured at ready with two models: 277-370 MB, and
252-253 MB with the free pages returned). ``malloc_trim`` returns them. The server calls it after
versions are loaded or retired, and once when traffic stops, after each engine has shrunk what
merged batches grew (``Runtime.shrink``), or when the process grew with no call at all (refused
messages); never between requests, where each run would fault the
pages back in (docs/server.md measured that costing 6-7 % of throughput).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections.abc import Callable
from functools import lru_cache
from typing import cast

IDLE_S = 1.0  # a quiet second after a burst of runtime calls: time to give back what they freed


@lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; musl and macOS have none
    except AttributeError:
        return None


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt(3) parameters (glibc's malloc.h)
REQUEST_HEAP_BYTES = 32 << 20  # glibc's largest mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)


def keep_request_buffers() -> None:
    """Let glibc reuse the freed buffers of image-sized requests instead of mapping fresh pages
    for each: allocations up to 32 MB come from the heap, and a heap keeps up to twice that free
    at its top. A front-end process (nothing large loaded in it) otherwise got every 600 KB gRPC
    message's buffers as new pages: 518 page faults and 3.1 ms of CPU per request, against 1.3 ms
    with this (docs/server.md, Front-end processes). A no-op without glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except AttributeError:
        return
    mallopt(M_MMAP_THRESHOLD, REQUEST_HEAP_BYTES)
    mallopt(M_TRIM_THRESHOLD, 2 * REQUEST_HEAP_BYTES)


def release_free_memory() -> None:
    """Return the free pages of every heap to the system (a no-op without glibc)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


GROWTH_BYTES = 32 << 20  # memory freed without a runtime call that is worth a release


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later), summed over every heap."""

    _fields_ = [
        (field, ctypes.c_size_t)
        for field in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@lru_cache(maxsize=1)
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except AttributeError:  # glibc before 2.33, musl, macOS
        return None
    mallinfo2.restype = _MallInfo2
    return cast(Callable[[], _MallInfo2], mallinfo2)


def resident_bytes() -> int:
    """This process's resident memory (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def held_bytes() -> int:
    """Resident memory that malloc does not have in use: what has been freed and glibc kept, the
    most a release can give back (resident memory less the bytes malloc has handed out, from its
    heaps and mapped apart). Resident memory itself where glibc cannot say (no ``mallinfo2``);
    0 where /proc is not there, so that no release is triggered by growth."""
    resident = resident_bytes()
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None or not resident:
        return resident
    used = mallinfo2()
    return resident - used.uordblks - used.hblkhd


async def release_after_bursts(
    activity: Callable[[], tuple[int, int]],
    release: Callable[[], None],
    interval_s: float = IDLE_S,
    held: Callable[[], int] = held_bytes,
) -> None:
    """Release once after each burst of traffic. ``activity`` gives (runtime calls finished,
    runtime calls running); a burst has ended when a whole interval passed with none finished and
    none running, and some finished since the last release, or ``held`` (memory freed and kept)
    grew by GROWTH_BYTES since then without any: gRPC's refusal of oversized messages happens
    before any call (up to 64 MB per heap stayed resident after such an attack, docs/server.md).
    Freed memory, not resident memory: measured as resident memory, a release during such an
    attack counted the message still being read into the bar, and what that message freed
    afterwards could stay under the bar for good (docs/server.md)."""
    loop = asyncio.get_running_loop()
    released = previous = activity()[0]
    floor = held()
    while True:
        await asyncio.sleep(interval_s)
        finished, running = activity()
        if finished == previous and running == 0 and (finished != released or held() - floor >= GROWTH_BYTES):
            await loop.run_in_executor(None, release)
            released, floor = finished, held()
        previous = finished
