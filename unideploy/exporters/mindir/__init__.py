"""MindSpore MindIR -> ONNX: read (reader.py), translate call by call (translate.py, ops.py), package
(exporter.py)."""
