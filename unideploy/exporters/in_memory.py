"""Models in memory: a PyTorch ``nn.Module``, a Keras ``keras.Model`` or a MindSpore ``nn.Cell`` a
Python user has in hand.

Each is saved to the file format its exporter takes, in a scratch folder, and exported from there
as that file would be: the package keeps the saved file as its source, so ``deploy verify`` and
every later stage re-run the same model. Nothing is imported here that the caller has not already
imported (a model object means its framework is loaded)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import ExportError, InputError, first_line
from unideploy.signature import InputShape, contiguous

TAKEN = "a model file, a torch.nn.Module, a keras.Model or a mindspore.nn.Cell"


def is_model_object(src: Any) -> bool:
    return not isinstance(src, (str, Path))


def save_model_object(
    model: Any, folder: Path, example_inputs: dict[str, np.ndarray] | None, input_shapes: list[InputShape]
) -> Path:
    """The file ``model`` was saved to in ``folder``, named after its class."""
    name = type(model).__name__
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(model, torch.nn.Module):
        return _save_torch(torch, model, folder / f"{name}.pt", example_inputs, input_shapes)
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(model, keras.Model):
        path = folder / f"{name}.keras"
        model.save(path)
        return path
    mindspore = sys.modules.get("mindspore")
    if mindspore is not None and isinstance(model, mindspore.nn.Cell):
        return _save_mindspore(mindspore, model, folder / name, example_inputs, input_shapes)
    raise InputError(f"cannot export a {type(model).__module__}.{type(model).__qualname__} object", f"pass {TAKEN}")


def _save_torch(
    torch: Any, model: Any, path: Path, examples: dict[str, np.ndarray] | None, shapes: list[InputShape]
) -> Path:
    """TorchScript: scripted (control flow kept) where TorchScript can compile the module, else
    traced on the example inputs (or zeros of the ``--input-shape`` sizes), in forward()'s order."""
    model = model.eval()
    try:
        saved = torch.jit.script(model)
    except Exception as scripting:  # TorchScript's compiler refuses much ordinary Python
        arguments = _trace_arguments(torch, model, examples, shapes, first_line(scripting))
        try:
            with torch.no_grad():
                saved = torch.jit.trace(model, arguments)
        except Exception as exc:
            raise ExportError(
                f"{type(model).__name__} could neither be scripted ({first_line(scripting)}) nor traced "
                f"({first_line(exc)})",
                "save it yourself (torch.export.save or torch.jit.save) and export the file",
            ) from exc
    torch.jit.save(saved, str(path))
    return path


def _trace_arguments(
    torch: Any, model: Any, examples: dict[str, np.ndarray] | None, shapes: list[InputShape], why: str
) -> tuple[Any, ...]:
    given = _arguments(
        model.forward, examples, shapes, f"{type(model).__name__} cannot be scripted ({why}); tracing it"
    )
    return tuple(torch.from_numpy(contiguous(np.asarray(value))) for value in given)


def _arguments(
    method: Any, examples: dict[str, np.ndarray] | None, shapes: list[InputShape], needing: str
) -> list[np.ndarray]:
    """A value for each argument of ``method`` (forward, construct), in its order: the example
    inputs, else zeros of the ``input_shapes`` sizes."""
    names = [p for p in inspect.signature(method).parameters if p != "self"]
    given: dict[str, np.ndarray] = dict(examples or {})
    for shape in shapes:
        given.setdefault(shape.name, np.zeros(shape.shape, shape.dtype))
    missing = [n for n in names if n not in given]
    if missing:
        raise InputError(
            f"{needing} needs a value for {', '.join(map(repr, missing))}",
            "give example_inputs={name: array} (or input_shapes) for every argument",
        )
    return [np.asarray(given[n]) for n in names]


def _save_mindspore(
    mindspore: Any, cell: Any, stem: Path, examples: dict[str, np.ndarray] | None, shapes: list[InputShape]
) -> Path:
    """MindIR through ``mindspore.export``, each input's first dimension left dynamic (the batch),
    as a user exports a Cell for serving; construct()'s arguments named by its signature."""
    cell.set_train(False)
    arguments = _arguments(cell.construct, examples, shapes, f"exporting {type(cell).__name__} to MindIR")
    placeholders = [
        mindspore.Tensor(shape=[None, *value.shape[1:]] if value.ndim else [], dtype=mindspore.Tensor(value).dtype)
        for value in arguments
    ]
    try:
        mindspore.export(cell, *placeholders, file_name=str(stem), file_format="MINDIR")
    except Exception as exc:
        raise ExportError(
            f"MindSpore could not export {type(cell).__name__} to MindIR: {first_line(exc)}",
            "export it yourself (mindspore.export(..., file_format='MINDIR')) and give the file",
        ) from exc
    return stem.with_suffix(".mindir")
