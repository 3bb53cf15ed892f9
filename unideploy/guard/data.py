"""Calibration and validation data: loading, checking against the signature, splitting.

Accepted forms: one ``.npz`` of named inputs (optionally ``labels``), or a directory of ``.npz``
files (each a batch of named inputs) and/or ``<input name>.npy`` files; everything is
concatenated along the batch axis.

A streaming model's data may leave its state inputs out: the rows are then a stream (each ``.npz``
file of a directory one stream, in order), as ``deploy run`` takes them. Calibration rows get the
state the fp32 model carries to them (``carrying_state``), and the guard runs each model over the
streams with its own state (``Guard.stream``), so what it judges is what a stream served gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import InputError
from unideploy.guard.guard import Runner
from unideploy.samples import (
    Axes,
    batch_size_of,
    concrete_shape,
    join_rows,
    joined,
    load_npz_inputs,
    random_tensor,
    row_axis,
    row_batches,
    streams,
    take_rows,
    too_large,
    with_carried_state,
)
from unideploy.signature import Signature

LABELS = "labels"


@dataclass
class Dataset:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    origin: str  # file name, or "synthetic"
    axes: Axes = field(default_factory=dict)  # each input's batch axis (Signature.batch_axes); axis 0 if absent
    # a streaming model's rows without their state: the first row of each stream; None where every
    # row carries its state, or the model has none
    stream_starts: tuple[int, ...] | None = None

    @property
    def rows(self) -> int:
        return batch_size_of(self.inputs, self.axes)

    def take(self, start: int, stop: int) -> Dataset:
        """Rows ``start:stop``; of streams, the part of each that lies there (a part cut from the
        middle of a stream is run from the initial state, as a stream begun there would be)."""
        starts = None
        if self.stream_starts is not None:
            starts = tuple(sorted({0, *(s - start for s in self.stream_starts if start < s < stop)}))
        return Dataset(
            take_rows(self.inputs, start, stop, self.axes),
            None if self.labels is None else self.labels[start:stop],
            self.origin,
            self.axes,
            starts,
        )

    def streams(self) -> list[dict[str, np.ndarray]]:
        """Each stream's rows (every row, as one stream, where the rows carry their state)."""
        starts = self.stream_starts or (0,)
        ends = (*starts[1:], self.rows)
        return [take_rows(self.inputs, a, b, self.axes) for a, b in zip(starts, ends, strict=True)]

    def batches(self, fixed: int | None = None) -> list[dict[str, np.ndarray]]:
        """Batches of ``samples.BATCH_ROWS`` rows, or exactly ``fixed`` rows for a model with a fixed
        batch size (dropping the incomplete tail), cut along each input's batch axis."""
        return row_batches(self.inputs, self.origin, fixed, self.axes)


def load_dataset(path: str | Path, signature: Signature, what: str = "--calibration") -> Dataset:
    path = Path(path)
    starts: tuple[int, ...] = (0,)
    if path.is_dir():
        arrays, starts = _load_directory(path, what, signature.batch_axes)
    elif path.exists():
        arrays = load_npz_inputs(str(path), what)
    else:
        raise InputError(f"{what} data '{path}' does not exist")
    labels = arrays.pop(LABELS, None)
    stream = streams(arrays, signature)
    dataset = Dataset(arrays, labels, path.name, signature.batch_axes, starts if stream else None)
    _check(dataset, signature, what, path)
    return dataset


def validation_rows(dataset: Dataset, fixed: int | None, signature: Signature) -> dict[str, Any]:
    """What a guard judges on from ``dataset`` (``Guard.of``'s batches, labels, rows and how its
    verdicts name them): batches of its rows (``fixed`` rows each, for a model that fixes its batch
    size), or its streams whole, each model run over them with its own state."""
    stream = dataset.stream_starts is not None
    batches = dataset.streams() if stream else dataset.batches(fixed)
    count = len(batches)
    return {
        "batches": batches,
        "labels": dataset.labels,
        "rows": sum(batch_size_of(b, signature.batch_axes) for b in batches),
        "rows_are": f"validation rows ({count} stream{'s' * (count != 1)})" if stream else "validation rows",
        "stream": signature if stream else None,
    }


