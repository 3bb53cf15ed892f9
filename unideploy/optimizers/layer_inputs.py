"""A model's layer inputs on the calibration batches, computed one graph segment at a time.

The re-fit (``graph.refit_all``) asks for the input of one layer after another, in graph order,
and re-fits each layer before asking for the next. Computed from the model's inputs each time,
layer L's input re-runs every node before it: on EfficientNet-Lite0's 34 layers that was half of a
prune's 167 s. Here the tensors later nodes still read (the frontier: the current layer's input,
a residual branch's start, a shape) are kept between calls, and the next call runs only the nodes
between the two cuts. That is exact for the pruned model as it is re-fitted: the nodes a call runs
read only layers before the one asked for, which are re-fitted by then, and never a later one.

The frontier is held for every calibration row at once, so it is capped (``FRONTIER_MAX_BYTES``,
estimated from the first batch): above it the layer's input is streamed a batch at a time, nothing
is held, and the next layer's input is computed from the model's inputs, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from unideploy.guard.measure import timing_session
from unideploy.onnx.graph import cut, names_read
from unideploy.optimizers.base import Batch

# The frontier held for one model (the re-fit holds two: the original's and the pruned one's).
# EfficientNet-Lite0 at 224x224 holds 1.6 MB a row in one early tensor: 100 rows fit, 512 rows of
# its first stages are streamed.
FRONTIER_MAX_BYTES = 1 << 30


class LayerInputs:
    """``model``'s tensors on ``batches``, each asked for in graph order (see the module docstring).

    ``model`` is read when a tensor is asked for, so a layer re-fitted in place between two calls
    is the layer the next call runs. A tensor's values are read before the next one is asked for."""

    def __init__(self, model: onnx.ModelProto, batches: list[Batch]) -> None:
        self.model = model
        self.batches = batches
        self._reset()

    def _reset(self) -> None:
        self.done: set[int] = set()  # indices of the graph's nodes already run
        names = {i.name for i in self.model.graph.input}
        self.held: dict[str, list[Any]] = {
            name: [np.asarray(batch[name]) for batch in self.batches] for name in names if name in self.batches[0]
        }

    def __call__(self, tensor: str) -> Iterable[np.ndarray]:
        """``tensor``'s value on each batch, computed from what earlier calls left."""
        return self.held[tensor] if tensor in self.held else self._advance(tensor)

    def _advance(self, tensor: str) -> Iterable[np.ndarray]:
        nodes = self.model.graph.node
        needed, segment = {tensor}, list[onnx.NodeProto]()
        for i in reversed(range(len(nodes))):  # what ``tensor`` depends on, back to what is held
            if i not in self.done and needed.intersection(nodes[i].output):
                segment.insert(0, nodes[i])
                needed |= names_read([nodes[i]])
                self.done.add(i)
        later = names_read([node for i, node in enumerate(nodes) if i not in self.done])
        made = [t for node in segment for t in node.output if t and (t in later or t == tensor)]
        fed = [name for name in self.held if name in needed]
        session = self._session(segment, fed, made)
        feeds = [{name: self.held[name][b] for name in fed} for b in range(len(self.batches))]
        first = dict(zip(made, session.run(made, feeds[0])))
        self.held = {name: held for name, held in self.held.items() if name in later}
        kept = sum(v.nbytes for held in self.held.values() for v in held if isinstance(v, np.ndarray))
        rows = len(self.batches) * sum(v.nbytes for v in first.values() if isinstance(v, np.ndarray))
        if kept + rows > FRONTIER_MAX_BYTES or not all(isinstance(v, np.ndarray) for v in first.values()):
            self._reset()  # too much to hold, or a sequence: stream, and start the next from the inputs
            return _streamed(session, tensor, first[tensor], feeds[1:])
        values = {name: [value] for name, value in first.items()}
        for feed in feeds[1:]:
            for name, value in zip(made, session.run(made, feed)):
                values[name].append(value)
        self.held.update(values)
        return values[tensor]

    def _session(self, segment: Sequence[onnx.NodeProto], fed: list[str], made: list[str]) -> Any:
        """A session running ``segment`` from the ``fed`` tensors held to the ``made`` ones."""
        declared = {i.name: i for i in self.model.graph.input}
        inputs = [
            declared.get(name)
            or helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(self.held[name][0].dtype), [None] * self.held[name][0].ndim
            )
            for name in fed
        ]
        return timing_session(cut(self.model, segment, inputs, made).SerializeToString())


def _streamed(session: Any, tensor: str, first: np.ndarray, feeds: list[dict[str, Any]]) -> Iterator[np.ndarray]:
    yield first
    for feed in feeds:
        yield session.run([tensor], feed)[0]
