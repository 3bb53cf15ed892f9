"""Batch sizes padded to a few fixed sizes ("buckets"), for engines that pay for every new shape.

ONNX Runtime's CUDA provider re-plans its cuDNN convolutions whenever a call's input shape differs
from the previous call's, even for shapes it has seen: 0.6-1.1 s per change for MobileNetV2 on an
H200, while a repeated batch of 32 takes 4-6 ms. A dynamic batcher that emits every size from 1 to
32 made ``deploy serve`` on the GPU answer in 2 s at concurrency 4-32. Padding each call to the
next bucket, and giving every bucket a session of its own, keeps each session on one shape; a
call larger than the largest bucket runs in pieces of that size.

Padding costs the device the padded rows: on the H200, served at concurrency 32, merged batches of
8-9 rows ran in the 16-row bucket (3.1-3.3 ms a call, where 8 rows take 2.0). So where the buckets'
call times are measured (``bucket_seconds``, at warm-up), a merged batch that would mostly be
padding runs the requests that fill the bucket below and carries the rest into the next call
(``cut_at_bucket``): Triton's ``preferred_batch_size``, decided by the measured times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from unideploy.samples import Axes, batch_size_of, join_rows, row_axis, rows_along, take_rows

Tensors = dict[str, np.ndarray]


def default_buckets(max_batch_size: int) -> tuple[int, ...]:
    """Powers of eight up to ``max_batch_size``, and that size itself: 1, 8, 32 for 32. Few, because
    each bucket is a session of its own (46-76 MB of the host's memory and about 550 of the GPU's for
    EfficientNet-Lite0 on an H200), and a GPU takes a few rows more almost for free: served at
    concurrency 32, three buckets made 5-19% more requests/s than six (powers of two) and held the
    model process at 992 MB against 1,160-1,169 (docs/gpu.md, 2026-11-28)."""
    sizes = {8**i for i in range(max_batch_size.bit_length()) if 8**i <= max_batch_size}
    return tuple(sorted(sizes | {max_batch_size}))


def bucket_for(rows: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``rows`` (the largest when none does: the call is split)."""
    return next((b for b in buckets if b >= rows), buckets[-1])


def bucket_seconds(
    run: Callable[[Tensors], object], batch_of: Callable[[int], Tensors], buckets: Sequence[int]
) -> dict[int, float]:
    """Each bucket's call time: its first call plans the session's kernels (about a second on a GPU,
    which a server pays at load rather than on a request), then the faster of two more calls."""
    measured = {}
    for size in buckets:
        batch = batch_of(size)
        run(batch)
        times = []
        for _ in range(2):
            start = time.perf_counter()
            run(batch)
            times.append(time.perf_counter() - start)
        measured[size] = min(times)
    return measured


def cut_at_bucket(rows: Sequence[int], buckets: Sequence[int], seconds: Mapping[int, float]) -> int:
    """How many of a merged batch's requests (``rows``: each one's rows, in arrival order) run now.
    All of them, padded to their bucket; or the first ones, that fit the bucket below, with the rest
    carried into the next call, where the buckets' call times (``seconds``) say that costs the device
    less: the first ones' call and the carried rows' share of a call of the upper bucket against the
    upper bucket's call (EfficientNet-Lite0 on an H200, 2.0 ms at 8 rows and about 3.5 at 16: 9
    rows run 8 and carry 1, 15 pad to 16; a small bucket's call costs about the same at any size, so
    3 rows pad to 4)."""
    total = sum(rows)
    if total in buckets or total > buckets[-1]:
        return len(rows)
    upper = bucket_for(total, buckets)
    lower = max((b for b in buckets if b < total), default=0)
    kept = filled = 0
    while kept < len(rows) and filled + rows[kept] <= lower:
        filled += rows[kept]
        kept += 1
    now = bucket_for(filled, buckets)
    if not kept or upper not in seconds or now not in seconds:
        return len(rows)
    carried = total - filled
    return kept if seconds[now] + carried * seconds[upper] / upper < seconds[upper] else len(rows)


def pieces(rows: int, largest: int) -> Iterator[slice]:
    """Row ranges of at most ``largest`` rows covering ``rows``."""
    for start in range(0, rows, largest):
        yield slice(start, min(start + largest, rows))


def pad_rows(inputs: Tensors, size: int, axes: Axes | None = None) -> Tensors:
    """Every input grown to ``size`` rows along its batch axis by repeating its last row: a real
    row, so padding never feeds the model values it was not made for (an all-zero attention mask,
    say). An input without a batch axis is the same for every row and stays as it is."""
    out = {}
    for name, array in inputs.items():
        axis = row_axis(axes, name, array)
        rows = 0 if axis is None else array.shape[axis]
        if axis is not None and size > rows:
            last = rows_along(array, axis, rows - 1, rows)
            out[name] = np.concatenate([array, np.repeat(last, size - rows, axis=axis)], axis=axis)
        else:
            out[name] = array
    return out


def run_in_buckets(
    run: Callable[[int, Tensors], Tensors],
    inputs: Tensors,
    buckets: Sequence[int],
    axes: Axes | None = None,
    output_axes: Axes | None = None,
) -> Tensors:
    """``run(bucket, padded_inputs)`` for each piece of ``inputs``, padded to its bucket; the
    outputs cut back to the real rows and joined. ``axes``/``output_axes``: where each input's and
    output's rows lie (axis 0 where not given; recurrent state ``[layers, batch, hidden]``: 1)."""
    rows = batch_size_of(inputs, axes)
    parts: list[Tensors] = []
    for piece in pieces(rows, buckets[-1]):
        count = piece.stop - piece.start
        size = bucket_for(count, buckets)
        outputs = run(size, pad_rows(take_rows(inputs, piece.start, piece.stop, axes), size, axes))
        parts.append(take_rows(outputs, 0, count, output_axes))
    if len(parts) == 1:
        return parts[0]
    return join_rows(parts, output_axes)
