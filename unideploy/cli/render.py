"""Human-readable output: rich tables on stdout, progress on stderr (so --json stays clean)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.status import Status
from rich.table import Table

from unideploy.bench import Tick
from unideploy.doctor import Finding
from unideploy.guard.accuracy import describe, detail
from unideploy.package import Package
from unideploy.package.manifest import OptimizationRecord
from unideploy.signature import normalize_dtype
from unideploy.validation import tolerance_text
from unideploy.verify import ArtifactCheck

if TYPE_CHECKING:
    from unideploy.edge.bundle import BundleReport
    from unideploy.server.kserve import ServiceEntry
    from unideploy.web.verify import WebReport

# Piped output (logs, CI) gets 120 columns instead of rich's 80 so tables are not truncated.
_PIPE_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120
SHOWN_LAYERS = 6  # layer names listed before "and N more"
out = Console(highlight=False, width=_PIPE_WIDTH)
err = Console(stderr=True, highlight=False)


@contextlib.contextmanager
def status(message: str) -> Iterator[Status]:
    with err.status(message) as spinner:
        yield spinner


@contextlib.contextmanager
def progress(description: str, total: int) -> Iterator[Tick]:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done, _total: bar.update(task, completed=done)


def _fmt(x: float) -> str:
    return f"{x:.2e}" if x and (abs(x) < 1e-3 or abs(x) >= 1e4) else f"{x:.4g}"


def _signature_table(package: Package) -> Table:
    table = Table(title="Signature", title_justify="left")
    for col in ("", "name", "dtype", "shape", "layout"):
        table.add_column(col)
    sig = package.manifest.signature
    for kind, specs, state in (("input", sig.inputs, sig.state_inputs), ("output", sig.outputs, sig.state_outputs)):
        for spec in specs:
            role = f"state {kind}" if spec.name in state else kind
            table.add_row(role, escape(spec.name), spec.dtype, escape(spec.shape_text()), spec.layout or "")
    notes = []
    if sig.state:
        pairs = "; ".join(f"{p.input} <- {p.output}, from {p.initial:g}" for p in sig.state)
        notes.append(f"state: {pairs} (deploy run carries it over a file's rows, the server per sequence)")
    if tables := [f"{t.name} from 0 to {t.table_rows - 1}" for t in sig.inputs if t.table_rows]:
        notes.append(f"values: {'; '.join(tables)} (rows of a table the model looks them up in; others are refused)")
    if notes:
        table.caption = escape("\n".join(notes))
        table.caption_justify = "left"
    return table


def _artifact_table(package: Package) -> Table:
    m = package.manifest
    table = Table(title="Artifacts", title_justify="left")
    for col in ("id", "format", "precision", "size", "runtimes", "validation", "max abs err", "tolerance"):
        table.add_column(col)
    for a in m.artifacts:
        record = m.validation.get(a.id)
        if record and "deferred" in record:  # the reason is in --json; the table says where it happens
            device = "the GPU" if "gpu" in (a.targets or ()) else "the serving device"
            verdict, worst, where = f"[yellow]deferred[/] to {device}", None, ""
            tol = f"atol {record['atol']:g}, rtol {record['rtol']:g}"
        elif record:
            verdict = "[green]passed[/]" if record["passed"] else "[red]failed[/]"
            worst = max((o["max_abs_error"] for o in record["outputs"].values()), default=0.0)
            tol = tolerance_text(record)
            where = f" (batch {_runs(record['batch_sizes'])})"
        else:
            verdict, worst, tol, where = "not validated", 0.0, "", ""
        table.add_row(
            a.id,
            a.format,
            a.precision,
            _size(a.size),
            ", ".join(a.runtimes),
            verdict + where,
            "" if worst is None else _fmt(worst),
            tol,
        )
    return table


def _runs(sizes: Sequence[int]) -> str:
    """Batch sizes in order, a run of equal ones counted: ``1, 4``; a batch-1 model's ``1 x16``."""
    runs = [(size, len(list(same))) for size, same in groupby(sizes)]
    return ", ".join(f"{size} x{count}" if count > 1 else str(size) for size, count in runs)


