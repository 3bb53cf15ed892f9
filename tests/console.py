"""Running the ``deploy`` console script as a user does, from any test."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

DEPLOY = shutil.which("deploy", path=str(Path(sys.executable).parent)) or "deploy"


def deploy(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([DEPLOY, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, pattern: str) -> None:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    assert re.search(pattern, lines[0]), lines[0]


def plugin_distribution(folder: Path, module: str, source: str, group: str, entry: str) -> Path:
    """A real (tiny) distribution in ``folder``: ``module``.py holding ``source`` and an entry point
    ``entry`` ("name = module:attr") in ``group``. Put ``folder`` on PYTHONPATH (processes the test
    starts) or sys.path (this one) to install it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(source)
    dist = folder / f"{module}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{entry}\n")
    return folder


def pythonpath_with(folder: Path) -> str:
    """The PYTHONPATH of this process with ``folder`` first: what processes a test starts import from."""
    import os

    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def without_modules(folder: Path, *modules: str) -> str:
    """A PYTHONPATH under which the processes a test starts find none of ``modules``, as on an
    install without the extra that brings them (a ``sitecustomize`` in ``folder`` hides them)."""
    folder.mkdir(parents=True, exist_ok=True)
    hidden = ", ".join(f"{m!r}: None" for m in modules)
    (folder / "sitecustomize.py").write_text(f"import sys\n\nsys.modules.update({{{hidden}}})\n")
    return pythonpath_with(folder)
