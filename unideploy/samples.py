"""Building input batches: reference samples at export time, load batches for benchmarks."""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from unideploy.errors import InputError
from unideploy.signature import STRING, Signature, TensorSpec, contiguous, normalize_dtype

# Batch sizes at which every export is validated when the batch dimension is dynamic.
VALIDATION_BATCH_SIZES = (1, 4)
# Size of a dynamic non-batch dimension in synthetic calibration data, where no sample says better.
DEFAULT_DYNAMIC_SIZE = 8


Axes = Mapping[str, int | None]  # each input's batch axis (Signature.batch_axes); None: no batch axis


class Shaped(Protocol):
    """What finding rows needs of a tensor: an array, or one not yet read (``server.unread``)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def ndim(self) -> int: ...


def row_axis(axes: Axes | None, name: str, array: Shaped) -> int | None:
    """Where input ``name``'s rows are: its batch axis in ``axes``, axis 0 when none is given, None
    for a scalar."""
    if array.ndim == 0:
        return None
    return 0 if axes is None else axes.get(name, 0)


def batch_size_of(inputs: Mapping[str, Shaped], axes: Axes | None = None) -> int:
    """Rows in ``inputs``: the size of the first batch axis (1 where none has one)."""
    for name, array in inputs.items():
        axis = row_axis(axes, name, array)
        if axis is not None:
            return int(array.shape[axis])
    return 1


def rows_along(array: np.ndarray, axis: int, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of ``array`` along ``axis`` (a view)."""
    return array[(slice(None),) * axis + (slice(start, stop),)]


def take_rows(
    inputs: Mapping[str, np.ndarray], start: int, stop: int, axes: Axes | None = None
) -> dict[str, np.ndarray]:
    """Rows ``start:stop`` of every input, along its batch axis; an input without one is kept whole."""
    out = {}
    for name, array in inputs.items():
        axis = row_axis(axes, name, array)
        out[name] = array if axis is None else rows_along(array, axis, start, stop)
    return out


def joined(name: str, chunks: Sequence[np.ndarray], axes: Axes | None = None) -> np.ndarray:
    """Tensor ``name``'s chunks as one array, along its rows' axis in ``axes`` (axis 0 where not
    given, or for a tensor ``axes`` does not name: labels); a scalar (a sample rate) is one value
    for every row, and stays one."""
    if chunks[0].ndim == 0:
        return chunks[0]
    return np.concatenate(chunks, axis=row_axis(axes, name, chunks[0]) or 0)


def join_rows(parts: Sequence[Mapping[str, np.ndarray]], axes: Axes | None = None) -> dict[str, np.ndarray]:
    """Each tensor's parts as one array, joined along its rows' axis in ``axes`` (axis 0 where not
    given): outputs run in pieces, or batches judged together."""
    return {k: joined(k, [p[k] for p in parts], axes) for k in parts[0]}


def random_tensor(spec: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Synthetic data for a tensor: normal floats, small non-negative ints (safe as indices)."""
    kind = spec.np_dtype.kind
    if kind == "f":
        return rng.standard_normal(shape).astype(spec.dtype)
    if kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 2, shape).astype(spec.dtype)


def dynamic_dims(signature: Signature) -> list[tuple[TensorSpec, int, str]]:
    """(input, axis, name) of every dynamic dim validation needs a size for (not the batch)."""
    batch_axis = signature.has_dynamic_batch
    return [
        (t, axis, d)
        for t in signature.inputs
        for axis, d in enumerate(t.shape)
        if isinstance(d, str) and not (batch_axis and axis == 0) and d != signature.batch_dim
    ]


def widest(batches: Sequence[Mapping[str, np.ndarray]], signature: Signature) -> Mapping[str, np.ndarray]:
    """The batch whose dynamic dims other than the batch are largest: of the two ``example_batches``
    makes, the user's example rather than its crop; the first where they agree."""
    dims = dynamic_dims(signature)
    return max(batches, key=lambda batch: tuple(batch[spec.name].shape[axis] for spec, axis, _ in dims))


def other_size(size: int) -> int:
    """A second size to validate a dynamic dim at: smaller (position tables and crops stay valid),
    and on the same stride as the first (detectors need multiples of 32, patch models of 8)."""
    for step in (32, 8):
        if size % step == 0 and size > step:
            return size - step
    return size - 1 if size > 1 else size


def concrete_shape(
    spec: TensorSpec, batch: int | None, sizes: Mapping[str, int], batch_axis: int | None = 0
) -> tuple[int, ...]:
    """Sizes for ``spec``: ``batch`` on its dynamic batch axis (unless None), ``sizes`` for named dims."""
    shape = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int):
            shape.append(dim)
        elif axis == batch_axis and batch is not None:
            shape.append(batch)
        else:
            shape.append(sizes.get(dim, DEFAULT_DYNAMIC_SIZE))
    return tuple(shape)


