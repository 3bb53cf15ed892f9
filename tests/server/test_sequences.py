"""Streaming models served as sequences (Triton's sequence batcher with implicit state): a client
sends a stream's calls with one sequence_id and its real inputs only; the server carries the state.
Real models: Silero VAD (an LSTM whose state merges along axis 1 of [2, batch, 128]) and
microWakeWord's "Okay Nabu" detector (six int8 buffers of past features, batch 1), beside a small
running average built here; through one process and through two front ends."""

from __future__ import annotations

import concurrent.futures
import functools
import importlib.util
import shutil

import numpy as np
import pytest
from console import deploy
from onnx_models import running_average_model
from serving import FRONTEND_COUNTS, FRONTEND_IDS, start_server, stop_server

onnx = pytest.importorskip("onnx")
httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient is in the dev extra")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="tritonclient is in the dev extra")
from tritonclient.utils import InferenceServerException  # noqa: E402

CHUNK = 512  # Silero VAD's samples a call at 16 kHz, read after the 64 before them
CONTEXT = 64


def _averages(rows: np.ndarray, start: float = 0.25) -> np.ndarray:
    h, out = np.full(rows.shape[1:], start, np.float32), []
    for x in rows:
        h = 0.5 * h + x
        out.append(2 * h)
    return np.array(out, np.float32)


@pytest.fixture(scope="module")
def stream_repo(zoo_models, digits, tmp_path_factory):
    """The running average (its state starting at 0.25), Silero VAD and microWakeWord as
    streaming models, and the digits CNN, which keeps no state."""
    root = tmp_path_factory.mktemp("streams")
    work = tmp_path_factory.mktemp("stream-sources")
    running_average_model(work / "average.onnx")
    made = [
        deploy("export", work / "average.onnx", "-o", root / "average" / "1", "--state", "h=h_next:0.25"),
        deploy(
            "export",
            zoo_models.shipped(zoo_models.SILERO_VAD),
            "-o",
            root / "vad" / "1",
            *("--input-shape", "input:batch=1,576", "--input-shape", "state:2,batch=1,128"),
            *("--constant", "sr=16000", "--state", "state=stateN"),
        ),
        deploy("export", zoo_models.shipped(zoo_models.MICRO_WAKE_WORD), "-o", root / "wake" / "1"),
    ]
    for result in made:
        assert result.returncode == 0, result.stdout + result.stderr
    shutil.copytree(digits["package"], root / "digits" / "1")
    return root


@pytest.fixture(scope="module", params=FRONTEND_COUNTS, ids=FRONTEND_IDS)
def server(stream_repo, tmp_path_factory, request):
    running = start_server(
        stream_repo, tmp_path_factory.mktemp("server"), "--frontends", request.param, "--max-sequences", "4"
    )
    yield running
    stop_server(running)


