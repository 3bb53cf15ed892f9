"""Unstructured magnitude pruning: zero the smallest weights, then re-fit the rest.

On ONNX Runtime sparse weights run no faster (no sparse kernels on CPU); what a user gains is a
smaller *compressed* file for download or OTA updates. The pass says so in its notes, and the
package records compressed size next to the real latency.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from unideploy.errors import InputError
from unideploy.optimizers.base import OptimizerPass, PassContext, PassResult
from unideploy.optimizers.graph import linear_layers, load_for_pruning, refit_all

SCOPES = ("global", "tensor")


def check_fraction(value: float, what: str) -> float:
    if not 0.0 < value < 1.0:
        raise InputError(f"{what} must be between 0 and 1 (exclusive), got {value:g}", "e.g. --prune 0.8 for 80%")
    return value


class MagnitudePruning(OptimizerPass):
    name = "prune-magnitude"
    stage = "prune"

    def __init__(self, sparsity: float, scope: str = "global", refit: bool = True) -> None:
        self.sparsity = check_fraction(sparsity, "--prune sparsity")
        if scope not in SCOPES:
            raise InputError(f"unknown pruning scope '{scope}'", f"use one of: {', '.join(SCOPES)}")
        self.scope = scope
        self.refit = refit

    def apply(self, model_path: Path, ctx: PassContext) -> PassResult:
        model, original = load_for_pruning(model_path)
        layers = linear_layers(model)
        if not layers:
            raise InputError("the model has no Conv/Gemm/MatMul weights to prune")
        matrices = {l.node.name: l.matrix(model) for l in layers}
        # Magnitudes relative to each layer's RMS: exporters fold BatchNorm into weights, so raw
        # scales differ per layer and a raw global threshold would empty whole layers.
        scores = {n: np.abs(m) / max(float(np.sqrt(np.mean(m.astype(np.float64) ** 2))), 1e-12)
                  for n, m in matrices.items()}
        if self.scope == "global":
            everything = np.concatenate([s.ravel() for s in scores.values()])
            thresholds = dict.fromkeys(scores, float(np.quantile(everything, self.sparsity)))
        else:
            thresholds = {n: float(np.quantile(s, self.sparsity)) for n, s in scores.items()}
        masks = {n: s > thresholds[n] for n, s in scores.items()}
        for layer in layers:  # biases stay dense
            layer.store(model, matrices[layer.node.name] * masks[layer.node.name], None)
        refitted = self.refit and bool(ctx.calibration)
        if refitted:
            refit_all(original, model, masks, ctx.calibration, ctx.say)
        out = ctx.workdir / "pruned-magnitude.onnx"
        onnx.save(model, str(out))
        kept = sum(int(m.sum()) for m in masks.values())
        total = sum(m.size for m in masks.values())
        return PassResult(
            path=out,
            params={"sparsity": self.sparsity, "scope": self.scope, "refit": refitted,
                    "layers": len(layers), "achieved_sparsity": round(1 - kept / total, 4)},
            notes=["unstructured sparsity makes the file compress better; ONNX Runtime on CPU does not run it faster"],
        )
