"""The accuracy search every non-exact stage shares: leave the fewest of the most sensitive layers
as they were (in fp32, in float, whole) for a candidate to fit the budget, and its record.

How the layers are ranked is the optimization's own business (ONNX Runtime's QDQ debugging for
INT8 and FP16, each channel group alone for pruning, LiteRT's per-tensor error for TFLite int8);
how candidates are tried, recorded and explained in a refusal is here, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unideploy.package.manifest import AccuracyRecord, SearchRecord, SearchTrial

MAX_TRIALS = 10


@dataclass
class SearchResult:
    path: Path | None  # the model within budget, else the candidate with the smallest drop (None: none tried)
    restored: list[str]  # the layers left as they were
    within_budget: bool
    trials: list[SearchTrial] = field(default_factory=list)


def trial(restored: int, accuracy: AccuracyRecord) -> SearchTrial:
    return {
        "restored": restored,
        "drop_points": accuracy["drop_points"],
        "within_budget": bool(accuracy["within_budget"]),
    }


def search(
    ranked: list[str],
    build: Callable[[list[str]], Path],
    judge: Callable[[Path], AccuracyRecord],
    say: Callable[[str], None],
    what: str,
    max_trials: int | None = None,
) -> SearchResult:
    """The fewest leading layers of ``ranked`` to leave as they were (``build`` makes the model with
    them restored) for the model to fit the budget:
    doubling until it fits, then bisecting between the last count over budget and the first within.
    When nothing fits, the candidate with the smallest drop goes to the guard, which refuses it.
    At most ``MAX_TRIALS`` candidates, and at most half the layers left as they were: a model that
    needs more is refused, as the optimization would then give little."""
    trials: list[SearchTrial] = []
    tried: dict[int, tuple[Path, float, bool]] = {}
    limit = max_trials or MAX_TRIALS

    def fits(count: int) -> bool:
        say(f"{what} with the {count} most sensitive layer(s) left as they were")
        path = build(ranked[:count])
        trials.append(trial(count, judge(path)))
        tried[count] = (path, float(trials[-1]["drop_points"]), trials[-1]["within_budget"])
        return tried[count][2]

    most = len(ranked) // 2  # beyond half the layers left as they were, the optimization gives little
    over, count = 0, 1
    while count < most and len(trials) < limit - 1 and not fits(count):
        over, count = count, count * 2
    within = min((c for c, (_, _, ok) in tried.items() if ok), default=None)
    if within is None and most > over and fits(most):
        within = most
    if within is None:
        if not tried:
            return SearchResult(None, [], False, trials)
        best = min(tried, key=lambda c: tried[c][1])
        return SearchResult(tried[best][0], ranked[:best], False, trials)
    while within - over > max(1, within // 8) and len(trials) < limit:
        middle = (over + within) // 2
        if fits(middle):
            within = middle
        else:
            over = middle
    return SearchResult(tried[within][0], ranked[:within], True, trials)


def search_record(
    ranked: int, restored_as: str, result: SearchResult | list[SearchTrial], units: str = "layers", **measured: Any
) -> SearchRecord:
    """The manifest's record of a search over ``ranked`` units, with the pass's own measurements."""
    trials = result if isinstance(result, list) else result.trials
    record: SearchRecord = {"ranked_layers": ranked, "restored_as": restored_as, "trials": trials}
    if units != "layers":
        record["units"] = units
    if not isinstance(result, list):
        record["within_budget"] = result.within_budget
    record.update(measured)  # type: ignore[typeddict-item]  # the keys SearchRecord names
    return record


def skipped(why: str) -> SearchRecord:
    """The record of a search that did not run (ranking failed, nothing to rank)."""
    return {"skipped": why}


def tried(record: SearchRecord) -> str:
    """What a search tried, for the refusal of a model still over budget after it: its own reason
    for refusing, or how many units it restored at most; '' where it did not run."""
    if record.get("refused"):
        return str(record["refused"])
    if not record.get("trials"):
        return ""
    most = max(t["restored"] for t in record["trials"])
    return (
        f"even with up to {most} of {record['ranked_layers']} {record.get('units', 'layers')} "
        f"{record['restored_as']} (the most sensitive first; more than half would leave little of the optimization)"
    )
