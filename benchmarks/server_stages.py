"""Where a served request's time went, as the server's own metrics say it (its request-duration
histogram: decode, queue, compute, encode; its batch sizes; and where its runtime calls' time
went: to_thread, input, infer, from_thread), read from outside between two moments."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from unideploy.server.batching import CallParts

STAGES = ("decode", "queue", "compute", "encode")
CALL_PARTS = CallParts._fields  # to_thread, input, infer, from_thread


def stage_sums(http: str, model: str) -> dict[str, tuple[float, float]]:
    """(sum, count) per stage of the server's request-duration histogram for ``model`` (0 before
    its first request), summed over its versions and variants; under "rows" its batch-size
    histogram's (rows, runtime calls); and under each of ``CALL_PARTS`` the seconds of its runtime
    calls in that part (count 0)."""
    totals = {stage: [0.0, 0.0] for stage in (*STAGES, "rows", *CALL_PARTS)}
    for family in text_string_to_metric_families(httpx.get(f"{http}/metrics", timeout=10).text):
        if family.name not in (
            "unideploy_request_duration_seconds",
            "unideploy_batch_rows",
            "unideploy_runtime_call_seconds",
        ):
            continue
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            if family.name == "unideploy_runtime_call_seconds":
                if sample.name.endswith("_total"):
                    totals[sample.labels["part"]][0] += sample.value
                continue
            stage = sample.labels.get("stage", "rows" if family.name == "unideploy_batch_rows" else None)
            if stage in totals and sample.name.endswith(("_sum", "_count")):
                totals[stage][sample.name.endswith("_count")] += sample.value
    return {stage: (total, count) for stage, (total, count) in totals.items()}


def rows_per_call(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> float | None:
    """The mean rows of the runtime calls made between two ``stage_sums`` (None where none was)."""
    calls = after["rows"][1] - before["rows"][1]
    return round((after["rows"][0] - before["rows"][0]) / calls, 1) if calls else None


def stage_means_ms(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
) -> tuple[float, dict[str, float]]:
    """The requests answered between two ``stage_sums`` and each stage's mean over them in ms
    (empty where none was)."""
    requests = after["decode"][1] - before["decode"][1]
    if not requests:
        return 0, {}
    return requests, {stage: round((after[stage][0] - before[stage][0]) / requests * 1000, 3) for stage in STAGES}


def call_means_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each part's mean over the runtime calls made between two ``stage_sums``, in ms (empty where
    none was)."""
    calls = after["rows"][1] - before["rows"][1]
    if not calls:
        return {}
    return {part: round((after[part][0] - before[part][0]) / calls * 1000, 3) for part in CALL_PARTS}
