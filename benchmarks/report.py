"""The command line and the report every model benchmark shares: tables (rich or markdown), the
targets met or missed, and JSON."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

Benchmark = Callable[[Path], dict[str, Any]]


def machine() -> str:
    """The CPU the figures were measured on ('AMD EPYC, family 26, 2 cores, AVX-512, VNNI'): the
    same benchmark ran twice as fast on one 2-core machine as on another, so a result names its CPU."""
    from unideploy.guard.measure import cpu_has_vnni

    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return f"{os.cpu_count()} cores"
    fields = dict(line.split(":", 1) for line in info.split("\n\n")[0].splitlines() if ":" in line)
    found = {k.strip(): v.strip() for k, v in fields.items()}
    flags = found.get("flags", "").split()
    parts = [
        found.get("model name", "unknown CPU"),
        f"family {found.get('cpu family', '?')}",
        f"{os.cpu_count()} cores",
    ]
    parts.append("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2")
    return ", ".join(parts + (["VNNI"] if cpu_has_vnni() else []))


def print_result(result: dict[str, Any], markdown: bool) -> None:
    """One model's rows (the first column names the row) with its targets and note; a row without
    a column (one that failed, say) leaves its cell empty."""
    rows = result["rows"]
    key = next(iter(rows[0]))
    columns = [c for c in dict.fromkeys(c for r in rows for c in r) if c != key]
    lines = [f"{'met' if ok else 'MISSED'}: {name} (measured {value})" for name, ok, value in result["targets"]]
    if result.get("note"):
        lines.append(f"note: {result['note']}")
    lines.append(f"machine: {machine()}")
    if markdown:
        print(f"\n### {result['model']}\n")
        print(f"| {key} | " + " | ".join(columns).replace("quality", result["quality"]) + " |")
        print("|---|" + "---:|" * len(columns))
        for r in rows:
            print(f"| {r[key]} | " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
        print()
        for line in lines:
            print(f"- {line}")
        return
    table = Table(title=result["model"], title_justify="left")
    table.add_column(key)
    for c in columns:
        table.add_column(c.replace("quality", result["quality"]), justify="right")
    for r in rows:
        table.add_row(str(r[key]), *(str(r.get(c, "")) for c in columns))
    out = Console()
    out.print(table)
    for line in lines:
        out.print("  " + line.replace("MISSED", "[red]MISSED[/]").replace("met:", "[green]met[/]:", 1))


def main(description: str, benchmarks: dict[str, Benchmark]) -> None:
    """``--only NAME``, ``--json``, ``--markdown``; each benchmark gets a scratch directory."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--only", choices=list(benchmarks))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="print tables for docs/")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unideploy-bench-"))
    try:
        results = []
        for name, fn in benchmarks.items():
            if args.only in (None, name):
                (work / name).mkdir()
                results.append(fn(work / name))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            print_result(result, args.markdown)
