"""How much does unideploy add on top of a bare onnxruntime.InferenceSession?

Runtime.run validates every request against the signature before the engine sees it. This
measures that cost as a ratio, interleaving the two callers in one process (machines here are
noisy; absolute numbers from different runs are not comparable).

    python benchmarks/runtime_overhead.py [PKG]      # default: examples/out/digits.udp (make demo)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import onnxruntime as ort

from unideploy.package import Package
from unideploy.runtimes.selection import open_runtime
from unideploy.samples import resize_batch

DEFAULT_PACKAGE = Path(__file__).parents[1] / "examples" / "out" / "digits.udp"


def _median_ms(fn, inputs, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(inputs)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", nargs="?", default=DEFAULT_PACKAGE)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()

    with Package.open(args.package) as pkg:
        _, runtime = open_runtime(pkg, options=None)
        session = ort.InferenceSession(str(pkg.path_of(pkg.manifest.artifacts[0])), providers=["CPUExecutionProvider"])
        sample = pkg.reference_samples()[-1].inputs
        print(
            f"{pkg.manifest.name}: unideploy Runtime.run vs bare InferenceSession.run "
            f"({args.rounds} interleaved rounds x {args.repeats} calls, median)"
        )
        print(f"{'batch':>5}  {'bare ms':>9}  {'unideploy ms':>12}  {'ratio':>6}")
        for batch in (1, 64):
            inputs = resize_batch(sample, batch)
            bare, ours = [], []
            for _ in range(args.rounds):
                bare.append(_median_ms(lambda x: session.run(None, x), inputs, args.repeats))
                ours.append(_median_ms(runtime.run, inputs, args.repeats))
            b, o = statistics.median(bare), statistics.median(ours)
            print(f"{batch:>5}  {b:>9.4f}  {o:>12.4f}  {o / b:>6.3f}")
        runtime.close()


if __name__ == "__main__":
    main()