def _size(size: int) -> str:
    n = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def export_summary(package: Package) -> None:
    m = package.manifest
    out.print(
        f"[bold green]Exported[/] {m.name}:{m.version} -> {escape(str(package.origin))}  "
        f"({m.source['exporter']} via {escape(m.source['conversion_path'])})"
    )
    out.print(_signature_table(package))
    out.print(_artifact_table(package))
    _guarded(package)
    _own_tolerances(package)
    _fixed_sizes(package)
    _omitted(package)


def _guarded(package: Package) -> None:
    """The accuracy guard's verdict on each non-exact artifact an export added (edge fp16/int8)."""
    m = package.manifest
    for a in m.artifacts:
        record = m.validation.get(a.id)
        if record is None or "accuracy" not in record:
            continue
        kind = f" ({record['quantization']})" if record.get("quantization") else ""
        acc = record["accuracy"]
        rows = f"{acc['rows']} {acc.get('rows_are', 'rows')}"  # packages made before it was recorded: "rows"
        out.print(f"{a.id}{escape(kind)}: within the accuracy budget on {rows}: {escape(describe(acc))}")
        if layers := [layer["tensor"] for layer in record.get("float_layers", [])]:
            out.print(
                f"  left {len(layers)} of {record['search']['ranked_layers']} layers in float, the most "
                f"error-prone first: {escape(_some(layers))}"
            )
        if kept := record.get("fp32_constants"):
            why = "; ".join(dict.fromkeys(reason.split(",")[0] for reason in kept.values()))
            out.print(f"  kept {len(kept)} constant(s) in fp32 that fp16 cannot carry ({escape(why)})")


def _own_tolerances(package: Package) -> None:
    """Why artifacts hold an output to a tolerance of its own (the source's engines disagree on it),
    once per reason: the table shows the number, this what it rests on."""
    m = package.manifest
    reasons: dict[str, list[str]] = {}
    for a in m.artifacts:
        record = m.validation.get(a.id)
        if record and record.get("output_atol") and record.get("tolerance_basis"):
            reasons.setdefault(record["tolerance_basis"], []).append(a.id)
    for basis, ids in reasons.items():
        out.print(f"[yellow]own tolerance[/] ({escape(', '.join(ids))}): {escape(basis)}")


def _fixed_sizes(package: Package) -> None:
    """Artifacts converted at fixed input sizes where the package takes others (TFLite through
    onnx2tf), with what serves the rest."""
    m = package.manifest
    dynamic = {t.name for t in m.signature.inputs if any(isinstance(d, str) for d in t.shape)}
    fixed, anysize = [], []
    for a in m.artifacts:
        own = {t.name: t for t in a.signature.inputs} if a.signature else {}
        if any(name in own and all(isinstance(d, int) for d in own[name].shape) for name in dynamic):
            shapes = ", ".join(f"{t.name} {list(t.shape)}{f' {t.layout}' if t.layout else ''}" for t in own.values())
            fixed.append(f"{a.id} ({shapes})")
        else:
            anysize.append(a.id)
    if fixed and dynamic:
        out.print(
            f"[yellow]fixed input size[/]: {escape('; '.join(fixed))}; other sizes run on "
            f"{escape(', '.join(anysize) or 'no artifact of this package')}"
        )


def _omitted(package: Package) -> None:
    for o in package.manifest.omitted:
        fix = f" [dim]Fix: {escape(o['fix'])}[/]" if o.get("fix") else ""
        out.print(f"[yellow]left out[/] {escape(o['artifact'])} ({o['stage']}): {escape(o['reason'])}.{fix}")