def synthetic_batches(signature: Signature, sizes: Mapping[str, int], seed: int = 0) -> list[dict[str, np.ndarray]]:
    """Random inputs at each validation batch size (one batch if the batch dim is fixed); the second
    batch also takes other sizes of the dynamic non-batch dims, so both values are proven."""
    texts = [s.name for s in signature.inputs if s.dtype == STRING]
    if texts:  # categories, words, identifiers: random characters exercise nothing the model does
        raise InputError(
            f"input(s) {', '.join(map(repr, texts))} hold text: random strings cannot stand for it",
            "give --example-input FILE.npz with real rows (numpy str arrays; np.savez keeps them)",
        )
    settings = [s.name for s in signature.inputs if not s.shape and s.np_dtype.kind in "iub"]
    if settings:
        # a sample rate, a threshold, a mode: a random value takes a branch the model does not mean
        # for it (ONNX Runtime then fails inside, or worse, the proof holds for a value nobody uses)
        raise InputError(
            f"input(s) {', '.join(map(repr, settings))} take one integer value (rank 0), such as a sample rate "
            "or a mode: a random one cannot stand for it",
            "give --example-input FILE.npz with a real value for each (and real rows for the others)",
        )
    rng = np.random.default_rng(seed)
    batch_sizes: tuple[int | None, ...] = VALIDATION_BATCH_SIZES if signature.batch_dim is not None else (None,)
    varied = {d: other_size(sizes[d]) for _, _, d in dynamic_dims(signature)}
    if len(batch_sizes) == 1 and any(sizes[d] != size for d, size in varied.items()):
        batch_sizes = (None, None)
    batches = []
    for i, batch in enumerate(batch_sizes):
        at = {**sizes, **varied} if i else sizes
        batches.append(
            {
                spec.name: random_tensor(spec, concrete_shape(spec, batch, at, signature.batch_axes[spec.name]), rng)
                for spec in signature.inputs
            }
        )
    return batches


