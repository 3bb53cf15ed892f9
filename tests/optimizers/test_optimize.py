"""Every optimizer pass on real models, the accuracy guard, and what lands in the package."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import unideploy
from unideploy.errors import AccuracyBudgetError, InputError
from unideploy.verify import verify_package

pytest.importorskip("torch", reason="the torch extra is not installed")


def tree_digest(root) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


def accuracy_on(package, artifact, data) -> float:
    with np.load(data) as d:
        out = unideploy.run(package, {"x": d["x"]}, artifact=artifact)
        return float((out["output"].argmax(1) == d["labels"]).mean())


def ops(package, artifact) -> list[str]:
    return [n.op_type for n in onnx.load(str(package.path_of(artifact))).graph.node]


def test_int8_auto_measures_both_variants_and_explains_its_choice(digits_package, digits):
    with unideploy.optimize(digits_package, quantize="int8", keep_slower=True, calibration=digits["data"]) as pkg:
        record = pkg.manifest.optimizations[-1]
        params = record["passes"][0]["params"]
        assert {c["variant"] for c in params["candidates"]} == {"static", "dynamic"}
        assert params["variant"] in ("static", "dynamic") and "within the accuracy budget" in params["why"]
        artifact = pkg.manifest.artifact("onnx-int8")
        assert artifact.precision == "int8" and artifact.derived_from == "onnx-fp32"
        assert record["accuracy"]["metric"] == "accuracy" and record["accuracy"]["within_budget"]
        assert record["effects"]["size_ratio"] < 0.75
        assert set(record["effects"]["latency_ms"]) == {"1", "64"}
        assert record["effects"]["latency_on"].startswith("the CPU (")  # where it was timed, named
        assert record["data"] == {
            "calibration": "data.npz",
            "calibration_rows": 348,
            "validation": "data.npz",
            "validation_rows": 349,
            "synthetic": False,
            "labels": True,
        }
        assert [c.status for c in verify_package(pkg)] == ["passed", "passed"]
        assert accuracy_on(pkg, "onnx-int8", digits["data"]) >= accuracy_on(pkg, "onnx-fp32", digits["data"]) - 0.02


def test_int8_dynamic_quantizes_a_cnn_classifier_head(digits_package, digits):
    """nn.Linear exports as Gemm, which onnxruntime's dynamic quantizer skips: it must still be quantized."""
    with unideploy.optimize(
        digits_package, quantize="int8", int8_variant="dynamic", keep_slower=True, calibration=digits["data"]
    ) as pkg:
        assert "MatMulInteger" in ops(pkg, "onnx-int8") or "DynamicQuantizeMatMul" in ops(pkg, "onnx-int8")
        assert pkg.manifest.optimizations[-1]["effects"]["size_ratio"] < 0.5


def test_int8_static_is_qdq_with_sensitive_ops_in_float(torch_models, tmp_path):
    path, shapes = torch_models["attention_traced"]
    unideploy.export(path, tmp_path / "attn.udp", input_shapes=shapes).close()
    with unideploy.optimize(
        tmp_path / "attn.udp",
        quantize="int8",
        int8_variant="static",
        keep_slower=True,  # a small attention block: INT8 is about its graph here, not its speed
        synthetic=True,
        metric="cosine",
        max_accuracy_drop=5.0,
    ) as pkg:
        model = onnx.load(str(pkg.path_of("onnx-int8")))
        producers = {o: n.op_type for n in model.graph.node for o in n.output}
        assert "QuantizeLinear" in producers.values()
        for node in model.graph.node:
            if node.op_type in ("Softmax", "LayerNormalization"):
                assert producers.get(node.input[0]) != "DequantizeLinear", f"{node.op_type} was quantized"
        record = pkg.manifest.optimizations[-1]
        assert record["data"]["synthetic"] and any("synthetic" in n for n in record["notes"])