def inspect(package: Package) -> None:
    m = package.manifest
    out.print(f"[bold]{m.name}[/] version {m.version}  (package format 1, created {m.created_at})")
    src = m.source
    libs = ", ".join(f"{k} {v}" for k, v in src["library_versions"].items())
    out.print(
        f"source: {escape(src['file_name'])} ({src['framework']}, sha256 {src['sha256'][:12]}...), "
        f"exported by {src['exporter']} via {escape(src.get('conversion_path', '?'))}"
    )
    out.print(f"libraries: {libs}")
    out.print(_signature_table(package))
    out.print(_artifact_table(package))
    samples = ", ".join(f"batch {s.batch_size} ({s.path})" for s in m.samples)
    out.print(f"reference samples: {escape(samples)}")
    out.print(f"optimizations: {', '.join(o['name'] for o in m.optimizations) or 'none'}")
    _own_tolerances(package)
    _fixed_sizes(package)
    _omitted(package)


def ran(found: dict[str, Any]) -> str:
    """One line naming what computed a result: artifact, engine, where and in what precision."""
    where = ", ".join(found.get("providers", [])) or found.get("device", "")
    return f"{found['artifact']} on {found['runtime']}" + (f" ({where})" if where else "") + f", {found['precision']}"


def fallbacks(found: dict[str, Any], of: str = "") -> None:
    """What was asked for and did not run, one line each (``of``: the artifact they are about, where
    several are shown): never a result labelled with a path it did not take."""
    about = f"{escape(of)}: " if of else ""
    for line in found.get("passed_over", []):
        out.print(f"[yellow]passed over[/] {about}{escape(line)}")
    if found.get("fallback"):
        out.print(f"[yellow]fallback:[/] {about}{escape(found['fallback'])}")
    if found.get("cpu_nodes"):  # a GPU session's nodes its provider has no kernel for
        out.print(f"[yellow]on the CPU:[/] {about}{escape(found['cpu_nodes'])}")


def run_outputs(found: dict[str, Any], outputs: dict[str, np.ndarray], written: str | None) -> None:
    fallbacks(found)
    if found.get("stream"):
        out.print(f"streamed: {escape(found['stream'])}")
    table = Table(title=f"Outputs of {escape(ran(found))}", title_justify="left")
    for col in ("name", "dtype", "shape", "min", "max", "mean", "argmax (last axis) or first values"):
        table.add_column(col)
    for name, value in outputs.items():
        numeric = value.size and np.issubdtype(value.dtype, np.number)
        arg = np.argmax(value, axis=-1).ravel()[:16].tolist() if numeric and value.ndim >= 1 else ""
        if value.dtype.kind == "U":  # text: what it says
            arg = value.ravel()[:8].tolist()
        stats = [_fmt(float(f(value))) for f in (np.min, np.max, np.mean)] if numeric else ["", "", ""]
        dtype = normalize_dtype(value.dtype)
        table.add_row(escape(name), dtype, escape(str(list(value.shape))), *stats, escape(str(arg)))
    out.print(table)
    if written:
        out.print(f"outputs written to {escape(written)}")


def signed(package: str, key: str, certificate: str | None) -> None:
    signer = f"certificate {escape(certificate)}" if certificate else f"key {escape(key)}"
    out.print(f"[bold green]Signed[/] every file of {escape(package)} with {signer}")


def verify(package: Package, checks: list[ArtifactCheck], signature_checked: bool = False) -> None:
    out.print(f"integrity of {escape(str(package.origin))}: [green]passed[/] (schema, checksums, paths)")
    if signature_checked:
        out.print("signature: [green]passed[/] (signed by the trusted key or chain; every file matches)")
    table = Table(title="Artifacts against the reference outputs", title_justify="left")
    for col in ("artifact", "ran on", "precision", "result", "max abs err", "max rel err", "detail"):
        table.add_column(col)
    for c in checks:
        outputs = (c.record.get("outputs", {}) if c.record else {}).values()
        abs_err = _fmt(max((o["max_abs_error"] for o in outputs), default=0.0)) if c.record else ""
        rel_err = _fmt(max((o["max_rel_error"] for o in outputs), default=0.0)) if c.record else ""
        where = ", ".join(c.ran.get("providers", [])) if c.ran else ""
        engine = f"{c.runtime} ({where})" if where else c.runtime or ""
        table.add_row(
            c.artifact,
            escape(engine),
            c.ran.get("precision", "") if c.ran else "",
            _status(c.status),
            abs_err,
            rel_err,
            escape(c.reason or ""),
        )
    out.print(table)
    for c in checks:
        if c.ran:
            fallbacks(c.ran, c.artifact)
    if package.manifest.samples_origin() == "synthetic":
        out.print(
            "[yellow]note:[/] the reference samples are random inputs (the export had no --example-input): an "
            "optimized artifact's error on real rows can be far larger than shown here; export with "
            "--example-input REAL.npz, and optimize with --validation data, to measure it on real inputs"
        )


