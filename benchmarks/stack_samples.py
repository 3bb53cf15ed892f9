"""Where a running server's CPU goes: py-spy's stack samples of its processes, summed per role.

A throughput figure says a ceiling was hit, not which: the model process's event loop, its batch
threads (merging, the runtime call), or the front ends. ``record`` samples the server and every
child for a few seconds (py-spy, no change to the server); ``summary`` reads the samples back as,
per role, how many were busy and the functions they were busy in (self time, and the calls of
ours and ONNX Runtime's they were under). Idle frames (a selector's wait, a worker thread waiting
for work) are counted apart, so the shares are of busy time.

    python benchmarks/stack_samples.py RAW.txt     # the summary of a recorded file
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

# leaf frames of a thread that waits: the event loop's selector, a pool worker's queue, a lock
IDLE = (
    ".select (selectors.py",
    "_worker (concurrent/futures/thread.py",  # a worker with nothing under it waits in its queue
    ".wait (threading.py",
    "_wait_for_tstate_lock",
)
# inclusive frames worth naming: our code and the engine's entry points
OURS = ("unideploy/", "onnxruntime_inference_collection.py")


def record(pid: int, seconds: float, out: Path, rate: int = 250) -> subprocess.Popen | str:
    """Start sampling ``pid`` and its children for ``seconds`` into ``out`` (py-spy's raw folded
    stacks); the caller waits on the returned process. A string says why it cannot run."""
    spy = shutil.which("py-spy")
    if spy is None:
        return "py-spy is not installed (pip install py-spy)"
    command = [spy, "record", "--pid", str(pid), "--subprocesses", "--nonblocking", "-f", "raw"]
    command += ["-r", str(rate), "-d", str(max(1, round(seconds))), "-o", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _role(frames: list[str]) -> str:
    """Which process a stack is from: a front end (a child's ``process`` frame) or the model process."""
    children = [f for f in frames[1:] if f.startswith("process ")]
    return "front ends" if children and "frontends.process" in children[0] else "model process"


def summary(raw: Path, top: int = 8) -> list[str]:
    """Per role, the busy share of samples and the functions the busy samples were in."""
    busy: dict[str, int] = Counter()
    idle: dict[str, int] = Counter()
    own: dict[str, Counter] = defaultdict(Counter)
    under: dict[str, Counter] = defaultdict(Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        role, n = _role(frames), int(count)
        code = [f for f in frames if not f.startswith("process ")]
        if not code or any(mark in code[-1] for mark in IDLE):
            idle[role] += n
            continue
        busy[role] += n
        own[role][code[-1]] += n
        for name in {f.split(" (")[0] for f in code if any(mark in f for mark in OURS)}:
            under[role][name] += n
    lines = []
    for role in sorted(busy, key=busy.__getitem__, reverse=True):
        total = busy[role]
        lines.append(f"{role}: {total} busy samples, {idle[role]} idle")
        lines += [f"  self {n / total:6.1%}  {frame}" for frame, n in own[role].most_common(top)]
        lines += [f"  under {n / total:5.1%}  {name}" for name, n in under[role].most_common(top)]
    return lines


if __name__ == "__main__":
    print("\n".join(summary(Path(sys.argv[1]))))