def _infer(client, model: str, inputs: dict[str, np.ndarray], module=httpclient, **sequence):
    tensors = []
    for name, value in inputs.items():
        tensor = module.InferInput(name, list(value.shape), module.np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    return client.infer(model, tensors, **sequence)


def _sequence(client, model: str, name: str, rows, key, output: str, module=httpclient) -> list[np.ndarray]:
    """``rows`` sent one call each as sequence ``key`` (started by the first, ended by the last),
    the ``output`` of each call."""
    last = len(rows) - 1
    return [
        _infer(
            client, model, {name: row}, module, sequence_id=key, sequence_start=i == 0, sequence_end=i == last
        ).as_numpy(output)
        for i, row in enumerate(rows)
    ]


def _error(call) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return f"{caught.value.status()} {caught.value.message()}"


def test_the_server_carries_a_sequences_state_over_rest_and_grpc(server):
    """Two sequences interleaved, one over each protocol: each answers as the model run in order
    on its own rows, the state never sent nor answered; the metadata lists the real inputs only and
    the configuration Triton's implicit state."""
    rng = np.random.default_rng(0)
    streams = {7: rng.standard_normal((5, 1, 4)).astype(np.float32), "b": rng.standard_normal((5, 1, 4), np.float32)}
    rest = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    grpc = grpcclient.InferenceServerClient(server.grpc)
    clients = {7: (rest, httpclient), "b": (grpc, grpcclient)}
    got: dict = {key: [] for key in streams}
    for step in range(5):  # the two sequences' calls interleaved
        for key, rows in streams.items():
            client, module = clients[key]
            flags = {"sequence_start": step == 0, "sequence_end": step == 4}
            answer = _infer(client, "average", {"x": rows[step]}, module, sequence_id=key, **flags)
            assert answer.as_numpy("h_next") is None  # the state stays in the server
            got[key].append(answer.as_numpy("y"))
    for key, rows in streams.items():
        np.testing.assert_allclose(np.array(got[key]), _averages(rows), rtol=1e-6)
    metadata = rest.get_model_metadata("average")
    assert [t["name"] for t in metadata["inputs"]] == ["x"] and [t["name"] for t in metadata["outputs"]] == ["y"]
    assert metadata["parameters"]["state"] == "h <- h_next (starts at 0.25)"
    config = rest.get_model_config("average")
    assert [t["name"] for t in config["input"]] == ["x"]
    assert config["sequence_batching"]["state"] == [
        {"input_name": "h", "output_name": "h_next", "data_type": "TYPE_FP32", "dims": [4]}
    ]
    # outside a sequence the state is the caller's, as before
    rows = streams[7]
    alone = _infer(rest, "average", {"x": rows[1], "h": np.full((1, 4), 0.25, np.float32)})
    np.testing.assert_allclose(alone.as_numpy("h_next"), 0.5 * 0.25 + rows[1], rtol=1e-6)


def test_sequences_ride_one_grpc_stream_and_a_failed_call_is_answered_on_it(server):
    """Triton's streaming inference (ModelStreamInfer, tritonclient's ``start_stream``): two
    sequences' calls and 150 digits images sent on one stream without waiting, each answered on it by
    its request id, the sequences exactly as the model run in order on their own rows; a call with
    a wrong input is answered with its error on the stream, which stays open for the calls after it."""
    import queue

    rng = np.random.default_rng(3)
    streams = {11: rng.standard_normal((6, 1, 4)).astype(np.float32), 12: rng.standard_normal((6, 1, 4), np.float32)}
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:

        def send(model: str, inputs: dict[str, np.ndarray], request_id: str, **sequence) -> None:
            tensors = []
            for name, value in inputs.items():
                tensor = grpcclient.InferInput(name, list(value.shape), grpcclient.np_to_triton_dtype(value.dtype))
                tensor.set_data_from_numpy(value)
                tensors.append(tensor)
            client.async_stream_infer(model, tensors, request_id=request_id, **sequence)

        for step in range(6):
            for key, rows in streams.items():
                flags = {"sequence_start": step == 0, "sequence_end": step == 5}
                send("average", {"x": rows[step]}, f"{key}-{step}", sequence_id=key, **flags)
            if step == 2:
                send("digits", {"nope": np.zeros((1, 1, 8, 8), np.float32)}, "bad")
        for i in range(150):  # more than a stream holds at once (STREAM_WINDOW): read as answers go
            send("digits", {"x": np.zeros((1, 1, 8, 8), np.float32)}, f"digits-{i}")
        got, errors = {}, []
        for _ in range(2 * 6 + 1 + 150):
            result, error = answers.get(timeout=60)
            if error is not None:
                errors.append(str(error))
            else:
                got[result.get_response().id] = result
    finally:
        client.stop_stream()
    assert len(errors) == 1 and "unknown input(s) 'nope'" in errors[0], errors
    assert all(got[f"digits-{i}"].as_numpy("output").shape == (1, 10) for i in range(150))
    for key, rows in streams.items():
        answered = np.array([got[f"{key}-{step}"].as_numpy("y") for step in range(6)])
        np.testing.assert_allclose(answered, _averages(rows), rtol=1e-6)


def test_sequences_of_a_batched_model_run_merged_and_each_keeps_its_own_state(server):
    """Four sequences at once from four threads: the batcher may merge their calls (the state's
    batch axis is axis 0 here, axis 1 for Silero's), yet each gets its own stream's answers."""
    rng = np.random.default_rng(1)
    streams = {i + 1: rng.standard_normal((12, 1, 4)).astype(np.float32) for i in range(4)}

    def run(key: int) -> np.ndarray:
        client = grpcclient.InferenceServerClient(server.grpc)
        return np.array(_sequence(client, "average", "x", streams[key], key, "y", grpcclient))

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = dict(zip(streams, pool.map(run, streams)))
    for key, rows in streams.items():
        np.testing.assert_allclose(answers[key], _averages(rows), rtol=1e-6)


def test_silero_vad_served_as_a_sequence_answers_as_the_model_run_in_order(server, zoo_models):
    """Silero VAD on eSpeak NG's speech, 512-sample chunks each after its 64 samples of context, the
    LSTM state kept by the server: the probabilities ONNX Runtime gives the model run in order with
    the state fed back by hand, two streams at once (their calls merge along the state's axis 1)."""
    import onnxruntime as ort

    audio = zoo_models.speech(6.0)
    padded = np.concatenate([np.zeros(CONTEXT, np.float32), audio])  # the first chunk's context: silence
    chunks = [padded[start : start + CONTEXT + CHUNK] for start in range(0, len(audio) - CHUNK + 1, CHUNK)][:120]
    session = ort.InferenceSession(str(zoo_models.shipped(zoo_models.SILERO_VAD)), providers=["CPUExecutionProvider"])
    state, expected = np.zeros((2, 1, 128), np.float32), []
    for chunk in chunks:
        out, state = session.run(None, {"input": chunk[None], "state": state, "sr": np.array(16000, np.int64)})
        expected.append(float(out[0, 0]))
    assert max(expected) > 0.9 and min(expected) < 0.1  # speech starts and stops in it

    def run(key: str) -> list[float]:
        client = grpcclient.InferenceServerClient(server.grpc)
        rows = [chunk[None] for chunk in chunks]
        return [float(out[0, 0]) for out in _sequence(client, "vad", "input", rows, key, "output", grpcclient)]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for got in pool.map(run, ["speech-1", "speech-2"]):
            np.testing.assert_allclose(got, expected, atol=1e-5)


def test_micro_wake_word_hears_okay_nabu_through_a_served_sequence(server, zoo_models):
    """microWakeWord's detector over REST, one feature window a call, its six int8 buffers kept by
    the server from their recorded start (-128): it hears "Okay Nabu" at the calls LiteRT's stateful
    source does, and not "Hey Jarvis"."""
    litert = pytest.importorskip("ai_edge_litert.interpreter", reason="the tflite extra is not installed")
    interpreter = litert.Interpreter(model_path=str(zoo_models.shipped(zoo_models.MICRO_WAKE_WORD)))
    interpreter.allocate_tensors()
    (audio_in,), (score_out,) = interpreter.get_input_details(), interpreter.get_output_details()
    windows = zoo_models.wake_word_windows(
        zoo_models.spoken(["Okay Nabu.", "Hey Jarvis.", "Okay, Nabu!"]), *audio_in["quantization"]
    )
    expected = []
    for window in windows:
        interpreter.set_tensor(audio_in["index"], window)
        interpreter.invoke()
        expected.append(int(interpreter.get_tensor(score_out["index"])[0, 0]))
    client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    got = [int(out[0, 0]) for out in _sequence(client, "wake", "input_audio", windows, 99, "dense_1")]

    def detections(scores) -> np.ndarray:  # the calls where the mean of 5 rises over 0.85
        fired = np.convolve(np.array(scores) / 256, np.ones(5) / 5, "valid") > 0.85
        return np.flatnonzero(fired[1:] & ~fired[:-1]) + 1

    assert len(detections(expected)) == 2
    assert np.abs(detections(got) - detections(expected)).max() <= 1 and len(detections(got)) == 2


def test_a_sequences_inputs_may_come_through_shared_memory(server, regions):
    """The real input in a system shared-memory region the client rewrites between calls (read when
    its batch is merged), the state beside it in the server."""
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    handle, name, key = regions(16)
    client = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    client.register_system_shared_memory(name, key, 16)
    try:
        rows = np.arange(1, 5, dtype=np.float32)[:, None, None] * np.ones((4, 1, 4), np.float32)
        got = []
        for i, row in enumerate(rows):
            shm.set_shared_memory_region(handle, [row])
            tensor = httpclient.InferInput("x", [1, 4], "FP32")
            tensor.set_shared_memory(name, 16)
            answer = client.infer("average", [tensor], sequence_id="shm", sequence_start=i == 0, sequence_end=i == 3)
            got.append(answer.as_numpy("y"))
        np.testing.assert_allclose(np.array(got), _averages(rows), rtol=1e-6)
    finally:
        client.unregister_system_shared_memory(name)


def test_sequence_mistakes_are_refused_naming_what_to_do(server):
    """Every misuse answers 400 (429 when the slots are full) with what to do, and leaves the
    server's sequences as they were."""
    rest = httpclient.InferenceServerClient(server.http.removeprefix("http://"))
    x = np.ones((1, 4), np.float32)
    assert "400" in (e := _error(lambda: _infer(rest, "average", {"x": x}))) and "sequence_id" in e
    assert "not live" in _error(lambda: _infer(rest, "average", {"x": x}, sequence_id=5))
    e = _error(lambda: _infer(rest, "digits", {"x": np.zeros((1, 1, 8, 8), np.float32)}, sequence_id=5))
    assert "keeps no state" in e
    e = _error(lambda: _infer(rest, "average", {"x": x, "h": x}, sequence_id=5, sequence_start=True))
    assert "leave the state inputs out" in e
    _infer(rest, "average", {"x": x}, sequence_id=6, sequence_start=True)
    e = _error(lambda: _infer(rest, "average", {"x": np.ones((2, 4), np.float32)}, sequence_id=6))
    assert "holds one row (one stream), and this one has 2" in e
    _infer(rest, "average", {"x": x}, sequence_id=6, sequence_end=True)
    assert "not live" in _error(lambda: _infer(rest, "average", {"x": x}, sequence_id=6))
    # four slots (--max-sequences 4): a fifth live sequence waits for one to end
    for key in range(10, 14):
        _infer(rest, "average", {"x": x}, sequence_id=key, sequence_start=True)
    e = _error(lambda: _infer(rest, "average", {"x": x}, sequence_id=14, sequence_start=True))
    assert e.startswith("429") and "all 4 sequence slots" in e
    _infer(rest, "average", {"x": x}, sequence_id=10, sequence_end=True)
    _infer(rest, "average", {"x": x}, sequence_id=14, sequence_start=True, sequence_end=True)
    for key in range(11, 14):
        _infer(rest, "average", {"x": x}, sequence_id=key, sequence_end=True)


def test_a_sequence_whose_version_was_replaced_is_told_to_start_again(stream_repo, tmp_path):
    """Hot reload replaces version 1 by version 2 while a sequence runs on 1: its next call is a 400
    naming the version and saying to start again, and a new sequence runs on version 2."""
    root = tmp_path / "repo"
    shutil.copytree(stream_repo / "average" / "1", root / "average" / "1")
    running = start_server(root, tmp_path, "--frontends", "0")
    try:
        client = httpclient.InferenceServerClient(running.http.removeprefix("http://"))
        x = np.ones((1, 4), np.float32)
        assert (
            _infer(client, "average", {"x": x}, sequence_id=1, sequence_start=True).get_response()["model_version"]
            == "1"
        )
        shutil.copytree(root / "average" / "1", root / "average" / "2")
        shutil.rmtree(root / "average" / "1")
        running.wait_for(
            lambda: client.get_model_metadata("average")["versions"] == ["2"], what="version 2 alone to serve"
        )
        refused = _error(lambda: _infer(client, "average", {"x": x}, sequence_id=1))
        assert "ran on version 1, which is no longer served" in refused and "start it again" in refused
        again = _infer(client, "average", {"x": x}, sequence_id=1, sequence_start=True, sequence_end=True)
        assert again.get_response()["model_version"] == "2"
    finally:
        stop_server(running)


def test_behind_a_balancer_routing_by_a_header_each_call_of_a_sequence_must_carry_its_id(stream_repo, tmp_path):
    """`--sequence-header x-session-id` (a load balancer in front hashes it to choose the replica):
    a sequence's call that carries its id there is answered, over REST and gRPC and through a front
    end; one without it, or with another id, is refused 400 / INVALID_ARGUMENT naming the header,
    since another replica would not hold its state; a call outside any sequence needs none."""
    root = tmp_path / "repo"
    shutil.copytree(stream_repo / "average", root / "average")
    shutil.copytree(stream_repo / "digits", root / "digits")
    running = start_server(root, tmp_path, "--frontends", "1", "--sequence-header", "X-Session-Id")
    try:
        x = np.ones((1, 4), np.float32)
        for module, address in ((httpclient, running.http), (grpcclient, running.grpc)):
            client = module.InferenceServerClient(address.removeprefix("http://"))
            routed = _infer(
                client, "average", {"x": x}, module, sequence_id=7, sequence_start=True, headers={"x-session-id": "7"}
            )
            np.testing.assert_allclose(routed.as_numpy("y"), 2 * (0.5 * 0.25 + x))
            for headers in ({}, {"x-session-id": "8"}):
                call = functools.partial(_infer, client, "average", {"x": x}, module, sequence_id=7, headers=headers)
                refused = _error(call)
                assert "without its id in the 'x-session-id' header" in refused, refused
                assert "400" in refused or "INVALID_ARGUMENT" in refused, refused
            _infer(client, "average", {"x": x}, module, sequence_id=7, sequence_end=True, headers={"x-session-id": "7"})
            state = {"x": x, "h": np.zeros((1, 4), np.float32)}
            np.testing.assert_allclose(_infer(client, "average", state, module).as_numpy("y"), 2 * x)
    finally:
        stop_server(running)


# -- SequenceStates on its own: reclaiming, order, ends -------------------------------------------
class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_idle_sequence_is_reclaimed_for_a_new_one_and_told_to_start_again():
    import asyncio

    from unideploy.server.sequences import SequenceControl, SequenceStates, TooManySequences

    clock = _Clock()
    states = SequenceStates(1, idle_s=10.0, clock=clock)

    async def scenario() -> None:
        async with states.call("m", SequenceControl(1, start=True), "1") as sequence:
            sequence.state = {"h": np.ones(2)}
        clock.now = 5.0  # not idle long enough: the only slot stays taken
        with pytest.raises(TooManySequences, match="all 1 sequence slots"):
            async with states.call("m", SequenceControl(2, start=True), "1"):
                pass
        clock.now = 11.0  # idle for 11 s: its slot goes to the new sequence
        async with states.call("m", SequenceControl(2, start=True), "1"):
            pass
        with pytest.raises(Exception, match="not live .* idle for more than 10 s"):
            states.version_of("m", SequenceControl(1))

    asyncio.run(scenario())


def test_a_sequences_calls_run_one_after_another_and_a_call_after_its_end_is_refused():
    """A call waits for the one before it (the state it needs is that call's); one that waited
    behind the ending call finds the sequence gone and is told so, not run on a fresh state."""
    import asyncio

    from unideploy.errors import InputError
    from unideploy.server.sequences import SequenceControl, SequenceStates

    states = SequenceStates(4, idle_s=60.0)
    order: list[str] = []

    async def scenario() -> None:
        async with states.call("m", SequenceControl("s", start=True), "1"):
            pass
        first_in = asyncio.Event()
        release = asyncio.Event()

        async def ending() -> None:
            async with states.call("m", SequenceControl("s", end=True), "1"):
                order.append("end")
                first_in.set()
                await release.wait()

        async def late() -> None:
            await first_in.wait()
            try:
                async with states.call("m", SequenceControl("s"), "1"):
                    order.append("late ran")
            except InputError as exc:
                order.append(f"late refused: {exc.message}")

        tasks = [asyncio.create_task(ending()), asyncio.create_task(late())]
        await first_in.wait()
        await asyncio.sleep(0)  # let the late call reach the lock
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert order[0] == "end" and order[1].startswith("late refused") and "ended before this call" in order[1]
    assert len(states) == 0


def test_sequence_parameters_are_read_as_tritons_clients_send_them():
    from unideploy.errors import InputError
    from unideploy.server.sequences import SequenceControl, sequence_control

    assert sequence_control({}) is None and sequence_control({"sequence_id": 0}) is None
    assert sequence_control({"sequence_id": "", "sequence_start": False}) is None
    assert sequence_control({"sequence_id": 3, "sequence_start": True}) == SequenceControl(3, True, False)
    assert sequence_control({"sequence_id": "a", "sequence_end": True}) == SequenceControl("a", False, True)
    for bad, words in [
        ({"sequence_start": True}, "without a sequence_id"),
        ({"sequence_id": 1.5}, "integer or a string"),
        ({"sequence_id": True}, "integer or a string"),
        ({"sequence_id": -1}, "out of range"),
        ({"sequence_id": "x" * 300}, "300 characters"),
        ({"sequence_id": 1, "sequence_end": "yes"}, "true or false"),
    ]:
        with pytest.raises(InputError, match=words):
            sequence_control(bad)


def test_a_start_that_waited_behind_the_end_of_the_same_id_starts_afresh():
    """A client that reuses a sequence id at once (perf_analyzer does) can have its next start reach
    the server while the ending call of the id's last sequence still runs: the start waits for it
    and then begins a new sequence, where it was refused as "ended before this call of it ran"."""
    import asyncio

    from unideploy.server.sequences import SequenceControl, SequenceStates

    states = SequenceStates(4, idle_s=60.0)
    seen: list[object] = []

    async def scenario() -> None:
        async with states.call("m", SequenceControl(9, start=True), "1") as first:
            first.state = {"h": np.ones(2)}
        ending_in, release = asyncio.Event(), asyncio.Event()

        async def ending() -> None:
            async with states.call("m", SequenceControl(9, end=True), "1"):
                ending_in.set()
                await release.wait()

        async def restart() -> None:
            await ending_in.wait()
            async with states.call("m", SequenceControl(9, start=True), "2") as sequence:
                seen.append((sequence.version, dict(sequence.state)))

        tasks = [asyncio.create_task(ending()), asyncio.create_task(restart())]
        await ending_in.wait()
        await asyncio.sleep(0)  # the restart reaches the lock and waits there
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert seen == [("2", {})] and len(states) == 1 and states.version_of("m", SequenceControl(9)) == "2"


def test_a_sequence_header_that_is_no_header_name_or_beside_ray_is_refused(tmp_path):
    """`--sequence-header` must be an HTTP header name, and does not apply under `--ray`, whose proxy
    hashes its own session header: both refused in one line before anything starts."""
    from console import assert_one_line_error, deploy

    (tmp_path / "repo").mkdir()
    assert_one_line_error(
        deploy("serve", tmp_path / "repo", "--sequence-header", "bad header"), 2, "sequence_header: String should match"
    )
    if importlib.util.find_spec("ray") is not None:
        refused = deploy("serve", tmp_path / "repo", "--ray", "--sequence-header", "x-id")
        assert_one_line_error(
            refused, 2, "--sequence-header does not apply with --ray: .*RAY_SERVE_SESSION_ID_HEADER_KEY"
        )
