"""``deploy``: parse arguments, call the library, print. Nothing here converts or runs models."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

import unideploy
from unideploy.errors import UnideployError

EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line. The flags plug-ins declare (a pass's, a target's) are added to the command
    ``argv`` runs alone: loading every pass imports onnx, which ``deploy serve`` and ``run`` need not."""
    from unideploy.cli.options import add_plugin_options
    from unideploy.targets import TARGETS

    command = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    from unideploy.validation import DEFAULT_ATOL, DEFAULT_RTOL

    parser = argparse.ArgumentParser(
        prog="deploy",
        description="Export, verify, run and benchmark ML models through unideploy packages.",
    )
    parser.add_argument("--version", action="version", version=f"unideploy {unideploy.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and converter output")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("export", help="convert a model file into a verified package")
    p.add_argument(
        "source",
        help="TorchScript .pt, torch.export .pt2, Keras .keras or .h5, TFLite .tflite, .onnx, MindIR .mindir, or a "
        "TensorFlow SavedModel directory",
    )
    p.add_argument("-o", "--output", required=True, help="package directory, or a path ending in .zip")
    p.add_argument("--target", choices=sorted(TARGETS), default="cpu", help="where the package will run (default: cpu)")
    p.add_argument("--name", help="model name (default: the source file name)")
    p.add_argument("--model-version", default="1", help="model version (default: 1)")
    p.add_argument("--exporter", help="exporter to use instead of detecting it from the file")
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME:DIMS[:DTYPE]",
        help="example input shape, repeatable: x:1x3x224x224, ids:1,seq=128:int64 (seq= marks a dynamic dim)",
    )
    p.add_argument("--example-input", metavar="FILE.npz", help="example inputs by name, used as reference samples")
    p.add_argument("--static-shapes", action="store_true", help="keep every dimension fixed (no dynamic batch)")
    p.add_argument(
        "--signature", help="SavedModel signature to export (default: serving_default); a .tflite has its own"
    )
    p.add_argument(
        "--keep-native-only",
        action="store_true",
        help="package a MindIR model as its native artifact alone, without ONNX (for operators "
        "the translator does not cover; runs on MindSpore / MindSpore Lite)",
    )
    p.add_argument(
        "--trust-source",
        action="store_true",
        help="export a model that holds operations reaching outside it (files, Python code: "
        "TorchScript aten::from_file, TensorFlow ReadFile/PyFunc, Keras Lambda); see docs/security.md",
    )
    p.add_argument(
        "--constant",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="TorchScript: bind a non-tensor forward() argument (sample_rate=16000); torch.export (.pt2): "
        "confirm the value torch.export fixed such an argument at; ONNX: make a settings input (a scalar or "
        "fixed-shape one) part of the model; repeatable, recorded in the manifest",
    )
    p.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="INPUT=OUTPUT[:INITIAL]",
        help="a streaming model's state: INPUT takes OUTPUT of the call before, starting from INITIAL "
        "(default 0) in every element (state=stateN, h0=hn); repeatable, recorded in the signature, so that "
        "'deploy run' carries it over a file's rows and the server keeps it per sequence. A TFLite model's "
        "resource variables are recorded without it",
    )
    p.add_argument("--opset", type=int, help="ONNX opset for TorchScript exports (default: 17)")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL, help=f"absolute tolerance (default: {DEFAULT_ATOL})")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"relative tolerance (default: {DEFAULT_RTOL})")
    p.add_argument("--force", action="store_true", help="replace an existing package at -o")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    _add_optimize_options(p, required=False, plugins=command == "export")
    target_options: list[str] = []
    if command == "export":  # each target's own options (importing the models, not the stages)
        for target in TARGETS.values():
            if (model := target.options_model()) is not None:
                group = p.add_argument_group(f"{target.name} target (--target {target.name})")
                target_options += add_plugin_options(group, [model])
    p.set_defaults(target_options=target_options)

    p = sub.add_parser("optimize", help="add a quantized and/or pruned artifact, guarded by an accuracy budget")
    p.add_argument("package")
    p.add_argument("-o", "--output", help="write the result here instead of updating PACKAGE in place")
    p.add_argument("--force", action="store_true", help="replace an existing package at -o")
    p.add_argument("--artifact", help="artifact to start from (default: the fp32 ONNX artifact)")
    p.add_argument("--json", action="store_true", help="print the optimization record as JSON")
    _add_optimize_options(p, required=True, plugins=command == "optimize")

    p = sub.add_parser("inspect", help="show a package's model, signature, artifacts and validation")
    p.add_argument("package")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")

    p = sub.add_parser("run", help="run inputs from an .npz file through a package")
    p.add_argument("package")
    p.add_argument("--input", required=True, metavar="IN.npz", help="inputs by name")
    p.add_argument("-o", "--output", metavar="OUT.npz", help="write the outputs here")
    _add_runtime_options(p)
    p.add_argument("--json", action="store_true", help="print outputs as JSON")

    p = sub.add_parser("verify", help="check integrity and re-run every artifact against the reference outputs")
    p.add_argument(
        "package",
        help="a package (directory or .zip), a mobile bundle or a web site (folder or .zip) from 'deploy bundle'",
    )
    p.add_argument("--runtime", help="runtime to use (default: the first available for each artifact)")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="cpu")
    _add_tf32_option(p)
    _add_trust_options(p, " (checks the package's signature first)")
    p.add_argument(
        "--backend",
        action="append",
        choices=["wasm", "webgpu"],
        help="web sites: the browser backend to check, repeatable (default: every one the site's runtime has)",
    )
    p.add_argument(
        "--software-webgpu",
        action="store_true",
        help="web sites: WebGPU on Chromium's software adapter (SwiftShader) where there is no GPU",
    )
    p.add_argument("--screenshot", metavar="PNG", help="web sites: save the demo page, once it has run, here")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("sign", help="sign every file of a package (OpenSSF model-signing, offline)")
    p.add_argument("package", help="a package (directory or .zip); signed in place")
    p.add_argument("--key", required=True, metavar="PRIVATE.pem", help="elliptic-curve private key")
    p.add_argument(
        "--certificate", metavar="CERT.pem", help="the key's signing certificate (certificate-based signing)"
    )
    p.add_argument(
        "--cert-chain",
        action="append",
        default=[],
        metavar="CA.pem",
        help="certificates between the signing certificate and the root, repeatable",
    )
    p.add_argument("--json", action="store_true")

    p = sub.add_parser(
        "bundle", help="Android or iOS runtime bundle, or a static web site running the model in a browser"
    )
    p.add_argument("package", help="a package exported with --target edge (android, ios), or any package (web)")
    p.add_argument("--platform", required=True, choices=["android", "ios", "web"])
    p.add_argument(
        "-o", "--output", required=True, metavar="OUT", help="BUNDLE.zip (android, ios); a folder or .zip (web)"
    )
    p.add_argument(
        "--artifact",
        action="append",
        default=[],
        metavar="ID",
        help="artifact to include, repeatable (default: every TFLite and .ort artifact; web: every ONNX one)",
    )
    p.add_argument("--labels", metavar="FILE", help="class labels, one per line in class-index order")
    p.add_argument("--namespace", help="Kotlin package of the Android wrappers (default: ai.unideploy.models.NAME)")
    p.add_argument(
        "--backends",
        choices=["wasm,webgpu", "wasm"],
        default="wasm,webgpu",
        help="web: the ONNX Runtime Web build to vendor (wasm alone is half the bytes)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing bundle at -o")
    p.add_argument("--json", action="store_true", help="print bundle.json (web.json for the web)")

    p = sub.add_parser("bench", help="measure latency percentiles and throughput")
    p.add_argument("package")
    p.add_argument(
        "--batch-size",
        type=_batch_sizes,
        default=(1,),
        metavar="B[,B...]",
        help="batch size, or several (1,8,32): one session runs each in turn (default: 1)",
    )
    p.add_argument("--iterations", type=_positive_int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--threads", type=_positive_int, help="intra-op threads (default: the runtime decides)")
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="on a GPU (ONNX Runtime's CUDA provider): each batch size on a session of its own that replays a "
        "captured CUDA graph, as model.yaml's cuda_graphs: true serves every bucket (by default only the one-row "
        "bucket replays one); what ran says whether each was captured",
    )
    _add_runtime_options(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("serve", help="serve a model repository over REST and gRPC (Open Inference Protocol v2)")
    p.add_argument(
        "repository",
        help="REPO/<model>/<version>/ holding packages (directories or .zip): "
        "a folder, or s3://bucket/prefix, gs://...",
    )
    p.add_argument(
        "--model-name",
        metavar="NAME",
        help="REPO is one model, served as NAME: its <version>/ folders (with model.yaml, routing.yaml) "
        "or one package (KServe's runtime passes its InferenceService name)",
    )
    p.add_argument("--host", default=None, help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--http-port", type=int, default=None, help="REST port (default: 8000)")
    p.add_argument("--grpc-port", type=int, default=None, help="gRPC port (default: 8001)")
    p.add_argument("--config", metavar="FILE", help="YAML server settings (command-line options win)")
    p.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        metavar="S",
        help="seconds between repository scans for hot reload (default: 2; 0 turns watching off)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=_positive_int,
        default=None,
        help="largest request accepted: its body, and its inputs in shared memory",
    )
    p.add_argument(
        "--max-request-rows",
        type=_positive_int,
        default=None,
        help="most rows (batch dimension) one request may hold (default: 4096)",
    )
    p.add_argument(
        "--max-run-memory",
        type=_positive_int,
        default=None,
        help="most bytes the models' runs may hold at once on the CPU (activations and answers, not weights); "
        "a run needing more is refused (default: three quarters of the memory the server may use)",
    )
    p.add_argument(
        "--max-response-bytes",
        type=_positive_int,
        default=None,
        help="largest answer, its outputs' bytes; a request asking for more is refused, before the model runs "
        "where the signature says their sizes (default: 256 MiB)",
    )
    p.add_argument(
        "--max-sequences",
        type=_positive_int,
        default=None,
        help="live sequences of streaming models at once, each keeping its state in the server (default: 1024)",
    )
    p.add_argument(
        "--sequence-idle",
        type=float,
        default=None,
        metavar="S",
        help="seconds a sequence may go without a call before its state may be reclaimed (default: 60)",
    )
    p.add_argument(
        "--sequence-header",
        metavar="NAME",
        default=None,
        help="the header a load balancer in front routes by (consistent hashing): each call of a sequence must "
        "carry its sequence_id there (default: none; under --ray, Ray Serve's session header, x-session-id)",
    )
    p.add_argument(
        "--max-connections",
        type=_positive_int,
        default=None,
        help="REST connections at once, more answered 503, and as many gRPC calls, more answered RESOURCE_EXHAUSTED "
        "(default: 512, shared out among front ends)",
    )
    p.add_argument(
        "--max-header-bytes",
        type=_positive_int,
        default=None,
        help="largest REST request line and headers together; more is answered 431 (default: 65536)",
    )
    p.add_argument(
        "--max-headers", type=_positive_int, default=None, help="most REST request headers; more: 431 (default: 100)"
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a REST request's headers may take from its first byte (or a new connection's first "
        "request from the connection), and a new gRPC connection its handshake; later: 408 and closed (default: 15)",
    )
    p.add_argument(
        "--grpc-idle-timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds a gRPC connection may stay open with no call; then closed with GOAWAY, and clients "
        "reconnect on their next call (default: 300)",
    )
    p.add_argument("--tls-cert", help="PEM certificate: serve both ports over TLS (with --tls-key)")
    p.add_argument("--tls-key", help="PEM private key for --tls-cert")
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help="threads for loading versions and scanning the repository (default: 4; "
        "each version runs its calls on a thread of its own, and model.yaml's lanes side by side)",
    )
    p.add_argument(
        "--shared-memory",
        choices=["off", "system", "cuda"],
        default=None,
        help="tensors through POSIX shared memory that co-located clients register (Triton's system shared "
        "memory extension; default: system, authorized like inference); cuda: GPU memory too (CUDA shared "
        "memory, on a GPU machine); off refuses both",
    )
    p.add_argument(
        "--frontends",
        type=int,
        default=None,
        metavar="N",
        help="N processes decode and encode requests for the one that runs the models, sharing both ports "
        "(0: one process does it all; default: from the cores, 0 below 8; docs/server.md)",
    )
    p.add_argument(
        "--switch-interval-us",
        type=float,
        default=None,
        metavar="US",
        help="microseconds after which a batch thread waiting for Python's GIL makes the event loop hand it "
        "over (sys.setswitchinterval in the model process; default 20, CPython's 5000; docs/server.md)",
    )
    p.add_argument(
        "--require-signed",
        action="store_true",
        default=None,
        help="load only versions signed by --trusted-key or --trusted-chain (others fail to load; "
        "the previous version keeps serving)",
    )
    _add_trust_options(p)
    p.add_argument(
        "--ray",
        action="store_true",
        help="run each model as a Ray Serve application (replicas and autoscaling from model.yaml; REST only)",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="Ray cluster to join (default: $RAY_ADDRESS, else a local one started for this server)",
    )

    p = sub.add_parser("kserve", help="KServe manifests: a serving runtime and an InferenceService per model")
    p.add_argument("source", help="a model repository (REPO/<model>/<version>/) or one package")
    p.add_argument(
        "--image",
        required=True,
        help="the serving image (built from docker/Dockerfile, or docker/Dockerfile.gpu with --gpu)",
    )
    p.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="folder for the manifests (kubectl apply -f DIR)"
    )
    p.add_argument(
        "--storage-uri",
        metavar="URI",
        help="where SOURCE is uploaded: s3://, gs://, pvc:// (a repository or a package), https:// or "
        "oci:// (one package); default pvc://unideploy-models/<SOURCE name>",
    )
    p.add_argument("--gpu", action="store_true", help="the GPU runtime: one nvidia.com/gpu and a TensorRT engine cache")
    p.add_argument("--namespace", help="namespace of the InferenceServices (default: kubectl's)")
    p.add_argument(
        "--routing",
        choices=["server", "kserve"],
        default="server",
        help="server: routing.yaml routes inside the server (weights, sticky keys, shadow); kserve: a "
        "two-version weighted split becomes KServe's canary rollout",
    )
    p.add_argument("--cpu", default="1", help="CPU request and limit per replica (default: 1)")
    p.add_argument("--memory", default="2Gi", help="memory request and limit per replica (default: 2Gi)")
    p.add_argument("--force", action="store_true", help="replace an existing DIR")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("doctor", help="which exporters, runtimes and targets work here, and how to fix the rest")
    p.add_argument("--json", action="store_true")
    return parser


