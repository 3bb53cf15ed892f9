"""ONNX Runtime: the embedded default runtime (CPU), using the CUDA provider when present.

It is also the second GPU path for a package's TensorRT recipe (``tensorrt`` artifacts): where
the TensorRT runtime is absent but onnxruntime-gpu is installed, the recipe's ONNX runs on ORT's
TensorRT execution provider with the recipe's precision, profiles and workspace (engines cached
beside the TensorRT runtime's). Where that provider does not load, the recipe is refused and the
package's next artifact runs: what ran is what ``describe()`` reports (ort_providers.py).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from unideploy.errors import MissingDependencyError, PackageError, RefusedValues, RuntimeFailure
from unideploy.registry import Availability
from unideploy.runtimes.base import Runtime, usable_cores
from unideploy.runtimes.batch_buckets import run_in_buckets
from unideploy.runtimes.cuda_work import CUDA_WORK
from unideploy.runtimes.device_batches import DeviceArray, DeviceBatchFailure
from unideploy.runtimes.ort_bound import BoundRun, GraphSessions, batch_dimension_names, fix_batch
from unideploy.runtimes.ort_providers import (
    CUDA,
    GPU_PROVIDERS,
    TENSORRT,
    Opened,
    node_placement,
    nodes_left_to_cpu,
    onnx_providers,
    open_session,
    ort_message,
    provider_names,
    recipe_providers,
    run_failure,
)
from unideploy.runtimes.tensorrt.engine_cache import default_cache_dir
from unideploy.runtimes.tensorrt.spec import EngineSpec, check_shapes, is_engine_spec
from unideploy.samples import batch_size_of

# By default (``cuda_graphs`` None) only buckets of this many rows replay a CUDA graph: a call of one
# row is mostly kernel launches, which a graph takes off the host (EfficientNet-Lite0 and MobileNetV2
# 1.41-1.52x faster on an H200), where at 8 and 32 rows it was 0.93-1.03x; and a graph's session runs
# one call at a time, so the server's two batch threads took turns on bucket 8's (3,936 images/s in
# process) where a plain session ran their batches side by side (5,180; docs/gpu.md, 2026-11-30 night)
GRAPH_ROWS = 1


_ARENA_LOCK = threading.Lock()
_ARENA_LIMIT: list[int | None] = []  # the shared arena's limit, once registered


def register_shared_arena(limit: int | None) -> None:
    """Register, once per process, the CPU arena that sessions with ``session.use_env_allocators``
    share, holding at most ``limit`` bytes (``RuntimeOptions.arena_limit``; the first call's stands:
    a process registers it once). It extends by what is requested, not by doubling: after merged
    batches of sizes 1-8 on EfficientNet-Lite0 the server held 299 MB instead of 333 (medians of
    four alternating starts)."""
    import onnxruntime as ort

    with _ARENA_LOCK:  # versions load on several threads
        if _ARENA_LIMIT:
            return
        config: dict[str, int] = {"arena_extend_strategy": 1}  # kSameAsRequested
        if limit is not None:
            config["max_mem"] = limit
        cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(cpu, ort.OrtArenaCfg(config))
        _ARENA_LIMIT.append(limit)


class OnnxRuntime(Runtime):
    name = "onnxruntime"
    formats = ("onnx", "ort", "tensorrt")
    targets = ("cpu", "gpu", "edge")
    required_modules = ("onnxruntime",)

    @classmethod
    def availability(cls) -> Availability:
        found = super().availability()
        if not found.ok:
            return found
        import onnxruntime

        return Availability(
            True, f"providers: {', '.join(onnxruntime.get_available_providers())}", modules=found.modules
        )

    def _load(self) -> None:
        import onnxruntime as ort

        self.spec = EngineSpec.load(self.path) if is_engine_spec(self.path) else None
        available = ort.get_available_providers()
        if self.spec is not None:
            cache = (self.options.engine_cache or default_cache_dir()) / "onnxruntime"
            self._providers = recipe_providers(self.spec, self.options.device, available, cache)
            cache.mkdir(parents=True, exist_ok=True)
        else:
            self._providers = onnx_providers(self.options.device, available, self.options.precision, self.options.tf32)
        self._gpu = bool(set(provider_names(self._providers)) & set(GPU_PROVIDERS))  # its CUDA work: cuda_work.py
        # where rows lie, for padding and cutting: recurrent state [layers, batch, hidden] on axis 1
        self._axes = (self.signature.batch_axes, self.signature.output_batch_axes)
        self._sessions: dict[int, Any] = {}
        self.graphs_problem: str | None = None  # why CUDA graphs, where they would replay, are not used
        self._graph_threads: list[ThreadPoolExecutor] = []  # each captured session's (ort_bound.py)
        # each bucket's session is told its batch size (ort_bound.py) by the names the signature
        # gives it, which the package's ONNX declares (onnx/interface.py)
        self._batch_names = batch_dimension_names(self.signature.inputs, self.signature.batch_axes)
        self._buckets = self._planned_buckets()
        opened = self._first_bucket() if self._buckets else None
        if opened is None:  # no buckets, or the CUDA provider did not load: one session, any batch
            self._buckets = ()
            opened = self._open()
        elif self.options.cuda_graphs is not False:  # asked for, or by default (None) where buckets run
            # every bucket opened now, its graph captured where it replays one, before the engine
            # serves: a capture fails the CUDA calls other threads make meanwhile (ort_bound.py), as
            # another bucket's calls would be
            try:
                for size in self._buckets[1:]:
                    self._bucket(size)
            except BaseException:  # nothing half-opened left holding GPU memory or threads
                self.close()
                raise
        self.session, self.fallback = opened.session, opened.lost
        self.placement = node_placement(self.session)
        # the providers that run a node of it (all of those it got, for a graph with no node left)
        self.ran_on = list(self.placement) or self.session.get_providers()
        got = self.ran_on
        if self.spec is not None and TENSORRT not in got:
            self.close()
            raise MissingDependencyError(
                f"the TensorRT recipe '{self.path.name}' cannot run here: ONNX Runtime's "
                f"{opened.lost or 'TensorRT provider took none of its nodes'}",
                "the package's ONNX artifacts run instead; ONNX Runtime 1.31's TensorRT provider needs "
                "TensorRT 10 (libnvinfer.so.10, NVIDIA's index): docs/gpu.md",
            )
        if self.options.device == "gpu" and not set(got) & set(GPU_PROVIDERS):
            self.close()
            raise MissingDependencyError(
                f"the GPU was asked for, but ONNX Runtime would run '{self.path.name}' on the CPU: "
                f"{opened.lost or 'its GPU providers took none of its nodes'}",
                "install onnxruntime-gpu with the CUDA and cuDNN libraries it needs ('deploy doctor' checks), "
                "or run on the CPU (--device cpu; device: cpu in model.yaml)",
            )
        session_inputs = {i.name for i in self.session.get_inputs()}
        if session_inputs != set(self.signature.input_names):
            self.close()
            raise PackageError(
                f"'{self.path.name}' takes inputs {sorted(session_inputs)} but the signature lists "
                f"{sorted(self.signature.input_names)}",
                "the package is inconsistent; export it again",
            )
        self._output_names = [o.name for o in self.session.get_outputs()]

    def _planned_buckets(self) -> tuple[int, ...]:
        """One session per batch size where a new shape costs a re-plan: the CUDA provider's cuDNN
        (asked for here; ``_first_bucket`` finds whether it loaded). A TensorRT engine takes any
        shape inside its profile, and a model without a batch dimension has one shape."""
        if self.spec is not None or CUDA not in provider_names(self._providers) or self.signature.batch_dim is None:
            return ()
        return tuple(sorted(set(self.options.batch_buckets)))

    def _first_bucket(self) -> Opened | None:
        """The smallest bucket's session, opened first: the providers it got are the runtime's, and
        no session for any batch is opened only to learn them (on a GPU, each is a CUDA session's
        start-up and host memory). None where it did not get the CUDA provider."""
        size = self._buckets[0]
        bucket = self._fixed_opened(size)
        if bucket.lost is not None:
            return None
        self._sessions[size] = bucket.session
        session = bucket.session.session if isinstance(bucket.session, GraphSessions) else bucket.session
        return Opened(session, None)

    def _open(self, rows: int | None = None, graph: bool = False) -> Opened:
        """A session; with ``rows``, one whose batch dimensions hold that many rows, and with
        ``graph``, one that captures its calls as a CUDA graph (run through a ``BoundRun``)."""
        import onnxruntime as ort

        session_options = ort.SessionOptions()
        if rows is not None:
            fix_batch(session_options, self._batch_names, rows)
        session_options.intra_op_num_threads = self.options.threads or usable_cores()
        if self.options.spin == "never":
            session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        elif self.options.spin == "run":
            session_options.add_session_config_entry("session.force_spinning_stop", "1")
        if self.options.shared_arena:
            register_shared_arena(self.options.arena_limit)
            session_options.add_session_config_entry("session.use_env_allocators", "1")
            # a memory plan per input shape keeps a block for each batch size seen
            session_options.enable_mem_pattern = False
        # fatal only: a run's error reaches us as an exception, with ONNX Runtime's words, and is
        # answered or raised with them; its own log line repeated it outside the server's JSON log,
        # once per request whose values a kernel refused
        session_options.log_severity_level = 4
        model = self.spec.onnx_path if self.spec else self.path
        providers = [
            (p[0], {**p[1], "enable_cuda_graph": "1"}) if graph and isinstance(p, tuple) and p[0] == CUDA else p
            for p in self._providers
        ]
        try:
            with self._cuda_work():
                return open_session(model, session_options, providers)
        except Exception as exc:  # ORT raises its own untyped pybind errors
            raise PackageError(
                f"ONNX Runtime cannot load '{self.path.name}': {ort_message(exc)}",
                "the artifact is invalid or needs a newer onnxruntime",
            ) from exc

    @property
    def max_batch_size(self) -> int | None:
        return self.spec.max_batch_size if self.spec else None  # a recipe runs only on TensorRT

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        return self._buckets

    @property
    def takes_device_batches(self) -> bool:
        """Its sessions on the CUDA provider read a batch merged in GPU memory in place (a TensorRT
        recipe's are left to the host: its profiles are checked against host arrays)."""
        return self.spec is None and CUDA in self.ran_on

    @property
    def precision(self) -> str:
        """What the model computes in as it runs here: the recipe's, else the artifact's, with fp32
        on the CUDA provider named tf32 when TF32 was asked for."""
        if self.spec is not None:
            return self.spec.precision
        if self.options.precision == "fp32" and self.options.tf32 and CUDA in self.ran_on:
            return "tf32"
        return self.options.precision

    def describe(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "runtime": self.name,
            "device": "gpu" if set(self.ran_on) & set(GPU_PROVIDERS) else "cpu",
            "providers": self.ran_on,
            "precision": self.precision,
            "threads": self.options.threads or "auto",
            "spin": self.options.spin,
        }
        if cpu_nodes := nodes_left_to_cpu(self.placement):
            found["cpu_nodes"] = cpu_nodes
        if self.fallback:
            found["fallback"] = self.fallback
        if self.spec is not None:
            found["profiles"] = self.spec.profile_text()
        if self._buckets:
            found["batch_buckets"] = list(self._buckets)
        if self.options.cuda_graphs or (self.options.cuda_graphs is None and self._buckets):
            # which buckets replay one, and why the others do not (where asked for, why none does)
            found["cuda_graphs"] = self._graphs_used()
        return found

    def _graphs_used(self) -> str:
        if not self._buckets:
            return "not used: they run on ONNX Runtime's CUDA provider with batch buckets, not here"
        captured = [size for size in self._buckets if isinstance(self._sessions.get(size), GraphSessions)]
        plain = [size for size in self._buckets if size not in captured]
        if self.graphs_problem is not None:
            if captured:  # a later bucket failed where the first ones had captured theirs
                return f"captured for batch buckets {_sizes(captured)} only: {self.graphs_problem}"
            return f"not used: {self.graphs_problem}"
        sessions = self.options.graph_sessions
        each = "one per bucket" if sessions == 1 else f"{sessions} sessions per bucket"
        if not plain:
            return f"captured, {each}"
        if not captured:
            return f"not used: no batch bucket of {GRAPH_ROWS} row (cuda_graphs: true captures every bucket)"
        return (
            f"captured for batch bucket {_sizes(captured)} ({each}); buckets {_sizes(plain)} run plain "
            "sessions, whose batches run side by side (cuda_graphs: true captures every bucket)"
        )

    def _replays_graph(self, size: int) -> bool:
        """Whether bucket ``size``'s session captures a CUDA graph: every bucket where asked for
        (``cuda_graphs`` True), by default (None) those of ``GRAPH_ROWS`` rows, none where turned
        off or where a capture failed."""
        if self.options.cuda_graphs is False or self.graphs_problem is not None:
            return False
        return self.options.cuda_graphs is True or size <= GRAPH_ROWS

    def _run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.spec is not None:
            check_shapes(self.spec.profiles, inputs)
        with self._cuda_work():
            if any(isinstance(v, DeviceArray) for v in inputs.values()):
                return self._run_on_device(inputs)
            if self._buckets:
                return run_in_buckets(self._run_bucket, inputs, self._buckets, *self._axes)
            return self._call(self.session, inputs)

    def _run_on_device(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        """A batch merged in GPU memory (``device_batches.py``), run where it lies: by its bucket's
        session, or the one session where there are no buckets; a batch of a size no bucket has is
        copied to the host and run as any other. A failure raises ``DeviceBatchFailure``, with ONNX
        Runtime's words: the server merges on the host from then on; values a kernel refused
        (``RefusedValues``) are the requests' own failure, raised as they are."""
        rows = batch_size_of(inputs, self._axes[0])
        if self._buckets and rows not in self._buckets:
            host = {k: v.value.numpy() if isinstance(v, DeviceArray) else v for k, v in inputs.items()}
            return run_in_buckets(self._run_bucket, host, self._buckets, *self._axes)
        try:
            return self._run_bucket(rows, inputs) if self._buckets else self._call(self.session, inputs)
        except RefusedValues:  # the requests' values, not where the batch lies
            raise
        except RuntimeFailure as exc:
            raise DeviceBatchFailure(f"ONNX Runtime's run on a batch in GPU memory: {exc}") from exc

    def _cuda_work(self) -> AbstractContextManager[None]:
        """On a GPU, CUDA work, which a CUDA graph's capture elsewhere in the process holds off
        (cuda_work.py); on the CPU, nothing to wait for."""
        return CUDA_WORK.shared() if self._gpu else nullcontext()

    def _run_bucket(self, size: int, inputs: dict[str, np.ndarray], run_options: Any = None) -> dict[str, np.ndarray]:
        """Run on the session that sees only ``size`` rows, opening it on first use. A CUDA graph's
        memory is fixed when captured: ``run_options`` (an arena shrink) does not apply to it."""
        bucket = self._bucket(size)
        if isinstance(bucket, GraphSessions):
            try:
                return bucket.run(inputs)
            except DeviceBatchFailure:
                raise
            except Exception as exc:
                raise run_failure(exc, inputs, self.options.arena_limit) from exc
        return self._call(bucket, inputs, run_options)

    def _bucket(self, size: int) -> Any:
        """The session of bucket ``size`` (``GraphSessions`` where it replays a CUDA graph)."""
        if size not in self._sessions:
            self._sessions[size] = self._fixed_session(size)
        return self._sessions[size]

    def _fixed_session(self, size: int) -> Any:
        """A later bucket's session (``_fixed_opened``), which must have the GPU as the first had."""
        opened = self._fixed_opened(size)
        if opened.lost:  # ONNX Runtime would run this bucket on the CPU: never silently
            raise RuntimeFailure(f"the session for batches of {size} could not use the GPU: {opened.lost}")
        return opened.session

    def _fixed_opened(self, size: int) -> Opened:
        """A session for ``size`` rows: where it replays a CUDA graph (``_replays_graph``),
        ``graph_sessions`` of them, each having captured its graph behind a ``BoundRun`` whose calls
        are all made on a thread of its own (where ONNX Runtime keeps the graph), else, or where
        capture failed, a plain one. A failure is named once (``describe``) and the other buckets do
        not try again."""
        if self._replays_graph(size):
            threads: list[ThreadPoolExecutor] = []
            try:
                runs = []
                for _ in range(self.options.graph_sessions):
                    threads.append(ThreadPoolExecutor(1, thread_name_prefix=f"unideploy-cuda-graph-{size}"))
                    opened = self._open(size, graph=True)
                    if opened.lost:
                        raise ValueError(opened.lost)
                    bound = BoundRun(opened.session, "cuda", thread=threads[-1])
                    bound.capture()
                    runs.append(bound)
                self._graph_threads += threads
                return Opened(GraphSessions(runs), None)
            except (ValueError, PackageError) as exc:
                self.graphs_problem = str(exc)[:300]
            except Exception as exc:  # ORT's own errors: capture refused (a node left to the CPU), ...
                self.graphs_problem = ort_message(exc)
            for thread in threads:
                thread.shutdown()
        return self._open(size)

    def _call(self, session: Any, inputs: dict[str, Any], run_options: Any = None) -> dict[str, np.ndarray]:
        """``session``'s answer to ``inputs``; a batch in GPU memory (``DeviceArray``) is fed as the
        ``OrtValue`` holding it, which the session reads in place."""
        import onnxruntime as ort

        try:
            if any(isinstance(v, DeviceArray) for v in inputs.values()):
                feeds = {
                    k: v.value if isinstance(v, DeviceArray) else ort.OrtValue.ortvalue_from_numpy(v)
                    for k, v in inputs.items()
                }
                got = session.run_with_ort_values(self._output_names, feeds, run_options)
                outputs = [value.numpy() for value in got]  # the host's copy, wherever ONNX Runtime left it
            else:
                outputs = session.run(self._output_names, inputs, run_options)
        except Exception as exc:
            raise run_failure(exc, inputs, self.options.arena_limit) from exc
        # string outputs come back as arrays of Python str objects: numpy unicode, as every stage keeps text
        return {n: o.astype(str) if o.dtype == object else o for n, o in zip(self._output_names, outputs)}

    def shrink(self, inputs: Mapping[str, Any]) -> None:
        """ONNX Runtime keeps the arena a merged batch grew (about 125 MB for the benchmark's two
        models after batch 8); a run with arena shrinkage frees what that run does not use. With
        batch buckets the run goes to its own bucket's session, which has seen no other shape."""
        import onnxruntime as ort

        options = ort.RunOptions()
        devices = "gpu:0" if self._buckets else "cpu:0"  # buckets: a CUDA session, whose arena is the GPU's
        options.add_run_config_entry("memory.enable_memory_arena_shrinkage", devices)
        inputs = self.signature.validate_inputs(inputs)
        with self._cuda_work():
            if self._buckets:
                run_in_buckets(
                    lambda size, padded: self._run_bucket(size, padded, options), inputs, self._buckets, *self._axes
                )
            else:
                self._call(self.session, inputs, options)

    def close(self) -> None:
        with self._cuda_work():  # the sessions' GPU memory freed
            self.__dict__.pop("session", None)
            self.__dict__.pop("_sessions", None)
        for thread in self.__dict__.pop("_graph_threads", ()):
            thread.shutdown()


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes))
