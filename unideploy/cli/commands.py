"""One function per ``deploy`` verb: call the library, hand the result to the renderer."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from unideploy.cli import render
from unideploy.cli.options import given
from unideploy.errors import InputError, ValidationError
from unideploy.package import Package
from unideploy.runtimes import RuntimeOptions
from unideploy.signature import normalize_dtype

if TYPE_CHECKING:
    from unideploy.optimizers.base import OptimizeRequest


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))


def _optimize_request(args: argparse.Namespace) -> OptimizeRequest:
    from unideploy.optimizers.base import OptimizeRequest

    return OptimizeRequest(
        quantize=args.quantize,
        prune=args.prune,
        prune_method=args.prune_method,
        calibration=args.calibration,
        validation=args.validation,
        synthetic=args.synthetic_calibration,
        max_accuracy_drop=args.max_accuracy_drop,
        metric=tuple(args.metric or ("auto",)),
        min_cosine=args.min_cosine,
        decision_thresholds=tuple(args.decision_threshold or ()),
        artifact=getattr(args, "artifact", None),
        passes=tuple(args.passes or ()),
        options=given(args, args.pass_options),
    )


def cmd_export(args: argparse.Namespace) -> int:
    from unideploy.exporters import ExportOptions
    from unideploy.pipeline import export_package

    options = ExportOptions.from_user(
        input_shapes=args.input_shape,
        example_inputs=args.example_input,
        static_shapes=args.static_shapes,
        opset=args.opset,
        signature=args.signature,
        keep_native_only=args.keep_native_only,
        trust_source=args.trust_source,
        constants=args.constant,
        state=args.state,
    )
    request = _optimize_request(args)
    target_options = given(args, args.target_options)
    with render.status("exporting") as status:
        path = export_package(
            args.source,
            args.output,
            name=args.name,
            version=args.model_version,
            exporter=args.exporter,
            target=args.target,
            options=options,
            atol=args.atol,
            rtol=args.rtol,
            overwrite=args.force,
            optimization=request if request.requested else None,
            progress=lambda msg: status.update(msg),
            target_options={**target_options, "calibration": args.calibration, "accuracy": request.accuracy},
        )
    return _show_package(path, args.json, render.export_summary)


def cmd_optimize(args: argparse.Namespace) -> int:
    from unideploy.optimizers.optimize import optimize

    with render.status("optimizing") as status:
        path = optimize(
            args.package, _optimize_request(args), args.output, args.force, progress=lambda msg: status.update(msg)
        )
    with Package.open(path) as package:
        record = package.manifest.optimizations[-1]
        if args.json:
            _print_json(record)
        else:
            render.optimization(package, record)
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    return _show_package(args.package, args.json, render.inspect)


def _show_package(path: str | Path, as_json: bool, show: Callable[[Package], None]) -> int:
    """Open (and so re-verify) a package, then print its manifest as JSON or as tables."""
    with Package.open(path) as package:
        if as_json:
            _print_json(package.manifest.to_dict())
        else:
            show(package)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from unideploy.runtimes.selection import open_runtime, what_ran
    from unideploy.samples import batch_size_of, load_npz_inputs, run_in_batches, streams

    inputs = load_npz_inputs(args.input, "--input")
    with Package.open(args.package) as package:
        options = RuntimeOptions(device=args.device, engine_cache=_engine_cache(args), tf32=args.tf32)
        artifact, engine = open_runtime(package, args.artifact, args.runtime, options, args.target)
        signature = package.manifest.signature_of(artifact)
        with engine:  # a batch-1 model given a file of rows runs them a batch at a time
            outputs = run_in_batches(engine.run, inputs, signature)
            ran = what_ran(artifact, engine)
        if streams(inputs, signature):
            ran["stream"] = (
                f"{batch_size_of(inputs, signature.batch_axes)} rows run in order as one stream, the state "
                f"({', '.join(p.input for p in signature.state)}) carried from call to call from its initial "
                f"values; {', '.join(p.output for p in signature.state)}: after the last row"
            )
    if args.output:
        out = Path(args.output)
        tmp = out.with_name(f".{out.name}.partial")
        with open(tmp, "wb") as fh:  # write then rename: never a half-written result file
            np.savez(fh, **outputs)  # type: ignore[arg-type]  # numpy stub: **arrays read as allow_pickle
        tmp.replace(out)
    if args.json:
        _print_json(
            {
                **ran,
                "outputs": {
                    k: {"dtype": normalize_dtype(v.dtype), "shape": list(v.shape), "data": v.tolist()}
                    for k, v in outputs.items()
                },
            }
        )
    else:
        render.run_outputs(ran, outputs, args.output)
    return 0


def _engine_cache(args: argparse.Namespace) -> Path | None:
    return Path(args.engine_cache) if args.engine_cache else None


def cmd_verify(args: argparse.Namespace) -> int:
    from unideploy.edge.bundle import is_bundle
    from unideploy.verify import verify_package
    from unideploy.web.verify import is_web_bundle

    if is_web_bundle(args.package):
        return _verify_site(args)
    if args.backend or args.software_webgpu or args.screenshot:
        raise InputError(
            "--backend, --software-webgpu and --screenshot check web sites, and this is not one",
            "leave them out, or give a site from 'deploy bundle --platform web'",
        )
    if is_bundle(args.package):
        return _verify_bundle(args)
    signed_by = None
    if args.trusted_key or args.trusted_chain:
        from unideploy.package.signing import TrustedSigners

        signed_by = TrustedSigners(
            Path(args.trusted_key) if args.trusted_key else None, tuple(Path(c) for c in args.trusted_chain)
        )
    with Package.open(args.package) as package:
        if signed_by is not None:
            from unideploy.package.signing import verify_signature

            verify_signature(package, signed_by)  # before any artifact runs
        checks = verify_package(package, args.runtime, args.device, tf32=args.tf32)
        if args.json:
            _print_json(
                {
                    "package": str(args.package),
                    "integrity": "passed",
                    "signature": "passed" if signed_by else "not checked",
                    "samples": package.manifest.samples_origin(),
                    "artifacts": [c.to_dict() for c in checks],
                }
            )
        else:
            render.verify(package, checks, signed_by is not None)
    failed = [c.artifact for c in checks if c.status == "failed"]
    return _verdict(
        [f"artifact(s) {', '.join(failed)}"] if failed else [],
        [c.status for c in checks],
        "no longer match the reference outputs",
        "no artifact could be run on this machine (see 'deploy doctor')",
    )


def _verdict(failed: list[str], statuses: list[str], failed_how: str, none_ran: str) -> int:
    """verify's exit: 1 when a check failed or none could run (said on stderr), else 0."""
    if failed:
        print(f"error: {', '.join(failed)} {failed_how}", file=sys.stderr)
        return ValidationError.exit_code
    if all(s == "skipped" for s in statuses):
        print(f"error: {none_ran}", file=sys.stderr)
        return ValidationError.exit_code
    return 0


