"""The edge target: mobile and edge-box artifacts beside the ONNX one, each proven against the
source model like every other artifact."""
