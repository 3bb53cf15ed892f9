"""Web bundles of real pretrained models, verified in headless Chromium: sizes and in-browser
latency per backend (writes docs/web.md).

Each model is exported as a user would (the zoo's source and options), given int8 and fp16
variants by `deploy optimize` (each admitted by its accuracy guard, or left out with the reason),
bundled with `deploy bundle --platform web`, and checked with `deploy verify SITE`: every reference
sample runs in the page, on WebAssembly and on the WebGPU adapter Chromium offers (on the project's
machines, SwiftShader: a software GPU, so its latency says nothing about a real GPU). Needs
`make bench` and `make web-tools` (Chromium).

    python benchmarks/web.py [--only efficientnet-lite0 ...] [--output docs/web.md|-] [--screenshot PNG]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import zoo
import zoo_models
from rich.console import Console

import unideploy

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("efficientnet-lite0", "nudenet-yolov8n", "ppocr-cls", "minilm-l6")
MEASURED = "## Measured: real pretrained models in Chromium"
console = Console(stderr=True)


def _largest_reference(package: Path) -> float:
    with unideploy.open_package(package) as opened:
        return max(float(np.abs(o).max()) for s in opened.reference_samples() for o in s.outputs.values())


def run_one(model: zoo_models.ZooModel, work: Path, screenshot: Path | None) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    src, data = model.source(work), model.data(work)
    pkg, site = work / "pkg", work / "site"
    steps = {}
    cell, _ = zoo._deploy(model.venv, "export", src, "-o", pkg, *model.export_args)
    if cell.status != "pass":
        return {"model": model.name, "error": f"export {cell.status}: {cell.reason}"}
    for precision in ("int8", "fp16"):
        cell, _ = zoo._deploy(
            ".venv", "optimize", pkg, "-o", pkg, "--force", "--quantize", precision, "--calibration", data
        )
        steps[precision] = cell.status if cell.status == "pass" else f"{cell.status}: {cell.reason}"
    cell, _ = zoo._deploy(".venv", "bundle", pkg, "--platform", "web", "-o", site, "--force")
    if cell.status != "pass":
        return {"model": model.name, "error": f"bundle {cell.status}: {cell.reason}"}
    shot = ["--screenshot", str(screenshot)] if screenshot else []
    cell, result = zoo._deploy(".venv", "verify", site, "--json", *shot)
    if result is None or not result.stdout.strip():
        return {"model": model.name, "error": f"verify {cell.status}: {cell.reason}"}
    return {
        "model": model.name,
        "optimize": steps,
        "site": json.loads((site / "web.json").read_text()),
        "verify": json.loads(result.stdout),
        "verify_status": cell.status,
        "largest_reference": _largest_reference(pkg),
    }


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        MEASURED,
        "",
        "Written by `benchmarks/web.py`. Each site holds the model's fp32 ONNX and the int8 and fp16 variants "
        "`deploy optimize` admitted; `deploy verify SITE` ran every reference sample in the page and judged the "
        "outputs with the package's tolerances. *error / largest*: the worst absolute error over all outputs "
        "divided by the largest reference output. Latency: median of up to 20 runs of the batch-1 sample in "
        "the page (at least 3, no more after 10 s; `performance.now()`); load: fetching and creating the "
        "session (the first row's includes compiling the runtime's WebAssembly). The WebGPU rows ran on the "
        "adapter headless Chromium offered here (SwiftShader, a software GPU on the CPU): they prove the "
        "outputs, not GPU speed.",
        "",
    ]
    for r in results:
        if "error" in r:
            lines += [f"### {r['model']}", "", f"not measured: {r['error']}", ""]
            continue
        site, verify = r["site"], r["verify"]
        sizes = site["sizes"]
        lines += [
            f"### {r['model']}",
            "",
            f"{verify['browser']}; "
            + "; ".join(f"{b}: {o['detail']}" for b, o in verify["backends"].items())
            + f". First load (fp32 model, runtime, page): {sizes['first_load']['bytes'] / 1e6:.1f} MB, "
            f"{sizes['first_load']['gzip_bytes'] / 1e6:.1f} MB gzip.",
            "",
            "| variant | backend | result | model MB (gzip) | load ms | latency ms (batch, runs) | error / largest |",
            "|---|---|---|---|---|---|---|",
        ]
        for check in verify["checks"]:
            size = sizes["models"].get(check["artifact"])
            shown = f"{size['bytes'] / 1e6:.2f} ({size['gzip_bytes'] / 1e6:.2f})" if size else ""
            record = check.get("validation")
            worst = max(o["max_abs_error"] for o in record["outputs"].values()) if record else None
            relative = "" if worst is None else f"{worst / r['largest_reference']:.1e}"
            latency = (
                ""
                if check["latency_ms"] is None
                else f"{check['latency_ms']:.1f} ({check['latency_batch']}, {check['latency_runs']} runs)"
            )
            load = "" if check["load_ms"] is None else f"{check['load_ms']:.0f}"
            status = check["status"] if check["status"] == "passed" else f"{check['status']}: {check['reason']}"
            lines.append(
                f"| {check['artifact']} | {check['backend']} | {status} | {shown} | {load} | {latency} | {relative} |"
            )
        not_made = {p: s for p, s in r["optimize"].items() if s != "pass"}
        lines += [""] + [f"- no {p} variant: {s}" for p, s in not_made.items()]
        lines += [f"- left out of the site: {o['artifact']}: {o['reason']}" for o in site["omitted"]] + [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=MODELS, help="model (repeatable; default: all four)")
    parser.add_argument(
        "--output", default=str(ROOT / "docs" / "web.md"), help="the page whose measured part is replaced, or -"
    )
    parser.add_argument("--screenshot", metavar="PNG", help="the first model's demo page, once it has run")
    args = parser.parse_args()
    models = {m.name: m for m in zoo_models.zoo()}
    results = []
    with tempfile.TemporaryDirectory(prefix="unideploy-web-bench-") as tmp:
        for i, name in enumerate(args.only or MODELS):
            console.log(f"{name}: export, optimize, bundle, verify in Chromium")
            shot = Path(args.screenshot).resolve() if args.screenshot and i == 0 else None
            results.append(run_one(models[name], Path(tmp) / name, shot))
    text = report(results)
    if args.output == "-":
        print(text)
        return
    page = Path(args.output)
    kept = page.read_text(encoding="utf-8").split(MEASURED)[0] if page.exists() else ""
    page.write_text(kept + text, encoding="utf-8")
    console.log(f"wrote {page}")


if __name__ == "__main__":
    main()
