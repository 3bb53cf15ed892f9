"""Keras files -> ONNX, through the SavedModel route: Keras 3 ``.keras`` archives, and the legacy
HDF5 files (``.h5``, ``.hdf5``) that ``model.save('model.h5')`` wrote and many published models
still ship as, which Keras 3 loads too.

Keras writes the serving SavedModel itself (``model.export``), whose signature carries the
inputs' names, dtypes and shapes; from there the SavedModel exporter converts with tf2onnx. The
outputs take the names of the model's output layers, and validation runs the Keras model itself.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from unideploy.errors import InputError, first_line
from unideploy.exporters import trust
from unideploy.exporters.base import ConvertedModel, Exporter, ExportOptions, zip_members
from unideploy.exporters.savedmodel import SavedModelExporter
from unideploy.onnx.interface import rename_values
from unideploy.quiet import quiet
from unideploy.signature import Signature, TensorSpec

HDF5_SUFFIXES = (".h5", ".hdf5")
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"  # where Keras writes it: the file's first bytes


class KerasExporter(Exporter):
    name = "keras"
    framework = "keras"
    required_modules = ("tensorflow", "tf2onnx", "keras")
    extra = "tensorflow"

    @classmethod
    def detect(cls, src: Path) -> bool:
        suffix = src.suffix.lower()
        if suffix in HDF5_SUFFIXES:
            return _is_hdf5(src)
        return suffix == ".keras" and "config.json" in zip_members(src)

    def convert(self, src: Path, workdir: Path, options: ExportOptions) -> ConvertedModel:
        import onnx

        if options.signature:
            raise InputError("--signature applies to SavedModel directories; a Keras file has one serving function")
        config = _hdf5_config(src) if src.suffix.lower() in HDF5_SUFFIXES else _archive_config(src)
        trust.check(trust.keras_findings(config), src, options.trust_source)
        model, saved_model = serving_saved_model(src, workdir, options.trust_source)
        import keras  # loaded quietly by serving_saved_model

        converted = SavedModelExporter().convert(saved_model, workdir, options)
        names = _output_names(model, converted.signature)
        onnx_model = onnx.load(str(converted.onnx_path))
        rename_values(onnx_model, names)
        onnx.save(onnx_model, str(converted.onnx_path))
        signature = Signature(
            converted.signature.inputs,
            tuple(
                TensorSpec(names.get(t.name, t.name), t.dtype, t.shape, t.layout) for t in converted.signature.outputs
            ),
        )
        input_names = signature.input_names

        def run_source(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            result = model(
                {n: inputs[n] for n in input_names} if len(input_names) > 1 else inputs[input_names[0]], training=False
            )
            if isinstance(result, dict):  # outputs keyed by layer name already
                return {k: np.asarray(v) for k, v in result.items()}
            values = result if isinstance(result, (list, tuple)) else [result]
            return {names.get(f"output_{i}", f"output_{i}"): np.asarray(v) for i, v in enumerate(values)}

        return ConvertedModel(
            onnx_path=converted.onnx_path,
            signature=signature,
            run_source=run_source,
            conversion_path=f"Keras {keras.__version__} SavedModel export + {converted.conversion_path}",
            library_versions={**converted.library_versions, "keras": keras.__version__},
            opset=converted.opset,
        )


def _is_hdf5(src: Path) -> bool:
    try:
        with src.open("rb") as file:
            return file.read(len(_HDF5_SIGNATURE)) == _HDF5_SIGNATURE
    except OSError:  # a folder, or unreadable: not this exporter's
        return False


def _archive_config(src: Path) -> Any:
    """A ``.keras`` archive's config.json; {} where it cannot be read (Keras refuses the file, with
    its own reason)."""
    try:
        with zipfile.ZipFile(src) as archive:
            return json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return {}


def _hdf5_config(src: Path) -> Any:
    """An HDF5 file's ``model_config`` attribute, which holds the model (``model.save``; {} where it
    cannot be parsed: Keras refuses the file, with its own reason). ``save_weights`` writes the
    weights alone, which no exporter can make a model of: refused, as is a file h5py cannot read."""
    import h5py  # Keras's own dependency, for its legacy format

    try:
        with h5py.File(src, "r") as h5:
            config = h5.attrs.get("model_config")
    except OSError as exc:
        raise InputError(
            f"'{src}' cannot be read as an HDF5 file: {first_line(exc)}",
            "check that the file was copied whole, or save the model again with model.save('model.keras')",
        ) from exc
    if config is None:
        raise InputError(
            f"'{src}' holds no model configuration, only weights (model.save_weights)",
            "build the model in Keras, load these weights into it with model.load_weights, and "
            "save the whole model with model.save('model.keras')",
        )
    try:
        return json.loads(config)
    except ValueError:
        return {}


def serving_saved_model(src: Path, workdir: Path, trust_source: bool = False) -> tuple[Any, Path]:
    """The Keras model in ``src`` and the serving SavedModel Keras writes for it (under ``workdir``):
    the ONNX export starts from it, and so does TFLite, with TensorFlow's own converter, keeping the
    model's channels-last layout. Safe mode refuses Lambda layers' bytecode unless the user vouched
    for the file (``--trust-source``)."""
    with quiet():
        import keras

        try:
            model = keras.saving.load_model(str(src), compile=False, safe_mode=not trust_source)
        except Exception as exc:
            raise InputError(
                f"'{src}' cannot be loaded by Keras {keras.__version__}: {first_line(exc)}",
                "save it with model.save('model.keras') from Keras 3",
            ) from exc
        saved_model = workdir / "saved_model"
        model.export(str(saved_model), format="tf_saved_model", verbose=False)
    return model, saved_model


def _output_names(model: Any, signature: Signature) -> dict[str, str]:
    """SavedModel output keys (``output_0``, ...) -> the model's output layer names, when distinct."""
    layer_names = list(getattr(model, "output_names", None) or [])
    keys = [f"output_{i}" for i in range(len(layer_names))]
    if (
        len(layer_names) != len(signature.outputs)
        or set(keys) != set(signature.output_names)
        or len(set(layer_names)) != len(layer_names)
        or set(layer_names) & set(signature.input_names)
    ):
        return {}
    return dict(zip(keys, layer_names))
