"""The fp16 pass's transformer fusions on graphs PyTorch writes: heads and hidden size measured on a
row, every attention block fused, and nothing done to a model without attention."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from unideploy.optimizers.transformer_fusion import attention_shape, fuse

torch = pytest.importorskip("torch", reason="the torch extra is not installed")
transformers = pytest.importorskip("transformers", reason="the dev extra is not installed")


@pytest.fixture(scope="module")
def small_bert(tmp_path_factory):
    """A BERT of 2 layers, 4 heads, hidden size 32 (random weights: the graph's shape is under test),
    exported as a user's torch.onnx.export writes it, and two rows of token ids."""
    config = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        attn_implementation="eager",
    )
    model = transformers.BertModel(config, add_pooling_layer=False).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    rows = {
        "input_ids": np.random.default_rng(0).integers(1, 100, (2, 16)),
        "attention_mask": np.ones((2, 16), np.int64),
    }
    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    torch.onnx.export(
        Encoder().eval(),
        tuple(torch.from_numpy(v) for v in rows.values()),
        str(path),
        input_names=list(rows),
        output_names=["hidden"],
        dynamic_axes={name: {0: "batch"} for name in (*rows, "hidden")},
        opset_version=17,
        dynamo=False,
    )
    return path, rows


def test_heads_and_hidden_size_are_measured_and_every_block_fused(small_bert, tmp_path):
    path, rows = small_bert
    assert attention_shape(onnx.load(str(path)), rows) == (4, 32)
    fused = fuse(path, rows, tmp_path / "fused.onnx")
    assert fused is not None and (fused.heads, fused.hidden_size) == (4, 32)
    assert fused.operators["Attention"] == 2 and fused.operators["SkipLayerNormalization"] == 4
    import onnxruntime as ort

    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, rows)[0]
    got = ort.InferenceSession(str(fused.path), providers=["CPUExecutionProvider"]).run(None, rows)[0]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_a_model_without_attention_is_left_alone(digits_package, tmp_path):
    from unideploy.package import Package

    with Package.open(digits_package) as package:
        model_path = package.path_of(package.manifest.artifact("onnx-fp32"))
        rows = package.reference_samples()[0].inputs
        assert attention_shape(onnx.load(str(model_path)), rows) is None
        assert fuse(model_path, rows, tmp_path / "fused.onnx") is None
    assert not (tmp_path / "fused.onnx").exists()
