"""The accuracy guard: how far an optimized model's outputs are from the fp32 model's.

Every metric is a fraction in [0, 1]; a *drop* is the loss in percentage points against fp32,
which is what ``--max-accuracy-drop`` bounds:

- ``accuracy``: labelled top-1 accuracy (needs ``labels``), drop = fp32 accuracy - accuracy;
- ``top1``: share of rows whose argmax (first output, last axis) matches fp32's, drop = 1 - share;
- ``cosine``: mean cosine similarity of each output row with fp32's, drop = 1 - mean.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from unideploy.errors import InputError

METRICS = ("auto", "accuracy", "top1", "cosine")


def choose_metric(requested: str, has_labels: bool) -> str:
    if requested == "accuracy" and not has_labels:
        raise InputError("--metric accuracy needs labels", "add a 'labels' array to the data, or use --metric top1/cosine")
    if requested != "auto":
        return requested
    return "accuracy" if has_labels else "top1"


def _rows(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1).astype(np.float64) if a.ndim > 1 else a.reshape(-1, 1).astype(np.float64)


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = _rows(a), _rows(b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = (a * b).sum(axis=1)
    return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), (np.abs(a - b).max(axis=1) == 0).astype(float))


def _top1(a: np.ndarray) -> np.ndarray:
    return np.argmax(a, axis=-1).reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(-1, 1)


def compare(reference: Sequence[dict[str, np.ndarray]], candidate: Sequence[dict[str, np.ndarray]],
            labels: np.ndarray | None, metric: str, budget_points: float) -> dict[str, Any]:
    """Metrics of ``candidate`` against ``reference`` outputs, batch by batch, and the verdict."""
    names = list(reference[0])
    ref = {n: np.concatenate([b[n] for b in reference]) for n in names}
    cand = {n: np.concatenate([b[n] for b in candidate]) for n in names}
    primary = names[0]
    outputs = {}
    for n in names:
        cos = _cosine(ref[n], cand[n])
        outputs[n] = {"max_abs_error": float(np.abs(ref[n].astype(np.float64) - cand[n]).max()),
                      "cosine_mean": float(cos.mean()), "cosine_min": float(cos.min())}
    result: dict[str, Any] = {
        "metric": metric,
        "rows": int(ref[primary].shape[0]),
        "outputs": outputs,
        "top1_agreement": float((_top1(ref[primary]) == _top1(cand[primary])).all(axis=1).mean()),
    }
    if labels is not None:  # a fixed-batch model may have left the incomplete last batch out
        truth = np.asarray(labels)[: result["rows"]].reshape(result["rows"], -1)
        result["accuracy_fp32"] = float((_top1(ref[primary]) == truth).all(axis=1).mean())
        result["accuracy"] = float((_top1(cand[primary]) == truth).all(axis=1).mean())
    if metric == "accuracy":
        drop = result["accuracy_fp32"] - result["accuracy"]
    elif metric == "top1":
        drop = 1.0 - result["top1_agreement"]
    else:
        drop = 1.0 - min(o["cosine_mean"] for o in outputs.values())
    result["drop_points"] = round(max(drop, 0.0) * 100.0, 4)
    result["budget_points"] = budget_points
    result["within_budget"] = result["drop_points"] <= budget_points
    return result


def describe(accuracy: dict[str, Any]) -> str:
    """One line of numbers for messages: the metric, the drop and the budget."""
    parts = [f"{accuracy['metric']} drop {accuracy['drop_points']:.2f} points (budget {accuracy['budget_points']:g})"]
    if "accuracy" in accuracy:
        parts.append(f"accuracy {accuracy['accuracy_fp32']:.4f} -> {accuracy['accuracy']:.4f}")
    parts.append(f"top-1 agreement {accuracy['top1_agreement']:.4f}")
    parts.append("cosine " + ", ".join(f"{n} {o['cosine_mean']:.5f}" for n, o in accuracy["outputs"].items()))
    return "; ".join(parts)
