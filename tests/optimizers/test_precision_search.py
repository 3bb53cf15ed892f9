"""Precision where it is needed: INT8 keeps the layers it would break in fp32, FP16 keeps the layers
beyond half precision's range, and those its rounding breaks, in fp32. On the digits CNN trained on
real digits."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

import unideploy
from unideploy.optimizers.base import PassContext
from unideploy.optimizers.sensitivity import PRUNING_TRIALS, SEARCH_REFIT_SECONDS, search, search_refitted
from unideploy.signature import Signature

torch = pytest.importorskip("torch", reason="the torch extra is not installed")


def _export(module, digits, tmp_path: Path) -> Path:
    with np.load(digits["data"]) as d:
        example = d["x"][:8]
    if not isinstance(module, torch.jit.ScriptModule):
        module = torch.jit.trace(module.eval(), torch.from_numpy(example))
    torch.jit.save(module, str(tmp_path / "model.pt"))
    unideploy.export(tmp_path / "model.pt", tmp_path / "model.udp", example_inputs={"x": example}).close()
    return tmp_path / "model.udp"


def _agreement(package, artifact: str, digits) -> float:
    with np.load(digits["data"]) as d:
        fp32 = unideploy.run(package, {"x": d["x"]}, artifact="onnx-fp32")["output"].argmax(1)
        other = unideploy.run(package, {"x": d["x"]}, artifact=artifact)["output"].argmax(1)
    return float((fp32 == other).mean())


def test_int8_keeps_the_layer_quantization_breaks_in_fp32(digits, tmp_path):
    """One input of the classifier's last layer is always zero (its bias puts it far below ReLU's
    threshold), and every class weighs it by 40: fp32 never sees it, but per-channel INT8 takes each
    class's weight scale from that 40 and rounds its real weights (~0.1) to a few levels."""
    model = torch.jit.load(str(digits["model"]))
    state = model.state_dict()
    with torch.no_grad():
        state["classifier.1.bias"][63] = -1000.0  # the last hidden unit: ReLU always gives 0
        state["classifier.3.weight"][:, 63] = 40.0
    package = _export(model, digits, tmp_path)

    with unideploy.optimize(
        package, quantize="int8", int8_variant="static", keep_slower=True, calibration=digits["data"]
    ) as pkg:
        params = pkg.manifest.optimizations[-1]["passes"][0]["params"]
        search_record = params["search"]
        assert search_record["drop_points_all_int8"] > 1.0, search_record  # plain static INT8 is over the budget
        kept = [layer["node"] for layer in params["fp32_layers"]]
        assert "classifier/3" in kept[0], search_record  # the layer that loses most is ranked first
        assert len(kept) <= search_record["ranked_layers"] // 2
        assert search_record["size_ratio"] < 0.5  # still an INT8 model: the other layers are
        assert pkg.manifest.optimizations[-1]["accuracy"]["within_budget"]
        assert _agreement(pkg, "onnx-int8", digits) >= 0.98


def test_search_finds_the_fewest_layers_by_doubling_then_bisecting():
    built: list[int] = []

    def build(exclude: list[str]) -> Path:
        built.append(len(exclude))
        return Path(f"candidate-{len(exclude)}.onnx")

    def judge(path: Path) -> dict:
        count = int(path.stem.split("-")[1])
        return {"drop_points": max(0.0, 6 - count), "within_budget": count >= 6}

    result = search([f"layer{i}" for i in range(40)], build, judge, lambda _m: None, "test")
    assert result.within_budget and result.restored == [f"layer{i}" for i in range(6)]
    assert built[:4] == [1, 2, 4, 8] and len(built) <= 10


def test_search_hands_the_closest_candidate_to_the_guard_when_nothing_fits():
    def judge(path: Path) -> dict:
        return {"drop_points": 10.0 - int(path.stem), "within_budget": False}

    result = search(["a", "b", "c"], lambda exclude: Path(f"{len(exclude)}.onnx"), judge, lambda _m: None, "test")
    assert not result.within_budget and result.restored == ["a"]  # at most half the layers are left as they were
    assert search(["only"], lambda exclude: Path("x.onnx"), judge, lambda _m: None, "test").path is None