def bundle(path: Path, document: dict[str, Any]) -> None:
    model = document["model"]
    out.print(
        f"wrote [bold]{escape(str(path))}[/] ({document['platform']}) for {escape(model['name'])}:{model['version']}"
    )
    table = Table(title="Models", title_justify="left")
    for col in ("artifact", "runtime", "precision", "bytes", "max abs err"):
        table.add_column(col)
    for m in document["models"]:
        table.add_row(
            m["artifact"],
            m["runtime"],
            m["precision"],
            f"{m['size']:,}",
            "" if m["max_abs_error"] is None else _fmt(m["max_abs_error"]),
        )
    out.print(table)
    out.print("sources: " + ", ".join(escape(c["path"]) for c in document["code"]))


def kserve(path: Path, runtime: str, services: list[ServiceEntry]) -> None:
    out.print(
        f"wrote [bold]{escape(str(path))}[/]: the serving runtime ({runtime}) and {len(services)} InferenceService(s)"
    )
    table = Table(title="InferenceServices", title_justify="left")
    for col in ("model", "service", "storageUri", "infer path", "canary"):
        table.add_column(col)
    for s in services:
        table.add_row(
            escape(s.model),
            s.service,
            escape(s.storage_uri),
            f"/v2/models/{s.service}/infer",
            escape(s.canary) if s.canary else "",
        )
    out.print(table)
    out.print(f"apply: kubectl apply -f {escape(str(path))}")
    if any(s.canary for s in services):
        out.print(f"then, once the services are ready: kubectl apply -f {escape(str(path / 'canary'))}")


def bundle_verify(path: str, report: BundleReport) -> None:
    out.print(f"integrity of {escape(str(path))}: [green]passed[/] (bundle.json and package checksums)")
    table = Table(title="Models against the reference outputs", title_justify="left")
    for col in ("artifact", "runtime", "result", "detail"):
        table.add_column(col)
    for c in report.models:
        table.add_row(c.artifact, c.runtime or "", _status(c.status), escape(c.reason or ""))
    out.print(table)
    table = Table(title="Generated source", title_justify="left")
    for col in ("file", "language", "result", "detail"):
        table.add_column(col)
    for code in report.code:
        table.add_row(escape(code.path), code.language, _status(code.status), escape(code.detail or ""))
    out.print(table)


def site(path: Path, document: dict[str, Any]) -> None:
    model, sizes, runtime = document["model"], document["sizes"], document["runtime"]
    out.print(
        f"wrote [bold]{escape(str(path))}[/] (web) for {escape(model['name'])}:{model['version']}: "
        f"ONNX Runtime Web {runtime['version']} ({', '.join(runtime['backends'])})"
    )
    table = Table(title="Models", title_justify="left")
    for col in ("artifact", "precision", "bytes", "gzip bytes", "max abs err"):
        table.add_column(col)
    for m in document["models"]:
        measured = sizes["models"][m["artifact"]]
        table.add_row(
            m["artifact"],
            m["precision"],
            f"{measured['bytes']:,}",
            f"{measured['gzip_bytes']:,}",
            "" if m["max_abs_error"] is None else _fmt(m["max_abs_error"]),
        )
    out.print(table)
    for o in document["omitted"]:
        out.print(f"left out {o['artifact']}: {escape(o['reason'])}")
    first = sizes["first_load"]
    out.print(
        f"first load (default model, runtime, page): {first['bytes']:,} bytes, {first['gzip_bytes']:,} gzip; "
        f"runtime {sizes['runtime']['bytes']:,} bytes"
    )
    headers = ", ".join(f"{k}: {v}" for k, v in document["headers"].items())
    out.print(f"host it with these headers (threaded WebAssembly): {escape(headers)}")
    out.print(f"check it in a browser: deploy verify {escape(str(path))}")


