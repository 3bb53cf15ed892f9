"""Structured channel pruning: fewer convolution channels, so less compute on any runtime.

The channels that must go together come from ``channel_groups.py``: a plain chain (``Conv -> BN
-> act -> Conv``), a depthwise convolution in between, every block on a residual stream, a
squeeze-and-excitation gate, the inputs of a Concat. Each group keeps the channels that carry the
largest share of the output of the layers reading them (``_importance``, measured on calibration
rows), rounded to a multiple of 8; a removed channel's mean moves into its readers' biases, and
the readers are then re-fitted by least squares to reproduce the original model's outputs from
the channels left (``graph.refit``).

When pruning every group is over the accuracy budget, the groups the model loses most to (each
pruned alone, the output SQNR lost) are left whole until it fits, as the other pruning and INT8
searches do. Groups the analysis cannot cut are listed with the reason.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx

from unideploy.errors import InputError
from unideploy.guard.search import search_record
from unideploy.onnx.session import basic_optimized
from unideploy.optimizers.base import OptimizeRequest, OptimizerPass, PassContext, PassResult
from unideploy.optimizers.channel_groups import ChannelGroups, Group, find_groups, remove_channels
from unideploy.optimizers.graph import REFIT_ROWS, input_statistics, load_for_pruning, not_refitted, refit, too_wide
from unideploy.optimizers.layer_inputs import LayerInputs
from unideploy.optimizers.options import PruningOptions
from unideploy.optimizers.prune_magnitude import check_fraction
from unideploy.optimizers.sensitivity import comparison_rows, rank_alone, search_refitted
from unideploy.quiet import quiet

CHANNEL_MULTIPLE = 8
STATISTICS_ROWS = 64  # calibration rows the channels are measured on
SHOWN_REASONS = 3  # reasons a model cannot be pruned, in the refusal


def _rounded(count: float, channels: int) -> int:
    """Channels to keep: a multiple of ``CHANNEL_MULTIPLE`` where the layer is wide enough, as CPU
    and GPU convolution kernels work in blocks of 8 or 16 channels and run odd counts slower."""
    if channels < 2 * CHANNEL_MULTIPLE:
        return max(1, round(count))
    return min(channels, max(CHANNEL_MULTIPLE, CHANNEL_MULTIPLE * round(count / CHANNEL_MULTIPLE)))


def _label(group: Group) -> str:
    """A group by the first Conv that produces it (the one earliest in the graph)."""
    return group.producers[0].node.name


def _importance(
    model: onnx.ModelProto,
    found: ChannelGroups,
    stats: dict[str, tuple[np.ndarray, np.ndarray]],
) -> dict[int, np.ndarray]:
    """Per group, the share of the output of the layers reading it that each channel carries:
    the energy of the weights reading the channel times the channel's variance (its mean is put
    back as bias when it is removed), over the layer's whole output energy, summed over readers."""
    scores = {g: np.zeros(group.channels) for g, group in found.groups.items()}
    for layer, layout, spatial in found.consumers:
        mean, var = stats[layer.node.name]
        matrix = layer.matrix(model).astype(np.float64)
        energy = (matrix**2).sum(axis=0).reshape(len(mean), -1).sum(axis=1)
        share = (energy * var / max(float((energy * (var + mean**2)).sum()), 1e-30)).reshape(-1, spatial).sum(axis=1)
        offset = 0
        for g, count in layout:
            scores[g] += share[offset : offset + count]
            offset += count
    return scores


def unprunable(found: ChannelGroups) -> str:
    """Why no channel of the model can be removed, for the refusal."""
    reasons = sorted({g.why_whole for g in found.whole() if g.why_whole})
    if not any(g.producers for g in found.groups.values()):
        return "it has no convolution whose output channels the pass can cut (plain Conv with weights in the file)"
    shown = "; ".join(reasons[:SHOWN_REASONS]) + (
        f"; and {len(reasons) - SHOWN_REASONS} more" if len(reasons) > SHOWN_REASONS else ""
    )
    return f"every group of coupled channels is read by something that needs all of them ({shown})"