def _add_trust_options(p: argparse.ArgumentParser, note: str = "") -> None:
    p.add_argument("--trusted-key", metavar="PUBLIC.pem", help="public key a package must be signed with" + note)
    p.add_argument(
        "--trusted-chain",
        action="append",
        default=[],
        metavar="CA.pem",
        help="certificate chain a package's signing certificate must lead to, repeatable" + note,
    )


def _add_optimize_options(p: argparse.ArgumentParser, required: bool, plugins: bool) -> None:
    from unideploy.cli.options import add_plugin_options
    from unideploy.guard.accuracy import DEFAULT_BUDGET_POINTS, metric_help
    from unideploy.optimizers import PASSES, pass_options

    g = p.add_argument_group("optimization" + ("" if required else " (optional, applied after export)"))
    g.add_argument("--quantize", choices=["int8", "fp16"], help="INT8 (variant picked per model) or FP16")
    g.add_argument(
        "--pass",
        dest="passes",
        action="append",
        metavar="NAME",
        choices=PASSES.names(),
        help=f"an optimizer pass by name with its defaults, repeatable ({', '.join(PASSES.names())}, "
        "and those packages add through the unideploy.optimizers entry points)",
    )
    g.add_argument(
        "--prune",
        type=float,
        metavar="SPARSITY",
        help="magnitude: share of weights zeroed (0.8); channels: share of conv channels removed (0.5)",
    )
    g.add_argument("--prune-method", choices=["magnitude", "channels"], default="magnitude")
    names: list[str] = []
    if plugins:  # each pass's own options, named after the passes that take them
        owners = {option: ", ".join(passes) for option, (passes, _) in pass_options().items()}
        names = add_plugin_options(g, [cls.options for _, cls in PASSES], owners)
    p.set_defaults(pass_options=names)
    g.add_argument(
        "--calibration",
        metavar="DATA",
        help=".npz of named inputs (+ optional 'labels') or a directory; a streaming model's rows without "
        "its state are a stream (one per file), judged with each model carrying its own state",
    )
    g.add_argument("--validation", metavar="DATA", help="separate validation data (default: half of --calibration)")
    g.add_argument(
        "--synthetic-calibration",
        action="store_true",
        help="accept random inputs when there is no data (accuracy cannot be judged)",
    )
    g.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=DEFAULT_BUDGET_POINTS,
        metavar="POINTS",
        help=f"budget in percentage points (default: {DEFAULT_BUDGET_POINTS})",
    )
    g.add_argument(
        "--metric",
        action="append",
        metavar="[OUTPUT=]NAME",
        help="how outputs are judged, repeatable, for every output or OUTPUT=NAME for one; auto (default) "
        f"picks per output from its shape and values. {metric_help().replace('%', '%%')}; and those packages add "
        "through the unideploy.metrics entry points",
    )
    g.add_argument(
        "--min-cosine",
        type=float,
        metavar="C",
        help="budget of cosine-judged outputs: mean cosine to fp32 at least C (default 1 - budget/100)",
    )
    g.add_argument(
        "--decision-threshold",
        type=float,
        action="append",
        metavar="P",
        help="a probability your application decides a yes or a no at, for outputs judged by 'decision' (a "
        "voice-activity or wake-word detector's), repeatable: rows must be decided as fp32 decides them at "
        "each (default: 0.3 and 0.5)",
    )


