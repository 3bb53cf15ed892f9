"""Writing ONNX models: every weight inline where protobuf allows, else in one data file beside."""

from __future__ import annotations

from pathlib import Path

import onnx

# protobuf cannot serialise a single message over 2 GiB: larger models keep their weights outside.
MAX_INLINE_BYTES = 2**31 - 1
# The one external data file of a package's ONNX artifact, beside it in artifacts/.
EXTERNAL_DATA_NAME = "model.onnx.data"


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


STANDALONE_INITIALIZERS = 4  # the IR version from which a weight need not be a graph input too


def oldest_ir_version(model: onnx.ModelProto) -> int:
    """The oldest ONNX IR version that holds ``model``: the one its operator sets need (ONNX's own
    release table), never above the one it has. A model saved by a newer onnx package carries that
    package's IR version (onnx 1.23 writes 14) whatever it uses, and a runtime built before it
    refuses the file: ONNX Runtime Web 1.30 read no IR above 13 ("Unsupported model IR version:
    14"). A model with functions of its own keeps its version (their features are not in the table)."""
    if model.functions:
        return model.ir_version
    needed = onnx.helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return min(model.ir_version, max(needed, STANDALONE_INITIALIZERS))


def save_model(model: onnx.ModelProto, path: Path, external: bool = False) -> None:
    """Save with every weight inline, or (``external``, or over 2 GiB) in one data file beside it."""
    if external or model.ByteSize() > MAX_INLINE_BYTES:
        data = path.with_name(EXTERNAL_DATA_NAME if path.name == "model.onnx" else f"{path.name}.data")
        data.unlink(missing_ok=True)  # onnx appends to an existing data file
        onnx.save(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
            size_threshold=0,
        )
    else:
        onnx.save(model, str(path))


def copy_model(src: Path, dst: Path) -> None:
    """Copy an ONNX model for a tool that reads (or rewrites) one file: weights inline where they
    fit, else beside ``dst`` in one data file."""
    save_model(onnx.load(str(src)), dst)
