"""The ONNX side of the translation: a growing list of nodes and initializers.

Values are ONNX tensor names (``str``); MindIR constants stay Python values until an operator
needs them as tensors, so that attributes (axes, perms, flags) can be read directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from unideploy.errors import ExportError


class Tensor(str):
    """The name of an ONNX value (as opposed to a MindIR constant, which is a plain Python value)."""


class OnnxBuilder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.ranks: dict[str, int] = {}
        self.dtypes: dict[str, str] = {}  # as MindSpore recorded them: a comparison's constant takes its operand's
        self._names: set[str] = set()

    def fresh(self, hint: str) -> str:
        base = "".join(c if c.isalnum() or c in "._" else "_" for c in hint) or "v"
        name, i = base, 0
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        return name

    def initializer(self, array: np.ndarray, hint: str) -> Tensor:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        self.ranks[name] = np.asarray(array).ndim
        self.dtypes[name] = str(np.asarray(array).dtype)
        return Tensor(name)

    def ints(self, values: Any, hint: str = "ints") -> Tensor:
        return self.initializer(np.asarray(values, dtype=np.int64).reshape(-1), hint)

    def tensor(self, value: Any, dtype: str, hint: str = "const") -> Tensor:
        """``value`` as an ONNX value: a name stays a name, a constant becomes an initializer."""
        if isinstance(value, Tensor):
            return value
        if value is None or (isinstance(value, (tuple, list)) and any(isinstance(v, Tensor) for v in value)):
            raise ExportError(f"expected a tensor or a constant, got {value!r}")
        return self.initializer(np.asarray(value, dtype=dtype), hint)

    def op(self, op_type: str, inputs: Sequence[str], hint: str, rank: int | None = None, **attrs: Any) -> Tensor:
        """Append one node with one output."""
        return self.multi_op(op_type, inputs, hint, 1, rank, **attrs)[0]

    def multi_op(
        self, op_type: str, inputs: Sequence[str], hint: str, outputs: int, rank: int | None = None, **attrs: Any
    ) -> list[Tensor]:
        """Append one node with ``outputs`` outputs, all of rank ``rank``."""
        names = [self.fresh(f"{hint}_{op_type}" if i == 0 else f"{hint}_{op_type}_{i}") for i in range(outputs)]
        self.nodes.append(
            helper.make_node(
                op_type, list(inputs), names, name=names[0], **{k: v for k, v in attrs.items() if v is not None}
            )
        )
        if rank is not None:
            self.ranks.update(dict.fromkeys(names, rank))
        return [Tensor(n) for n in names]

    def producer(self, value: str) -> onnx.NodeProto | None:
        return next((n for n in reversed(self.nodes) if value in n.output), None)

    def is_initializer(self, value: str) -> bool:
        return any(i.name == value for i in self.initializers)

    def constant(self, value: str) -> np.ndarray | None:
        """The array of an initializer, for folding work on weights into the weights themselves."""
        found = next((i for i in self.initializers if i.name == value), None)
        return None if found is None else numpy_helper.to_array(found)

    def prune(self, outputs: list[str]) -> None:
        """Drop nodes and initializers nothing reads (a Conv superseded by its copy with a bias)."""
        needed, kept = set(outputs), []
        for node in reversed(self.nodes):
            if needed.intersection(node.output):
                kept.append(node)
                needed.update(node.input)
        self.nodes = kept[::-1]
        self.initializers = [i for i in self.initializers if i.name in needed]

    def rank(self, value: str) -> int:
        if value not in self.ranks:
            raise ExportError(f"the rank of '{value}' is unknown")
        return self.ranks[value]
