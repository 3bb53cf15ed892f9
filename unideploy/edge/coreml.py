"""Core ML for iOS bundles: an ``.mlpackage`` converted from the package's TorchScript source.

coremltools converts PyTorch programs, not ONNX, so only TorchScript sources get one, and only
where coremltools is installed (the ``bundle`` extra). Core ML predicts only on Apple platforms:
the program is converted and its inputs and outputs checked here, but its numbers are proven on
a Mac, not on this host, and the bundle says so.
"""

from __future__ import annotations

from pathlib import Path

from unideploy.errors import ExportError, first_line
from unideploy.quiet import quiet
from unideploy.registry import ExtraModules
from unideploy.signature import Signature

# Core ML's ML program default: fp16 compute, the precision the Neural Engine runs.
COREML_PRECISION = "fp16"
# ML programs need a bound on every dynamic dimension (batch, sequence length).
MAX_DYNAMIC_DIM = 256


COREML = ExtraModules("bundle", ("coremltools",))


def torchscript_to_mlpackage(source: Path, signature: Signature, dest: Path) -> Path:
    """Convert with the signature's input and output names; dynamic dimensions run 1..MAX_DYNAMIC_DIM."""
    import numpy as np
    import torch

    with quiet():
        import coremltools as ct

        inputs = [
            ct.TensorType(
                name=t.name,
                dtype=np.dtype(t.dtype).type,
                shape=tuple(ct.RangeDim(1, MAX_DYNAMIC_DIM) if isinstance(d, str) else d for d in t.shape),
            )
            for t in signature.inputs
        ]
        outputs = [ct.TensorType(name=t.name) for t in signature.outputs]
        try:
            # freezing folds the `if self.training` branches scripting keeps, which coremltools refuses
            program = torch.jit.freeze(torch.jit.load(str(source), map_location="cpu").eval())
            model = ct.convert(
                program,
                inputs=inputs,
                outputs=outputs,
                convert_to="mlprogram",
                minimum_deployment_target=ct.target.iOS16,
            )
            model.save(str(dest))
            spec = ct.models.MLModel(str(dest), skip_model_load=True).get_spec()  # loading needs macOS
        except Exception as exc:
            raise ExportError(f"coremltools cannot convert this model: {first_line(exc)}") from exc
    names = ([i.name for i in spec.description.input], [o.name for o in spec.description.output])
    if names != (signature.input_names, signature.output_names):
        raise ExportError(
            f"the Core ML model has inputs {names[0]} and outputs {names[1]}, not the signature's "
            f"{signature.input_names} and {signature.output_names}"
        )
    return dest
