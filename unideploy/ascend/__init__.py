"""``--target ascend``: ONNX graphs rebuilt as MindSpore networks, exported as MindIR, with MindSpore
Lite recipes for the Ascend NPU and edge devices."""
