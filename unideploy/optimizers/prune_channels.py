"""Structured channel pruning of convolution chains: fewer channels, so less compute.

A chain is a Conv whose output reaches exactly one next linear layer through channel-wise
operators only (BatchNormalization, activations, pooling): ``Conv -> [BN] -> ReLU -> [MaxPool] ->
Conv`` or ``... -> Flatten -> Gemm/MatMul``. Removing output channel c of the first Conv removes
the same channel from every BatchNormalization on the way and input channel c (or the features
c*S..(c+1)*S of the Flatten) of the next layer. Channels are ranked by the L1 norm of their filter
times the BatchNormalization scale; the next layer is then re-fitted by least squares to
reproduce its original output from the remaining channels. Chains that branch (residual adds,
several consumers, graph outputs) are left whole.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from unideploy.errors import InputError
from unideploy.optimizers.base import OptimizerPass, PassContext, PassResult
from unideploy.optimizers.graph import (
    Layer, attributes, first_rows, get_array, initializers, linear_layers, load_for_pruning, refit, set_array, REFIT_ROWS,
)
from unideploy.optimizers.graph import consumers as graph_consumers
from unideploy.optimizers.prune_magnitude import check_fraction

CHANNELWISE = {"Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "Elu", "Selu",
               "Softplus", "MaxPool", "AveragePool", "Dropout", "Identity"}


@dataclass
class Chain:
    producer: Layer
    consumer: Layer
    batch_norms: list[onnx.NodeProto] = field(default_factory=list)
    spatial: int = 1  # features per channel after a Flatten (1 for a Conv consumer)


def find_chains(model: onnx.ModelProto) -> list[Chain]:
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    consumers = graph_consumers(model.graph)
    outputs = {o.name for o in model.graph.output}
    inits = initializers(model)
    layers = {l.node.name: l for l in linear_layers(model)}
    chains = []
    for producer in (l for l in layers.values() if l.kind == "conv"):
        chain = Chain(producer, producer)  # consumer set below
        tensor = producer.node.output[0]
        while True:
            users = consumers.get(tensor, [])
            if tensor in outputs or len(users) != 1 or users[0].input[0] != tensor:
                break
            node = users[0]
            if node.op_type == "BatchNormalization" and all(i in inits for i in node.input[1:5]):
                chain.batch_norms.append(node)
            elif node.op_type in CHANNELWISE and all(i in inits or not i for i in node.input[1:]):
                pass
            elif node.op_type == "Conv" and node.name in layers:
                chain.consumer = layers[node.name]
                chains.append(chain)
                break
            elif node.op_type == "Flatten" and attributes(node).get("axis", 1) == 1:
                dims = shapes.get(tensor, [])
                after = consumers.get(node.output[0], [])
                if len(dims) == 4 and all(dims[1:]) and len(after) == 1 and after[0].name in layers \
                        and layers[after[0].name].kind in ("gemm", "matmul") and node.output[0] not in outputs:
                    chain.consumer, chain.spatial = layers[after[0].name], dims[2] * dims[3]
                    chains.append(chain)
                break
            else:
                break
            tensor = node.output[0]
    return chains


def _importance(model: onnx.ModelProto, chain: Chain) -> np.ndarray:
    score = np.abs(chain.producer.matrix(model)).sum(axis=1)
    for bn in chain.batch_norms:
        gamma, var = get_array(model, bn.input[1]), get_array(model, bn.input[4])
        score = score * np.abs(gamma) / np.sqrt(var + attributes(bn).get("epsilon", 1e-5))
    return score


class ChannelPruning(OptimizerPass):
    name = "prune-channels"
    stage = "prune"

    def __init__(self, ratio: float, refit: bool = True) -> None:
        self.ratio = check_fraction(ratio, "--prune channel ratio")
        self.refit = refit

    def apply(self, model_path: Path, ctx: PassContext) -> PassResult:
        model, original = load_for_pruning(model_path)
        chains = find_chains(model)
        if not chains:
            raise InputError("no prunable convolution chain found (Conv -> BN/activation/pool -> Conv or Flatten -> Gemm)",
                             "use --prune-method magnitude for this model")
        kept_rows: dict[str, np.ndarray] = {}
        report = []
        for chain in chains:
            channels = chain.producer.matrix(model).shape[0]
            keep = np.sort(np.argsort(-_importance(model, chain))[: max(1, round(channels * (1 - self.ratio)))])
            _remove_channels(model, chain, keep)
            kept_rows[chain.producer.node.name] = keep
            report.append({"layer": chain.producer.node.name, "channels": channels, "kept": int(len(keep))})
        refitted = self.refit and bool(ctx.calibration)
        if refitted:
            batches = first_rows(ctx.calibration, REFIT_ROWS)
            consumers = [c.consumer for c in chains]
            for i, consumer in enumerate(consumers, 1):
                ctx.say(f"re-fitting layer {i}/{len(consumers)} ({consumer.node.name})")
                shape = consumer.matrix(model).shape
                refit(original, model, consumer.node.name, np.ones(shape, bool), batches,
                      out_rows=kept_rows.get(consumer.node.name))
        del model.graph.value_info[:]  # shapes changed; runtimes infer them again
        out = ctx.workdir / "pruned-channels.onnx"
        onnx.save(model, str(out))
        return PassResult(path=out, params={"ratio": self.ratio, "refit": refitted, "chains": report})


def _remove_channels(model: onnx.ModelProto, chain: Chain, keep: np.ndarray) -> None:
    producer = chain.producer
    set_array(model, producer.weight, get_array(model, producer.weight)[keep])
    if producer.bias:
        set_array(model, producer.bias, get_array(model, producer.bias)[keep])
    for bn in chain.batch_norms:
        for name in bn.input[1:5]:
            set_array(model, name, get_array(model, name)[keep])
    consumer = chain.consumer
    if consumer.kind == "conv":
        set_array(model, consumer.weight, get_array(model, consumer.weight)[:, keep])
        return
    features = (keep[:, None] * chain.spatial + np.arange(chain.spatial)[None, :]).ravel()
    matrix = consumer.matrix(model)[:, features]
    consumer.store(model, matrix, None)
