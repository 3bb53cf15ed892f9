"""The metric contract: one output of a candidate model against the fp32 model's, as a drop in
points of what the metric measures.

A metric declares its name, what it measures (shown by ``--help`` and docs/optimize.md), the
budget option that bounds its drop, whether it needs labels, and how its numbers read in a
message. Choosing a metric for an output from its shape and values is ``guard/accuracy.py``'s job;
a metric added through the ``unideploy.metrics`` entry points is chosen by name
(``--metric [OUTPUT=]NAME``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from unideploy.guard.metrics.maps import THRESHOLDS
from unideploy.registry import Availability

Budget = Literal["max_accuracy_drop", "min_cosine"]  # the options that bound a drop
BUDGET_OPTIONS: dict[Budget, str] = {"max_accuracy_drop": "--max-accuracy-drop", "min_cosine": "--min-cosine"}


@dataclass(frozen=True)
class Output:
    """What a metric sees of one output: every validation row of both models, by batch too (for
    metrics that decode sequences batch by batch), the fp32 model's other outputs (coordinates are
    read beside their class probabilities) and the labels, if any (rows x label columns)."""

    name: str
    reference: np.ndarray
    candidate: np.ndarray
    reference_batches: Sequence[np.ndarray]
    candidate_batches: Sequence[np.ndarray]
    all_references: Mapping[str, np.ndarray]
    labels: np.ndarray | None
    # the probabilities the application decides at (``--decision-threshold``), for metrics of a yes or a no
    decision_thresholds: Sequence[float] = THRESHOLDS


class Metric(ABC):
    name: ClassVar[str]
    measures: ClassVar[str]  # one line: what the drop is a drop of
    budget: ClassVar[Budget] = "max_accuracy_drop"
    needs_labels: ClassVar[bool] = False

    @classmethod
    def availability(cls) -> Availability:
        """A metric needs nothing beyond the core's numpy, scipy and rapidfuzz; it says what it measures."""
        return Availability(True, cls.measures)

    @abstractmethod
    def score(self, output: Output) -> tuple[float, dict[str, Any]]:
        """The drop as a fraction (0: as fp32; 1: nothing kept) and the numbers behind it, which go
        into the output's record."""

    @abstractmethod
    def detail(self, record: Mapping[str, Any]) -> str:
        """What the metric measured, in words, from the output's record (messages, the CLI's table)."""


def probabilities(ref: np.ndarray) -> bool:
    """Rows of non-negative values summing to one over a last axis of two or more: class probabilities."""
    if ref.ndim < 2 or ref.shape[-1] < 2 or not np.issubdtype(ref.dtype, np.floating):
        return False  # text labels (a scikit-learn classifier's) are not scores
    values = ref.astype(np.float64)
    return bool((values >= -1e-6).all()) and bool(np.allclose(values.sum(-1), 1.0, atol=1e-3))


def rows(a: np.ndarray) -> np.ndarray:
    """One row per validation row, in float64."""
    return a.reshape(a.shape[0], -1).astype(np.float64) if a.ndim > 1 else a.reshape(-1, 1).astype(np.float64)


def classes(a: np.ndarray) -> np.ndarray:
    """The class each row (or position) holds: the argmax of scores, or integer values as they are."""
    if not np.issubdtype(a.dtype, np.floating):
        return a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)
    return np.argmax(a, axis=-1).reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(-1, 1)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row's cosine similarity; two zero rows are alike (1), a zero and a non-zero row not (0)."""
    a, b = rows(a), rows(b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = (a * b).sum(axis=1)
    with np.errstate(invalid="ignore"):  # an infinite row's cosine is NaN, which compare() reads as the output lost
        return np.where(
            norms > 0, dots / np.where(norms > 0, norms, 1.0), (np.abs(a - b).max(axis=1) == 0).astype(float)
        )


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """L2 error over all rows relative to the L2 norm of the fp32 outputs: rows that are nearly
    zero (a text detector's heatmap of a photo without text) cannot blow it up, as a per-row ratio
    would."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(float(np.linalg.norm(a)), 1e-12))
