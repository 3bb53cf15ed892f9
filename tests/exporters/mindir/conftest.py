from __future__ import annotations

from pathlib import Path

import pytest

# These tests run in the MindSpore test venv (`make test` runs them with `-m mindspore`): mindspore
# needs protobuf >= 7 and the server tests' tritonclient needs protobuf < 7.
pytestmark = pytest.mark.mindspore


@pytest.fixture(scope="session")
def mindir_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The MindIR files exported from the Cells in tests/mindspore_models.py."""
    pytest.importorskip("mindspore", reason="the mindspore extra is not installed in this venv")
    from mindspore_models import save_mindir_models

    return save_mindir_models(tmp_path_factory.mktemp("mindir"))
