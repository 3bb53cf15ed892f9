"""The GPU target: TensorRT recipes beside the ONNX artifact, built into engines on the serving GPU
(or at export, when the exporting machine has one) and checked against the source model there."""