def site_verify(path: str, report: WebReport) -> None:
    out.print(f"integrity of {escape(str(path))}: [green]passed[/] (web.json and package checksums)")
    for backend, offered in report.backends.items():
        out.print(f"{backend}: {escape(offered['detail'])}")
    table = Table(title=f"Models in {escape(report.browser)} against the reference outputs", title_justify="left")
    for col in ("artifact", "backend", "result", "load ms", "latency ms", "detail"):
        table.add_column(col)
    for c in report.checks:
        latency = "" if c.latency_ms is None else f"{c.latency_ms:.2f} (batch {c.latency_batch}, {c.latency_runs} runs)"
        errors = (
            "" if c.record is None else "max abs " + _fmt(max(o["max_abs_error"] for o in c.record["outputs"].values()))
        )
        table.add_row(
            c.artifact,
            c.backend,
            _status(c.status),
            "" if c.load_ms is None else f"{c.load_ms:.0f}",
            latency,
            escape(c.reason or errors),
        )
    out.print(table)
    if report.screenshot:
        out.print(f"screenshot of the page: {escape(report.screenshot)}")


def _status(status: str) -> str:
    return f"[{ {'passed': 'green', 'failed': 'red', 'skipped': 'yellow'}[status] }]{status}[/]"


_BENCH_SHOWN = {
    "runs",
    "latency_ms",
    "precision",
    "device",
    "passed_over",
    "fallback",
    "cpu_nodes",
    "artifact",
    "runtime",
    "providers",
    "batch_size",
    "iterations",
    "throughput_per_s",
    "package",
    "threads",
    "warmup",
}


def bench(result: dict[str, Any]) -> None:
    fallbacks(result)
    table = Table(title=escape(ran(result)), title_justify="left")
    for col in ("batch", "runs", "p50 ms", "p90 ms", "p99 ms", "mean ms", "throughput /s"):
        table.add_column(col, justify="right")
    for run in result.get("runs", [result]):  # one row per batch size
        lat = run["latency_ms"]
        table.add_row(
            str(run["batch_size"]),
            str(run["iterations"]),
            f"{lat['p50']:.3f}",
            f"{lat['p90']:.3f}",
            f"{lat['p99']:.3f}",
            f"{lat['mean']:.3f}",
            f"{run['throughput_per_s']:.1f}",
        )
    out.print(table)
    for key, value in result.items():  # engine details (TensorRT: precision, profiles, where the engine came from)
        if key not in _BENCH_SHOWN:
            out.print(f"  {key}: {escape(str(value))}")


def doctor(machine: str, findings: list[Finding]) -> None:
    out.print(machine)
    table = Table(title="What works here", title_justify="left")
    for col in ("kind", "name", "status", "detail", "fix"):
        table.add_column(col)
    for f in findings:
        table.add_row(
            f.kind, f.name, "[green]ok[/]" if f.ok else "[red]unavailable[/]", escape(f.detail), escape(f.fix or "")
        )
    out.print(table)


def _some(names: list[str]) -> str:
    return ", ".join(names[:SHOWN_LAYERS]) + (
        f" and {len(names) - SHOWN_LAYERS} more" if len(names) > SHOWN_LAYERS else ""
    )


def _channel_report(params: dict[str, Any]) -> None:
    """How much of the network channel pruning could cut, and why the rest was left whole."""
    coupled = sum(1 for g in params["groups"] if g["layers"] > 1)
    out.print(
        f"  cut channels from {params['pruned_convolutions']} of {params['convolutions']} convolutions "
        f"({len(params['groups'])} groups of coupled channels, {coupled} of them shared by several layers)"
    )
    reasons: dict[str, list[str]] = {}
    for group in params["left_whole"]:
        reasons.setdefault(group["why"], []).extend(group["layers"])
    for why, layers in reasons.items():
        out.print(f"  left whole: {escape(_some(layers))}: {escape(why)}")


