"""Ctrl-C in the middle of an export leaves neither a package nor its staging area."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch", reason="the torch extra is not installed")


def _interrupt_export(path, shapes, out_dir) -> tuple[int, str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "unideploy.cli.main",
            "export",
            str(path),
            "-o",
            str(out_dir / "pkg"),
            "--input-shape",
            shapes[0],
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # as a terminal starts it: an ignored SIGINT is inherited, and something earlier in the same
        # pytest process (TensorFlow's converter, a server) may have left it ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not any(out_dir.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "export finished before it could be interrupted"
    assert [p.name.endswith(".partial") for p in out_dir.iterdir()] == [True]  # staging, hidden
    time.sleep(0.1)  # into the conversion itself
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr


def test_sigint_during_export_leaves_nothing(torch_models, tmp_path):
    path, shapes = torch_models["mha_traced"]  # the slowest export: several seconds to interrupt
    for attempt in range(3):
        out_dir = tmp_path / f"out{attempt}"
        out_dir.mkdir()
        code, stderr = _interrupt_export(path, shapes, out_dir)
        if code != 0:  # 0: on a loaded machine the export can finish before the signal lands; try again
            break
    assert code == 130, stderr
    assert "interrupted: nothing was written" in stderr
    assert list(out_dir.iterdir()) == []


def test_scratch_folders_a_killed_export_left_go_with_the_next_export(torch_models, tmp_path, monkeypatch):
    """kill -9 skips every cleanup: an export's scratch folder in the temp dir is named for its process,
    and the next export removes those of processes no longer running (and keeps a live one's)."""
    import os
    import tempfile

    import unideploy

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale, live = scratch / f"unideploy-export-{int(gone.stdout)}-x1", scratch / f"unideploy-export-{os.getpid()}-x2"
    for leftover in (stale, live):
        leftover.mkdir()
        (leftover / "model.onnx").write_bytes(b"half written")
    path, shapes = torch_models["cnn_scripted"]
    unideploy.export(path, tmp_path / "pkg", input_shapes=shapes).close()
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith("unideploy-export-")) == [live.name]
