"""Models in memory: a PyTorch ``nn.Module`` or a Keras ``keras.Model`` a Python user has in hand.

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
from unideploy.signature import InputShape

TAKEN = "a model file, a torch.nn.Module or a keras.Model"


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
    names = [p for p in inspect.signature(model.forward).parameters if p != "self"]
    given: dict[str, np.ndarray] = dict(examples or {})
    for shape in shapes:
        given.setdefault(shape.name, np.zeros(shape.shape, shape.dtype))
    missing = [n for n in names if n not in given]
    if missing:
        raise InputError(
            f"{type(model).__name__} cannot be scripted ({why}); tracing it needs a value for "
            f"{', '.join(map(repr, missing))}",
            "give example_inputs={name: array} (or input_shapes) for every forward() argument",
        )
    return tuple(torch.from_numpy(np.ascontiguousarray(given[n])) for n in names)
