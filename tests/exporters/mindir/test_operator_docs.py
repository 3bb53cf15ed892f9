"""The operator page in docs/ is generated from the translator's table and must match it."""

from pathlib import Path

from unideploy.exporters.mindir.docs import operators_markdown

DOC = Path(__file__).parents[3] / "docs" / "mindir-operators.md"


def test_operator_docs_are_generated_from_the_table():
    assert DOC.read_text() == operators_markdown(), (
        "regenerate: python -m unideploy.exporters.mindir.docs > docs/mindir-operators.md"
    )


def test_the_operators_the_issue_names_are_all_in_the_table():
    text = operators_markdown()
    for name in [
        "Conv2D",
        "BiasAdd",
        "BatchNorm",
        "ReLU",
        "ReLU6",
        "Sigmoid",
        "Tanh",
        "GeLU",
        "Erf",
        "SiLU",
        "MaxPool",
        "AvgPool",
        "ReduceMean",
        "MatMul",
        "MatMulExt",
        "Dense",
        "BatchMatMul",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Muls",
        "Pow",
        "Sqrt",
        "Softmax",
        "LayerNorm",
        "Reshape",
        "Flatten",
        "Transpose",
        "Squeeze",
        "ExpandDims",
        "Concat",
        "StridedSlice",
        "Gather",
        "ReduceSum",
        "Cast",
    ]:
        assert f"| {name} |" in text, name
