"""PyTorch 2 ``torch.export`` programs (``.pt2``, an ExportedProgram) -> ONNX.

The successor of TorchScript: the file carries its graph, weights, the dtype and shape of every
input (dynamic dims as symbols with ranges) and usually the example inputs it was exported with,
so no ``--input-shape`` is needed. ONNX comes from ``torch.onnx.export(program, dynamo=True)``;
validation runs the program itself (``program.module()``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, InputError, first_line
from unideploy.exporters import trust
from unideploy.exporters.base import ConvertedModel, Exporter, ExportOptions, zip_members
from unideploy.exporters.shapes import apply_input_shapes, readable_dims
from unideploy.exporters.torchscript import flatten_outputs, unsupported_operator
from unideploy.onnx.interface import opset_of
from unideploy.quiet import quiet
from unideploy.samples import random_tensor
from unideploy.signature import Signature, TensorSpec, contiguous, default_output_names, signature_from_onnx


class TorchExportExporter(Exporter):
    name = "torch-export"
    framework = "torch"
    required_modules = ("torch", "onnxscript")
    extra = "torch"
    binds_constants = True  # a non-tensor forward() argument, fixed when torch.export ran, confirmed by --constant

    @classmethod
    def detect(cls, src: Path) -> bool:
        # torch.export.save writes a zip whose entries include ``<name>/archive_format``.
        return any(n.endswith("/archive_format") for n in zip_members(src))

    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        import onnx
        import torch

        trust.check(trust.pt2_pickle_findings(src), src, options.trust_source)  # before loading runs them
        program = _load(src)
        trust.check(trust.program_findings(program), src, options.trust_source)
        declared, fixed = _declared_inputs(program)
        _check_constants(fixed, options.constants)
        apply_input_shapes(readable_dims(Signature(tuple(declared))), options)  # refuse contradictions first
        example = _example_arrays(program, declared, options)
        order = [name for name, _ in _user_inputs(program)]  # tensors and constants, in forward()'s order

        def arguments(tensors: dict[str, np.ndarray]) -> tuple:
            return tuple(fixed[n] if n in fixed else torch.from_numpy(contiguous(tensors[n])) for n in order)

        args = arguments(example)
        module = program.module()
        try:
            with torch.no_grad():
                outputs = flatten_outputs(module(*args))
        except (AssertionError, RuntimeError, ValueError) as exc:  # the program's shape guards
            raise InputError(
                f"the program refuses the example inputs "
                f"({', '.join(f'{n}: {list(a.shape)}' for n, a in example.items())}): {first_line(exc)}",
                "give sizes within the ranges the program was exported with",
            ) from exc
        output_names = default_output_names(len(outputs))
        onnx_path = workdir / "model.onnx"
        try:
            with quiet():
                torch.onnx.export(
                    program,
                    args,
                    str(onnx_path),
                    dynamo=True,
                    external_data=False,
                    input_names=[t.name for t in declared],
                    output_names=output_names,
                )
            onnx.checker.check_model(str(onnx_path))
        except Exception as exc:
            raise unsupported_operator(src, exc) or ExportError(
                f"'{src.name}' could not be converted to ONNX: {first_line(exc)}",
                "re-run with --debug for the converter's output",
            ) from exc
        model = onnx.load(str(onnx_path))
        signature = readable_dims(signature_from_onnx(model))
        # The program's own example inputs size its dynamic dims when the user gave none.
        hints = {
            d: int(np.shape(example[t.name])[axis])
            for t in signature.inputs
            for axis, d in enumerate(t.shape)
            if isinstance(d, str)
        }

        def run_source(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            with torch.no_grad():
                result = flatten_outputs(module(*arguments(inputs)))
            return {n: t.detach().cpu().numpy() for n, t in zip(output_names, result)}

        opset = opset_of(model)
        return ConvertedModel(
            onnx_path=onnx_path,
            signature=signature,
            run_source=run_source,
            conversion_path="torch.onnx (dynamo) from the ExportedProgram",
            library_versions={"torch": torch.__version__, "onnx": onnx.__version__},
            opset=opset,
            size_hints=hints,
        )


def _load(src: Path) -> Any:
    import torch

    try:
        with quiet():
            return torch.export.load(str(src))
    except Exception as exc:
        raise InputError(
            f"'{src}' cannot be loaded as a torch.export program: {first_line(exc)}",
            "save it with torch.export.save(torch.export.export(model, args), 'model.pt2')",
        ) from exc


def _user_inputs(program: Any) -> list[tuple[str, Any]]:
    """The program's user inputs in forward()'s order, each with its ``graph_signature`` argument
    (a tensor's, or a ``ConstantArgument`` that torch.export fixed at the value it ran with)."""
    from torch.export.graph_signature import InputKind

    return [(s.arg.name, s.arg) for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]


def _declared_inputs(program: Any) -> tuple[list[TensorSpec], dict[str, Any]]:
    """The program's tensor inputs, with static dims as ints and symbolic ones by symbol name, and
    its non-tensor inputs with the values torch.export fixed them at."""
    from torch.export.graph_signature import ConstantArgument

    values = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    specs, fixed = [], {}
    for name, arg in _user_inputs(program):
        if isinstance(arg, ConstantArgument):
            fixed[name] = arg.value
            continue
        value = values.get(name)
        if value is None or not hasattr(value, "shape"):
            raise ExportError(
                f"input '{name}' of the program is not a tensor; only tensor inputs can be exported",
                "wrap the model so forward() takes tensors only",
            )
        dims = tuple(int(d) if isinstance(d, int) or str(d).isdigit() else str(d) for d in value.shape)
        specs.append(TensorSpec(name, str(value.dtype).removeprefix("torch."), dims))
    if not specs:
        raise ExportError("the program takes no tensor inputs, so there is nothing to export")
    return specs, fixed


def _check_constants(fixed: dict[str, Any], given: dict[str, Any]) -> None:
    """torch.export fixed each non-tensor argument at the value it ran with: the program answers
    only for that value, so ``--constant`` must name it (recorded in the manifest), and no other."""
    if unknown := [name for name in given if name not in fixed]:
        raise InputError(
            f"--constant {', '.join(unknown)}: the program has no such non-tensor input",
            f"its non-tensor inputs: {', '.join(fixed) or 'none'}",
        )
    for name, value in fixed.items():
        if name not in given:
            raise InputError(
                f"forward() argument '{name}' is not a tensor: torch.export fixed it at {value!r}",
                f"pass --constant {name}={value} to export the program at that value (recorded in the manifest)",
            )
        if given[name] != value or type(given[name]) is not type(value):
            raise InputError(
                f"--constant {name}={given[name]!r}, but torch.export fixed '{name}' at {value!r} when the program "
                "was made: it answers only for that value",
                f"pass --constant {name}={value}, or export the program again with {name}={given[name]!r}",
            )


def _example_arrays(program: Any, declared: list[TensorSpec], options: ExportOptions) -> dict[str, np.ndarray]:
    """Inputs to trace ONNX with: --example-input, else the program's own, else --input-shape."""
    names = [t.name for t in declared]
    if options.example_inputs is not None:
        given = dict(options.example_inputs)
    elif program.example_inputs is not None and not options.input_shapes:
        args, _ = program.example_inputs
        given = {n: a.detach().cpu().numpy() for n, a in zip(names, args)}
    elif options.input_shapes:
        rng = np.random.default_rng(0)
        given = {
            s.name: random_tensor(TensorSpec(s.name, s.dtype, s.shape), s.shape, rng) for s in options.input_shapes
        }
    else:
        shapes = " ".join(
            f"--input-shape {t.name}:{','.join(str(d) if isinstance(d, int) else 'SIZE' for d in t.shape)}"
            for t in declared
        )
        raise InputError(
            "the program was saved without example inputs and no sizes were given",
            f"pass {shapes} (SIZE: a size the model takes), or --example-input FILE.npz",
        )
    if set(given) != set(names):
        raise InputError(
            f"inputs given for {', '.join(sorted(given))} but the program takes {', '.join(names)}",
            "name each --input-shape / example array after the program's input",
        )
    return {n: contiguous(given[n]) for n in names}
