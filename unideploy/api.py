"""The Python API: the same verbs as the CLI, returning objects instead of printing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from unideploy.package import Package

if TYPE_CHECKING:
    from unideploy.optimizers.base import OptimizeRequest


def export(
    src: str | Path | Any,
    output: str | Path,
    *,
    input_shapes: Sequence[str] = (),
    example_inputs: Mapping[str, np.ndarray] | str | None = None,
    static_shapes: bool = False,
    opset: int | None = None,
    signature: str | None = None,
    optimization: OptimizeRequest | None = None,
    keep_native_only: bool = False,
    trust_source: bool = False,
    constants: Mapping[str, int | float | bool | str] | None = None,
    state: Sequence[str] = (),
    **kwargs: Any,
) -> Package:
    """Export a model file, or a model in memory (a ``torch.nn.Module``, a ``keras.Model``, a
    MindSpore ``nn.Cell``), to a verified package (optimized too, if asked) and return it opened. A
    module is saved as TorchScript (scripted, else traced on ``example_inputs`` or zeros of
    ``input_shapes``), a Keras model as ``.keras``, a Cell as MindIR (its batch dimension dynamic):
    the package keeps that file as its source.
    ``constants``: values for a TorchScript ``forward()``'s non-tensor arguments (``{"sr": 16000}``;
    a ``.pt2`` program's as torch.export fixed them). ``state``: a streaming model's state inputs,
    as ``deploy export --state`` takes them (``["state=stateN"]``).

    ``kwargs`` are those of :func:`unideploy.exporters.export.export` (name, version, exporter,
    target, atol, rtol, overwrite), and ``target_options``: the target stage's options by name
    (``calibration``; ``trt_precision``, ``trt_profile``, ``trt_workspace``; targets.py) and
    ``accuracy``, the budget and metric its accuracy guard judges with
    (``{"max_accuracy_drop": 5, "metric": ("auto",), "min_cosine": None, "decision_thresholds": (0.97,)}``).
    """
    from unideploy.exporters import ExportOptions
    from unideploy.pipeline import export_package

    options = ExportOptions.from_user(
        input_shapes=input_shapes,
        example_inputs=example_inputs,
        static_shapes=static_shapes,
        opset=opset,
        signature=signature,
        keep_native_only=keep_native_only,
        trust_source=trust_source,
        constants=constants or {},
        state=state,
    )
    from unideploy.exporters.in_memory import is_model_object, save_model_object

    if not is_model_object(src):
        return Package.open(export_package(src, output, options=options, optimization=optimization, **kwargs))
    from unideploy.package.files import scratch_dir

    with scratch_dir("unideploy-in-memory-") as tmp:
        saved = save_model_object(src, Path(tmp), options.example_inputs, options.input_shapes)
        kwargs.setdefault("name", type(src).__name__.lower())
        return Package.open(export_package(saved, output, options=options, optimization=optimization, **kwargs))


def optimize(package: str | Path, output: str | Path | None = None, **request: Any) -> Package:
    """Add an optimized artifact (``quantize="int8"``, ``prune=0.8``, ``calibration="data.npz"``, ...:
    the fields of :class:`unideploy.optimizers.base.OptimizeRequest`, and the passes' own options such
    as ``int8_variant="static"``) and return the package."""
    from unideploy.optimizers.base import OptimizeRequest
    from unideploy.optimizers.optimize import optimize as optimize_package

    return Package.open(optimize_package(package, OptimizeRequest.of(**request), output))


def open_package(path: str | Path) -> Package:
    """Open and verify a package (directory or .zip)."""
    return Package.open(path)


def run(
    package: Package | str | Path,
    inputs: Mapping[str, Any],
    *,
    artifact: str | None = None,
    runtime: str | None = None,
    device: str = "auto",
) -> dict[str, np.ndarray]:
    """Run named inputs through a package on the best available runtime (or the named one). A
    streaming model given none of its state inputs takes the rows as one stream, its state carried
    from call to call (``samples.run_as_stream``)."""
    from unideploy.runtimes import RuntimeOptions
    from unideploy.runtimes.selection import open_runtime
    from unideploy.samples import run_in_batches

    pkg = package if isinstance(package, Package) else Package.open(package)
    try:
        chosen, engine = open_runtime(pkg, artifact, runtime, RuntimeOptions(device=device))
        with engine:  # a batch-1 model given several rows runs them a batch at a time
            return run_in_batches(engine.run, inputs, pkg.manifest.signature_of(chosen))
    finally:
        if pkg is not package:
            pkg.close()