def _pruning_candidates() -> tuple[list[tuple[int, bool]], PassContext, Callable[[list[str], bool], Path]]:
    """A pruning search's collaborators: a candidate with n layers dense loses 20 - 2n points
    un-refitted and 14 - 2n re-fitted (a re-fit recovers part of what the layers before it lost)."""
    built: list[tuple[int, bool]] = []

    def build(dense: list[str], refit: bool) -> Path:
        built.append((len(dense), refit))
        return Path(f"{len(dense)}-{int(refit)}.onnx")

    def judge(path: Path) -> dict:
        dense, refit = map(int, path.stem.split("-"))
        drop = (14.0 if refit else 20.0) - 2 * dense
        return {"drop_points": drop, "within_budget": drop <= 1.0}

    ctx = PassContext(Signature(inputs=()), [], Path("."), evaluate=lambda _p: None, judge=judge)
    return built, ctx, build


def test_a_pruning_search_refits_the_candidates_it_judges_where_affordable():
    built, ctx, build = _pruning_candidates()
    result = search_refitted([f"layer{i}" for i in range(20)], build, True, 10.0, ctx, "test")
    assert result.within_budget and len(result.restored) == 7  # the fewest dense: 14 - 2 x 7 = 0 points
    assert all(refit for _, refit in built) and len(built) <= PRUNING_TRIALS


def test_where_refits_cost_too_much_the_closest_candidate_is_refitted_before_the_guard():
    """Six un-refitted candidates all over budget: the closest is re-fitted, so what the guard
    refuses (or accepts) is what a re-fit reaches, not the un-refitted numbers."""
    slow = SEARCH_REFIT_SECONDS / 2  # two re-fits affordable: fewer than MIN_REFIT_TRIALS
    built, ctx, build = _pruning_candidates()
    result = search_refitted([f"layer{i}" for i in range(10)], build, True, slow, ctx, "test")
    assert [refit for _, refit in built[:-1]] == [False] * (len(built) - 1) and built[-1] == (5, True)
    assert result.path == Path("5-1.onnx") and not result.within_budget  # 4 points re-fitted, against 10


class _Loud(torch.nn.Module):
    """The digits CNN behind a gain of 1e6 and its inverse: exact in fp32, beyond fp16's 65504."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("gain", torch.tensor(1e6))

    def forward(self, x):
        return self.inner(x * self.gain / self.gain)


def test_fp16_keeps_layers_beyond_half_precision_in_fp32(digits, tmp_path):
    package = _export(_Loud(torch.jit.load(str(digits["model"]))), digits, tmp_path)
    with unideploy.optimize(package, quantize="fp16", calibration=digits["data"]) as pkg:
        params = pkg.manifest.optimizations[-1]["passes"][0]["params"]
        reasons = " ".join(layer["why"] for layer in params["fp32_layers"])
        assert "reaches 1e+06" in reasons
        assert pkg.manifest.optimizations[-1]["accuracy"]["within_budget"]
        assert _agreement(pkg, "onnx-fp16", digits) >= 0.99


class _Offset(torch.nn.Module):
    """The digits CNN behind adding 2049 to its pixels and taking away 2048 and 1: exact in fp32;
    fp16's neighbours of 2048 are 2 apart, so in half precision 2049 is stored as 2048 and every
    pixel ends 1 too low, though no value comes near fp16's range. (ONNX Runtime's CPU provider
    adds and subtracts fp16 tensors in fp32, so the loss is in the stored constant, as in a real
    model's weights.)"""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("high", torch.tensor(2049.0))
        self.register_buffer("low", torch.tensor(2048.0))

    def forward(self, x):
        return self.inner((x + self.high) - self.low - 1.0)


def test_fp16_keeps_the_layers_its_rounding_breaks_in_fp32(digits, tmp_path):
    package = _export(_Offset(torch.jit.load(str(digits["model"]))), digits, tmp_path)
    with unideploy.optimize(package, quantize="fp16", calibration=digits["data"]) as pkg:
        params = pkg.manifest.optimizations[-1]["passes"][0]["params"]
        assert params["search"]["drop_points_all_fp16"] > 10.0, params["search"]  # plain fp16 breaks it
        kept = params["fp32_layers"]
        assert {layer["node"] for layer in kept} >= {"/Add", "/Sub"}, kept  # 2049 and the sum it is in
        assert all("dB of SQNR in fp16" in layer["why"] for layer in kept)
        assert params["search"]["size_ratio"] < 0.6  # the convolutions are still fp16
        assert pkg.manifest.optimizations[-1]["accuracy"]["within_budget"]
        assert _agreement(pkg, "onnx-fp16", digits) >= 0.99


