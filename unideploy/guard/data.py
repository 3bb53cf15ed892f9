"""Calibration and validation data: loading, checking against the signature, splitting.

Accepted forms: one ``.npz`` of named inputs (optionally ``labels``), or a directory of ``.npz``
files (each a batch of named inputs) and/or ``<input name>.npy`` files; everything is
concatenated along the batch axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from unideploy.errors import InputError
from unideploy.samples import (
    Axes,
    batch_size_of,
    concrete_shape,
    joined,
    load_npz_inputs,
    random_tensor,
    row_axis,
    row_batches,
    take_rows,
    too_large,
)
from unideploy.signature import Signature

LABELS = "labels"


@dataclass
class Dataset:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    origin: str  # file name, or "synthetic"
    axes: Axes = field(default_factory=dict)  # each input's batch axis (Signature.batch_axes); axis 0 if absent

    @property
    def rows(self) -> int:
        return batch_size_of(self.inputs, self.axes)

    def take(self, start: int, stop: int) -> Dataset:
        return Dataset(
            take_rows(self.inputs, start, stop, self.axes),
            None if self.labels is None else self.labels[start:stop],
            self.origin,
            self.axes,
        )

    def batches(self, fixed: int | None = None) -> list[dict[str, np.ndarray]]:
        """Batches of ``samples.BATCH_ROWS`` rows, or exactly ``fixed`` rows for a model with a fixed
        batch size (dropping the incomplete tail), cut along each input's batch axis."""
        return row_batches(self.inputs, self.origin, fixed, self.axes)


def load_dataset(path: str | Path, signature: Signature, what: str = "--calibration") -> Dataset:
    path = Path(path)
    if path.is_dir():
        arrays = _load_directory(path, what, signature.batch_axes)
    elif path.exists():
        arrays = load_npz_inputs(str(path), what)
    else:
        raise InputError(f"{what} data '{path}' does not exist")
    labels = arrays.pop(LABELS, None)
    dataset = Dataset(arrays, labels, path.name, signature.batch_axes)
    _check(dataset, signature, what, path)
    return dataset


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


def _load_directory(path: Path, what: str, axes: Axes) -> dict[str, np.ndarray]:
    """Every .npz and .npy file in ``path``, each input's parts joined along its batch axis (a
    recurrent state ``[layers, batch, hidden]`` along axis 1); labels along axis 0."""
    parts: dict[str, list[np.ndarray]] = {}
    files = sorted(p for p in path.iterdir() if p.suffix in (".npz", ".npy"))
    if not files:
        raise InputError(f"{what} directory '{path}' holds no .npz or .npy files")
    for file in files:
        if file.suffix == ".npz":
            for name, array in load_npz_inputs(str(file), what).items():
                parts.setdefault(name, []).append(array)
        else:
            try:
                parts.setdefault(file.stem, []).append(np.load(file, allow_pickle=False))
            except (ValueError, OSError) as exc:
                raise InputError(f"{what} file '{file}' is not a readable .npy array: {exc}") from exc
            except MemoryError as exc:
                raise too_large(f"{what} file '{file}'", exc) from exc
    try:
        return {name: joined(name, chunks, axes) for name, chunks in parts.items()}
    except ValueError as exc:
        raise InputError(f"{what} files in '{path}' do not stack along the batch axis: {exc}") from exc


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
    try:
        signature.validate_inputs(dataset.take(0, 1).inputs)
    except InputError as exc:
        raise InputError(f"{what} data '{path}': {exc.message}", exc.hint) from exc
