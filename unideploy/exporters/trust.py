"""Untrusted source models: the operations in a model that reach outside it when it runs.

Exporting runs the source framework on the model (conversion traces it; validation runs it on the
reference samples). A model file is code: a TorchScript ``forward`` can map, read and write files
(``aten::from_file``, ``aten::save``), a SavedModel graph can (ReadFile, WriteFile, MatchingFiles)
or call back into Python (PyFunc), a MindIR can dump tensors to files (TensorDump) or run Python
(PyExecute), and a Keras Lambda layer is Python bytecode stored in the file.
Each exporter lists what its model holds of these before running it (loading TorchScript or a
SavedModel's graph runs nothing), and the export stops with that list unless the user passed
``--trust-source``. Loading can run code too: ``torch.export.load`` unpickles a ``.pt2``'s pickled
weights, constants and sample inputs without restriction when torch's weights-only unpickler
refuses them, so those are checked with that unpickler before the program is loaded. The threat
model and what the scan does not cover: docs/security.md.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from unideploy.errors import InputError

# TorchScript operators that touch the file system, or call Python (which can do anything)
TORCHSCRIPT_OPS = {
    "aten::from_file": "maps or reads a file",
    "aten::save": "writes a file",
    "debugprims::load_tensor": "reads a file",
    "prim::PythonOp": "calls Python code",
}
# TensorFlow operators that touch the file system or call Python; a SavedModel's own variable
# saving and restoring (SaveV2, RestoreV2) and its asset tables are part of the format, not flagged.
TENSORFLOW_OPS = {
    "ReadFile": "reads a file",
    "WriteFile": "writes a file",
    "MatchingFiles": "lists files",
    "ImmutableConst": "maps a file into memory",
    "PyFunc": "calls Python code",
    "PyFuncStateless": "calls Python code",
    "EagerPyFunc": "calls Python code",
}
KERAS_LAYERS = {"Lambda": "runs Python bytecode stored in the file"}
# MindSpore primitives that write files or run Python when a MindIR runs (GraphCell)
MINDSPORE_OPS = {
    "TensorDump": "writes .npy files",
    "DumpGradient": "writes .npy files",
    "PyExecute": "runs Python code",
    "PyInterpret": "runs Python code",
    "PyFunc": "calls Python code",
}


def check(findings: Iterable[str], src: Path, trusted: bool) -> None:
    """Stop the export when the model holds operations that reach outside it, unless trusted."""
    found = sorted(set(findings))
    if found and not trusted:
        raise InputError(
            f"'{src.name}' contains operations that reach outside the model when it runs: {'; '.join(found)}; "
            "exporting runs the model, so nothing was run",
            "export it only if you trust where it came from, with --trust-source (see docs/security.md)",
        )


def _described(kinds: Iterable[str], table: dict[str, str], where: str) -> list[str]:
    return [f"{kind} ({table[kind]}) in {where}" for kind in kinds if kind in table]


def torchscript_findings(module: Any) -> list[str]:
    """Flagged operators in every method of a loaded TorchScript module and its submodules."""
    findings = []
    for prefix, submodule in module.named_modules():
        for method in submodule._c._method_names():
            kinds = {node.kind() for node in _nodes(submodule._c._get_method(method).graph)}
            findings += _described(kinds, TORCHSCRIPT_OPS, f"{prefix + '.' if prefix else ''}{method}()")
    return findings


def _nodes(block: Any) -> Iterable[Any]:
    """The nodes of a TorchScript graph or block, with those of the blocks nested in them (if, loop)."""
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def pt2_pickle_findings(src: Path) -> list[str]:
    """Pickles in a ``.pt2`` archive that need more than torch's weights-only unpickler (its
    allowlist of tensor types): loading the program would unpickle them without restriction."""
    import torch

    if not zipfile.is_zipfile(src):
        return []  # not an archive: loading it fails, with torch's own reason, before anything runs
    findings = []
    with zipfile.ZipFile(src) as archive:
        names = set(archive.namelist())
        pickled = [n for n in names if "/data/sample_inputs/" in n]
        for config in (n for n in names if n.endswith(("_weights_config.json", "_constants_config.json"))):
            folder = config.rsplit("/", 1)[0]
            entries = json.loads(archive.read(config)).get("config", {})
            pickled += [f"{folder}/{e['path_name']}" for e in entries.values() if e.get("use_pickle")]
        for name in sorted(set(pickled) & names):
            try:
                torch.load(io.BytesIO(archive.read(name)), weights_only=True, map_location="cpu")
            except pickle.UnpicklingError as exc:
                unsupported = re.search(r"unsupported GLOBAL (\S+)", str(exc), re.IGNORECASE)
                what = f"imports {unsupported.group(1)}" if unsupported else "not plain tensors"
                findings.append(f"pickle '{name}' ({what}), which loading the program would run")
    return findings


def program_findings(program: Any) -> list[str]:
    """Flagged operators in a torch.export program. Its graph can call only what deserialization
    resolves by name (ATen and registered operators, ``operator.getitem``, higher-order operators),
    never arbitrary Python."""
    kinds = {
        node.target._schema.name
        for node in program.graph_module.graph.nodes
        if node.op == "call_function" and hasattr(node.target, "_schema")
    }
    return _described(kinds, TORCHSCRIPT_OPS, "the program's graph")


def savedmodel_findings(proto: Any) -> list[str]:
    """Flagged operators in a parsed SavedModel's graphs and functions."""
    return [finding for meta in proto.meta_graphs for finding in graph_def_findings(meta.graph_def)]


def graph_def_findings(graph_def: Any) -> list[str]:
    """Flagged operators in a TensorFlow GraphDef (a frozen graph, a SavedModel's) and its functions."""
    findings = _described({n.op for n in graph_def.node}, TENSORFLOW_OPS, "the graph")
    for function in graph_def.library.function:
        findings += _described({n.op for n in function.node_def}, TENSORFLOW_OPS, f"function {function.signature.name}")
    return findings


def mindir_findings(primitives: Iterable[str]) -> list[str]:
    """Flagged primitives among those a MindIR file defines (its main graph and every subgraph
    call primitives from the one model-level list)."""
    return _described(set(primitives), MINDSPORE_OPS, "the file's primitives")


def keras_findings(config: Any) -> list[str]:
    """Flagged layers in a Keras model's configuration (nested models included), as the exporter
    read it from the file (``exporters/keras.py``: a ``.keras`` archive's config.json, an HDF5 file's
    ``model_config``)."""
    findings = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if value.get("class_name") in KERAS_LAYERS:
                name = (value.get("config") or {}).get("name", "?")
                findings.extend(_described([value["class_name"]], KERAS_LAYERS, f"layer '{name}'"))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(config)
    return findings
