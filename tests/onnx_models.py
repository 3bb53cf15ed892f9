"""Small ONNX graphs the tests build with onnx.helper, for layouts no exporter here writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def stateful_model(path: Path) -> Path:
    """An ONNX graph with recurrent state laid out as ONNX's LSTM lays it out, [2, batch, 3]: the
    batch is axis 0 of 'x' and axis 1 of 'state' (and of the output 'stateN')."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("ReduceSum", ["state", "axes"], ["summed"], keepdims=0),
            helper.make_node("Add", ["xw", "summed"], ["y"]),
            helper.make_node("Mul", ["state", "half"], ["stateN"]),
        ],
        "stateful",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 3]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [2, "batch", 3]),
        ],
        [
            numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W"),
            numpy_helper.from_array(np.array([0], np.int64), "axes"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        ],
    )
    return _saved(graph, path)


def running_average_model(path: Path) -> Path:
    """A streaming model in its smallest form: h_next = 0.5 h + x, y = 2 h_next, any batch."""
    import onnx
    from onnx import TensorProto, helper

    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["h", "half"], ["decayed"]),
            helper.make_node("Add", ["decayed", "x"], ["h_next"]),
            helper.make_node("Mul", ["h_next", "two"], ["y"]),
        ],
        "running_average",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in ("x", "h")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in ("y", "h_next")],
        [half, two],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def rows_of_state(count: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.standard_normal((count, 4)).astype(np.float32),
        "state": rng.standard_normal((2, count, 3)).astype(np.float32),
    }


def batch_statistic_model(path: Path) -> Path:
    """A graph answering each row's sum ('rows', [batch]) and the sum over the whole call ('total',
    a scalar): an output that does not grow by rows, which no split of a merged call could answer."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x", "last"], ["rows"], keepdims=0),
            helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        ],
        "statistic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["batch"]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, []),
        ],
        [numpy_helper.from_array(np.array([1], np.int64), "last")],
    )
    return _saved(graph, path)


def branching_model(path: Path) -> Path:
    """An ONNX graph whose only weighted layer, a 3x3 Conv, sits in an If branch (as Silero VAD
    keeps its layers, one branch per sample rate): the condition is a graph constant."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    image = ["batch", 1, 8, 8]
    conv = helper.make_graph(
        [helper.make_node("Conv", ["x", "W"], ["convolved"], pads=[1, 1, 1, 1])],
        "conv_branch",
        [],
        [helper.make_tensor_value_info("convolved", TensorProto.FLOAT, image)],
        [numpy_helper.from_array(rng.standard_normal((1, 1, 3, 3)).astype(np.float32), "W")],
    )
    same = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["kept"])],
        "identity_branch",
        [],
        [helper.make_tensor_value_info("kept", TensorProto.FLOAT, image)],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["convolve"], ["y"], then_branch=conv, else_branch=same)],
        "branching",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, image)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, image)],
        [numpy_helper.from_array(np.array(True), "convolve")],
    )
    return _saved(graph, path)


def conv1d_model(path: Path) -> Path:
    """An audio front end: two 1-D convolutions over [batch, 1, samples] (Silero VAD's layers are
    such)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["audio", "W1"], ["hidden"], pads=[1, 1]),
            helper.make_node("Relu", ["hidden"], ["active"]),
            helper.make_node("Conv", ["active", "W2"], ["y"], pads=[1, 1]),
        ],
        "conv1d",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", 1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 64])],
        [
            numpy_helper.from_array(rng.standard_normal((8, 1, 3)).astype(np.float32), "W1"),
            numpy_helper.from_array(rng.standard_normal((4, 8, 3)).astype(np.float32), "W2"),
        ],
    )
    return _saved(graph, path)


def value_sized_model(path: Path) -> Path:
    """A graph whose work is set by an input's value, not its shape: 'total' counts the ones of a
    tensor 'n' elements long (ConstantOfShape, then ReduceSum), as a loop's trip count or the boxes a
    detector keeps set a real model's work. Eight bytes of input take microseconds or seconds."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node(
                "ConstantOfShape", ["n"], ["ones"], value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
            ),
            helper.make_node("ReduceSum", ["ones"], ["total"], keepdims=1),
        ],
        "value_sized",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [1])],
    )
    return _saved(graph, path)


def embedding_model(path: Path, vocabulary: int = 10, through: str | None = None) -> Path:
    """Token ids [batch, 4] looked up in a table of ``vocabulary`` rows (Gather) and averaged: the
    smallest model whose inputs can be wrong in value only, an id past the table, as a text model's
    can. Row ``i`` of the table is ``i`` in each of its 3 columns, so an answer says which ids it read.
    ``through``: an operator the ids pass before the lookup ("Identity", as a converter may leave
    one), which hides the table from the export's reading of the graph (``table_rows``)."""
    from onnx import TensorProto, helper, numpy_helper

    table = np.repeat(np.arange(vocabulary, dtype=np.float32)[:, None], 3, axis=1)
    ids = "ids" if through is None else "passed"
    graph = helper.make_graph(
        [
            *([helper.make_node(through, ["ids"], [ids])] if through else []),
            helper.make_node("Gather", ["table", ids], ["vectors"]),
            helper.make_node("ReduceMean", ["vectors"], ["y"], axes=[1], keepdims=0),
        ],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(table, "table")],
    )
    return _saved(graph, path)


def token_vectors_model(path: Path, width: int, vocabulary: int = 10) -> Path:
    """Token ids [batch, seq] looked up in a table of ``width`` columns (Gather), each id's row
    answered: ``width`` * 4 bytes out for 8 in, as a language model's logits are (GPT-2's 50,257 a
    token), so a small request asks for a large answer whose size the signature says."""
    from onnx import TensorProto, helper, numpy_helper

    table = np.repeat(np.arange(vocabulary, dtype=np.float32)[:, None], width, axis=1)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["vectors"])],
        "token_vectors",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("vectors", TensorProto.FLOAT, ["batch", "seq", width])],
        [numpy_helper.from_array(table, "table")],
    )
    return _saved(graph, path)


def ones_model(path: Path) -> Path:
    """'n' ones (ConstantOfShape): an answer whose size is an input's value, which no signature says."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node(
                "ConstantOfShape", ["n"], ["ones"], value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
            )
        ],
        "ones",
        [helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("ones", TensorProto.FLOAT, ["count"])],
    )
    return _saved(graph, path)


def embedding_package(work: Path, package: Path, through: str | None = None) -> Path:
    """``embedding_model`` (10 rows; ``through`` as there) exported to ``package``, with the ids
    ``[[1, 2, 3, 4]]`` as its example; the model and the example are written into ``work``."""
    import unideploy

    work.mkdir(parents=True, exist_ok=True)
    np.savez(work / "example.npz", ids=np.array([[1, 2, 3, 4]], np.int64))
    model = embedding_model(work / "words.onnx", through=through)
    unideploy.export(model, package, example_inputs=str(work / "example.npz")).close()
    return package


def fixed_width_model(path: Path) -> Path:
    """``y = x @ W`` for ``x`` [batch, width] with ``width`` left open in the graph but ``W`` 4 rows
    tall: a signature that takes any width, a model that computes only 4, as a detector whose image
    sides must be multiples of 32 declares them open."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "fixed_width",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(np.ones((4, 2), np.float32), "W")],
    )
    return _saved(graph, path)


def _saved(graph, path: Path) -> Path:
    """``graph`` as a checked ONNX model of opset 17 (IR 8, which every onnxruntime here reads), at ``path``."""
    import onnx
    from onnx import helper

    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
