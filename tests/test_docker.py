"""No Docker engine runs here, so run what the image runs: its ENTRYPOINT with its CMD."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

DOCKERFILE = Path(__file__).parents[1] / "docker" / "Dockerfile"


def _instruction(name: str) -> list[str]:
    match = re.search(rf"^{name}\s+(\[.*\])\s*$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, f"{name} missing from {DOCKERFILE}"
    return json.loads(match.group(1))


def test_image_entrypoint_and_default_command_run():
    entrypoint, cmd = _instruction("ENTRYPOINT"), _instruction("CMD")
    executable = shutil.which(entrypoint[0], path=str(Path(sys.executable).parent))
    assert executable, f"the image's entrypoint '{entrypoint[0]}' is not installed by the package"
    result = subprocess.run([executable, *entrypoint[1:], *cmd], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "onnxruntime" in result.stdout


def test_image_installs_only_files_the_repository_has():
    root = DOCKERFILE.parents[1]
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (root / source).exists(), f"Dockerfile copies missing '{source}'"