def carrying_state(dataset: Dataset, run: Runner, signature: Signature) -> Dataset:
    """``dataset``'s rows each with the state ``run`` (the fp32 model) carries to it over its
    stream: calibration rows that hold what the model meets there. Rows that carry their state
    already are returned as they are."""
    if dataset.stream_starts is None:
        return dataset
    rows = [with_carried_state(run, stream, signature) for stream in dataset.streams()]
    return Dataset(join_rows(rows, signature.batch_axes), dataset.labels, dataset.origin, dataset.axes)


def synthetic_dataset(signature: Signature, rows: int = 128, seed: int = 0) -> Dataset:
    """Random inputs, for users who explicitly accept that accuracy cannot be judged on them."""
    rng = np.random.default_rng(seed)
    axes = signature.batch_axes
    inputs = {s.name: random_tensor(s, concrete_shape(s, rows, {}, axes[s.name]), rng) for s in signature.inputs}
    return Dataset(inputs, None, "synthetic", axes)


def split(dataset: Dataset, max_calibration_rows: int = 512) -> tuple[Dataset, Dataset]:
    """Calibrate on the first half (at most ``max_calibration_rows``), validate on the rest, so the
    accuracy guard never grades a model on the data it was calibrated with."""
    if dataset.rows < 2:
        raise InputError(
            f"{dataset.origin} has {dataset.rows} row(s); at least 2 are needed (one to calibrate, one to validate)",
            "pass more data, or --validation DATA",
        )
    cut = min(dataset.rows // 2, max_calibration_rows)
    return dataset.take(0, cut), dataset.take(cut, dataset.rows)


def _load_directory(path: Path, what: str, axes: Axes) -> tuple[dict[str, np.ndarray], tuple[int, ...]]:
    """Every .npz and .npy file in ``path``, each input's parts joined along its batch axis (a
    recurrent state ``[layers, batch, hidden]`` along axis 1); labels along axis 0. And the first
    row of each .npz file (each is a stream of a streaming model's rows, where they are streams)."""
    parts: dict[str, list[np.ndarray]] = {}
    files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy"))
    if not files:
        raise InputError(f"{what} directory '{path}' holds no .npz or .npy files")
    starts, row = [], 0
    for file in files:
        if file.suffix == ".npz":
            arrays = load_npz_inputs(str(file), what)
            starts.append(row)
            row += batch_size_of({k: v for k, v in arrays.items() if k != LABELS}, axes)
            for name, array in arrays.items():
                parts.setdefault(name, []).append(array)
        else:
            try:
                parts.setdefault(file.stem, []).append(np.load(file, allow_pickle=False))
            except (ValueError, OSError) as exc:
                raise InputError(f"{what} file '{file}' is not a readable .npy array: {exc}") from exc
            except MemoryError as exc:
                raise too_large(f"{what} file '{file}'", exc) from exc
    try:
        arrays = {name: joined(name, chunks, axes) for name, chunks in parts.items()}
    except ValueError as exc:
        raise InputError(f"{what} files in '{path}' do not stack along the batch axis: {exc}") from exc
    whole_files = all(file.suffix == ".npz" for file in files)  # an .npy file is one input's every row
    return arrays, tuple(starts) if whole_files else (0,)


def _check(dataset: Dataset, signature: Signature, what: str, path: Path) -> None:
    axes = signature.batch_axes
    if any(a.size == 0 for a in dataset.inputs.values()):
        raise InputError(f"{what} data '{path}' is empty")
    along = {
        name: (a.shape[axis], axis)
        for name, a in dataset.inputs.items()
        if (axis := row_axis(axes, name, a)) is not None and axis < a.ndim
    }
    if len({count for count, _ in along.values()}) > 1:
        counts = {name: f"{count} (axis {axis})" for name, (count, axis) in along.items()}
        raise InputError(f"{what} inputs in '{path}' have different row counts along their batch axes: {counts}")
    if dataset.labels is not None and len(dataset.labels) != dataset.rows:
        raise InputError(f"{what} '{path}': {len(dataset.labels)} labels for {dataset.rows} rows")
    first = dataset.take(0, 1).inputs
    if dataset.stream_starts is not None:  # a stream's first row, as its first call takes it
        first.update({pair.input: signature.initial_state(pair, 1) for pair in signature.state})
    try:
        signature.validate_inputs(first)
    except InputError as exc:
        raise InputError(f"{what} data '{path}': {exc.message}", exc.hint) from exc
