"""The server gives memory it has freed back to the system: after loads and retirements, and once
after each burst of traffic, never while requests run."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from unideploy.server.memory import release_after_bursts

FRAGMENTED = """
from unideploy.server.memory import release_free_memory

def rss_mb():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024

blocks = [bytes(2048) for _ in range(100_000)]  # 200 MB of small blocks: glibc's heap, not mmap
del blocks[:-1]  # all freed but the last, which pins the heap's top
before = rss_mb()
release_free_memory()
print(before - rss_mb())
"""


def test_freed_small_blocks_below_a_live_one_go_back_to_the_system():
    """glibc returns a heap's free pages only from its top; a block still in use above them (as a
    loaded model leaves) keeps the rest resident until malloc_trim hands them back."""
    done = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True)
    assert float(done.stdout) > 100, f"only {float(done.stdout):.0f} MB of ~200 MB freed came back"


def test_held_memory_is_what_was_freed_and_kept_until_a_release():
    """The measure the release after bursts watches: memory in use is not held, the same memory
    freed (and kept by glibc) is, and a release gives it back."""
    script = """
from unideploy.server.memory import held_bytes, release_free_memory
mb = lambda: held_bytes() / 2**20
start = mb()
blocks = [bytes(2048) for _ in range(100_000)]  # 200 MB of small blocks: glibc's heap, not mmap
in_use = mb()
del blocks[:-1]  # all freed but the last, which pins the heap's top
freed = mb()
release_free_memory()
print(in_use - start, freed - start, mb() - start)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    in_use, freed, released = (float(mb) for mb in done.stdout.split())
    assert abs(in_use) < 16 and freed > 150 and released < 50, done.stdout


def test_memory_is_released_once_per_burst_and_never_while_calls_run():
    """Once after each burst of calls, and once where 32 MB were freed without any. Counted in the watcher's looks at the activity, not in seconds: each step waits until the
    watcher has looked as often as the rule needs, however slow the machine."""
    finished, running, resident, released = [0], [0], [0], []
    looks = [0]

    async def scenario() -> None:
        looked = asyncio.Event()

        def activity() -> tuple[int, int]:
            looks[0] += 1
            looked.set()
            return finished[0], running[0]

        async def after_looks(count: int) -> None:
            target = looks[0] + count
            while looks[0] < target:
                looked.clear()
                await looked.wait()

        watcher = asyncio.get_running_loop().create_task(
            release_after_bursts(activity, lambda: released.append(finished[0]), 0.001, lambda: resident[0])
        )
        await after_looks(4)  # idle from the start: nothing freed, nothing to release
        assert released == []
        running[0] = 1
        for _ in range(5):  # a burst: calls keep finishing while one runs
            finished[0] += 1
            await after_looks(2)
        assert released == []
        running[0] = 0
        await after_looks(4)  # quiet: one release, then none until the next burst
        assert released == [5]
        finished[0] += 1
        await after_looks(4)
        assert released == [5, 6]
        # no call at all, but memory was freed and kept (gRPC refusing oversized messages): released once
        resident[0] += 16 << 20
        await after_looks(4)
        assert released == [5, 6]
        resident[0] += 24 << 20
        await after_looks(4)
        assert released == [5, 6, 6]
        # what was in use at that release is freed later, with the process still quiet: released again
        resident[0] += 40 << 20
        await after_looks(4)
        assert released == [5, 6, 6, 6]
        watcher.cancel()

    asyncio.run(scenario())
