"""Exporter plug-ins. Built-ins are listed here; others arrive through the ``unideploy.exporters``
entry-point group."""

from unideploy.exporters.base import ConvertedModel, Exporter, ExportOptions
from unideploy.registry import Registry

EXPORTERS: Registry[Exporter] = Registry(
    "exporter",
    "unideploy.exporters",
    builtin={
        "torchscript": "unideploy.exporters.torchscript:TorchScriptExporter",
        "torch-export": "unideploy.exporters.torch_export:TorchExportExporter",
        "keras": "unideploy.exporters.keras:KerasExporter",
        "onnx": "unideploy.exporters.onnx_file:OnnxFileExporter",
        "savedmodel": "unideploy.exporters.savedmodel:SavedModelExporter",
        "frozen-graph": "unideploy.exporters.frozen_graph:FrozenGraphExporter",
        "tflite": "unideploy.exporters.tflite_file:TFLiteExporter",
        "mindir": "unideploy.exporters.mindir.exporter:MindIRExporter",
    },
)

__all__ = ["EXPORTERS", "ConvertedModel", "ExportOptions", "Exporter"]
