"""ONNX Runtime CPU sessions for unideploy's own use (references, measurements, graph rewrites);
serving sessions are the runtime plug-in's."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cpu_session(
    model: Path | bytes, *, optimization: str = "all", spin: bool = True, save_optimized: Path | None = None
) -> Any:
    """An ONNX Runtime CPU session for unideploy's own use (not serving: that is the runtime
    plug-in's), quiet but for errors. ``optimization``: "all", "basic" or "none" (graph rewrites);
    ``spin=False`` stops worker threads busy-waiting after a run, for sessions that take turns."""
    import onnxruntime as ort

    levels = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }
    options = ort.SessionOptions()
    options.graph_optimization_level = levels[optimization]
    options.log_severity_level = 3
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if save_optimized is not None:
        options.optimized_model_filepath = str(save_optimized)
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def basic_optimized(path: Path, out: Path) -> Path:
    """``path`` after ONNX Runtime's basic graph optimizations, written to ``out``: constant
    subgraphs folded, BatchNormalization, bias Adds and scale Muls folded into the Conv before them.
    Exporters leave these as separate nodes (Paddle2ONNX's biases, TorchScript's padding and
    attention masks), which hides from channel pruning which tensors are per-channel constants and
    from onnx2tf which shapes are static. Only standard ONNX ops remain."""
    cpu_session(path, optimization="basic", save_optimized=out)
    return out
