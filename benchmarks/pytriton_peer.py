"""Triton as a peer row in benchmarks/server.py: the same ONNX files behind Triton's C++ front ends.

PyPI's ``nvidia-pytriton`` 0.7.0 ships a real ``tritonserver`` binary (multithreaded C++ HTTP and gRPC
front ends, dynamic batching) with its Python backend only; the model runs in a Python callable that
holds an ONNX Runtime session, so Triton is measured with the same engine as ours. That makes it a
floor, not a ceiling: Triton's native ONNX Runtime backend is not on PyPI. It gets a venv of its own
(it needs numpy < 2), built once into a cache folder; its Python backend's stub needs a Python built
with a shared libpython, found through LD_LIBRARY_PATH. Driven by the same perf_analyzer as ours.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import peer_server

VERSION = "0.7.0"
PACKAGES = [f"nvidia-pytriton=={VERSION}", "numpy<2", "onnxruntime"]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "unideploy" / "pytriton-venv"

# Run by the venv's Python: argv[1] is {"http_port", "grpc_port", "metrics_port", "max_batch_size",
# "models": {name: onnx file}}. Each model is an ONNX Runtime session behind PyTriton's @batch
# callable, with Triton's dynamic batcher up to max_batch_size (as ours merges).
PEER_SERVER = """
import json, sys
import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

DTYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def tensors(values):
    # without the batch dim; Triton needs dims, so a per-row scalar is one value
    return [
        Tensor(name=v.name, dtype=DTYPES[v.type], shape=tuple(d if isinstance(d, int) else -1 for d in v.shape[1:]) or (1,))
        for v in values
    ]


def bind(triton, name, path, max_batch_size):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    @batch
    def infer(**inputs):
        return {n: a if a.ndim > 1 else a[:, None] for n, a in zip(names, session.run(names, inputs))}

    triton.bind(
        model_name=name,
        infer_func=infer,
        inputs=tensors(session.get_inputs()),
        outputs=tensors(session.get_outputs()),
        config=ModelConfig(max_batch_size=max_batch_size),
    )


spec = json.loads(sys.argv[1])
config = TritonConfig(
    http_address="127.0.0.1",
    grpc_address="127.0.0.1",
    http_port=spec["http_port"],
    grpc_port=spec["grpc_port"],
    metrics_port=spec["metrics_port"],
)
# no endpoint restricted: perf_analyzer reads statistics, which PyTriton otherwise guards with a
# token of its own (the server listens on 127.0.0.1 only)
with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
    for name, path in spec["models"].items():
        bind(triton, name, path, spec["max_batch_size"])
    triton.serve()
"""


def ensure(cache: Path = CACHE) -> tuple[Path, dict[str, str]] | str:
    """The venv's Python and the environment its server needs, built on first use; or why not."""
    python = cache / "bin" / "python"
    if not python.exists():
        steps = [
            [sys.executable, "-m", "venv", str(cache)],
            [str(python), "-m", "pip", "install", "--quiet", *PACKAGES],
        ]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                return f"PyTriton's venv could not be built ({' '.join(step[:4])}): {done.stderr.strip()[-300:]}"
    probe = "import sysconfig; print(sysconfig.get_config_var('Py_ENABLE_SHARED'), sysconfig.get_config_var('LIBDIR'))"
    shared, libdir = subprocess.run([str(python), "-c", probe], capture_output=True, text=True).stdout.split()
    if shared != "1":
        return "Triton's Python backend stub needs a Python built with a shared libpython (--enable-shared)"
    return python, {**os.environ, "LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}"}


def start(
    peer: tuple[Path, dict[str, str]],
    models: dict[str, Path],
    work: Path,
    ports: tuple[int, int, int],
    max_batch_size: int,
) -> subprocess.Popen:
    """PyTriton serving ``models`` (name -> ONNX file) on (http, grpc, metrics) ``ports``; returns
    once Triton answers ready."""
    python, env = peer
    script = work / "pytriton_server.py"
    script.write_text(PEER_SERVER)
    spec = {
        "http_port": ports[0],
        "grpc_port": ports[1],
        "metrics_port": ports[2],
        "max_batch_size": max_batch_size,
        "models": {name: str(path) for name, path in models.items()},
    }
    log_path = work / "pytriton.log"
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [str(python), str(script), json.dumps(spec)], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    if peer_server.ready(process, ports[0], list(models)):
        return process
    stop(process)
    raise peer_server.not_ready("PyTriton", log_path)


def stop(process: subprocess.Popen) -> None:
    """SIGINT, as PyTriton expects: it stops Triton and removes its workspace."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
