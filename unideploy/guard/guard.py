"""The accuracy guard every stage admits its non-exact artifacts through.

A ``Guard`` holds the fp32 model's outputs on the evaluation rows (the validation half of the
user's data, or the package's reference samples), the labels if any, the metric request and the
budgets. It judges a candidate once (``judge``: each output by its metric, cached by the
candidate's key, so a search's candidates and the final check never run a model twice) and
admits it or raises the stage's own refusal with the numbers (``admit``). A streaming model's
evaluation rows may be whole streams (``stream``): each model then runs over them carrying its own
state, as it will when served. Optimize, edge and ascend use the same one; what differs between
them is only what the candidate is (an ONNX session, a TFLite interpreter, a MindSpore network)
and how a refusal is worded.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from unideploy.errors import InputError, UnideployError
from unideploy.guard.accuracy import (
    DEFAULT_BUDGET_POINTS,
    DEFAULT_DECISION_THRESHOLDS,
    choose_metrics,
    compare,
    describe,
)
from unideploy.package.manifest import AccuracyRecord
from unideploy.samples import join_rows, run_as_stream
from unideploy.signature import Signature

Batch = dict[str, np.ndarray]
Runner = Callable[[Batch], Mapping[str, np.ndarray]]


def settings_of(accuracy: Mapping[str, Any] | None) -> dict[str, Any]:
    """A guard's budget and metric from what the user asked for (``max_accuracy_drop``, ``metric``,
    ``min_cosine``, ``decision_thresholds``, as ``deploy export`` and ``optimize`` take them), the
    defaults where not given: a target's stage (edge's TFLite, ascend's MindIR) judges with the same
    request an optimization does. Thresholds that are no probability are refused here, before any work."""
    given = {k: v for k, v in (accuracy or {}).items() if v is not None}
    thresholds = tuple(given.get("decision_thresholds") or ())
    for threshold in thresholds:
        if not 0.0 < threshold < 1.0:
            raise InputError(
                f"--decision-threshold {threshold:g} is not a probability a yes or a no is decided at",
                "give a value between 0 and 1, such as 0.5, or the one your application uses",
            )
    return {
        "budget_points": given.get("max_accuracy_drop", DEFAULT_BUDGET_POINTS),
        "metric": given.get("metric", "auto"),
        "min_cosine": given.get("min_cosine"),
        "decision_thresholds": thresholds,
    }


def reference_rows(origin: str) -> str:
    """How a verdict names a package's reference rows (``Manifest.samples_origin``): random ones
    say so, since a verdict on them says little about what real inputs will get."""
    return "synthetic reference rows (random inputs)" if origin == "synthetic" else "reference rows"


def run_on(run: Runner, batch: Batch, stream: Signature | None = None) -> dict[str, np.ndarray]:
    """``run``'s outputs on ``batch``; on a stream (``stream``: the model's signature), its outputs
    over the stream run from the initial state, each call given the state ``run`` itself returned
    the call before (``run_as_stream``), so an error in the state compounds as it does when the
    model is served. The state outputs are left out: what they hold counts through the outputs
    they lead to (an LSTM's hidden state may drift where its decisions do not)."""
    if stream is None:
        return dict(run(batch))
    outputs = run_as_stream(run, batch, stream)
    return {name: value for name, value in outputs.items() if name not in stream.state_outputs}


@dataclass
class Guard:
    batches: list[Batch]
    reference: list[dict[str, np.ndarray]]  # the fp32 model's outputs on ``batches``
    labels: np.ndarray | None = None
    metric: str | Sequence[str] = "auto"  # one for every output, and/or OUTPUT=NAME items
    budget_points: float = DEFAULT_BUDGET_POINTS  # percentage points of each output's metric
    min_cosine: float | None = None  # the budget of cosine-judged outputs (default: 1 - budget/100)
    # the probabilities a yes or a no is decided at, as asked for (none: DEFAULT_DECISION_THRESHOLDS)
    decision_thresholds: Sequence[float] = ()
    rows_are: str = "rows"  # how a refusal names the rows ("validation rows", "reference rows")
    rows: int | None = None  # how many rows ``batches`` hold (along each input's batch axis), where known
    output_axes: Mapping[str, int | None] | None = None  # where each output's rows lie (the signature's)
    # a streaming model's signature where each of ``batches`` is a stream (``Dataset.streams``): each
    # model runs over it from the initial state, carrying its own state (``run_on``)
    stream: Signature | None = None
    _judged: dict[Hashable, AccuracyRecord] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, fp32: Runner, batches: list[Batch], labels: np.ndarray | None = None, **settings: Any) -> Guard:
        """A guard whose reference is ``fp32`` run on ``batches``."""
        return cls(batches, [run_on(fp32, b, settings.get("stream")) for b in batches], labels, **settings)

    @cached_property
    def metrics(self) -> dict[str, tuple[str, str]]:
        """(metric, why) per output, chosen once for every candidate; asked for first, it refuses a
        bad ``--metric`` before any candidate is made."""
        reference = join_rows(self.reference, self.output_axes)
        chosen = choose_metrics(
            self.metric, reference, self.labels is not None, self.rows, self.output_axes, self.thresholds
        )
        if self.decision_thresholds and all(metric != "decision" for metric, _ in chosen.values()):
            raise InputError(
                "--decision-threshold applies to outputs judged by 'decision', and none is here ("
                + ", ".join(f"{name}: {metric}" for name, (metric, _) in chosen.items())
                + ")",
                "add --metric OUTPUT=decision for an output of one probability per row, or leave the threshold out",
            )
        return chosen

    @property
    def thresholds(self) -> Sequence[float]:
        """Where the ``decision`` metric cuts: as asked for, or the defaults."""
        return self.decision_thresholds or DEFAULT_DECISION_THRESHOLDS

    def judge(self, key: Hashable, open_runner: Callable[[], Runner]) -> AccuracyRecord:
        """The candidate's accuracy record (every output by its metric, and the verdict); the
        candidate is opened (``open_runner``) and run only the first time ``key`` is judged."""
        if key not in self._judged:
            run = open_runner()
            record = compare(
                self.reference,
                [run_on(run, b, self.stream) for b in self.batches],
                self.labels,
                self.metric,
                self.budget_points,
                self.min_cosine,
                self.metrics,
                self.output_axes,
                self.thresholds,
            )
            record["rows_are"] = self.rows_are
            self._judged[key] = record
        return self._judged[key]

    def numbers(self, accuracy: AccuracyRecord) -> str:
        """'on N rows: <each output's metric, drop and budget>', for messages."""
        return f"on {accuracy['rows']} {self.rows_are}: {describe(accuracy)}"

    def admit(self, accuracy: AccuracyRecord, refusal: Callable[[str], UnideployError]) -> AccuracyRecord:
        """``accuracy`` when it is within budget; else the stage's ``refusal``, given the numbers."""
        if not accuracy["within_budget"]:
            raise refusal(self.numbers(accuracy))
        return accuracy
