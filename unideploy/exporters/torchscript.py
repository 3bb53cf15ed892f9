"""TorchScript (.pt) -> ONNX.

First the legacy TorchScript-based exporter (keeps If/Loop control flow, dynamic batch through
``dynamic_axes``); where it fails, TS2EP + ``torch.export`` (the only path for a traced
``nn.MultiheadAttention``). TorchScript files carry no input shapes, so the user gives them;
non-tensor ``forward()`` arguments are bound with ``--constant NAME=VALUE``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, InputError, first_line
from unideploy.exporters import trust
from unideploy.exporters.base import Constant, ConvertedModel, Exporter, ExportOptions, zip_members
from unideploy.onnx.interface import opset_of, set_io_dims
from unideploy.quiet import quiet
from unideploy.samples import random_tensor
from unideploy.signature import BATCH_DIM, TensorSpec, contiguous, default_output_names, signature_from_onnx

DEFAULT_OPSET = 17


class TorchScriptExporter(Exporter):
    name = "torchscript"
    framework = "torchscript"
    required_modules = ("torch", "onnxscript")
    extra = "torch"
    binds_constants = True

    @classmethod
    def detect(cls, src: Path) -> bool:
        # TorchScript archives are zips holding a ``*/code/`` folder and ``constants.pkl``.
        return any(n.endswith("constants.pkl") or "/code/" in n for n in zip_members(src))

    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        import onnx
        import torch

        module = _load(src)
        trust.check(trust.torchscript_findings(module), src, options.trust_source)
        _refuse_state_between_calls(module, src)
        tensors = _tensor_arguments(module, options.constants)
        example = _example_inputs(tensors, options)
        arg_names = list(example)  # the ONNX input names, in forward()'s order
        dynamic = {} if options.static_shapes else _input_dynamic_axes(arg_names, options)
        args = tuple(torch.from_numpy(example[n]) for n in arg_names)
        if options.constants:
            module = _bound(module, tensors, options.constants, args)

        with torch.no_grad():
            outputs = flatten_outputs(module(*args))
        output_names = default_output_names(len(outputs))
        batch = args[0].shape[0] if args[0].dim() else None
        leading = all(axes.get(0) == BATCH_DIM for axes in dynamic.values())  # no state with the batch inside
        for name, out in zip(output_names, outputs):
            if not options.static_shapes and leading and out.dim() and out.shape[0] == batch:
                dynamic[name] = {0: BATCH_DIM}

        onnx_path = workdir / "model.onnx"
        opset = options.opset or DEFAULT_OPSET
        try:
            _export_legacy(module, args, onnx_path, arg_names, output_names, dynamic, opset)
            conversion_path = "torch.onnx legacy (TorchScript)"
        except Exception as legacy_error:
            try:
                _export_via_torch_export(module, args, onnx_path, arg_names, output_names)
            except Exception as fallback_error:
                raise _export_failure(src, legacy_error, fallback_error) from fallback_error
            conversion_path = "TS2EP + torch.export (dynamo)"
            _pin_static_dims(onnx_path, example, outputs, output_names, dynamic)

        try:
            onnx.checker.check_model(str(onnx_path))
        except Exception as exc:
            raise ExportError(f"the exporter wrote an invalid ONNX model: {exc}") from exc
        model = onnx.load(str(onnx_path))
        opset = opset_of(model, opset)
        signature = signature_from_onnx(model)

        def run_source(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            with torch.no_grad():
                result = flatten_outputs(module(*(torch.from_numpy(contiguous(inputs[n])) for n in arg_names)))
            return {n: t.detach().cpu().numpy() for n, t in zip(output_names, result)}

        return ConvertedModel(
            onnx_path=onnx_path,
            signature=signature,
            run_source=run_source,
            conversion_path=conversion_path,
            library_versions={"torch": torch.__version__, "onnx": onnx.__version__},
            opset=opset,
        )


def _load(src: Path) -> Any:
    import torch

    try:
        module = torch.jit.load(str(src), map_location="cpu")
    except Exception as exc:
        raise InputError(
            f"'{src}' cannot be loaded as TorchScript: {first_line(exc)}",
            "save the model with torch.jit.save(torch.jit.script(model) or torch.jit.trace(model, x), path)",
        ) from exc
    module.eval()
    return module


def _refuse_state_between_calls(module: Any, src: Path) -> None:
    """A module whose forward() sets its own attributes (a streaming wrapper keeping its recurrent
    state and audio context: Silero VAD's ``silero_vad.jit``) answers each call from the calls
    before it; an exported graph would hold the state it had at export. The legacy exporter failed
    on such a wrapper with a message about a bitwise Not."""
    graph = module.forward.inlined_graph  # held: its nodes are invalid once it is freed
    changed = sorted({node.s("name") for node in graph.findAllNodes("prim::SetAttr")})
    if not changed:
        return
    parts = [name for name, _ in module.named_children()]
    raise InputError(
        f"'{src.name}' changes its own attributes when it runs ({', '.join(changed)}): it carries state from one "
        "call to the next, which an exported graph cannot",
        "export the model that takes that state as an input and returns it"
        + (f" (one of its submodules, {', '.join(parts)}: torch.jit.save(module.NAME, path))" if parts else ""),
    )


def _tensor_arguments(module: Any, constants: Mapping[str, Constant]) -> list[str]:
    """Names of the tensor arguments of ``forward``; every other argument is bound by ``--constant``
    or has a default."""
    names, others = [], []
    for arg in module.forward.schema.arguments[1:]:  # [0] is self
        if str(arg.type) == "Tensor":
            names.append(arg.name)
            continue
        others.append(arg.name)
        if arg.name not in constants and not arg.has_default_value():
            raise InputError(
                f"forward() argument '{arg.name}' has type {arg.type}, which is not a tensor",
                f"bind it with --constant {arg.name}=VALUE (recorded in the package's manifest)",
            )
    if unknown := [name for name in constants if name not in others]:
        raise InputError(
            f"--constant {', '.join(unknown)}: forward() has no such non-tensor argument",
            f"its non-tensor arguments: {', '.join(others) or 'none'}",
        )
    if not names:
        raise ExportError("forward() takes no tensor arguments, so there is nothing to export")
    return names


def _bound(module: Any, tensors: list[str], constants: Mapping[str, Constant], args: tuple) -> Any:
    """``module`` with its non-tensor arguments fixed to ``constants``, traced into TorchScript
    again (its scripted parts stay scripted), so both export paths and the reference runs take
    the tensors alone."""
    import torch

    class Bound(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = module

        def forward(self, *values: Any) -> Any:
            return self.module(**dict(zip(tensors, values)), **constants)

    with torch.no_grad():
        return torch.jit.trace(Bound().eval(), args, check_trace=False)


def _example_inputs(arg_names: list[str], options: ExportOptions) -> dict[str, np.ndarray]:
    """Example tensors in forward()'s argument order, keyed by the input names the package will use.

    With a single argument, the user's name wins (``nn.Sequential`` calls its argument ``input``,
    but users name it ``x``); with several, names must match forward()'s to say which is which.
    """
    expected = ", ".join(arg_names)
    if options.example_inputs is not None:
        given = options.example_inputs
    elif options.input_shapes:
        rng = np.random.default_rng(0)
        given = {
            s.name: random_tensor(TensorSpec(s.name, s.dtype, s.shape), s.shape, rng) for s in options.input_shapes
        }
    else:
        raise InputError(
            "TorchScript files carry no input shapes",
            f"pass --input-shape for each of forward()'s inputs ({expected}), e.g. "
            f"{arg_names[0]}:1x3x224x224, or --example-input FILE.npz",
        )
    if len(arg_names) == 1 and len(given) == 1:
        return {name: contiguous(array) for name, array in given.items()}
    if set(given) != set(arg_names):
        raise InputError(
            f"inputs given for {', '.join(sorted(given))} but forward() takes {expected}",
            "name each --input-shape / example array after forward()'s argument",
        )
    return {n: contiguous(given[n]) for n in arg_names}


def _input_dynamic_axes(arg_names: list[str], options: ExportOptions) -> dict[str, dict[int, str]]:
    """Each input's dynamic axes: axis 0 is the batch, and the dims ``--input-shape`` names, unless it
    names the batch on another axis (recurrent state ``[layers, batch, hidden]``: axis 0 was made a
    second batch axis, so the layers were cut as rows and the source failed on its own inputs)."""
    named = {s.name: s.dim_names for s in options.input_shapes}

    def axes(name: str) -> dict[int, str]:
        given = named.get(name, {})
        return dict(given) if BATCH_DIM in given.values() else {0: BATCH_DIM, **given}

    return {n: axes(n) for n in arg_names}


def flatten_outputs(result: Any) -> list[Any]:
    import torch

    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
        return list(result)
    raise ExportError(
        f"forward() returns {type(result).__name__}; only a tensor or a tuple/list of tensors can be exported",
        "wrap the model so forward() returns tensors",
    )


def _export_legacy(
    module: Any,
    args: tuple,
    path: Path,
    input_names: list[str],
    output_names: list[str],
    dynamic: dict[str, dict[int, str]],
    opset: int,
) -> None:
    import torch

    with quiet():
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            opset_version=opset,
            do_constant_folding=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic or None,
        )


def _export_via_torch_export(
    module: Any, args: tuple, path: Path, input_names: list[str], output_names: list[str]
) -> None:
    import torch
    from torch._export.converter import TS2EPConverter

    with quiet():
        program = TS2EPConverter(module, args).convert()
        torch.onnx.export(
            program,
            args,
            str(path),
            dynamo=True,
            external_data=False,
            input_names=input_names,
            output_names=output_names,
        )


def _pin_static_dims(
    path: Path,
    example: dict[str, np.ndarray],
    outputs: list[Any],
    output_names: list[str],
    dynamic: dict[str, dict[int, str]],
) -> None:
    """torch.export makes every dim symbolic; fix those the user did not declare dynamic."""
    import onnx

    model = onnx.load(str(path))
    sizes = {**{n: a.shape for n, a in example.items()}, **{n: tuple(o.shape) for n, o in zip(output_names, outputs)}}
    set_io_dims(
        model,
        {
            name: [dynamic.get(name, {}).get(axis, size) for axis, size in enumerate(shape)]
            for name, shape in sizes.items()
        },
    )
    onnx.save(model, str(path))


_OPERATOR = re.compile(r"(aten::\w+|aten\.\w+|prim::\w+)")


def unsupported_operator(src: Path, *errors: Exception) -> ExportError | None:
    """The error naming the first torch operator a converter message blames, if one does."""
    for exc in errors:
        match = _OPERATOR.search(str(exc))
        if match:
            op = match.group(1).replace("aten.", "aten::")
            return ExportError(
                f"'{src.name}' uses operator {op}, which has no ONNX conversion ("
                + "; ".join(first_line(e) for e in errors)
                + ")",
                f"replace {op} in the model with supported operations, or compute it outside the model",
            )
    return None


def _export_failure(src: Path, legacy: Exception, fallback: Exception) -> ExportError:
    return unsupported_operator(src, legacy, fallback) or ExportError(
        f"'{src.name}' could not be converted to ONNX (legacy exporter: {first_line(legacy)}; torch.export path: "
        f"{first_line(fallback)})",
        "re-run with --debug for the full converter output",
    )