def cmd_sign(args: argparse.Namespace) -> int:
    from unideploy.package.signing import sign_package

    signature = sign_package(args.package, args.key, args.certificate, args.cert_chain)
    if args.json:
        _print_json({"package": str(args.package), "signature": str(signature)})
    else:
        render.signed(str(args.package), str(args.key), args.certificate)
    return 0


def _verify_bundle(args: argparse.Namespace) -> int:
    from unideploy.edge.bundle import verify_bundle

    with render.status("verifying the bundle"):
        report = verify_bundle(args.package, args.runtime)
    if args.json:
        _print_json({"bundle": str(args.package), **report.to_dict()})
    else:
        render.bundle_verify(args.package, report)
    return _verdict(
        report.failed,
        [c.status for c in report.models],
        "failed (see above)",
        "no model in the bundle could be run on this machine (see 'deploy doctor')",
    )


def _verify_site(args: argparse.Namespace) -> int:
    from unideploy.web.verify import verify_web_bundle

    with render.status("verifying the site in headless Chromium"):
        report = verify_web_bundle(args.package, args.backend, args.software_webgpu, screenshot=args.screenshot)
    if args.json:
        _print_json({"site": str(args.package), **report.to_dict()})
    else:
        render.site_verify(args.package, report)
    return _verdict(
        report.failed,
        [c.status for c in report.checks],
        "failed in the browser (see above)",
        "no model could be run in this browser (see above)",
    )


def cmd_bundle(args: argparse.Namespace) -> int:
    from unideploy.edge.bundle import build_bundle

    if args.platform == "web":
        return _bundle_site(args)
    with render.status(f"bundling for {args.platform}"):
        document = build_bundle(
            args.package, args.platform, args.output, args.force, args.artifact or None, args.labels, args.namespace
        )
    if args.json:
        _print_json(document)
    else:
        render.bundle(Path(args.output), document)
    return 0