def _fusions(fusions: dict[str, Any]) -> str:
    if "skipped" in fusions:
        return f"transformer fusions skipped: {fusions['skipped']}"
    fused = ", ".join(f"{n} {op}" for op, n in fusions["operators"].items())
    return f"fused the transformer blocks ({fusions['heads']} heads, hidden size {fusions['hidden_size']}): {fused}"


def optimization(package: Package, record: OptimizationRecord) -> None:
    acc, eff = record["accuracy"], record["effects"]
    out.print(
        f"[bold green]Added[/] {record['artifact']} to {escape(str(package.origin))} "
        f"(from {record['derived_from']}: {escape(record['name'])})"
    )
    for step in record["passes"]:
        params = step["params"]
        if params.get("why"):
            out.print(f"  {step['name']}: chose [bold]{params['variant']}[/], {escape(params['why'])}")
        search = params.get("search") or {}
        if fusions := params.get("transformer_fusions"):
            out.print(f"  {step['name']}: {escape(_fusions(fusions))}")
        if "convolutions" in params:
            _channel_report(params)
        restored = params.get("fp32_layers") or params.get("dense_layers") or params.get("whole_groups")
        names = [layer["node"] for layer in restored or [] if "sqnr_loss_db" in layer]  # those the search kept
        reasoned = [layer for layer in restored or [] if "why" in layer and "sqnr_loss_db" not in layer]
        for layer in reasoned[:SHOWN_LAYERS]:  # kept for a reason of their own, not by the search
            out.print(f"  kept {escape(layer['node'])} in fp32: {escape(layer['why'])}")
        if len(reasoned) > SHOWN_LAYERS:
            out.print(f"  and {len(reasoned) - SHOWN_LAYERS} more kept in fp32 (the record's fp32_layers say why)")
        if names and "ranked_layers" in search:
            out.print(
                f"  left {len(names)} of {search['ranked_layers']} {search.get('units', 'layers')} "
                f"{search['restored_as']}, the most sensitive first: {escape(_some(names))}"
            )
            out.print(f"  their cost: {search['cost']}")
        elif search.get("skipped"):
            out.print(f"  [yellow]no sensitivity search[/]: {escape(search['skipped'])}")
        for variant, reason in (params.get("skipped") or {}).items():
            out.print(f"  [yellow]left out[/] the {variant} variant: {escape(reason)}")
        if wide := params.get("not_refitted"):
            out.print(f"  [yellow]not re-fitted[/]: {escape(_some(wide['layers']))}: {escape(wide['why'])}")
    table = Table(title="Accuracy against fp32", title_justify="left")
    for col in ("output", "metric", "drop (points)", "budget", "verdict", "detail"):
        table.add_column(col)
    for name, o in acc["outputs"].items():
        table.add_row(
            escape(name),
            o["metric"],
            f"{o['drop_points']:.2f}",
            f"{o['budget_points']:g}",
            "[green]within[/]" if o["within_budget"] else "[red]over[/]",
            detail(o),
        )
    out.print(table)
    for name, o in acc["outputs"].items():
        out.print(f"  judged '{escape(name)}' by {o['metric']}: {escape(o['why'])}")
    out.print(f"  on {acc['rows']} {acc.get('rows_are', 'validation rows')}")
    table = Table(title="Effects", title_justify="left")
    # packages optimized before it was recorded were timed on the CPU too
    timed = f"latency fp32 -> optimized (ms), on {eff.get('latency_on', 'the CPU')}"
    for col in ("size", "size vs fp32", "gzip vs fp32", "weight sparsity", timed):
        table.add_column(col)
    lat = ", ".join(
        f"b{b}: {v['fp32']:.3f} -> {v['optimized']:.3f} ({v['speedup']:.2f}x)" for b, v in eff["latency_ms"].items()
    )
    table.add_row(
        _size(eff["size_bytes"]),
        f"{eff['size_ratio']:.0%}",
        f"{eff['gzip_ratio']:.0%}",
        f"{eff['weight_sparsity']:.0%}",
        lat,
    )
    out.print(table)
    for note in record.get("notes", []):
        out.print(f"[yellow]note:[/] {escape(note)}")
