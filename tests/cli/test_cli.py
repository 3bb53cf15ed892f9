"""The ``deploy`` console script as a user runs it: round trips, JSON output, exit codes, errors."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from console import assert_one_line_error, deploy, without_modules


def test_export_inspect_run_verify_bench_round_trip(torch_models, tmp_path):
    src, shapes = torch_models["cnn_traced"]
    pkg = tmp_path / "cnn.zip"
    result = deploy("export", src, "-o", pkg, "--input-shape", shapes[0], "--name", "digits", "--model-version", "3")
    assert result.returncode == 0, result.stderr
    assert "Exported digits:3" in result.stdout and "passed" in result.stdout

    manifest = json.loads(deploy("inspect", pkg, "--json").stdout)
    assert manifest["model"] == {"name": "digits", "version": "3"}
    assert manifest["signature"]["inputs"][0]["shape"] == ["batch", 1, 8, 8]
    assert "[batch, 1, 8, 8]" in deploy("inspect", pkg).stdout

    np.savez(tmp_path / "in.npz", x=np.random.default_rng(0).standard_normal((5, 1, 8, 8)).astype(np.float32))
    result = deploy("run", pkg, "--input", tmp_path / "in.npz", "-o", tmp_path / "out.npz", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["outputs"]["output"]["shape"] == [5, 10]
    with np.load(tmp_path / "out.npz") as out:
        assert out["output"].shape == (5, 10)

    report = json.loads(deploy("verify", pkg, "--json").stdout)
    assert [a["status"] for a in report["artifacts"]] == ["passed"]

    result = deploy("bench", pkg, "--batch-size", "16", "--iterations", "20", "--json")
    assert result.returncode == 0, result.stderr
    bench = json.loads(result.stdout)
    assert bench["batch_size"] == 16 and bench["iterations"] == 20
    assert 0 < bench["latency_ms"]["p50"] <= bench["latency_ms"]["p99"]
    assert bench["throughput_per_s"] > 0

    # a sweep: every batch size in one process, on one session, what ran named once
    sweep = json.loads(deploy("bench", pkg, "--batch-size", "1,4,1", "--iterations", "3", "--json").stdout)
    assert [r["batch_size"] for r in sweep["runs"]] == [1, 4] and sweep["artifact"] == "onnx-fp32"
    assert all(r["iterations"] == 3 and r["throughput_per_s"] > 0 for r in sweep["runs"])
    # CUDA graphs asked for where there is no GPU: the sizes are still timed, and what ran says so
    graphs = json.loads(
        deploy("bench", pkg, "--batch-size", "1,2", "--iterations", "2", "--cuda-graphs", "--json").stdout
    )
    assert [r["batch_size"] for r in graphs["runs"]] == [1, 2]
    assert graphs["cuda_graphs"].startswith("not used: they run on ONNX Runtime's CUDA provider")


def test_human_tables(cnn_package, tmp_path):
    verify = deploy("verify", cnn_package)
    assert verify.returncode == 0 and "integrity" in verify.stdout and "passed" in verify.stdout
    bench = deploy("bench", cnn_package, "--iterations", "5", "--batch-size", "2,3")
    assert bench.returncode == 0 and "p99 ms" in bench.stdout
    rows = [line.split("│")[1].strip() for line in bench.stdout.splitlines() if line.count("│") > 6]
    assert rows[-2:] == ["2", "3"]  # one row per batch size


def test_doctor_reports_each_plugin_with_a_fix(tmp_path):
    result = deploy("doctor", "--json")
    assert result.returncode == 0
    findings = {(f["kind"], f["name"]): f for f in json.loads(result.stdout)["findings"]}
    assert findings[("runtime", "onnxruntime")]["ok"]
    assert findings[("exporter", "torchscript")]["ok"]
    assert ("device", "gpu") in findings
    assert findings[("server", "serve")]["ok"]
    assert "deploy bundle --platform web" in findings[("web", "bundle")]["detail"]
    web = findings[("web", "verify")]
    assert web["ok"] or "apt-get install chromium" in web["fix"] or "unideploy[web]" in web["fix"]
    assert not findings[("target", "ascend")]["ok"] and findings[("target", "ascend")]["fix"]
    tensorrt = findings[("runtime", "tensorrt")]
    if not tensorrt["ok"]:  # the target still works: packages are made here, engines on the GPU
        assert "pypi.nvidia.com" in tensorrt["fix"] or "GPU" in tensorrt["fix"]
        assert (
            findings[("target", "gpu")]["ok"]
            and "built and checked on the serving GPU" in findings[("target", "gpu")]["detail"]
        )


def test_serve_without_the_serve_extra_names_what_is_missing(cnn_package, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", without_modules(tmp_path / "core-only", "uvicorn", "grpc"))
    assert_one_line_error(
        deploy("serve", cnn_package),
        2,
        r"deploy serve needs the serve extra: missing Python module\(s\): uvicorn, grpc \(pip install 'unideploy\[serve\]'\)",
    )
    monkeypatch.setenv("PYTHONPATH", without_modules(tmp_path / "no-ray", "ray"))
    assert_one_line_error(
        deploy("serve", cnn_package, "--ray"),
        2,
        r"deploy serve --ray needs the ray extra: missing Python module\(s\): ray \(pip install 'unideploy\[ray\]'\)",
    )
    monkeypatch.setenv("PYTHONPATH", without_modules(tmp_path / "core-only", "uvicorn", "grpc"))
    server = next(f for f in json.loads(deploy("doctor", "--json").stdout)["findings"] if f["kind"] == "server")
    assert not server["ok"] and server["fix"] == "pip install 'unideploy[serve]'"


def test_verify_fails_on_a_tampered_package(cnn_package):
    model = cnn_package / "artifacts" / "model.onnx"
    model.write_bytes(model.read_bytes()[:-10])
    assert_one_line_error(deploy("verify", cnn_package), 2, r"'artifacts/model.onnx' has \d+ bytes")


def test_verify_fails_when_reference_outputs_no_longer_match(cnn_package):
    """Re-sign a package whose stored outputs were altered: integrity passes, verification fails."""
    from unideploy.package.files import digest_path

    sample = cnn_package / "samples" / "batch4.npz"
    with np.load(sample) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["outputs/output"] = arrays["outputs/output"] + 0.5
    np.savez_compressed(sample, **arrays)
    manifest = json.loads((cnn_package / "manifest.json").read_text())
    entry = next(s for s in manifest["samples"] if s["path"] == "samples/batch4.npz")
    entry["sha256"], entry["size"] = digest_path(sample)
    (cnn_package / "manifest.json").write_text(json.dumps(manifest))
    result = deploy("verify", cnn_package)
    assert result.returncode == 1
    assert "failed" in result.stdout and "onnx-fp32" in result.stderr


@pytest.mark.parametrize(
    "args, code, pattern",
    [
        (["export", "missing.pt", "-o", "x"], 2, "source model 'missing.pt' does not exist"),
        (["inspect", "nowhere"], 2, "package 'nowhere' does not exist"),
        (["export", "{cnn}", "-o", "x", "--input-shape", "x"], 2, "bad --input-shape 'x'"),
        (["export", "{cnn}", "-o", "x", "--input-shape", "x:1x1x8x8:complex64"], 2, "dtype"),
        (
            ["export", "{cnn}", "-o", "x", "--target", "ascend"],
            2,
            "target 'ascend' needs mindspore.*unideploy\\[mindspore\\]",
        ),
        (["export", "{cnn}", "-o", "x", "--example-input", "nofile.npz"], 2, "'nofile.npz' does not exist"),
        (["run", "{pkg}", "--input", "{bad_dtype}"], 2, "input 'x' has dtype float64, expected float32"),
        (["run", "{pkg}", "--input", "{wrong_name}"], 2, "unknown input\\(s\\) 'image'"),
        (["run", "{pkg}", "--input", "{not_npz}"], 2, r"not an \.npz archive \(a zip of \.npy arrays\)"),
        (["run", "{pkg}", "--input", "{npy}"], 2, r"is a single \.npy array, not an \.npz of named arrays"),
        (["run", "{pkg}", "--input", "{pkg}"], 2, r"--input '.*' is a directory, not an \.npz file"),
        (
            ["run", "{pkg}", "--input", "/dev/null"],
            2,
            r"--input '/dev/null' is a device, pipe or socket, not an \.npz file",
        ),
        (["run", "{pkg}", "--input", "{huge}"], 2, r"declares an array larger than this machine's memory"),
        (["run", "{pkg}", "--input", "{bad_dtype}", "--runtime", "tvm"], 2, "unknown runtime 'tvm'"),
        (["run", "{pkg}", "--input", "{bad_dtype}", "--artifact", "nope"], 2, "no artifact 'nope'"),
        (["bench", "{static}", "--batch-size", "3"], 2, "fixed batch size of 2"),
    ],
)
def test_bad_input_gives_one_line_errors(args, code, pattern, torch_models, cnn_package, tmp_path):
    np.savez(tmp_path / "bad_dtype.npz", x=np.zeros((1, 1, 8, 8)))
    np.savez(tmp_path / "wrong_name.npz", image=np.zeros((1, 1, 8, 8), np.float32))
    (tmp_path / "not.npz").write_text("hello")
    np.save(tmp_path / "one.npy", np.zeros((1, 1, 8, 8), np.float32))  # an unnamed array (was an internal error)
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as archive:  # 256 GiB declared, 64 bytes held (was one too)
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**36,)})
        archive.writestr("x.npy", header.getvalue() + bytes(64))
    static = tmp_path / "static.udp"
    if "{static}" in args:
        src, shapes = torch_models["cnn_scripted"]
        assert deploy("export", src, "-o", static, "--input-shape", shapes[0], "--static-shapes").returncode == 0
    names = {
        "cnn": torch_models["cnn_scripted"][0],
        "pkg": cnn_package,
        "bad_dtype": tmp_path / "bad_dtype.npz",
        "wrong_name": tmp_path / "wrong_name.npz",
        "not_npz": tmp_path / "not.npz",
        "npy": tmp_path / "one.npy",
        "huge": tmp_path / "huge.npz",
        "static": static,
    }
    result = deploy(*[a.format(**names) for a in args], cwd=tmp_path)
    assert_one_line_error(result, code, pattern)
    assert not (tmp_path / "x").exists()


def test_parsing_the_command_line_imports_no_framework_or_converter():
    """Every command parses its arguments first, deploy serve and run included: importing onnx (an
    optimizer pass's module) there cost each start 0.15 s and the server 12 MB of memory."""
    heavy = ("onnx", "onnxruntime", "torch", "tensorflow", "mindspore", "scipy", "sympy")
    code = f"import sys; from unideploy.cli.main import build_parser; build_parser(); print(sorted(set({heavy!r}) & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_argument_errors_use_usage_and_exit_2():
    result = deploy("bench", "pkg", "--batch-size", "0")
    assert result.returncode == 2 and "must be at least 1" in result.stderr
    result = deploy("bench", "pkg", "--batch-size", "8,x")
    assert result.returncode == 2 and "'x' is not a whole number" in result.stderr
    assert deploy("frobnicate").returncode == 2


def test_debug_shows_the_traceback(tmp_path):
    result = deploy("--debug", "inspect", tmp_path)
    assert result.returncode == 2 and "Traceback" in result.stderr and "has no manifest.json" in result.stderr


def test_optimize_command_round_trip(digits, digits_package, tmp_path):
    result = deploy(
        "optimize",
        digits_package,
        "--quantize",
        "int8",
        "--keep-slower",  # the digits CNN's INT8 is about as fast as fp32: on some CPUs slower
        "--calibration",
        digits["data"],
        "-o",
        tmp_path / "int8.zip",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["artifact"] == "onnx-int8" and record["accuracy"]["within_budget"]
    assert record["effects"]["latency_on"].startswith("the CPU (")
    human = deploy("optimize", tmp_path / "int8.zip", "--quantize", "fp16", "--calibration", digits["data"])
    assert human.returncode == 0 and "Accuracy against fp32" in human.stdout and "note:" in human.stdout
    assert [a["status"] for a in json.loads(deploy("verify", tmp_path / "int8.zip", "--json").stdout)["artifacts"]] == [
        "passed",
        "passed",
        "passed",
    ]
    bench = deploy("bench", tmp_path / "int8.zip", "--artifact", "onnx-int8", "--iterations", "5", "--json")
    assert json.loads(bench.stdout)["artifact"] == "onnx-int8"


def test_export_with_quantize_in_one_step(digits, tmp_path):
    result = deploy(
        "export",
        digits["model"],
        "-o",
        tmp_path / "q.udp",
        "--input-shape",
        "x:1x1x8x8",
        "--quantize",
        "fp16",
        "--calibration",
        digits["data"],
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert [a["id"] for a in json.loads(result.stdout)["artifacts"]] == ["onnx-fp32", "onnx-fp16"]


@pytest.mark.parametrize(
    "args, code, pattern",
    [
        (["optimize", "{pkg}"], 2, "nothing to optimize"),
        (["optimize", "{pkg}", "--quantize", "int8"], 2, "no calibration data: .*cannot be judged"),
        (["optimize", "{pkg}", "--prune", "1.5", "--calibration", "{data}"], 2, "between 0 and 1"),
        (["optimize", "{pkg}", "--quantize", "fp16", "--calibration", "{wrong}"], 2, "unknown input\\(s\\) 'pixels'"),
        (
            [
                "optimize",
                "{pkg}",
                "--prune",
                "0.97",
                "--no-refit",
                "--calibration",
                "{data}",
                "--max-accuracy-drop",
                "0.1",
            ],
            1,
            "exceeds the accuracy budget .* not changed",
        ),
        (
            ["optimize", "{pkg}", "--quantize", "fp16", "--calibration", "{data}", "--artifact", "nope"],
            2,
            "no artifact 'nope'",
        ),
    ],
)
def test_optimize_bad_input_gives_one_line_errors(args, code, pattern, digits, digits_package, tmp_path):
    np.savez(tmp_path / "wrong.npz", pixels=np.zeros((4, 1, 8, 8), np.float32))
    names = {"pkg": digits_package, "data": digits["data"], "wrong": tmp_path / "wrong.npz"}
    assert_one_line_error(deploy(*[a.format(**names) for a in args]), code, pattern)


def test_verify_says_when_its_samples_are_random(tmp_path):
    """Exported without --example-input, the stored samples are random inputs, on which an optimized
    artifact's error can be far below its error on real rows (0.04 against 2.35e-4 measured):
    verify says so, and --json names where the samples came from."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "relu.onnx")
    np.savez(tmp_path / "rows.npz", x=np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    for origin, extra in (
        ("synthetic", ["--input-shape", "x:N=2,4"]),
        ("example", ["--example-input", str(tmp_path / "rows.npz")]),
    ):
        package = tmp_path / f"{origin}.udp"
        assert deploy("export", str(tmp_path / "relu.onnx"), "-o", str(package), *extra).returncode == 0
        shown = deploy("verify", str(package))
        assert shown.returncode == 0 and ("random inputs" in " ".join(shown.stdout.split())) == (origin == "synthetic")
        assert json.loads(deploy("verify", str(package), "--json").stdout)["samples"] == origin


def test_the_validation_column_counts_a_run_of_equal_batch_sizes():
    """A batch-1 model's sixteen reference batches read "1 x16", not sixteen 1s."""
    from unideploy.cli.render import _runs

    assert _runs([1] * 16) == "1 x16" and _runs([1, 4]) == "1, 4" and _runs([4, 1, 1]) == "4, 1 x2"


def test_a_model_whose_batch_lies_on_axis_1_of_its_state_benches_at_any_batch(tmp_path):
    """Recurrent state laid out [2, batch, 3] beside an input [batch, 4]: the batch is dynamic
    (bench was refused as 'a fixed batch size of 1', reading axis 0 alone), and each size's inputs
    grow along each input's own batch axis (the state's axis 1, not its axis 0)."""
    from onnx_models import stateful_model

    import unideploy

    unideploy.export(stateful_model(tmp_path / "stateful.onnx"), tmp_path / "pkg").close()
    assert unideploy.open_package(tmp_path / "pkg").manifest.fixed_batch is None
    result = deploy("bench", tmp_path / "pkg", "--batch-size", "1,8", "--iterations", "3", "--json")
    assert result.returncode == 0, result.stderr
    assert [run["batch_size"] for run in json.loads(result.stdout)["runs"]] == [1, 8]


def test_a_streaming_models_state_is_recorded_at_export_and_carried_by_run(tmp_path):
    """``--state h=h_next:0.25`` records the pair in the signature; ``deploy run`` given the other
    input's rows runs them as one stream from 0.25 and says so; a pair that cannot be one is refused
    naming why, with nothing written."""
    pytest.importorskip("onnx")
    from onnx_models import running_average_model

    source = running_average_model(tmp_path / "average.onnx")
    made = deploy("export", source, "-o", tmp_path / "pkg", "--state", "h=h_next:0.25")
    assert made.returncode == 0, made.stderr
    manifest = json.loads((tmp_path / "pkg" / "manifest.json").read_text())
    assert manifest["signature"]["state"] == [{"input": "h", "output": "h_next", "initial": 0.25}]
    import unideploy

    with unideploy.open_package(tmp_path / "pkg") as package:  # random rows, each with a state the model reaches
        sample = max(package.reference_samples(), key=lambda s: s.batch_size)
    np.testing.assert_allclose(
        sample.inputs["h"][1:], 0.5 * sample.inputs["h"][:-1] + sample.inputs["x"][:-1], rtol=1e-6
    )
    assert (sample.inputs["h"][0] == 0.25).all()
    shown = " ".join(deploy("inspect", tmp_path / "pkg").stdout.split())
    assert "state input" in shown and "state output" in shown and "state: h <- h_next, from 0.25" in shown
    rows = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.savez(tmp_path / "rows.npz", x=rows)
    ran = deploy("run", tmp_path / "pkg", "--input", tmp_path / "rows.npz", "--json")
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    assert found["stream"].startswith("5 rows run in order as one stream, the state (h)")
    h, expected = np.full(4, 0.25, np.float32), []
    for row in rows:
        h = 0.5 * h + row
        expected.append(2 * h)
    np.testing.assert_allclose(np.array(found["outputs"]["y"]["data"]), np.array(expected), rtol=1e-6)
    assert found["outputs"]["h_next"]["shape"] == [1, 4]  # where a next run would go on from
    shown = deploy("run", tmp_path / "pkg", "--input", tmp_path / "rows.npz")
    assert "streamed: 5 rows run in order as one stream" in " ".join(shown.stdout.split())
    for flag, words in [
        ("h=nope", "state output 'nope' \\(for input 'h'\\) is not an output of the model"),
        ("z=h_next", "state input 'z' is not an input of the model"),
        ("h=h_next:half", "bad --state 'h=h_next:half'"),
    ]:
        refused = deploy("export", source, "-o", tmp_path / "bad", "--state", flag)
        assert_one_line_error(refused, 2, words)
        assert not (tmp_path / "bad").exists()
