"""Accuracy metrics as plug-ins (``base.Metric``): built-ins listed here in the order ``--help``
shows them; others arrive through the ``unideploy.metrics`` entry-point group and are asked for
by name (``--metric [OUTPUT=]NAME``)."""

from unideploy.guard.metrics.base import Metric
from unideploy.registry import Registry

METRICS: Registry[Metric] = Registry(
    "metric",
    "unideploy.metrics",
    builtin={
        "accuracy": "unideploy.guard.metrics.builtin:LabelledAccuracy",
        "top1": "unideploy.guard.metrics.builtin:TopOneAgreement",
        "bins": "unideploy.guard.metrics.builtin:NeighbouringBins",
        "text": "unideploy.guard.metrics.builtin:CharacterErrorRate",
        "cosine": "unideploy.guard.metrics.builtin:CosineSimilarity",
        "detection": "unideploy.guard.metrics.builtin:DetectionAP",
        "regions": "unideploy.guard.metrics.builtin:RegionHmean",
        "mask": "unideploy.guard.metrics.builtin:MaskIoU",
        "decision": "unideploy.guard.metrics.builtin:DecisionAgreement",
        "coords": "unideploy.guard.metrics.builtin:CoordinateError",
        "relerr": "unideploy.guard.metrics.builtin:RelativeError",
    },
)

__all__ = ["METRICS", "Metric"]
