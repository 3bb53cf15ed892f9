"""Fixed-shape sessions and IO binding (runtimes/ort_bound.py), on real ONNX Runtime sessions: the
CUDA graph they exist for needs a GPU (tests/gpu/test_cuda_graphs.py); the binding, the fixed batch
and the copies out are the same on the CPU."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from unideploy.package import Package
from unideploy.runtimes.ort_bound import CAPTURE_CALLS, BoundRun, GraphSessions, batch_dimension_names, fix_batch


def _session(path, rows: int | None = None, names=("batch",)) -> ort.InferenceSession:
    options = ort.SessionOptions()
    if rows is not None:
        fix_batch(options, names, rows)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _model(tmp_path, inputs: dict[str, list], name: str = "m.onnx"):
    """A graph adding its inputs (each of ``inputs``' shapes, float)."""
    specs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, shape) for k, shape in inputs.items()]
    first = next(iter(inputs))
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, inputs[first])
    nodes = (
        [helper.make_node("Identity", [first], ["y"])]
        if len(inputs) == 1
        else [helper.make_node("Add", list(inputs), ["y"])]
    )
    model = helper.make_model(helper.make_graph(nodes, "g", specs, [out]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / name)
    return tmp_path / name


@pytest.fixture
def digits_onnx(digits):
    with Package.open(digits["package"]) as package:
        return package.path_of(package.manifest.artifact("onnx-fp32"))


def test_the_batch_names_are_those_that_size_nothing_else(tmp_path, digits_onnx):
    assert batch_dimension_names(_session(digits_onnx).get_inputs(), {"x": 0}) == ["batch"]
    text = _model(tmp_path, {"input_ids": ["batch", "seq"], "attention_mask": ["batch", "seq"]})
    axes = {"input_ids": 0, "attention_mask": 0}
    assert batch_dimension_names(_session(text).get_inputs(), axes) == ["batch"]
    # a square input whose one name sizes both axes: fixing it would fix the second axis too
    square = _model(tmp_path, {"x": ["n", "n"]}, "square.onnx")
    assert batch_dimension_names(_session(square).get_inputs(), {"x": 0}) == []


def test_a_fixed_batch_runs_its_size_and_refuses_another(digits, digits_onnx):
    images = np.load(digits["data"])["x"][:4]
    session = _session(digits_onnx, rows=4)
    assert session.get_inputs()[0].shape[0] == 4 and session.get_outputs()[0].shape[0] == 4
    expected = _session(digits_onnx).run(None, {"x": images})[0]
    np.testing.assert_allclose(session.run(None, {"x": images})[0], expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match="Got: 3 Expected: 4"):
        session.run(None, {"x": images[:3]})


def test_a_bound_run_answers_as_the_session_does_in_arrays_of_its_own(digits, digits_onnx):
    images = np.load(digits["data"])["x"]
    plain = _session(digits_onnx)
    bound = BoundRun(_session(digits_onnx, rows=8), "cpu")
    bound.capture()
    answers = []
    for start in (0, 8, 16):
        batch = images[start : start + 8]
        got = bound.run({"x": batch})
        np.testing.assert_allclose(got["output"], plain.run(None, {"x": batch})[0], rtol=1e-5, atol=1e-5)
        answers.append(got["output"])
    # each answer is the caller's: the next call's binding did not overwrite the first
    np.testing.assert_allclose(answers[0], plain.run(None, {"x": images[:8]})[0], rtol=1e-5, atol=1e-5)
    assert not np.shares_memory(answers[0], answers[1])
    # the real digits: the bound session classifies them as the plain one does
    labels = np.load(digits["data"])["labels"][16:24]
    assert (answers[2].argmax(1) == labels).mean() >= 0.75
    # a replay answers what the buffers hold: the last batch copied in
    np.testing.assert_allclose(bound.replay()["output"], answers[2], rtol=1e-6, atol=1e-6)


def test_a_session_without_a_fixed_size_is_not_bound(digits_onnx):
    with pytest.raises(ValueError, match="input 'x' .* is not a fixed-size tensor"):
        BoundRun(_session(digits_onnx), "cpu")


class _Calls:
    """A real session whose IO-bound calls are counted by the thread that made them."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session, self.threads = session, []

    def __getattr__(self, name):
        return getattr(self.session, name)

    def run_with_iobinding(self, binding, run_options=None):
        self.threads.append(threading.current_thread().name)
        return self.session.run_with_iobinding(binding, run_options)


def test_a_binding_given_a_thread_makes_every_call_there(digits, digits_onnx):
    """ONNX Runtime's CUDA provider keeps a captured graph in the thread that captured it: callers
    on any thread (the server's batch threads) must reach that graph, never capture their own."""
    images = np.load(digits["data"])["x"][:8]
    expected = _session(digits_onnx).run(None, {"x": images})[0]
    session = _Calls(_session(digits_onnx, rows=8))
    with ThreadPoolExecutor(1, thread_name_prefix="graph") as thread:
        bound = BoundRun(session, "cpu", thread=thread)
        bound.capture()
        assert len(session.threads) == 1 + CAPTURE_CALLS == 3  # planned, then captured and replayed
        with ThreadPoolExecutor(2, thread_name_prefix="batch") as callers:
            answers = list(callers.map(lambda _: bound.run({"x": images})["output"], range(6)))
        bound.replay()
    assert len(session.threads) == 3 + 6 + 1 and all(name.startswith("graph") for name in session.threads)
    for answer in answers:
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)


class _Meeting(_Calls):
    """A real session whose calls, once ``meet`` is set, each wait until two calls are under way at
    once (a barrier that breaks, failing the test, if the second never comes)."""

    def __init__(self, session: ort.InferenceSession, barrier: threading.Barrier) -> None:
        super().__init__(session)
        self.barrier, self.meet = barrier, False

    def run_with_iobinding(self, binding, run_options=None):
        if self.meet:
            self.barrier.wait(timeout=30)
        return super().run_with_iobinding(binding, run_options)


def test_a_buckets_graph_sessions_run_two_calls_side_by_side(digits, digits_onnx):
    """``graph_sessions: 2``: the server's two batch threads calling one bucket at once each get a
    session of their own, made on its own thread (where its graph was captured), where one session
    makes them take turns (ONNX Runtime runs no two calls of a session capturing graphs at once)."""
    images = np.load(digits["data"])["x"][:8]
    expected = _session(digits_onnx).run(None, {"x": images})[0]
    barrier = threading.Barrier(2)
    sessions = [_Meeting(_session(digits_onnx, rows=8), barrier) for _ in range(2)]
    with (
        ThreadPoolExecutor(1, thread_name_prefix="graph-a") as a,
        ThreadPoolExecutor(1, thread_name_prefix="graph-b") as b,
        ThreadPoolExecutor(2, thread_name_prefix="batch") as callers,
    ):
        runs = [BoundRun(session, "cpu", thread=thread) for session, thread in zip(sessions, (a, b), strict=True)]
        for run in runs:
            run.capture()
        graphs = GraphSessions(runs)
        assert graphs.session is sessions[0]
        for session in sessions:
            session.meet = True  # from now on a call returns only once another is under way
        answers = list(callers.map(lambda _: graphs.run({"x": images})["output"], range(4)))
    for answer in answers:
        np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)
    # each session made its calls on its own thread: two in the pair's each time
    assert [name.split("_")[0] for name in sessions[0].threads[3:]] == ["graph-a"] * 2
    assert [name.split("_")[0] for name in sessions[1].threads[3:]] == ["graph-b"] * 2
