"""Optimization profiles: the min/opt/max shape of every dynamic input an engine is built for.

TensorRT engines only accept shapes inside their profile, so every dynamic dimension needs a
range. The batch dimension gets a default range; any other named dimension (a sequence length)
must be given, because no default would be right for both a 16-token classifier and a
512-token encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

from unideploy.errors import InputError
from unideploy.signature import Signature, TensorSpec

DEFAULT_BATCH = (1, 8, 32)  # min, opt, max rows when the batch dimension is dynamic


@dataclass(frozen=True)
class InputProfile:
    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def to_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}

    def contains(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.min) and all(lo <= d <= hi for lo, d, hi in zip(self.min, shape, self.max))


def shape_text(dims: tuple[int, ...]) -> str:
    """A shape as ``--trt-profile`` and ONNX Runtime's TensorRT provider write it: ``1x3x32x32``."""
    return "x".join(map(str, dims))


def parse_profile(text: str) -> tuple[str, tuple[tuple[int, ...], ...]]:
    """``NAME:MIN,OPT,MAX`` with each shape as ``1x128`` (one shape alone means min = opt = max)."""
    name, sep, shapes = text.partition(":")
    example = "ids:1x16,8x128,32x512"
    if not sep or not name:
        raise InputError(f"--trt-profile '{text}' is not NAME:MIN,OPT,MAX", f"for example {example}")
    try:
        parsed = tuple(tuple(int(d) for d in s.split("x")) for s in shapes.split(","))
    except ValueError:
        raise InputError(
            f"--trt-profile '{text}' has a shape that is not whole numbers joined by 'x'", f"for example {example}"
        ) from None
    if len(parsed) == 1:
        parsed = parsed * 3
    if len(parsed) != 3:
        raise InputError(f"--trt-profile '{text}' needs 1 or 3 shapes, got {len(parsed)}", f"for example {example}")
    return name, parsed


def build_profiles(signature: Signature, given: list[str] | None = None) -> list[InputProfile]:
    """One profile entry per input: fixed inputs are their shape; dynamic ones the given range or,
    for a dynamic batch alone, DEFAULT_BATCH (on the input's batch axis: recurrent state
    ``[layers, batch, hidden]`` has it at axis 1)."""
    overrides = dict(parse_profile(text) for text in given or [])
    unknown = set(overrides) - set(signature.input_names)
    if unknown:
        raise InputError(
            f"--trt-profile names unknown input(s) {sorted(unknown)}", f"inputs: {', '.join(signature.input_names)}"
        )
    profiles = [_profile(spec, overrides.get(spec.name), signature.batch_axes[spec.name]) for spec in signature.inputs]
    _check_shared_dims(signature, profiles)
    return profiles


def _check_shared_dims(signature: Signature, profiles: list[InputProfile]) -> None:
    """Inputs that share a named dimension (``batch``, ``seq``) must give it the same range, or
    the engine would be built for shapes the model can never receive together."""
    seen: dict[str, tuple[str, tuple[int, int, int]]] = {}
    for spec, profile in zip(signature.inputs, profiles):
        for axis, dim in enumerate(spec.shape):
            if isinstance(dim, int):
                continue
            ranges = (profile.min[axis], profile.opt[axis], profile.max[axis])
            first = seen.setdefault(str(dim), (spec.name, ranges))
            if first[1] != ranges:
                raise InputError(
                    f"dimension '{dim}' is {'/'.join(map(str, first[1]))} (min/opt/max) for "
                    f"'{first[0]}' but {'/'.join(map(str, ranges))} for '{spec.name}'",
                    "give every input that shares a dimension the same range in --trt-profile",
                )


def _profile(spec: TensorSpec, given: tuple[tuple[int, ...], ...] | None, batch_axis: int | None) -> InputProfile:
    if given is not None:
        low, opt, high = given
        for shape in given:
            if len(shape) != len(spec.shape):
                raise InputError(
                    f"--trt-profile for '{spec.name}' has rank {len(shape)}, the input has rank "
                    f"{len(spec.shape)} ({spec.shape_text()})"
                )
            for axis, (d, want) in enumerate(zip(shape, spec.shape)):
                if isinstance(want, int) and d != want:
                    raise InputError(f"--trt-profile for '{spec.name}': dimension {axis} is fixed at {want}, not {d}")
                if d < 1:
                    raise InputError(f"--trt-profile for '{spec.name}': dimension {axis} must be at least 1")
        if not all(a <= b <= c for a, b, c in zip(low, opt, high)):
            raise InputError(f"--trt-profile for '{spec.name}' must satisfy min <= opt <= max in every dimension")
        return InputProfile(spec.name, low, opt, high)
    dims: list[tuple[int, int, int]] = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int):
            dims.append((dim, dim, dim))
        elif axis == batch_axis:
            dims.append(DEFAULT_BATCH)
        else:
            raise InputError(
                f"input '{spec.name}' has the dynamic dimension '{dim}' ({spec.shape_text()}), which "
                "needs a range for TensorRT",
                f"give --trt-profile {spec.name}:MIN,OPT,MAX (shapes like 1x16,8x128,32x512)",
            )
    return InputProfile(spec.name, *(tuple(col) for col in zip(*dims)))