def _add_tf32_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tf32",
        action="store_true",
        help="on a GPU, compute fp32 artifacts in TF32 (faster; named and judged as tf32). Default: exact fp32",
    )


def _add_runtime_options(p: argparse.ArgumentParser) -> None:
    from unideploy.targets import TARGETS

    p.add_argument("--runtime", help="runtime to use (default: the first available)")
    p.add_argument("--artifact", help="artifact id to run (default: the first the runtime can run)")
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--target", choices=sorted(TARGETS), help="only use runtimes that serve this target")
    _add_tf32_option(p)
    p.add_argument(
        "--engine-cache",
        metavar="DIR",
        help="where TensorRT engines built here are kept "
        "(default: $UNIDEPLOY_ENGINE_CACHE, else ~/.cache/unideploy/engines)",
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _batch_sizes(text: str) -> tuple[int, ...]:
    """``--batch-size 1,8,32``: each a whole number of at least 1, in the order given, once each."""
    return tuple(dict.fromkeys(_positive_int(part.strip()) for part in text.split(",")))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    if args.debug:
        os.environ["UNIDEPLOY_DEBUG"] = "1"  # lets converter output through
    from unideploy.cli import commands

    try:
        return getattr(commands, f"cmd_{args.command}")(args)
    except UnideployError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: say so in one line, traceback only with --debug
        if args.debug:
            traceback.print_exc()
        print(f"internal error: {type(exc).__name__}: {exc} (re-run with --debug and report it)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