def test_int8_holds_where_tensor_names_meet_the_quantizers_own(tmp_path):
    """ONNX Runtime's quantizer copies a bias several Convs share under its name plus a suffix ('b'
    -> 'b0'); tf2onnx's names end in counters too, and where a Conv's output was already called so
    (Basic Pitch's graph) the quantized model read the bias copy in its place and did not load. The
    graph's inner tensors are renamed first: the int8 artifact loads, runs and is judged."""

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), f"w{i}") for i in range(3)]
    shared_bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Conv", ["r", "w1", "b"], ["b0"], pads=[1, 1, 1, 1]),  # the name the bias copy gets
        helper.make_node("Relu", ["b0"], ["r0"]),
        helper.make_node("Conv", ["r0", "w2", "b"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "shared_bias",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [*weights, shared_bias],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    unideploy.export(tmp_path / "m.onnx", tmp_path / "m.udp").close()
    with unideploy.optimize(
        tmp_path / "m.udp",
        quantize="int8",
        int8_variant="static",
        keep_slower=True,
        synthetic=True,
        metric="cosine",
        max_accuracy_drop=50.0,  # about the graph loading, not its accuracy on random inputs
    ) as pkg:
        assert "QuantizeLinear" in ops(pkg, "onnx-int8")
        x = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
        assert unideploy.run(pkg, {"x": x}, artifact="onnx-int8")["y"].shape == (2, 4, 8, 8)


def test_int8_dynamic_quantizes_matmuls(torch_models, tmp_path):
    path, shapes = torch_models["attention_traced"]
    unideploy.export(path, tmp_path / "attn.udp", input_shapes=shapes).close()
    with unideploy.optimize(
        tmp_path / "attn.udp",
        quantize="int8",
        int8_variant="dynamic",
        keep_slower=True,  # a small attention block: INT8 is about its graph here, not its speed
        synthetic=True,
        metric="cosine",
        max_accuracy_drop=5.0,
    ) as pkg:
        assert "MatMulInteger" in ops(pkg, "onnx-int8") or "DynamicQuantizeMatMul" in ops(pkg, "onnx-int8")


def test_fp16_halves_weights_keeps_fp32_io_and_says_what_it_is_for(digits_package, digits):
    with unideploy.optimize(digits_package, quantize="fp16", calibration=digits["data"]) as pkg:
        artifact = pkg.manifest.artifact("onnx-fp16")
        assert artifact.precision == "fp16" and artifact.targets == ["gpu", "edge"]
        model = onnx.load(str(pkg.path_of(artifact)))
        assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
        record = pkg.manifest.optimizations[-1]
        assert record["effects"]["size_ratio"] < 0.6
        assert any("does not run faster" in n for n in record["notes"])
        assert "transformer_fusions" not in record["passes"][0]["params"]  # a CNN: no attention to fuse


def test_magnitude_pruning_reaches_the_sparsity_and_refit_recovers_accuracy(digits_package, digits, tmp_path):
    refit = unideploy.optimize(
        digits_package, tmp_path / "refit.udp", prune=0.8, calibration=digits["data"], max_accuracy_drop=3.0
    )
    plain = unideploy.optimize(
        digits_package,
        tmp_path / "plain.udp",
        prune=0.8,
        refit=False,
        calibration=digits["data"],
        max_accuracy_drop=100.0,
    )
    with refit, plain:
        effects = refit.manifest.optimizations[-1]["effects"]
        assert 0.8 <= effects["weight_sparsity"] < 0.85  # re-fitting zeroes weights that read dead channels
        assert effects["gzip_ratio"] < 0.45
        assert refit.manifest.optimizations[-1]["accuracy"]["drop_points"] <= 3.0
        assert accuracy_on(refit, "onnx-sparse80", digits["data"]) > accuracy_on(plain, "onnx-sparse80", digits["data"])


def test_channel_pruning_removes_whole_channels(digits_package, digits):
    with unideploy.optimize(
        digits_package, prune=0.5, prune_method="channels", calibration=digits["data"], max_accuracy_drop=3.0
    ) as pkg:
        base = onnx.load(str(pkg.path_of("onnx-fp32")))
        slim = onnx.load(str(pkg.path_of("onnx-slim50")))
        shapes = lambda m: sorted(tuple(i.dims) for i in m.graph.initializer if len(i.dims) == 4)  # noqa: E731
        assert shapes(base) == [(32, 1, 3, 3), (64, 32, 3, 3)]
        assert shapes(slim) == [(16, 1, 3, 3), (32, 16, 3, 3)]
        groups = pkg.manifest.optimizations[-1]["passes"][0]["params"]["groups"]
        assert [(g["channels"], g["kept"]) for g in groups] == [(32, 16), (64, 32)]
        x = np.zeros((3, 1, 8, 8), np.float32)
        assert unideploy.run(pkg, {"x": x}, artifact="onnx-slim50")["output"].shape == (3, 10)


def test_refusal_leaves_the_package_byte_identical(digits_package, digits):
    before = tree_digest(digits_package)
    with pytest.raises(AccuracyBudgetError, match=r"accuracy drop [\d.]+ points \(budget 0\.1\).*not changed"):
        unideploy.optimize(digits_package, prune=0.97, refit=False, calibration=digits["data"], max_accuracy_drop=0.1)
    assert tree_digest(digits_package) == before
    assert [p.name for p in digits_package.parent.iterdir()] == ["digits.udp"]


def test_zip_package_is_updated_in_place(digits_package, digits, tmp_path):
    zipped = unideploy.optimize(digits_package, tmp_path / "d.zip", quantize="fp16", calibration=digits["data"])
    zipped.close()
    with unideploy.optimize(tmp_path / "d.zip", prune=0.5, calibration=digits["data"]) as pkg:
        assert [a.id for a in pkg.manifest.artifacts] == ["onnx-fp32", "onnx-fp16", "onnx-sparse50"]
        assert len(pkg.manifest.optimizations) == 2


def test_export_can_optimize_in_the_same_step(digits, tmp_path):
    with unideploy.export(
        digits["model"],
        tmp_path / "q.udp",
        input_shapes=["x:1x1x8x8"],
        optimization=_request(quantize="fp16", calibration=str(digits["data"])),
    ) as pkg:
        assert [a.id for a in pkg.manifest.artifacts] == ["onnx-fp32", "onnx-fp16"]
    with pytest.raises(AccuracyBudgetError):
        unideploy.export(
            digits["model"],
            tmp_path / "no.udp",
            input_shapes=["x:1x1x8x8"],
            optimization=_request(prune=0.97, refit=False, calibration=str(digits["data"]), max_accuracy_drop=0.1),
        )
    assert not (tmp_path / "no.udp").exists()


def _request(**kwargs):
    from unideploy.optimizers.base import OptimizeRequest

    return OptimizeRequest.of(**kwargs)


def test_an_int8_model_slower_than_fp32_is_refused_with_the_numbers_unless_kept(tmp_path):
    """INT8 is asked for speed. A chain of eight 8x8 MatMuls, where quantizing and dequantizing
    each product costs more than the product (0.5-0.6x fp32 on a CPU with VNNI, slower still
    without), is refused with the measured speedups and the package left as it was, from the
    command line too; ``keep_slower`` (for a package served on another CPU) keeps it with a note, and
    the symmetric variant, made for TensorRT, is not judged by this CPU's speed.
    A ratio far below the 0.95 the rule allows for noise, measured as optimize always measures."""
    from console import assert_one_line_error, deploy

    from unideploy.errors import NotFasterError

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((8, 8)) / 3).astype(np.float32), f"w{i}") for i in range(8)]
    nodes = [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"]) for i in range(8)]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("h0", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("h8", TensorProto.FLOAT, ["N", 8])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "chain.onnx")
    rows = rng.standard_normal((64, 8)).astype(np.float32)
    np.savez(tmp_path / "rows.npz", h0=rows)
    unideploy.export(tmp_path / "chain.onnx", tmp_path / "chain.udp", example_inputs={"h0": rows[:4]}).close()
    before = tree_digest(tmp_path / "chain.udp")
    asked = {
        "quantize": "int8",
        "int8_variant": "dynamic",
        "metric": "cosine",
        "calibration": str(tmp_path / "rows.npz"),
    }

    with pytest.raises(NotFasterError, match=r"INT8 runs slower than fp32 on this CPU \(0\.\d\dx at batch 1, "):
        unideploy.optimize(tmp_path / "chain.udp", **asked)
    refused = deploy("optimize", str(tmp_path / "chain.udp"), "--quantize", "int8", "--int8-variant", "dynamic",
                     "--metric", "cosine", "--calibration", str(tmp_path / "rows.npz"))  # fmt: skip
    assert_one_line_error(refused, 1, r"INT8 runs slower than fp32 on this CPU .*the package was not changed")
    assert "add --keep-slower" in refused.stderr
    assert tree_digest(tmp_path / "chain.udp") == before

    with unideploy.optimize(tmp_path / "chain.udp", tmp_path / "kept.udp", keep_slower=True, **asked) as pkg:
        notes = pkg.manifest.optimizations[-1]["notes"]
        assert pkg.manifest.artifact("onnx-int8").precision == "int8"
    assert any(n.startswith("onnx-int8 runs slower than fp32 on this CPU (0.") for n in notes), notes
    # the symmetric variant is TensorRT's (--target gpu): how fast it runs on this CPU is no reason to refuse it
    symmetric = {**asked, "int8_variant": "symmetric"}
    with unideploy.optimize(tmp_path / "chain.udp", tmp_path / "trt.udp", **symmetric) as pkg:
        assert pkg.manifest.optimizations[-1]["passes"][0]["params"]["variant"] == "symmetric"


def test_int8_of_a_tree_ensemble_is_refused_as_nothing_to_quantize(tmp_path):
    """A tree ensemble (ONNX-ML's TreeEnsembleRegressor, one split on petal length) on the real iris
    measurements that ship with scikit-learn: INT8 has no weight to quantize, and says so with exit
    2 (ONNX Runtime's quantizer failed inside with "Failed to find proper ai.onnx domain", exit 1)."""
    from console import assert_one_line_error, deploy

    sklearn_datasets = pytest.importorskip("sklearn.datasets", reason="scikit-learn is in the dev extra")
    iris = sklearn_datasets.load_iris().data.astype(np.float32)
    tree = helper.make_node(
        "TreeEnsembleRegressor",
        ["x"],
        ["y"],
        domain="ai.onnx.ml",
        n_targets=1,
        nodes_treeids=[0, 0, 0],
        nodes_nodeids=[0, 1, 2],
        nodes_featureids=[2, 0, 0],
        nodes_values=[2.45, 0.0, 0.0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 0, 0],
        nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0],
        target_nodeids=[1, 2],
        target_ids=[0, 0],
        target_weights=[0.0, 1.0],
    )
    graph = helper.make_graph(
        [tree],
        "setosa-or-not",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "tree.onnx")
    unideploy.export(tmp_path / "tree.onnx", tmp_path / "tree.udp", example_inputs={"x": iris[:8]}).close()
    np.testing.assert_array_equal(unideploy.run(tmp_path / "tree.udp", {"x": iris})["y"][:, 0], iris[:, 2] > 2.45)
    np.savez(tmp_path / "iris.npz", x=iris)
    before = tree_digest(tmp_path / "tree.udp")
    refused = deploy(
        "optimize", str(tmp_path / "tree.udp"), "--quantize", "int8", "--calibration", str(tmp_path / "iris.npz")
    )
    assert_one_line_error(refused, 2, "INT8 has nothing to quantize .*ai.onnx.ml.TreeEnsembleRegressor")
    assert tree_digest(tmp_path / "tree.udp") == before


