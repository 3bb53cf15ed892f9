"""The optimizer-pass contract: one ONNX file in, one ONNX file out, and what was done.

Passes do not judge themselves: the pipeline (``optimize.py``) measures every result against the
fp32 artifact on validation data and refuses it if it exceeds the accuracy budget. A pass that
has choices to make (INT8 picks static or dynamic quantization, and which layers stay in fp32)
asks ``ctx.evaluate`` for the same measurements, or ``ctx.judge`` for the accuracy alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from unideploy.optimizers.optimize import OptimizeRequest

from unideploy.errors import InputError
from unideploy.package.manifest import Precision, TargetName
from unideploy.registry import Availability, modules_availability
from unideploy.signature import Signature

Batch = dict[str, np.ndarray]
# magnitude pruning's scopes, here so that the CLI lists them without importing the pass (and onnx)
PRUNE_SCOPES = ("row", "tensor", "global")


@dataclass
class Evaluation:
    """A candidate model measured against the fp32 artifact."""

    accuracy: dict[str, Any]  # metrics, "metric", "drop_points", "within_budget"
    latency_ms: dict[int, dict[str, float]]  # batch size -> {"fp32", "optimized", "speedup"}

    @property
    def within_budget(self) -> bool:
        return bool(self.accuracy["within_budget"])

    @property
    def mean_speedup(self) -> float:
        """Geometric mean of the speedups over the measured batch sizes."""
        speedups = [v["speedup"] for v in self.latency_ms.values()]
        return float(np.exp(np.mean(np.log(speedups)))) if speedups else 1.0


@dataclass
class PassContext:
    signature: Signature
    calibration: list[Batch]  # batches of named inputs, no labels
    workdir: Path
    evaluate: Callable[[Path], Evaluation]
    judge: Callable[[Path], dict[str, Any]]  # the accuracy part of evaluate, without timing
    fixed_batch: int | None = None  # the batch size every input batch must have, if the model fixes one
    say: Callable[[str], None] = lambda _msg: None


@dataclass
class PassResult:
    path: Path
    params: dict[str, Any]  # what was done, including choices and their reasons
    precision: Precision | None = None  # the precision the model now has; None: unchanged
    targets: list[TargetName] | None = None  # deployment targets the result is meant for, when narrower
    notes: list[str] = field(default_factory=list)  # what a user must know (e.g. fp16 on CPU)


STAGES = ("prune", "quantize")  # the order passes run in: quantizing a pruned model keeps its zeros


class OptimizerPass(ABC):
    """A pass describes itself: how a request asks for it (``from_request``), where it runs in the
    chain (``stage``) and how its artifact is named (``tag``). ``optimize`` iterates the registry, so
    a pass added through the ``unideploy.optimizers`` entry points is requested by name (``--pass
    NAME``) with no core file edited."""

    name: ClassVar[str]
    stage: ClassVar[str]  # one of STAGES
    required_modules: ClassVar[tuple[str, ...]] = ("onnx", "onnxruntime")

    @classmethod
    def availability(cls) -> Availability:
        return modules_availability(cls.required_modules, None)

    @classmethod
    def from_request(cls, request: OptimizeRequest) -> OptimizerPass | None:
        """This pass as ``request`` asks for it, or None. By default: named in ``--pass``, with the
        defaults of its constructor."""
        return cls() if cls.name in request.passes else None

    def tag(self) -> str:
        """Its part of the optimized artifact's id (``onnx-<tag>-<tag>``)."""
        return self.name

    @classmethod
    def asked_share(cls, request: OptimizeRequest, method: str, what: str) -> float | None:
        """The share a pruning pass is asked to remove (``--prune``) when ``request`` chooses it by
        ``--prune-method`` or ``--pass``; named by ``--pass`` without ``--prune`` is an error."""
        named = cls.name in request.passes
        if request.prune is None and named:
            raise InputError(f"the {cls.name} pass needs --prune {what}")
        return request.prune if request.prune_method == method or named else None

    @abstractmethod
    def apply(self, model: Path, ctx: PassContext) -> PassResult:
        """Write the optimized model into ``ctx.workdir`` and describe it."""
