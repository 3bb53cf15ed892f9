"""Building input batches: reference samples at export time, load batches for benchmarks."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from unideploy.errors import InputError
from unideploy.signature import Signature, TensorSpec, normalize_dtype

# Batch sizes at which every export is validated when the batch dimension is dynamic.
VALIDATION_BATCH_SIZES = (1, 4)
# Example size for a dynamic non-batch dimension nobody gave a size for.
DEFAULT_DYNAMIC_SIZE = 8


def batch_size_of(inputs: Mapping[str, np.ndarray]) -> int:
    first = next(iter(inputs.values()))
    return int(first.shape[0]) if first.ndim else 1


def random_tensor(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Synthetic data for a tensor: normal floats, small non-negative ints (safe as indices)."""
    kind = np.dtype(spec.dtype).kind
    if kind == "f":
        return rng.standard_normal(shape).astype(spec.dtype)
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 2, shape).astype(spec.dtype)


def concrete_shape(spec: TensorSpec, batch: int, sizes: Mapping[str, int]) -> tuple[int, ...]:
    shape = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int):
            shape.append(dim)
        elif axis == 0:
            shape.append(batch)
        else:
            shape.append(sizes.get(dim, DEFAULT_DYNAMIC_SIZE))
    return tuple(shape)


def synthetic_batches(signature: Signature, sizes: Mapping[str, int], seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Random inputs at each validation batch size (one batch if the batch dim is fixed)."""
    rng = np.random.default_rng(seed)
    batch_sizes = VALIDATION_BATCH_SIZES if signature.has_dynamic_batch else (None,)
    batches = []
    for batch in batch_sizes:
        batches.append({
            spec.name: random_tensor(spec, concrete_shape(spec, batch or 1, sizes), rng)
            for spec in signature.inputs
        })
    return batches


def resize_batch(inputs: Mapping[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """Cut or repeat rows so every input has ``batch`` rows."""
    out = {}
    for name, array in inputs.items():
        if array.ndim == 0:
            raise InputError(f"input '{name}' is a scalar and has no batch dimension")
        reps = -(-batch // array.shape[0])
        out[name] = np.ascontiguousarray(np.concatenate([array] * reps, axis=0)[:batch])
    return out


def example_batches(example: Mapping[str, np.ndarray], dynamic_batch: bool) -> list[dict[str, np.ndarray]]:
    """Two batch sizes from user-given example inputs (the example itself, and 1 or 4 rows)."""
    example = dict(example)
    if not dynamic_batch:
        return [example]
    batch = batch_size_of(example)
    other = 1 if batch > 1 else VALIDATION_BATCH_SIZES[-1]
    return sorted([example, resize_batch(example, other)], key=batch_size_of)


def load_npz_inputs(path: str, what: str = "--example-input") -> dict[str, np.ndarray]:
    """Read named arrays from an .npz file, refusing pickles and empty files."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError as exc:
        raise InputError(f"{what} file '{path}' does not exist") from exc
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{what} file '{path}' is not a readable .npz archive: {exc}",
                         "write it with numpy.savez(path, name=array, ...)") from exc
    if not arrays:
        raise InputError(f"{what} file '{path}' holds no arrays")
    for name, array in arrays.items():
        try:
            normalize_dtype(array.dtype)
        except InputError as exc:
            raise InputError(f"array '{name}' in '{path}': {exc.message}", exc.hint) from exc
    return arrays