def test_layers_inside_control_flow_are_named_when_nothing_else_can_be_optimized(tmp_path):
    """A graph whose only Conv sits in an If branch (Silero VAD's layout): INT8 and pruning, which
    edit the top-level graph, say where the layers are and how to reach them (they said the model
    had none)."""
    from console import assert_one_line_error, deploy
    from onnx_models import branching_model

    x = np.random.default_rng(0).standard_normal((16, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    unideploy.export(
        branching_model(tmp_path / "if.onnx"), tmp_path / "pkg", example_inputs=str(tmp_path / "x.npz")
    ).close()
    for asked, tool in ((("--quantize", "int8"), "the quantizer"), (("--prune", "0.3"), "pruning")):
        refused = deploy("optimize", tmp_path / "pkg", *asked, "--calibration", tmp_path / "x.npz")
        assert_one_line_error(
            refused,
            2,
            rf"weighted layers \(1 Conv in If\) sit inside control-flow branches, which {tool} does not enter "
            r"\(export a graph without the control flow",
        )


def test_pruning_names_the_weighted_layers_it_does_not_edit(tmp_path):
    """Two depthwise convolutions (each channel filtered on its own) and a transposed convolution
    sized by its ``output_shape``: pruning edits convolutions without groups and matrix products,
    and says which layers it found instead (it said the model had no Conv weights)."""
    from console import assert_one_line_error, deploy

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["h"], group=4, pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["h"], ["a"]),
            helper.make_node("Conv", ["a", "w2"], ["d"], group=4, pads=[1, 1, 1, 1]),
            helper.make_node("ConvTranspose", ["d", "w3"], ["y"], strides=[2, 2], output_shape=[16, 16]),
        ],
        "depthwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, 16, 16])],
        [
            *(numpy_helper.from_array(rng.standard_normal((4, 1, 3, 3)).astype(np.float32), w) for w in ("w1", "w2")),
            numpy_helper.from_array(rng.standard_normal((4, 2, 2, 2)).astype(np.float32), "w3"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "dw.onnx")
    np.savez(tmp_path / "x.npz", x=rng.standard_normal((16, 4, 8, 8)).astype(np.float32))
    unideploy.export(tmp_path / "dw.onnx", tmp_path / "pkg", example_inputs=str(tmp_path / "x.npz")).close()
    refused = deploy("optimize", tmp_path / "pkg", "--prune", "0.3", "--calibration", tmp_path / "x.npz")
    assert_one_line_error(
        refused,
        2,
        r"none of the model's weighted layers is one pruning edits \(2 grouped convolution, 1 transposed "
        r"convolution sized by output_shape or SAME; it edits convolutions and transposed convolutions without groups",
    )


def test_pruning_a_model_of_recurrent_layers_only_names_them(tmp_path):
    """An LSTM's weights are not layers pruning edits: a model of one is refused naming it (exit 2,
    nothing written), where the refusal said it had no weights to prune at all."""
    from console import assert_one_line_error, deploy

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=8)],
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, "batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 1, "batch", 8])],
        [
            numpy_helper.from_array(rng.normal(0, 0.5, (1, 32, 4)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.normal(0, 0.3, (1, 32, 8)).astype(np.float32), "r"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "lstm.onnx")
    np.savez(tmp_path / "x.npz", x=rng.standard_normal((5, 16, 4)).astype(np.float32))
    unideploy.export(tmp_path / "lstm.onnx", tmp_path / "pkg", example_inputs=str(tmp_path / "x.npz")).close()
    refused = deploy("optimize", tmp_path / "pkg", "--prune", "0.3", "--calibration", tmp_path / "x.npz")
    assert_one_line_error(refused, 2, r"none of the model's weighted layers is one pruning edits \(1 LSTM; it edits")


@pytest.mark.parametrize(
    "asked, refusal",
    [
        (("--quantize", "int8"), r"INT8 has nothing to quantize .*ai\.onnx\.ml\.LinearClassifier"),
        (("--quantize", "fp16"), r"FP16 has nothing to convert .*ai\.onnx\.ml\.LinearClassifier.* stay in fp32"),
        (("--prune", "0.3"), r"the model has no Conv/ConvTranspose/Gemm/MatMul weights to prune"),
    ],
)
def test_a_classifier_answering_class_names_is_refused_what_it_cannot_take(
    text_packages, text_models, tmp_path, asked, refusal
):
    """scikit-learn's classifier as skl2onnx writes it (ONNX-ML, a text label output beside the
    probabilities), trained on the real iris data: the guard reads its text labels (they crashed
    its choice of metric: exit 70), and each optimization it cannot take is refused with exit 2,
    fp16 included (the converter left every operator in fp32 and an "fp16" artifact was admitted)."""
    from console import assert_one_line_error, deploy

    before = tree_digest(text_packages["labels"])
    refused = deploy(
        "optimize", text_packages["labels"], "-o", tmp_path / "out", *asked, "--calibration", text_models["features"]
    )
    assert_one_line_error(refused, 2, refusal)
    assert tree_digest(text_packages["labels"]) == before and not (tmp_path / "out").exists()


def test_the_passes_own_options_are_checked_through_the_python_api_too(tmp_path):
    """The Python API takes a pass's options as keywords, checked by the pass's own model before
    anything is opened: a bad value names the flag and the pass, an unknown option the ones there are."""
    with pytest.raises(InputError, match=r"--int8-variant of the quantize-int8 pass: Input should be 'auto'"):
        unideploy.optimize(tmp_path / "pkg", quantize="int8", int8_variant="fastest")
    with pytest.raises(InputError, match=r"unknown optimization option\(s\): sparsity_pattern") as refused:
        unideploy.optimize(tmp_path / "pkg", prune=0.5, sparsity_pattern="2:4")
    assert "int8_variant" in refused.value.hint and "prune_scope" in refused.value.hint
    with pytest.raises(InputError, match=r"--prune-scope applies to the prune-magnitude pass, which this request"):
        unideploy.optimize(tmp_path / "pkg", quantize="fp16", prune_scope="global")
    with pytest.raises(InputError, match=r"--no-transformer-fusions applies to the quantize-fp16 pass"):
        unideploy.optimize(tmp_path / "pkg", quantize="int8", transformer_fusions=False)


def test_an_int8_source_reduced_again_to_fp16_is_labelled_mixed(digits, tmp_path):
    """The real digits CNN quantized by ONNX Runtime before export: its artifact is onnx-int8, which
    the optimizers refuse as a base unless named; named, FP16 around its int8 kernels is neither
    precision, and the new artifact says so."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with unideploy.open_package(digits["package"]) as package:
        fp32 = package.path_of(package.manifest.base_onnx())
    quantize_dynamic(str(fp32), str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8)
    unideploy.export(tmp_path / "int8.onnx", tmp_path / "pkg").close()
    with pytest.raises(InputError, match="'onnx-int8' computes in int8 already"):
        unideploy.optimize(tmp_path / "pkg", quantize="fp16", calibration=str(digits["data"]))
    with unideploy.optimize(
        tmp_path / "pkg", tmp_path / "out", quantize="fp16", calibration=str(digits["data"]), artifact="onnx-int8"
    ) as package:
        made = package.manifest.artifact("onnx-fp16")
    assert (made.precision, made.derived_from) == ("mixed", "onnx-int8")


def test_a_streaming_model_is_calibrated_and_judged_over_the_stream_it_is_given(tmp_path):
    """`deploy optimize` of a streaming model given its rows without the state (one stream, as
    `deploy run` takes them): the terminal and the record say the rows were judged as a stream, and
    the state output is judged through the output it leads to, not on its own."""
    from console import deploy
    from onnx_models import running_average_model

    unideploy.export(running_average_model(tmp_path / "a.onnx"), tmp_path / "pkg", state=["h=h_next:0.25"]).close()
    np.savez(tmp_path / "stream.npz", x=np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32))
    made = deploy("optimize", tmp_path / "pkg", "--quantize", "fp16", "--calibration", tmp_path / "stream.npz")
    assert made.returncode == 0, made.stderr
    assert "on 32 validation rows (1 stream)" in " ".join(made.stdout.split()), made.stdout
    with unideploy.open_package(tmp_path / "pkg") as package:
        record = package.manifest.optimizations[-1]
    assert record["accuracy"]["rows_are"] == "validation rows (1 stream)" and set(record["accuracy"]["outputs"]) == {
        "y"
    }
    assert record["data"]["calibration_rows"] == 32 and record["accuracy"]["within_budget"]
