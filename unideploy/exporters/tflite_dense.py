"""A ``.tflite`` with sparse weights written dense, so that tf2onnx can read it.

TensorFlow's converter stores weights pruned with ``EXPERIMENTAL_SPARSITY`` in TFLite's sparse
format, expanded when the model loads by a ``DENSIFY`` operator (MediaPipe's full-range face
detector ships so). tf2onnx reads the compressed buffer as if it were dense and stops with a
reshape error. The dense values are what LiteRT's own ``DENSIFY`` kernel computes: it runs once,
without XNNPACK (which takes those operators over and keeps no intermediate tensors), and each
``DENSIFY`` is replaced by a constant holding its output. The package keeps the sparse source as
it is: LiteRT runs it, and it stays the reference the ONNX artifact is checked against.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from unideploy.exporters.tflite_flatbuffer import builtin_of, text
from unideploy.quiet import quiet


def sparse_tensors(path: Path) -> list[str]:
    """The names of the tensors stored in TFLite's sparse format in ``path``, in any subgraph."""
    with quiet():
        from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(path))
    return [text(t.name) for g in model.subgraphs for t in g.tensors if t.sparsity is not None]


def densified(src: Path, out: Path) -> int:
    """Write ``src`` to ``out`` with each ``DENSIFY`` of the main subgraph replaced by the dense
    weights it makes; return how many (0: none, and nothing is written)."""
    with quiet():
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
        from tensorflow.lite.python import schema_py_generated as schema
        from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model(str(src))
    codes = {i for i, code in enumerate(model.operatorCodes) if builtin_of(code) == schema.BuiltinOperator.DENSIFY}
    graph = model.subgraphs[0]  # the interpreter's tensor indices are the main subgraph's
    expanding = [op for op in graph.operators if op.opcodeIndex in codes]
    if not expanding:
        return 0
    with quiet():
        interpreter = Interpreter(
            model_path=str(src),
            experimental_preserve_all_tensors=True,
            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
        )
        interpreter.allocate_tensors()
        for detail in interpreter.get_input_details():
            interpreter.set_tensor(detail["index"], np.zeros(detail["shape"], detail["dtype"]))
        interpreter.invoke()
    for op in expanding:
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(interpreter.get_tensor(op.outputs[0]).tobytes(), np.uint8)
        model.buffers.append(buffer)
        for index in (op.outputs[0], op.inputs[0]):  # the sparse input, read by nothing now, dense too
            graph.tensors[index].buffer = len(model.buffers) - 1
            graph.tensors[index].sparsity = None
        graph.operators.remove(op)
    flatbuffer_utils.write_model(model, str(out))
    return len(expanding)
