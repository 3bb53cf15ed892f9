"""Which convolution channels must be removed together, and removing them.

Removing output channel c of a Conv is only sound if every tensor that carries that channel loses
it too. Real networks couple channels across layers: a residual ``Add`` ties the channels of the
block's input to those of its projection (and so to every block on the same stream), a depthwise
convolution or a BatchNormalization carries its input's channels through to its output, a
squeeze-and-excitation ``Mul`` ties the excitation conv to the features it scales, and a
``Concat`` lays the channels of several producers side by side for the layer that reads it.

The analysis walks the graph once, in order, and gives every tensor whose axis 1 is made of
prunable channels a *layout*: the groups its channels come from, in order (one group, or several
after a Concat). A group starts at each Conv the pruning passes can edit; an element-wise op over
two layouts merges their groups (union-find). The channels of a group can be removed when every
reader of its tensors is understood: channel-wise ops, per-channel constants, depthwise convs and
the linear layers that read them (a Conv, or a Gemm/MatMul after a Flatten). Anything else (a
Reshape, a Split, a model output, a shared weight) leaves the whole group as it is, and the reason
is kept for the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from unideploy.onnx.graph import consumers
from unideploy.optimizers.graph import Layer, attributes, get_array, initializers, linear_layers, set_array

NORMALIZATIONS = {"BatchNormalization", "InstanceNormalization"}
CHANNELWISE = {
    "Relu",
    "LeakyRelu",
    "PRelu",
    "Sigmoid",
    "Tanh",
    "Clip",
    "HardSigmoid",
    "HardSwish",
    "Elu",
    "Selu",
    "Softplus",
    "Mish",
    "Gelu",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Dropout",
    "Identity",
}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Sum"}
REDUCE = {"ReduceMean", "ReduceMax", "ReduceSum"}

Layout = tuple[tuple[int, int], ...]  # ((group, channels), ...) along axis 1


def width(layout: Layout) -> int:
    """Channels along axis 1 of a tensor with this layout."""
    return sum(count for _, count in layout)


def _columns(indices: np.ndarray, per: int) -> np.ndarray:
    """The matrix columns of the channels at ``indices``, each spanning ``per`` columns (a kernel's
    taps, or the positions a Flatten lays out)."""
    return (indices[:, None] * per + np.arange(per)[None, :]).ravel()


@dataclass
class Group:
    """Channels that leave together: the Convs producing them (in graph order), and why they stay
    whole (if so)."""

    id: int
    channels: int
    producers: list[Layer] = field(default_factory=list)
    why_whole: str | None = None


@dataclass
class ChannelGroups:
    """The result of the analysis: groups, and every edit removing a group's channels implies."""

    groups: dict[int, Group]
    consumers: list[tuple[Layer, Layout, int]]  # linear layers reading channels: (layer, layout, features per channel)
    sliced: list[tuple[str, int, Layout]]  # initializers cut along an axis: (name, axis, layout)
    regrouped: list[tuple[onnx.NodeProto, Layout]]  # depthwise convs whose ``group`` follows the channel count
    convolutions: int  # Conv nodes in the model

    def prunable(self) -> list[Group]:
        return [g for g in self.groups.values() if g.why_whole is None]

    def whole(self) -> list[Group]:
        return [g for g in self.groups.values() if g.why_whole is not None and g.producers]


