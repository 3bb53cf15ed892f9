"""Dimensions, every way a model declares them, made into the package's contract.

Models name a dimension (``batch``), give it a converter's name (``p2o.DynamicDimension.1``,
``unk__12``, a symbolic expression), declare it -1 or 0, or say nothing. The package signature
gives every dynamic dimension a readable identifier, keeps static ones static, and knows a size
to validate each dynamic one at, before any conversion work starts:

- ``readable_dims``: converter names become ``batch``, ``height``/``width``, or ``<tensor>_dimN``.
- ``apply_input_shapes``: ``--input-shape`` on a model that declares its own shapes; a plain
  number fixes a dynamic dim, ``name=N`` keeps it dynamic under that name, with N as example size.
- ``example_sizes``: where each dynamic size comes from (``--input-shape``, ``--example-input``,
  the model's metadata); a dim nothing sizes stops the export with the option to pass.
- ``settle_outputs``: output dims that stayed the same across the reference runs (whose dynamic
  inputs varied) are static; those that follow an input dim take its name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from unideploy.errors import InputError
from unideploy.exporters.base import ExportOptions
from unideploy.samples import dynamic_dims
from unideploy.signature import BATCH_DIM, Dim, Signature, TensorSpec, dim_identifier, unnamed_dim

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
# Names converters make up, which tell a user nothing: tf2onnx's unk__N, paddle2onnx's
# DynamicDimension.N, torch's sN and <op><tensor>_dim_N, and anything holding an expression.
_GENERATED = re.compile(r"(?i)dynamicdimension|^unk__|^s\d+$|_dim_?\d+$|^d_\d|^(?:add|div|mul|sub|concat)")
_SPATIAL_NAMES = {
    "NCW": {2: "length"},
    "NCHW": {2: "height", 3: "width"},
    "NCDHW": {2: "depth", 3: "height", 4: "width"},
}


def is_readable(name: str) -> bool:
    return bool(_IDENTIFIER.match(name)) and not _GENERATED.search(name)


def _rename(signature: Signature, mapping: Mapping[str, Dim]) -> Signature:
    def spec(t: TensorSpec) -> TensorSpec:
        return TensorSpec(
            t.name, t.dtype, tuple(mapping.get(d, d) if isinstance(d, str) else d for d in t.shape), t.layout
        )

    return Signature(tuple(spec(t) for t in signature.inputs), tuple(spec(t) for t in signature.outputs))


def readable_dims(signature: Signature) -> Signature:
    """Rename converter-made dynamic dims; a model's own identifiers are kept. One old name maps
    to one new name everywhere, so dims the model ties together stay tied."""
    mapping: dict[str, str] = {}
    owner: dict[str, str] = {}  # new name -> the old name it stands for
    for spec in signature.inputs + signature.outputs:
        for d in spec.shape:
            if isinstance(d, str) and is_readable(d):
                owner.setdefault(d, d)
    single_image = sum(1 for t in signature.inputs if t.layout in _SPATIAL_NAMES) == 1
    for is_input, specs in ((True, signature.inputs), (False, signature.outputs)):
        for spec in specs:
            for axis, d in enumerate(spec.shape):
                if not isinstance(d, str) or is_readable(d) or d in mapping:
                    continue
                if is_input and axis == 0:
                    candidates = [BATCH_DIM]  # shared on purpose: inputs agree on their batch
                else:
                    role = _SPATIAL_NAMES.get(spec.layout or "", {}).get(axis) if is_input else None
                    candidates = ([role] if role and single_image else []) + [
                        dim_identifier(f"{spec.name}_{role}") if role else unnamed_dim(spec.name, axis)
                    ]
                    candidates += [f"{candidates[-1]}_{i}" for i in range(2, 100)]
                for candidate in candidates:
                    if owner.get(candidate, d) == d or candidate == BATCH_DIM:
                        mapping[d] = candidate
                        owner[candidate] = d
                        break
    return _rename(signature, mapping) if mapping else signature


def apply_input_shapes(signature: Signature, options: ExportOptions) -> Signature:
    """Honour ``--input-shape`` (and ``--static-shapes``) on a model that declares its own shapes.

    Dims the model fixes must be given as they are. A dynamic dim given as a plain number is fixed
    at that size (the batch, on axis 0, stays dynamic unless ``--static-shapes``); ``name=N``
    keeps it dynamic under the user's name.
    """
    by_name = {t.name: t for t in signature.inputs}
    mapping: dict[str, Dim] = {}
    for shape in options.input_shapes:
        spec = by_name.get(shape.name)
        if spec is None:
            raise InputError(
                f"--input-shape names '{shape.name}', which the model does not take",
                f"its inputs are: {', '.join(signature.input_names)}",
            )
        if len(shape.shape) != len(spec.shape):
            raise InputError(
                f"--input-shape gives '{shape.name}' {len(shape.shape)} dims, but the model declares "
                f"rank {len(spec.shape)} {spec.shape_text()}",
                f"give one size per dim, e.g. {template(spec, {}, signature.has_dynamic_batch)}",
            )
        if shape.dtype != spec.dtype and shape.dtype != "float32":
            raise InputError(
                f"--input-shape gives '{shape.name}' dtype {shape.dtype}, but the model takes {spec.dtype}"
            )
        for axis, (size, declared) in enumerate(zip(shape.shape, spec.shape)):
            named = shape.dim_names.get(axis)
            if isinstance(declared, int):
                if size != declared or named:
                    raise InputError(
                        f"axis {axis} of '{shape.name}' is fixed at {declared} in the model; --input-shape "
                        f"gives {named + '=' if named else ''}{size}",
                        f"pass {declared} there (a fixed dimension cannot be resized or made dynamic)",
                    )
                continue
            if named:
                target: Dim = named
            elif axis == 0 and not options.static_shapes:
                continue  # the batch stays dynamic: validation picks its sizes
            else:
                target = size
            if mapping.setdefault(declared, target) != target:
                raise InputError(
                    f"dimension '{declared}' is given as both {mapping[declared]} and {target}",
                    "inputs that share a dimension must give it the same size or name",
                )
    if options.static_shapes:
        unsized = [
            f"'{t.name}'" for t in signature.inputs if any(isinstance(d, str) and d not in mapping for d in t.shape)
        ]
        if unsized:
            raise InputError(
                f"--static-shapes needs a size for every dynamic dim of {', '.join(unsized)}",
                "give each such input an --input-shape",
            )
    return _rename(signature, mapping) if mapping else signature


def template(spec: TensorSpec, sizes: Mapping[str, int], batch: bool = True) -> str:
    """An ``--input-shape`` value for ``spec``: known sizes filled in, SIZE where one is needed
    (``batch``: axis 0 is the dynamic batch, which validation sizes itself)."""
    items = []
    for axis, d in enumerate(spec.shape):
        if isinstance(d, int):
            items.append(str(d))
        elif axis == 0 and batch:
            items.append("1")
        else:
            items.append(f"{d}={sizes.get(d, 'SIZE')}")
    dtype = "" if spec.dtype == "float32" else f":{spec.dtype}"
    return f"{spec.name}:{','.join(items)}{dtype}"


def example_sizes(
    signature: Signature, options: ExportOptions, metadata: Mapping[str, int] | None = None
) -> dict[str, int]:
    """A size for every dynamic dim: from --input-shape, --example-input, then the model's metadata.

    Raises before any work with the ``--input-shape`` that would size what nothing sizes.
    """
    sizes: dict[str, int] = {}
    specs = {t.name: t for t in signature.inputs}
    for shape in options.input_shapes:
        spec = specs.get(shape.name)
        if spec is not None and len(spec.shape) == len(shape.shape):
            for d, size in zip(spec.shape, shape.shape):
                if isinstance(d, str):
                    sizes.setdefault(d, size)
    for name, array in (options.example_inputs or {}).items():
        spec = specs.get(name)
        if spec is not None and np.ndim(array) == len(spec.shape):
            for d, size in zip(spec.shape, np.shape(array)):
                if isinstance(d, str):
                    sizes.setdefault(d, int(size))
    for d, size in (metadata or {}).items():
        sizes.setdefault(d, size)
    missing = [(t, axis, d) for t, axis, d in dynamic_dims(signature) if d not in sizes]
    if missing:
        inputs = list(dict.fromkeys(t.name for t, _, _ in missing))
        dims = ", ".join(dict.fromkeys(f"{d} (axis {axis} of '{t.name}')" for t, axis, d in missing))
        hint = " ".join(f"--input-shape {template(specs[n], sizes, signature.has_dynamic_batch)}" for n in inputs)
        raise InputError(
            f"no size to validate dynamic dimension(s) {dims} at",
            f"pass {hint} with SIZE replaced by a size the model takes (name=SIZE keeps the dim "
            f"dynamic, a plain number fixes it), or --example-input FILE.npz",
        )
    return sizes


def settle_outputs(
    signature: Signature, references: Sequence[tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]]]
) -> Signature:
    """Output dims as the reference runs show them.

    A dynamic output dim whose size followed an input dim in every run takes that dim's name; one
    whose size never changed while the inputs' dynamic dims did is static. With one run (nothing
    varied) the declared dims stand, unless the model declared another rank than it computes
    (ddddocr's recognizer declares [1, seqlen] and returns [seq, batch, classes]): then the runs
    say every dim.
    """
    varied = _input_dims_that_varied(signature, [inputs for inputs, _ in references])
    input_sizes = [signature.dim_sizes(inputs) for inputs, _ in references]
    axes_of: dict[int, set[str]] = {}
    for t in signature.inputs:
        for axis, d in enumerate(t.shape):
            axes_of.setdefault(axis, set()).add(d) if isinstance(d, str) else None
    outputs = []
    for spec in signature.outputs:
        seen = [np.shape(outputs_[spec.name]) for _, outputs_ in references if spec.name in outputs_]
        ranks = {len(s) for s in seen}
        declared_dims: Sequence[Dim | None] = spec.shape
        if len(ranks) == 1 and ranks != {len(spec.shape)}:
            declared_dims = [None] * ranks.pop()
        elif not seen or len(ranks) != 1 or not varied:
            outputs.append(spec)
            continue
        dims: list[Dim] = []
        for axis, declared in enumerate(declared_dims):
            sizes = [s[axis] for s in seen]
            follows = [d for d in varied if all(b.get(d) == n for b, n in zip(input_sizes, sizes))]
            if isinstance(declared, int) and set(sizes) == {declared}:
                dims.append(declared)
            elif follows:  # several (height and width varied alike): the one on the same axis
                same_axis = [d for d in follows if d in axes_of.get(axis, ())]
                dims.append(declared if declared in follows else (same_axis or follows)[0])
            elif len(set(sizes)) == 1 and declared not in varied:
                dims.append(int(sizes[0]))
            else:  # a size of the model's own, or one that changed with no input dim
                dims.append(declared if isinstance(declared, str) else unnamed_dim(spec.name, axis))
        outputs.append(TensorSpec(spec.name, spec.dtype, tuple(dims), spec.layout))
    return Signature(signature.inputs, tuple(outputs), signature.state)


def _input_dims_that_varied(signature: Signature, batches: Sequence[Mapping[str, np.ndarray]]) -> list[str]:
    bound = [signature.dim_sizes(b) for b in batches]
    names = list(dict.fromkeys(d for b in bound for d in b))
    return [d for d in names if len({b.get(d) for b in bound}) > 1]


def resolve_signature(
    signature: Signature, options: ExportOptions, metadata: Mapping[str, int] | None = None
) -> tuple[Signature, dict[str, int]]:
    """The signature a package will declare for its inputs, and a size for each dynamic dim.

    Idempotent, so an exporter may call it before converting (to stop before any work) and the
    export verb again after."""
    signature = apply_input_shapes(readable_dims(signature), options)
    return signature, example_sizes(signature, options, metadata)