class _LogPower(torch.nn.Module):
    """The digits CNN behind a spectrogram's log power, log(x^2 + 1e-10), brought back to [0, 1]
    (the pixels scaled to an audio frame's magnitudes, at most 0.01). fp16 stores 1e-10 and the
    squares of the faint pixels (4e-7) as 0 or with a few bits: blank pixels become log(0), -inf,
    and every answer NaN."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("scale", torch.tensor(0.01))
        self.register_buffer("eps", torch.tensor(1e-10))

    def forward(self, x):
        power = (x * self.scale) ** 2 + self.eps
        floor, top = math.log(1e-10), math.log(1e-4 + 1e-10)
        return self.inner((torch.log(power) - floor) / (top - floor))


def test_fp16_keeps_a_log_of_values_below_its_normal_range_and_what_computes_them_in_fp32(digits, tmp_path):
    package = _export(_LogPower(torch.jit.load(str(digits["model"]))), digits, tmp_path)
    with unideploy.optimize(package, quantize="fp16", calibration=digits["data"]) as pkg:
        params = pkg.manifest.optimizations[-1]["passes"][0]["params"]
        kept = {layer["node"]: layer["why"] for layer in params["fp32_layers"]}
        assert "search" not in params, params  # in budget at once: no layer search was needed
        log = next(node for node in kept if "Log" in node)
        assert "below fp16's normal range" in kept[log], kept
        assert {node.split("/")[-1] for node in kept} == {"Log", "Add", "Pow"}, kept  # the square and the 1e-10
        assert pkg.manifest.optimizations[-1]["accuracy"]["within_budget"]
        assert _agreement(pkg, "onnx-fp16", digits) >= 0.99


def test_pruning_over_budget_leaves_its_most_sensitive_layers_dense(digits_package, digits):
    """90% of every layer's weights is more than the digits CNN can lose; leaving the layers that
    lose most dense brings it within budget, and the record says what was reached."""
    with unideploy.optimize(digits_package, prune=0.9, calibration=digits["data"]) as pkg:
        record = pkg.manifest.optimizations[-1]
        params = record["passes"][0]["params"]
        assert params["search"]["drop_points_all_pruned"] > 1.0 and params["search"]["within_budget"]
        assert 1 <= len(params["dense_layers"]) < params["search"]["ranked_layers"]
        assert 0 < params["achieved_sparsity"] < 0.9
        assert record["accuracy"]["within_budget"]


def test_int8_keeps_a_concat_of_boxes_and_probabilities_in_fp32(digits, tmp_path):
    """YOLOv8's head concatenates box coordinates (up to the image size) with class probabilities
    in [0, 1]: one int8 scale for both leaves the probabilities no level (each 0 or ~2.5). The Concat
    stays fp32, says why, and the probabilities come out as fp32 gives them."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "to_boxes": (rng.standard_normal((64, 4)) * 40.0).astype(np.float32),
        "to_scores": rng.standard_normal((64, 12)).astype(np.float32) * 0.5,
    }
    nodes = [
        helper.make_node("Flatten", ["x"], ["flat"]),
        helper.make_node("MatMul", ["flat", "to_boxes"], ["boxes"]),
        helper.make_node("MatMul", ["flat", "to_scores"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["scores"]),
        helper.make_node("Concat", ["boxes", "scores"], ["output0"], axis=1, name="head_concat"),
    ]
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 16])],
        [numpy_helper.from_array(w, name) for name, w in weights.items()],
    )
    onnx_path = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(onnx_path))
    unideploy.export(onnx_path, tmp_path / "head.udp").close()

    with unideploy.optimize(
        tmp_path / "head.udp", quantize="int8", int8_variant="static", keep_slower=True, calibration=digits["data"]
    ) as pkg:
        kept = pkg.manifest.optimizations[-1]["passes"][0]["params"]["fp32_layers"]
        assert kept[0]["node"] == "head_concat" and "ranges differ" in kept[0]["why"], kept
        with np.load(digits["data"]) as d:
            x = d["x"][:64]
        fp32 = unideploy.run(pkg, {"x": x}, artifact="onnx-fp32")["output0"]
        int8 = unideploy.run(pkg, {"x": x}, artifact="onnx-int8")["output0"]
    assert np.abs(int8[:, 4:] - fp32[:, 4:]).max() < 0.05  # the probabilities, quantized on their own scale
