"""What a ``torch.save`` file holds, read without loading it: the most common PyTorch file, and one
no exporter takes.

``torch.save(model.state_dict(), PATH)`` stores weights only; ``torch.save(model, PATH)`` pickles the
module, which only its own class (importable where it is loaded) can rebuild, and unpickling runs
whatever code the file names. Both are zips whose ``data.pkl`` names the classes it needs; reading
those names with ``pickletools`` (no unpickling) tells the two apart, so the user hears what the file
is and the two lines that turn it into a TorchScript or ``torch.export`` file, instead of "cannot tell
what kind of model" (issue 39).
"""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path

from unideploy.errors import InputError

# What a state_dict's pickle needs besides its tensors' storages
_TENSOR_GLOBALS = ("collections ", "torch._utils ", "torch ", "torch._tensor ", "torch.nn.parameter Parameter")
TO_TORCHSCRIPT = "torch.jit.script(model).save('model.pt')  (or torch.export.save(torch.export.export(model, example_args), 'model.pt2'))"


def _globals(pickled: bytes) -> tuple[list[str], list[str]]:
    """The ``module name`` globals a pickle names, in order, and the strings it holds."""
    found: list[str] = []
    strings: list[str] = []
    for opcode, arg, _ in pickletools.genops(pickled):
        if opcode.name == "GLOBAL":
            found.append(str(arg))
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            found.append(f"{strings[-2]} {strings[-1]}")
        elif isinstance(arg, str):
            strings.append(arg)
    return found, strings


def refusal(src: Path) -> InputError | None:
    """The error for a ``torch.save`` file (weights, or a pickled module), or None for anything else."""
    if not src.is_file() or not zipfile.is_zipfile(src):
        return None
    with zipfile.ZipFile(src) as zf:
        pickles = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if not pickles or any(n.endswith("constants.pkl") or "/code/" in n for n in zf.namelist()):
            return None  # not torch.save's (TorchScript archives have code/ and constants.pkl)
        try:
            names, strings = _globals(zf.read(pickles[0]))
        except Exception:  # not a pickle pickletools can walk: not a torch.save file we can describe
            return None
    classes = [g.replace(" ", ".") for g in names if not g.startswith(_TENSOR_GLOBALS)]
    if not classes:
        keys = [s for s in strings if s.endswith((".weight", ".bias"))]
        example = f", such as {', '.join(repr(k) for k in keys[:3])}" if keys else ""
        return InputError(
            f"'{src}' is a PyTorch state_dict: weights only ({len(keys)} weight and bias tensors{example}), "
            "with no network in it to export",
            "build the model in Python and save it whole: model.load_state_dict(torch.load(PATH)); " + TO_TORCHSCRIPT,
        )
    module = next((c for c in classes if not c.startswith("torch.")), classes[0])
    return InputError(
        f"'{src}' is a pickled PyTorch module ({module}): only that class, importable where it is loaded, "
        "can rebuild it, and loading a pickle runs the code it names",
        "where the class is importable and you trust the file: model = torch.load(PATH, weights_only=False); "
        + TO_TORCHSCRIPT,
    )
