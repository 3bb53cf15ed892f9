"""MLServer as a peer row in benchmarks/server.py: the same ONNX files, served by MLServer.

MLServer (Seldon's Open Inference Protocol server, KServe's default for many formats) has no ONNX
runtime of its own; ``PEER_RUNTIME`` below is the smallest one: an ONNX Runtime session per model,
inputs and outputs through MLServer's own NumPy codec. MLServer gets a venv of its own (its pins
differ from ours), built once into a cache folder; ``parallel_workers: 0`` keeps inference in the
server process, as ours does, so the two compare like with like. Its REST side accepts JSON only
(no binary-tensor extension); gRPC as ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import peer_server

VERSION = "1.7.1"
PACKAGES = [f"mlserver=={VERSION}", "onnxruntime", "uvloop<0.22"]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "unideploy" / "mlserver-venv"

PEER_RUNTIME = """
import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    async def load(self) -> bool:
        self.session = ort.InferenceSession(self.settings.parameters.uri, providers=["CPUExecutionProvider"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        feeds = {i.name: NumpyCodec.decode_input(i) for i in payload.inputs}
        names = [o.name for o in self.session.get_outputs()]
        outputs = self.session.run(names, feeds)
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output(n, np.asarray(o)) for n, o in zip(names, outputs)]
        )
"""


def ensure(cache: Path = CACHE) -> Path | str:
    """The venv's ``mlserver`` command, built on first use, or why it cannot be."""
    command = cache / "bin" / "mlserver"
    if command.exists():
        return command
    steps = [
        [sys.executable, "-m", "venv", str(cache)],
        [str(cache / "bin" / "python"), "-m", "pip", "install", "--quiet", *PACKAGES],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            return f"MLServer's venv could not be built ({' '.join(step[:4])}): {done.stderr.strip()[-300:]}"
    return command


def start(command: Path, models: dict[str, Path], work: Path, http_port: int, grpc_port: int) -> subprocess.Popen:
    """``mlserver start`` on a folder holding ``models`` (name -> ONNX file); returns once ready."""
    root = work / "mlserver"
    root.mkdir(exist_ok=True)
    (root / "onnx_runtime.py").write_text(PEER_RUNTIME)
    settings = {
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": 0,
        "parallel_workers": 0,
        "host": "127.0.0.1",
    }
    (root / "settings.json").write_text(json.dumps(settings))
    for name, onnx_file in models.items():
        (root / name).mkdir(exist_ok=True)
        (root / name / "model-settings.json").write_text(
            json.dumps(
                {"name": name, "implementation": "onnx_runtime.OnnxModel", "parameters": {"uri": str(onnx_file)}}
            )
        )
    with open(work / "mlserver.log", "w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen([str(command), "start", str(root)], cwd=root, stdout=log, stderr=subprocess.STDOUT)
    if peer_server.ready(process, http_port, list(models), wait_s=120):
        return process
    process.kill()
    raise peer_server.not_ready("MLServer", work / "mlserver.log")