class ChannelPruning(OptimizerPass):
    name = "prune-channels"
    stage = "prune"

    options = PruningOptions

    def __init__(self, ratio: float, options: PruningOptions | None = None) -> None:
        self.ratio = check_fraction(ratio, "--prune channel ratio")
        self.refit = (options or PruningOptions()).refit

    @classmethod
    def from_request(cls, request: OptimizeRequest) -> ChannelPruning | None:
        ratio = cls.asked_share(request, "channels", "RATIO")
        return None if ratio is None else cls(ratio, cls.settings(request))

    def tag(self) -> str:
        return f"slim{round(self.ratio * 100)}"

    def apply(self, model_path: Path, ctx: PassContext) -> PassResult:
        model, original = load_for_pruning(basic_optimized(model_path, ctx.workdir / "prune-channels-input.onnx"))
        found = find_groups(model)
        groups = {_label(g): g for g in found.prunable()}
        if not groups:
            raise InputError(
                f"no convolution channels can be removed from this model: {unprunable(found)}",
                "use --prune-method magnitude for this model",
            )
        stats = input_statistics(
            original, [layer for layer, _, _ in found.consumers], ctx.first_batches(STATISTICS_ROWS)
        )
        means = {name: mean for name, (mean, _) in stats.items()}
        importance = _importance(original, found, stats)
        keep = {
            g.id: np.sort(np.argsort(-importance[g.id])[: _rounded(g.channels * (1 - self.ratio), g.channels)])
            for g in groups.values()
        }
        refitted = self.refit and bool(ctx.calibration)
        wide_layers: list[str] = []  # readers never re-fitted (cutting fewer groups leaves them wider)

        def build(whole: list[str], refit: bool, name: str = "") -> Path:
            kept = {g.id: keep[g.id] for label, g in groups.items() if label not in whole}
            candidate = onnx.ModelProto()
            candidate.CopyFrom(original)
            remove_channels(candidate, found, kept, means)
            if refit:
                wide = self._refit(original, candidate, found, kept, ctx)
                wide_layers[:] = wide_layers or wide
            del candidate.graph.value_info[:]  # shapes changed; runtimes infer them again
            path = ctx.workdir / (name or f"pruned-channels-whole{len(whole)}{'-refit' if refit else ''}.onnx")
            onnx.save(candidate, str(path))
            return path

        started = time.perf_counter()
        out = build([], refitted, "pruned-channels.onnx")
        refit_seconds = time.perf_counter() - started
        params = {"ratio": self.ratio, "refit": refitted, **_report(found, groups, keep, whole=[])}
        params.update(not_refitted(wide_layers))
        if len(groups) > 1 and not (judged := ctx.judge(out))["within_budget"]:
            out, searched = self._leave_whole(
                original, groups, build, refitted, refit_seconds, out, judged["drop_points"], ctx
            )
            if searched:
                params.update(_report(found, groups, keep, whole=searched.pop("whole")), **searched)
        return PassResult(path=out, params=params)

    def _leave_whole(
        self,
        original: onnx.ModelProto,
        groups: dict[str, Group],
        build,
        refitted: bool,
        refit_seconds: float,
        out: Path,
        all_groups: float,
        ctx: PassContext,
    ) -> tuple[Path, dict]:
        ctx.say(
            f"removing {self.ratio:.0%} of every group's channels is over the accuracy budget: "
            "ranking the groups by sensitivity"
        )
        reference = ctx.workdir / "prune-original.onnx"
        onnx.save(original, str(reference))
        labels = list(groups)
        with quiet():
            ranked = rank_alone(
                reference,
                labels,
                lambda label: build([x for x in labels if x != label], False, "pruned-channels-alone.onnx"),
                comparison_rows(ctx),
                ctx.workdir,
            )
        result = search_refitted(
            [n for n, _ in ranked], build, refitted, refit_seconds, ctx, f"{self.ratio:.0%} channel pruning"
        )
        if result.path is None:
            return out, {}
        loss = dict(ranked)
        return result.path, {
            "whole": result.restored,
            "whole_groups": [
                {
                    "node": n,
                    "layers": len(groups[n].producers),
                    "channels": groups[n].channels,
                    "sqnr_loss_db": round(loss[n], 2),
                }
                for n in result.restored
            ],
            "search": search_record(
                len(ranked),
                "whole",
                result,
                units="channel groups",
                drop_points_all_pruned=all_groups,
                cost=f"{self.ratio:.0%} of the channels of every group gave a drop of {all_groups:.2f} points",
            ),
        }

    @staticmethod
    def _refit(
        original: onnx.ModelProto,
        pruned: onnx.ModelProto,
        found: ChannelGroups,
        kept: dict[int, np.ndarray],
        ctx: PassContext,
    ) -> list[str]:
        """Re-fit every layer that reads a cut group, in graph order, to the original's outputs;
        the layers too wide to re-fit (``graph.REFIT_MAX_INPUTS``)."""
        own_rows = {layer.node.name: kept[g.id] for g in found.groups.values() if g.id in kept for layer in g.producers}
        readers = [layer for layer, layout, _ in found.consumers if any(g in kept for g, _ in layout)]
        order = {node.name: i for i, node in enumerate(original.graph.node)}
        readers.sort(key=lambda layer: order[layer.node.name])
        batches = ctx.first_batches(REFIT_ROWS)
        inputs_o, inputs_p, wide = LayerInputs(original, batches), LayerInputs(pruned, batches), []
        for i, layer in enumerate(readers, 1):
            ctx.say(f"re-fitting layer {i}/{len(readers)} ({layer.node.name})")
            shape = layer.matrix(pruned).shape
            name = layer.node.name
            if not refit(inputs_o, inputs_p, name, np.ones(shape, bool), out_rows=own_rows.get(name)):
                wide.append(too_wide(name, ctx.say))
        return wide


def _report(found: ChannelGroups, groups: dict[str, Group], keep: dict[int, np.ndarray], whole: list[str]) -> dict:
    """What was cut and what was not, and why, for the manifest and the CLI."""
    cut = [g for label, g in groups.items() if label not in whole]
    cut_ids = {g.id for g in cut}
    depthwise = sum(1 for _, layout in found.regrouped if any(g in cut_ids for g, _ in layout))
    left = [
        {"layers": [p.node.name for p in g.producers], "channels": g.channels, "why": g.why_whole}
        for g in found.whole()
    ]  # those the accuracy search leaves whole are in "whole_groups"
    return {
        "convolutions": found.convolutions,
        "pruned_convolutions": sum(len(g.producers) for g in cut) + depthwise,
        "groups": [
            {"node": _label(g), "layers": len(g.producers), "channels": g.channels, "kept": len(keep[g.id])}
            for g in cut
        ],
        "left_whole": left,
    }
