"""Generate docs/mindir-operators.md from the operator table, so the docs cannot drift from it.

python -m unideploy.exporters.mindir.docs > docs/mindir-operators.md
"""

from __future__ import annotations

from unideploy.exporters.mindir.ops import OPS, OPSET
from unideploy.exporters.mindir.translate import PLUMBING


def operators_markdown() -> str:
    lines = [
        "# MindIR operators unideploy translates to ONNX",
        "",
        "Generated from `unideploy/exporters/mindir/ops.py` by `python -m unideploy.exporters.mindir.docs`;",
        "`tests/exporters/mindir/test_operator_docs.py` fails when this page is out of date.",
        "",
        f"Every model is written at ONNX opset {OPSET}. A model using an operator outside this table fails",
        "with the operator's name; `deploy export model.mindir --keep-native-only` still packages it, with",
        "the MindIR artifact alone (run by MindSpore / MindSpore Lite).",
        "",
        "| MindSpore primitive | ONNX | Notes |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {op.name} | {op.onnx} | {op.notes} |".replace(" |  |", " | |")
        for op in sorted(OPS.values(), key=lambda o: o.name.lower())
    ]
    lines += [
        "",
        "## Graph plumbing (resolved, no ONNX node)",
        "",
        "| MindSpore primitive | What it does |",
        "| --- | --- |",
    ]
    lines += [f"| {name} | {what} |" for name, what in PLUMBING.items()]
    lines += ["| Constant | a value node: attributes, shapes and scalars are read from it |"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(operators_markdown(), end="")
