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
