"""The optimizer-pass contract: one ONNX file in, one ONNX file out, and what was done.

Passes do not judge themselves: the pipeline (``optimize.py``) measures every result against the
fp32 artifact on validation data and refuses it if it exceeds the accuracy budget. A pass that
has choices to make (INT8 picks static or dynamic quantization, and which layers stay in fp32)
asks ``ctx.evaluate`` for the same measurements, or ``ctx.judge`` for the accuracy alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from unideploy.errors import InputError
from unideploy.guard.accuracy import DEFAULT_BUDGET_POINTS
from unideploy.options import PluginOptions
from unideploy.package.manifest import AccuracyRecord, Precision, TargetName
from unideploy.registry import Availability, modules_availability
from unideploy.samples import batch_size_of
from unideploy.signature import Signature

Batch = dict[str, np.ndarray]


@dataclass
class Evaluation:
    """A candidate model measured against the fp32 artifact."""

    accuracy: AccuracyRecord
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
    judge: Callable[[Path], AccuracyRecord]  # the accuracy part of evaluate, without timing
    fixed_batch: int | None = None  # the batch size every input batch must have, if the model fixes one
    say: Callable[[str], None] = lambda _msg: None

    def first_batches(self, rows: int) -> list[Batch]:
        """The leading calibration batches that hold at least ``rows`` rows (all, if there are
        fewer), counted along each input's batch axis: a recurrent model's state ``[layers, batch,
        hidden]`` holds its rows on axis 1, so its axis 0 says nothing about how many there are."""
        taken, count = [], 0
        for batch in self.calibration:
            if count >= rows:
                break
            taken.append(batch)
            count += batch_size_of(batch, self.signature.batch_axes)
        return taken


@dataclass
class PassResult:
    path: Path
    params: dict[str, Any]  # what was done, including choices and their reasons
    precision: Precision | None = None  # the precision the model now has; None: unchanged
    targets: list[TargetName] | None = None  # deployment targets the result is meant for, when narrower
    notes: list[str] = field(default_factory=list)  # what a user must know (e.g. fp16 on CPU)


@dataclass
class OptimizeRequest:
    """What to optimize and how to judge it. The passes' own settings (``--int8-variant``,
    ``--prune-scope``, a plug-in pass's) are in ``options`` by name: each pass reads and checks its
    part (``OptimizerPass.options``); ``OptimizeRequest.of`` sorts keyword arguments into the two."""

    quantize: str | None = None  # "int8" or "fp16"
    prune: float | None = None  # sparsity (magnitude) or share of channels removed (channels)
    prune_method: str = "magnitude"
    calibration: str | None = None
    validation: str | None = None
    synthetic: bool = False
    max_accuracy_drop: float = DEFAULT_BUDGET_POINTS  # percentage points
    metric: str | tuple[str, ...] = "auto"  # one for every output, and/or OUTPUT=NAME items
    min_cosine: float | None = None  # the budget of cosine-judged outputs (default: 1 - budget/100)
    decision_thresholds: tuple[float, ...] = ()  # where a yes or a no is decided (default: 0.3 and 0.5)
    artifact: str | None = None  # the artifact to start from (default: the fp32 ONNX one)
    passes: tuple[str, ...] = ()  # passes asked for by name (--pass), e.g. one added through an entry point
    options: Mapping[str, Any] = field(default_factory=dict)  # the passes' own options, by field name

    @classmethod
    def of(cls, **values: Any) -> OptimizeRequest:
        """A request from keyword arguments: the request's fields, and any other as a pass option
        (``OptimizeRequest.of(quantize="int8", int8_variant="static")``)."""
        own = {f.name for f in fields(cls)} - {"options"}
        return cls(
            **{k: v for k, v in values.items() if k in own},
            options={**values.get("options", {}), **{k: v for k, v in values.items() if k not in own | {"options"}}},
        )

    @property
    def requested(self) -> bool:
        return bool(self.quantize or self.prune or self.passes)

    @property
    def accuracy(self) -> dict[str, Any]:
        """The budget and metric asked for, as every stage's guard takes them (``guard.settings_of``)."""
        return {
            "max_accuracy_drop": self.max_accuracy_drop,
            "metric": self.metric,
            "min_cosine": self.min_cosine,
            "decision_thresholds": self.decision_thresholds,
        }


STAGES = ("prune", "quantize")  # the order passes run in: quantizing a pruned model keeps its zeros


class OptimizerPass(ABC):
    """A pass describes itself: how a request asks for it (``from_request``), where it runs in the
    chain (``stage``) and how its artifact is named (``tag``). ``optimize`` iterates the registry, so
    a pass added through the ``unideploy.optimizers`` entry points is requested by name (``--pass
    NAME``) with no core file edited."""

    name: ClassVar[str]
    stage: ClassVar[str]  # one of STAGES
    options: ClassVar[type[PluginOptions]] = PluginOptions  # its own settings (none by default)
    required_modules: ClassVar[tuple[str, ...]] = ("onnx", "onnxruntime")

    @classmethod
    def availability(cls) -> Availability:
        return modules_availability(cls.required_modules, None)

    @classmethod
    def from_request(cls, request: OptimizeRequest) -> OptimizerPass | None:
        """This pass as ``request`` asks for it, or None. By default: named in ``--pass``, built
        with no arguments."""
        return cls() if cls.name in request.passes else None

    @classmethod
    def settings(cls, request: OptimizeRequest) -> Any:
        """This pass's own options in ``request`` (those its ``options`` model declares), checked."""
        return cls.options.parse(
            {k: v for k, v in request.options.items() if k in cls.options.model_fields}, f"the {cls.name} pass"
        )

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