def _bundle_site(args: argparse.Namespace) -> int:
    from unideploy.web.bundle import build_web_bundle

    if args.namespace:
        raise InputError("--namespace names the Kotlin package of Android wrappers", "leave it out for --platform web")
    with render.status("building the web site"):
        document = build_web_bundle(
            args.package, args.output, args.force, args.artifact or None, args.labels, args.backends
        )
    if args.json:
        _print_json(document)
    else:
        render.site(Path(args.output), document)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from unideploy.bench import benchmark
    from unideploy.runtimes.selection import open_runtime, what_ran
    from unideploy.samples import resize_batch

    with Package.open(args.package) as package:
        sample = package.reference_samples()[-1].inputs
        fixed = package.manifest.fixed_batch
        if fixed is not None and set(args.batch_size) != {fixed}:
            raise InputError(
                f"this package has a fixed batch size of {fixed}: its model takes {fixed} row(s) a call",
                f"benchmark --batch-size {fixed}; other sizes need a model with a dynamic batch (its source's, "
                "exported without --static-shapes)",
            )
        options = RuntimeOptions(
            device=args.device,
            threads=args.threads,
            engine_cache=_engine_cache(args),
            tf32=args.tf32,
            # as the server runs cuda_graphs: a bucket (a fixed-shape session replaying its graph) per size
            batch_buckets=args.batch_size if args.cuda_graphs else (),
            cuda_graphs=args.cuda_graphs,
        )
        artifact, engine = open_runtime(package, args.artifact, args.runtime, options, args.target)
        runs: list[dict[str, Any]] = []
        with engine:
            # one session for every batch size: a sweep in one process spares each size the start
            # (imports, session, provider) that its own `deploy bench` would pay
            for batch in args.batch_size:
                label = f"bench {artifact.id} on {engine.name}, batch {batch}"
                with render.progress(label, args.iterations) as tick:
                    inputs = resize_batch(sample, batch, engine.signature.batch_axes)  # state's rows on axis 1
                    runs.append(benchmark(engine, inputs, args.iterations, args.warmup, tick=tick))
            result: dict[str, Any] = {**runs[0]} if len(runs) == 1 else {"runs": runs}
            result.update({"package": str(args.package), **what_ran(artifact, engine)})
    if args.json:
        _print_json(result)
    else:
        render.bench(result)
    return 0


def cmd_kserve(args: argparse.Namespace) -> int:
    from unideploy.server import require

    require("kserve", "deploy kserve")
    from unideploy.server.kserve import KServeRequest, write_manifests

    request = KServeRequest(
        Path(args.source),
        args.image,
        Path(args.output),
        args.storage_uri,
        args.gpu,
        args.namespace,
        args.routing,
        args.cpu,
        args.memory,
        args.force,
    )
    runtime, services = write_manifests(request)
    if args.json:
        _print_json({"output": str(request.output), "runtime": runtime, "services": [s.to_dict() for s in services]})
    else:
        render.kserve(request.output, runtime, services)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from unideploy.doctor import diagnose, machine_summary

    findings = diagnose()
    if args.json:
        _print_json({"machine": machine_summary(), "findings": [f.to_dict() for f in findings]})
    else:
        render.doctor(machine_summary(), findings)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Bearer tokens come from UNIDEPLOY_INFERENCE_TOKEN / UNIDEPLOY_REPOSITORY_TOKEN (or the config
    file), never from the command line, where every user of the machine can read them; every
    setting can come from UNIDEPLOY_<SETTING> (server/config.py)."""
    from unideploy.server import require

    on_ray = bool(args.ray or args.ray_address)
    require("ray" if on_ray else "serve", "deploy serve --ray" if on_ray else "deploy serve")
    from unideploy.server.app import serve
    from unideploy.server.config import ServerConfig

    config = ServerConfig.load(
        Path(args.config) if args.config else None,
        repository=args.repository,
        model_name=args.model_name,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        poll_interval_s=args.poll_interval,
        max_request_bytes=args.max_request_bytes,
        max_request_rows=args.max_request_rows,
        max_response_bytes=args.max_response_bytes,
        max_run_memory=args.max_run_memory,
        max_sequences=args.max_sequences,
        sequence_idle_s=args.sequence_idle,
        sequence_header=args.sequence_header,
        max_connections=args.max_connections,
        max_header_bytes=args.max_header_bytes,
        max_headers=args.max_headers,
        header_timeout_s=args.header_timeout,
        grpc_idle_timeout_s=args.grpc_idle_timeout,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        workers=args.workers,
        shared_memory=args.shared_memory,
        frontends=args.frontends,
        switch_interval_us=args.switch_interval_us,
        require_signed=args.require_signed,
        trusted_key=args.trusted_key,
        trusted_chain=tuple(args.trusted_chain) or None,
    )
    if args.ray or args.ray_address:
        from unideploy.server.ray_serve import serve_on_ray

        serve_on_ray(config, args.ray_address)
    else:
        serve(config)
    return 0