class _Analysis:
    def __init__(self, model: onnx.ModelProto) -> None:
        inferred = onnx.shape_inference.infer_shapes(model)
        values = list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output)
        self.shapes = {
            v.name: [d.dim_value if d.HasField("dim_value") else 0 for d in v.type.tensor_type.shape.dim]
            for v in values
            if v.type.tensor_type.HasField("shape")
        }
        self.model = model
        self.inits = initializers(model)
        self.producers = {t: node for node in model.graph.node for t in node.output}
        self.readers = consumers(model.graph)
        self.layers = {layer.node.name: layer for layer in linear_layers(model)}
        self.parent: dict[int, int] = {}
        self.groups: dict[int, Group] = {}
        self.layout: dict[str, Layout] = {}
        self.flat: dict[str, tuple[Layout, int]] = {}  # Flatten outputs: layout and features per channel
        self.consumers: list[tuple[Layer, Layout, int]] = []
        self.sliced: list[tuple[str, int, Layout]] = []
        self.regrouped: list[tuple[onnx.NodeProto, Layout]] = []

    # union-find over group ids
    def root(self, g: int) -> int:
        while self.parent[g] != g:
            self.parent[g] = self.parent[self.parent[g]]
            g = self.parent[g]
        return g

    def union(self, a: int, b: int) -> None:
        a, b = self.root(a), self.root(b)
        if a != b:
            self.parent[b] = a
            self.groups[a].producers += self.groups[b].producers
            self.groups[a].why_whole = self.groups[a].why_whole or self.groups[b].why_whole

    def freeze(self, layout: Layout, why: str) -> None:
        for g, _ in layout:
            group = self.groups[self.root(g)]
            group.why_whole = group.why_whole or why

    def new_group(self, channels: int) -> int:
        g = len(self.parent)
        self.parent[g] = g
        self.groups[g] = Group(g, channels)
        return g

    def slice_constant(self, name: str, rank: int, layout: Layout, axis: int | None = None) -> bool:
        """Cut a constant operand of an op over a [N, C, ...] tensor of ``rank`` dims (broadcast
        from the right, or along ``axis`` when given); False if it cannot be cut."""
        if not name:
            return True  # an omitted optional input
        value = self.constant(name)
        if value is None:
            return False  # computed from the model's input: not a constant
        axis = 1 - (rank - value.ndim) if axis is None else axis
        if axis < 0 or value.shape[axis] == 1:
            return True  # broadcast over the channels
        if name not in self.inits or value.shape[axis] != width(layout) or len(self.readers[name]) > 1:
            return False
        self.sliced.append((name, axis, layout))
        return True

    def run(self) -> ChannelGroups:
        model = self.model
        for node in model.graph.node:
            self.visit(node)
        for output in model.graph.output:
            if output.name in self.layout:
                self.freeze(self.layout[output.name], f"its channels are the model output '{output.name}'")
            if output.name in self.flat:
                self.freeze(self.flat[output.name][0], f"its channels are the model output '{output.name}'")
        groups: dict[int, Group] = {}
        for g in self.parent:
            r = self.root(g)
            groups.setdefault(r, self.groups[r])
        order = {node.name: i for i, node in enumerate(model.graph.node)}
        for group in groups.values():
            group.producers.sort(key=lambda layer: order[layer.node.name])
        shared = {name for name, readers in self.readers.items() if name in self.inits and len(readers) > 1}
        for layer in (p for group in groups.values() for p in group.producers):
            if layer.weight in shared or layer.bias in shared:
                self.freeze(self.layout[layer.node.output[0]], f"the weights of '{layer.node.name}' are shared")
        for layer, layout, _ in self.consumers:
            if layer.weight in shared:
                self.freeze(layout, f"the weights of '{layer.node.name}' are shared")
        canonical = lambda layout: tuple((self.root(g), c) for g, c in layout)  # noqa: E731
        return ChannelGroups(
            groups=groups,
            consumers=[(c, canonical(lay), s) for c, lay, s in self.consumers],
            sliced=[(n, a, canonical(lay)) for n, a, lay in self.sliced],
            regrouped=[(n, canonical(lay)) for n, lay in self.regrouped],
            convolutions=sum(n.op_type == "Conv" for n in model.graph.node),
        )

    def visit(self, node: onnx.NodeProto) -> None:
        inputs = [self.layout.get(t) for t in node.input]
        flat = [self.flat.get(t) for t in node.input]
        layer = self.layers.get(node.name)
        if layer is not None and layer.kind == "conv":
            if inputs[0] is not None:
                self.consumers.append((layer, inputs[0], 1))
            channels = self.inits[layer.weight].dims[0]
            group = self.new_group(channels)
            self.groups[group].producers.append(layer)
            self.layout[node.output[0]] = ((group, channels),)
            return
        if layer is not None and flat[0] is not None:
            self.consumers.append((layer, *flat[0]))
            return
        if layer is not None and inputs[0] is not None and len(self.shapes.get(node.input[0], [])) == 2:
            self.consumers.append((layer, inputs[0], 1))  # a Gemm/MatMul after a global pooling
            return
        if all(i is None for i in inputs + flat):
            return  # nothing prunable flows through this node
        if all(f is None for f in flat) and self.propagate(node, inputs):
            return
        for layout in [*(i for i in inputs if i), *(f[0] for f in flat if f)]:
            self.freeze(layout, f"read by {node.op_type} '{node.name}'")

    def propagate(self, node: onnx.NodeProto, inputs: list[Layout | None]) -> bool:
        """Carry a layout through a node that keeps channels on axis 1; False if it does not."""
        first = next(i for i, layout in enumerate(inputs) if layout is not None)
        layout, rank = inputs[first], len(self.shapes.get(node.input[first], []))
        assert layout is not None
        op = node.op_type
        if rank < 2:
            return False
        if op in ("Flatten", "Reshape"):
            return self._flatten(node, layout, rank)
        if op == "Concat":
            return self._concat(node, inputs, rank)
        if op == "Pad":
            carried = inputs[0] is not None and self._spatial_pad(node, rank)
        elif op == "Resize":
            carried = inputs[0] is not None and self._spatial_resize(node, rank)
        elif op in CHANNELWISE or op in NORMALIZATIONS:
            carried = self._channelwise(node, inputs, layout, rank)
        elif op in REDUCE or op in ("Squeeze", "Unsqueeze"):
            carried = inputs[0] is not None and self._spatial_axes(node, rank)
        elif op == "Conv":
            carried = self._depthwise(node, inputs, layout)
        else:
            carried = op in ELEMENTWISE and self._elementwise(node, inputs, layout, rank)
        if carried:
            self.layout[node.output[0]] = layout
        return carried

    def _channelwise(self, node: onnx.NodeProto, inputs: list[Layout | None], layout: Layout, rank: int) -> bool:
        axis = 0 if node.op_type in NORMALIZATIONS else None  # their scale, bias, mean, var are [C]
        return (
            inputs[0] is not None
            and all(i is None for i in inputs[1:])
            and all(self.slice_constant(name, rank, layout, axis) for name in node.input[1:])
        )

    def _spatial_axes(self, node: onnx.NodeProto, rank: int) -> bool:
        """A reduction, Squeeze or Unsqueeze over axes after the channels (global pooling, an SE gate)."""
        axes = attributes(node).get("axes")
        if axes is None and len(node.input) > 1 and (value := self.constant(node.input[1])) is not None:
            axes = value.tolist()
        if not axes:
            return False
        if node.op_type == "Unsqueeze":  # its axes count in the output's rank
            return all(int(x) >= 2 for x in axes)
        return all(int(x) % rank >= 2 for x in axes)

    def _depthwise(self, node: onnx.NodeProto, inputs: list[Layout | None], layout: Layout) -> bool:
        """A depthwise Conv (one filter per channel) carries channels through: cut its filters."""
        if inputs[0] is None or node.input[1] not in self.inits or len(self.readers[node.input[1]]) > 1:
            return False
        dims, channels = list(self.inits[node.input[1]].dims), width(layout)
        if not attributes(node).get("group", 1) == channels == dims[0] or dims[1] != 1:
            return False
        if len(node.input) > 2 and not self.slice_constant(node.input[2], 2, layout, 0):
            return False
        self.sliced.append((node.input[1], 0, layout))
        self.regrouped.append((node, layout))
        return True

    def _elementwise(self, node: onnx.NodeProto, inputs: list[Layout | None], layout: Layout, rank: int) -> bool:
        """Element-wise ops over several layouts tie their groups together (a residual Add)."""
        layouts = [i for i in inputs if i is not None]
        if any([c for _, c in other] != [c for _, c in layout] for other in layouts):
            return False
        if not all(i is not None or self.slice_constant(name, rank, layout) for name, i in zip(node.input, inputs)):
            return False
        for other in layouts[1:]:
            for (g, _), (h, _) in zip(layout, other):
                self.union(g, h)
        return True

    def _concat(self, node: onnx.NodeProto, inputs: list[Layout | None], rank: int) -> bool:
        """Channels side by side; an input no prunable Conv made keeps all its channels."""
        if attributes(node).get("axis") not in (1, 1 - rank):
            return False
        layout: list[tuple[int, int]] = []
        for name, i in zip(node.input, inputs):
            channels = self.shapes.get(name, [0, 0])[1] if len(self.shapes.get(name, [])) > 1 else 0
            if i is None and not channels:
                return False
            if i is None:
                fixed = self.new_group(channels)
                self.groups[fixed].why_whole = f"coupled to the channels of '{name}', which no prunable Conv made"
                i = ((fixed, channels),)
            layout += i
        self.layout[node.output[0]] = tuple(layout)
        return True

    def _spatial_resize(self, node: onnx.NodeProto, rank: int) -> bool:
        """A Resize by constant scales that leave the channel axis alone (an FPN's upsampling)."""
        scales = self.constant(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        return (
            scales is not None and scales.size == rank and scales[1] == 1 and (len(node.input) < 4 or not node.input[3])
        )

    def _spatial_pad(self, node: onnx.NodeProto, rank: int) -> bool:
        pads = self.constant(node.input[1]) if len(node.input) > 1 else None
        axes = self.constant(node.input[3]) if len(node.input) > 3 and node.input[3] else np.arange(rank)
        if pads is None or axes is None:
            return False
        return all(int(axis) % rank != 1 or pads[i] == pads[i + len(axes)] == 0 for i, axis in enumerate(axes))

    def _flatten(self, node: onnx.NodeProto, layout: Layout, rank: int) -> bool:
        """A Flatten, or a Reshape to [batch, -1]: each channel becomes H*W features of a Gemm/MatMul."""
        dims = self.shapes[node.input[0]]
        if node.op_type == "Flatten":
            flattens = attributes(node).get("axis", 1) == 1
        else:  # torch's x.view(x.size(0), -1) computes the batch and writes -1 for the rest
            producer = self.producers.get(node.input[1])
            shape = self.constant(node.input[1])
            last = (
                shape[-1:]
                if shape is not None
                else self.constant(producer.input[-1])
                if producer is not None and producer.op_type == "Concat"
                else None
            )
            flattens = len(self.shapes.get(node.output[0], [])) == 2 and last is not None and list(last) == [-1]
        if not flattens or rank != 4 or not dims[2] or not dims[3]:
            return False
        self.flat[node.output[0]] = (layout, dims[2] * dims[3])
        return True

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a constant operand; None for a computed one. The model has been through
        ``basic_optimized``, which folds exporters' small constant subgraphs (pads, shapes,
        Constant nodes) into initializers."""
        return numpy_helper.to_array(self.inits[name]) if name in self.inits else None


def find_groups(model: onnx.ModelProto) -> ChannelGroups:
    """Every group of coupled Conv output channels in ``model`` (after ``basic_optimized``, as the
    pruning pass gives it), and what removing them touches."""
    return _Analysis(model).run()


def layout_keep(layout: Layout, keep: dict[int, np.ndarray], channels: dict[int, int]) -> np.ndarray:
    """Indices along a tensor's axis 1 that remain when each group keeps ``keep[group]``."""
    parts, offset = [], 0
    for g, count in layout:
        parts.append(offset + keep.get(g, np.arange(channels[g])))
        offset += count
    return np.concatenate(parts)