def resize_batch(inputs: Mapping[str, np.ndarray], batch: int, axes: Axes | None = None) -> dict[str, np.ndarray]:
    """Cut or repeat rows so every input has ``batch`` rows along its batch axis (axis 0 unless
    ``axes`` says otherwise); a scalar (a sample rate) or an input without a batch axis is one
    value for every row."""
    out = {}
    for name, array in inputs.items():
        axis = row_axis(axes, name, array)
        if axis is None:
            out[name] = array
            continue
        reps = -(-batch // array.shape[axis])
        grown = np.concatenate([array] * reps, axis=axis)
        out[name] = contiguous(rows_along(grown, axis, 0, batch))
    return out


MAX_EXAMPLE_BATCHES = 16  # of a model that fixes its batch size: a batch-1 model's example is run a row at a time


def fixed_rows(signature: Signature) -> int | None:
    """The batch size a model fixes (a batch-1 TFLite model's 1): the size every input has along its
    rows' axis (its package's, for a recurrent state's axis 1: ``Signature.rows_like``) where no
    dimension is dynamic along the rows; None where the batch is dynamic."""
    if signature.batch_dim is not None:
        return None
    axes = signature.batch_axes
    sizes = {spec.shape[axis] for spec in signature.inputs if (axis := axes[spec.name]) is not None and spec.shape}
    size = sizes.pop() if len(sizes) == 1 else None
    return size if isinstance(size, int) else None


def example_batches(example: Mapping[str, np.ndarray], signature: Signature) -> list[dict[str, np.ndarray]]:
    """Batches the model is run on from user-given example inputs, each checked against the
    signature: the example itself, and 1 or 4 rows of it cropped to a smaller size of each dynamic
    non-batch dim (a crop of an image or a token sequence is still one), so a second value of
    those dims is proven too. A model that fixes its batch size takes an example of more rows (a
    batch-1 model given a data set, as its calibration data is) a batch of that size at a time:
    the first ``MAX_EXAMPLE_BATCHES`` batches."""
    parts = fixed_batches(example, signature)
    if parts is not None:
        parts = parts[:MAX_EXAMPLE_BATCHES]
        return _cropped_too(signature.validate_inputs(parts[0]), signature) + [
            signature.validate_inputs(part) for part in parts[1:]
        ]
    return _cropped_too(signature.validate_inputs(example), signature)


def fixed_batches(inputs: Mapping[str, Any], signature: Signature) -> list[dict[str, np.ndarray]] | None:
    """``inputs`` cut into the batches a model that fixes its batch size takes, where they hold a
    multiple of it (a batch-1 model given a file of rows); None where they are to be taken whole
    (the batch is dynamic, or they are one batch, or the signature will refuse them as they are)."""
    fixed = fixed_rows(signature)
    if not fixed or set(inputs) != set(signature.input_names):
        return None
    given = {name: np.asarray(value) for name, value in inputs.items()}
    axes = signature.batch_axes
    rows = batch_size_of(given, axes)
    return row_batches(given, "the inputs", fixed, axes) if rows > fixed and rows % fixed == 0 else None


def run_in_batches(
    run: Callable[[Mapping[str, Any]], Mapping[str, np.ndarray]], inputs: Mapping[str, Any], signature: Signature
) -> dict[str, np.ndarray]:
    """``run`` on ``inputs`` as the model takes them: whole, or a batch at a time where it fixes
    its batch size and they hold several (``fixed_batches``), the outputs joined in order; a
    streaming model given none of its state, as one stream (``run_as_stream``)."""
    if streams(inputs, signature):
        return run_as_stream(run, inputs, signature)
    parts = fixed_batches(inputs, signature)
    if parts is None:
        return dict(run(inputs))
    return join_rows([run(part) for part in parts], signature.output_batch_axes)


def streams(inputs: Mapping[str, Any], signature: Signature) -> bool:
    """Whether ``inputs`` are a stream for a streaming model to carry its state over: none of its
    state inputs given. Some given and some not is refused: which were meant is unknown."""
    state = signature.state_inputs
    given = [name for name in state if name in inputs]
    if given and len(given) < len(state):
        missing = ", ".join(repr(n) for n in state if n not in inputs)
        raise InputError(
            f"state input(s) {', '.join(map(repr, given))} given without {missing}",
            "give every state input, or none: the rows are then one stream, its state carried from call to call",
        )
    return bool(state) and not given


def run_as_stream(
    run: Callable[[dict[str, Any]], Mapping[str, np.ndarray]], inputs: Mapping[str, Any], signature: Signature
) -> dict[str, np.ndarray]:
    """A streaming model's other inputs as one stream (``stream_calls``): the outputs' rows joined,
    and the state outputs of the last call (where a later run would go on from)."""
    answers, state = [], {}
    for _, answer in stream_calls(run, inputs, signature):
        answers.append({k: v for k, v in answer.items() if k not in signature.state_outputs})
        state = {pair.output: answer[pair.output] for pair in signature.state}
    return {**join_rows(answers, signature.output_batch_axes), **state}


def with_carried_state(
    run: Callable[[dict[str, Any]], Mapping[str, np.ndarray]], inputs: Mapping[str, Any], signature: Signature
) -> dict[str, np.ndarray]:
    """A stream's rows each with the state ``run`` carried to it (``stream_calls``): rows a
    streaming model can take one by one, in any order (calibration rows whose state is what the
    model meets on that stream, not a constant or noise)."""
    return join_rows([given for given, _ in stream_calls(run, inputs, signature)], signature.batch_axes)


def stream_calls(
    run: Callable[[dict[str, Any]], Mapping[str, np.ndarray]], inputs: Mapping[str, Any], signature: Signature
) -> Iterator[tuple[dict[str, np.ndarray], Mapping[str, np.ndarray]]]:
    """A streaming model's other inputs as one stream: their rows run in order, a call at a time (a
    row, or the model's fixed batch), each call's state outputs fed to the next as its state
    inputs, starting from the signature's initial values. Each call's inputs (its state included)
    and answer, in order."""
    axes = signature.batch_axes
    rows = batch_size_of(inputs, axes)
    step = 1
    if signature.batch_dim is None:  # a fixed batch: the first input's size along its rows' axis
        spec = next(t for t in signature.inputs if t.name not in signature.state_inputs)
        step = int(spec.shape[axes[spec.name] or 0]) if spec.shape else 1
    if rows % step:
        raise InputError(
            f"the inputs hold {rows} rows, and the model takes {step} a call",
            f"give a multiple of {step} rows",
        )
    state = {pair.input: signature.initial_state(pair, step) for pair in signature.state}
    for start in range(0, rows, step):
        given = {**take_rows(inputs, start, start + step, axes), **state}
        answer = run(given)
        state = {pair.input: answer[pair.output] for pair in signature.state}
        yield given, answer


def _cropped_too(example: Mapping[str, np.ndarray], signature: Signature) -> list[dict[str, np.ndarray]]:
    """``example``, and the batch cropped to other sizes of its dynamic dims (``example_batches``)."""
    example = dict(example)
    crops: dict[str, dict[int, int]] = {}
    for spec, axis, _ in dynamic_dims(signature):
        size = example[spec.name].shape[axis]
        if other_size(size) < size:
            crops.setdefault(spec.name, {})[axis] = other_size(size)
    dynamic_batch = signature.batch_dim is not None
    if not dynamic_batch and not crops:
        return [example]
    batch = batch_size_of(example, signature.batch_axes)
    other = batch if not dynamic_batch else 1 if batch > 1 else VALIDATION_BATCH_SIZES[-1]
    second = resize_batch(example, other, signature.batch_axes)
    for name, cut in crops.items():
        index = tuple(slice(0, cut[a]) if a in cut else slice(None) for a in range(second[name].ndim))
        second[name] = contiguous(second[name][index])
    return [example, second] if batch <= other else [second, example]


def load_npz_inputs(path: str, what: str = "--example-input") -> dict[str, np.ndarray]:
    """Read named arrays from an .npz file, refusing pickles, lone .npy arrays and empty files."""
    how = "write it with numpy.savez(path, name=array, ...), one name per model input"
    if not Path(path).exists():
        raise InputError(f"{what} file '{path}' does not exist")
    if not Path(path).is_file():
        kind = "a directory" if Path(path).is_dir() else "a device, pipe or socket"
        raise InputError(f"{what} '{path}' is {kind}, not an .npz file", how)
    if not zipfile.is_zipfile(path):  # np.load would read a .npy as one unnamed array, anything else as a pickle
        with open(path, "rb") as fh:
            npy = fh.read(6) == b"\x93NUMPY"
        kind = (
            "a single .npy array, not an .npz of named arrays" if npy else "not an .npz archive (a zip of .npy arrays)"
        )
        raise InputError(f"{what} file '{path}' is {kind}", how)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{what} file '{path}' is not a readable .npz archive: {exc}", how) from exc
    except MemoryError as exc:
        raise too_large(f"{what} file '{path}'", exc) from exc
    if not arrays:
        raise InputError(f"{what} file '{path}' holds no arrays")
    for name, array in arrays.items():
        try:
            normalize_dtype(array.dtype)
        except InputError as exc:
            raise InputError(f"array '{name}' in '{path}': {exc.message}", exc.hint) from exc
    return arrays


def too_large(file: str, exc: MemoryError) -> InputError:
    """A data file whose array does not fit in memory: one whose header declares far more than it
    holds (truncated, or written to exhaust a reader) asks numpy for all of it before reading."""
    return InputError(
        f"{file} declares an array larger than this machine's memory ({exc}): it is malformed or truncated, "
        "or too large to read at once",
        "check the file (numpy.load reads it the same way), or give the data in smaller files",
    )


BATCH_ROWS = 32  # rows per batch handed to a runtime when the model does not fix its batch size


def row_batches(
    inputs: Mapping[str, np.ndarray], origin: str, fixed: int | None = None, axes: Axes | None = None
) -> list[dict[str, np.ndarray]]:
    """Named rows in batches of ``BATCH_ROWS``, or exactly ``fixed`` rows for a model with a fixed
    batch size (dropping the incomplete tail), cut along each input's batch axis. ``origin`` names
    the data in the error."""
    total = batch_size_of(inputs, axes)
    rows = fixed or BATCH_ROWS
    stop = total - total % rows if fixed else total
    batches = [
        {k: contiguous(v) for k, v in take_rows(inputs, i, i + rows, axes).items()}  # a scalar stays one
        for i in range(0, stop, rows)
    ]
    if not batches:
        raise InputError(
            f"{origin}: {total} row(s) cannot fill one batch of {rows}",
            "the model has a fixed batch size; pass more data",
        )
    return batches
