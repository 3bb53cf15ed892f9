"""The Ascend operator page is generated from the rebuild table and must match it; the table covers
what the zoo's CNNs, detectors and transformer encoders use (no MindSpore needed to check it)."""

from pathlib import Path

from unideploy.ascend.docs import operators_markdown
from unideploy.ascend.ops import OPS

DOC = Path(__file__).parents[2] / "docs" / "ascend-operators.md"


def test_operator_docs_are_generated_from_the_table():
    assert DOC.read_text() == operators_markdown(), (
        "regenerate: python -m unideploy.ascend.docs > docs/ascend-operators.md"
    )


def test_the_operators_the_issue_names_are_all_in_the_table():
    named = (
        "Conv ConvTranspose MaxPool AveragePool GlobalAveragePool BatchNormalization Add Mul Gemm MatMul "
        "LayerNormalization Softmax Erf Gelu Gather Reshape Transpose Concat Slice Where Equal Cast Expand "
        "Shape Unsqueeze Squeeze Split Resize Clip Sigmoid HardSwish"
    )
    assert not [name for name in named.split() if name not in OPS]
