"""A call in a process of its own: its answer and its errors come back; its crash costs only it.
The calls are to importable functions, as the child imports what it runs by name."""

from __future__ import annotations

import operator
import signal
from pathlib import Path

import pytest

from unideploy import child_process
from unideploy.errors import ExportError, InputError
from unideploy.guard.accuracy import choose_metrics


def test_the_answer_comes_back_and_relative_writes_stay_in_the_private_folder(tmp_path, monkeypatch):
    assert child_process.call(operator.mul, 3, 4, workdir=tmp_path, what="the call", hint="") == 12
    monkeypatch.chdir(tmp_path)
    child_process.call(Path("left-behind.txt").write_text, "by relative path", workdir=tmp_path, what="it", hint="")
    assert not Path("left-behind.txt").exists()
    assert [p.parent.parent for p in tmp_path.glob("child-*/left-behind.txt")] == [tmp_path]


def test_an_error_is_raised_here_with_its_type_and_hint(tmp_path):
    with pytest.raises(InputError, match="unknown metric 'nonsense'") as raised:
        child_process.call(choose_metrics, "nonsense", {}, False, workdir=tmp_path, what="the call", hint="")
    assert "use one of" in raised.value.hint


def test_a_crash_says_how_the_process_ended(tmp_path):
    with pytest.raises(ExportError, match=r"the converter ended \(killed by SIGSEGV\) before it finished") as raised:
        child_process.call(
            signal.raise_signal, signal.SIGSEGV, workdir=tmp_path, what="the converter", hint="the rest is unaffected"
        )
    assert raised.value.hint == "the rest is unaffected"


def test_a_framework_exception_there_is_an_export_error_here_naming_what_failed(tmp_path):
    """Not an internal error: ONNX Runtime's constant folding raises its own ``Fail`` on Silero VAD's
    If branches in some runs (and segfaults in the others), and either must cost only the step."""
    with pytest.raises(ExportError, match=r"the folding failed: ZeroDivisionError: division by zero") as raised:
        child_process.call(operator.truediv, 1, 0, workdir=tmp_path, what="the folding", hint="the rest still runs")
    assert raised.value.hint == "the rest still runs"
