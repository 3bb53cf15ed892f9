"""Generate docs/ascend-operators.md from the operator table, so the docs cannot drift from it.

python -m unideploy.ascend.docs > docs/ascend-operators.md
"""

from __future__ import annotations

from unideploy.ascend.ops import OPS


def operators_markdown() -> str:
    lines = [
        "# ONNX operators `--target ascend` rebuilds in MindSpore",
        "",
        "Generated from `unideploy/ascend/ops.py` by `python -m unideploy.ascend.docs`;",
        "`tests/ascend/test_ascend_operator_docs.py` fails when this page is out of date.",
        "",
        "The package's fp32 ONNX graph becomes a MindSpore `nn.Cell` whose `construct` calls these",
        "`mindspore.ops` functions and primitives, and `mindspore.export` writes it as MindIR. Values known",
        "before the network runs (initializers, `Constant` nodes, shapes that shape inference fixes, and any",
        "operator whose inputs are all such values, whatever its kind) are computed once by ONNX's reference",
        "evaluator and become constants; constants the graph computes (padding sizes) are folded by ONNX",
        "Runtime's basic optimizations first, so shape inference fixes the sizes after them. An `If` whose",
        "condition is such a value (a branch on a dim the signature fixes) is replaced by the branch it takes;",
        "one on values computed from the inputs is refused naming it. A model with an operator outside this",
        "table (inside an `If`'s branches too) fails before any work, naming every such operator; its ONNX",
        "artifact still serves the cpu, gpu and edge targets.",
        "",
        "| ONNX operator | MindSpore | Notes |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {op.name} | `{op.mindspore}` | {op.notes} |".replace(" |  |", " | |")
        for op in sorted(OPS.values(), key=lambda o: o.name.lower())
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(operators_markdown(), end="")