def remove_channels(
    model: onnx.ModelProto, found: ChannelGroups, keep: dict[int, np.ndarray], means: dict[str, np.ndarray]
) -> None:
    """Cut ``model`` in place so that each group in ``keep`` keeps only those channels.

    A removed channel is rarely zero (a folded BatchNorm gives it a bias), so each layer reading
    it adds what it contributed on average, ``means`` (layer -> mean of each input feature), to its
    own bias."""
    channels = {g: group.channels for g, group in found.groups.items()}
    for group_id, kept in keep.items():
        for layer in found.groups[group_id].producers:
            set_array(model, layer.weight, get_array(model, layer.weight)[kept])
            if layer.bias:
                set_array(model, layer.bias, get_array(model, layer.bias)[kept])
    touched = lambda layout: any(g in keep for g, _ in layout)  # noqa: E731
    for name, axis, layout in found.sliced:
        if touched(layout):
            set_array(model, name, np.take(get_array(model, name), layout_keep(layout, keep, channels), axis=axis))
    nodes = {node.name: node for node in model.graph.node}
    for node, layout in found.regrouped:
        if touched(layout):
            group = next(a for a in nodes[node.name].attribute if a.name == "group")
            group.i = len(layout_keep(layout, keep, channels))
    for layer, layout, spatial in found.consumers:
        if not touched(layout):
            continue
        kept = layout_keep(layout, keep, channels)
        matrix = layer.matrix(model)
        if layer.bias and layer.node.name in means:
            column_mean = np.repeat(means[layer.node.name], matrix.shape[1] // len(means[layer.node.name]))
            columns = _columns(np.setdiff1d(np.arange(width(layout)), kept), matrix.shape[1] // width(layout))
            shift = matrix[:, columns].astype(np.float64) @ column_mean[columns]
            set_array(model, layer.bias, (get_array(model, layer.bias) + shift).astype(np.float32))
        if layer.kind == "conv":
            set_array(model, layer.weight, get_array(model, layer.weight)[:, kept])
        else:
            layer.store(model, matrix[:, _columns(kept, spatial)], None)
