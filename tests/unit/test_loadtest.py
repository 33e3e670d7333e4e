"""Load testing, the pure parts: the load shapes, the gates, the LLM's streamed answers
(tritonstack.clients.streaming, which Locust's user and `tritonstack generate` share), and the CLI's
mistakes as one line. tests/functional/test_loadtest.py runs Locust against the real
server, tests/functional/test_loadtest_llm.py the LLM user against the real vLLM engine."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import subprocess
import sys

import pytest

from tests.support import ROOT
from tritonstack.clients import streaming as generation
from tritonstack.core import contract


def load(name: str):
    """A module of loadtest/ under a private name (gates and shapes import no Locust)."""
    path = ROOT / "loadtest" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"loadtest_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


gates = load("gates")
shapes = load("shapes")


# --- the files themselves ------------------------------------------------------------------------


# --- shapes and gates, as pure functions ---------------------------------------------------------


def test_step_shape_ramps_in_four_steps_then_stops():
    users = [shapes.step(t, 8, 8.0, 12.0)[0] for t in (0, 2.9, 3, 6, 9, 11.9)]
    assert users == [2, 2, 4, 6, 8, 8]
    assert shapes.step(12.0, 8, 8.0, 12.0) is None
    assert shapes.step(4 * shapes.STEP_SECONDS, 8, 8.0, None) is None  # default length


def test_spike_shape_bursts_in_the_middle_and_comes_back():
    stages = [shapes.spike(t, 40, 2.0, 10.0) for t in (0, 3.9, 4, 5.9, 6, 9.9)]
    assert [users for users, _ in stages] == [10, 10, 40, 40, 10, 10]
    assert all(rate >= 40 for _, rate in stages)  # the burst arrives within a second
    assert shapes.spike(10.0, 40, 2.0, 10.0) is None


def test_soak_and_constant_hold_the_users():
    assert shapes.soak(29 * 60, 16, 4.0, None) == (16, 4.0)
    assert shapes.soak(30 * 60, 16, 4.0, None) is None
    assert shapes.constant(1e6, 16, 4.0, None) == (16, 4.0)  # plain Locust: until stopped
    assert shapes.constant(10, 16, 4.0, 10) is None


def test_gates_name_the_gate_and_the_value():
    measured = {"requests": 100, "fail_ratio": 0.25, "p99_ms": 12}
    assert gates.evaluate(measured, None, None) == []
    assert gates.evaluate(measured, 20, 0.5) == []
    assert gates.evaluate(measured, 5, 0.1) == [
        "p99 12 ms > --max-p99-ms 5",
        "fail ratio 0.2500 > --max-fail-ratio 0.1",
    ]
    assert gates.evaluate({**measured, "requests": 0}, 5, None) == ["no request completed"]


def test_llm_gates_name_the_timing_and_the_value():
    measured = {
        "requests": 10,
        "fail_ratio": 0.0,
        "p99_ms": 900,
        "ttft": {"count": 10, "p50_ms": 30, "p99_ms": 80},
        "itl": {"count": 630, "p50_ms": 4, "p99_ms": 12},
    }
    assert gates.evaluate(measured, None, 0, 100, 20) == []
    assert gates.evaluate(measured, None, None, 50, 10) == [
        "TTFT p99 80 ms > --max-ttft-p99-ms 50",
        "ITL p99 12 ms > --max-itl-p99-ms 10",
    ]
    # a classifier run has no timings: a TTFT gate there cannot pass silently
    classifier = {"requests": 10, "fail_ratio": 0.0, "p99_ms": 9, "ttft": None, "itl": None}
    assert gates.evaluate(classifier, None, None, 50) == [
        "no TTFT measured for --max-ttft-p99-ms (only the LLM user reports it)"
    ]


def events(*payloads: str) -> list[bytes]:
    """A server-sent events body as http.client's line reader returns it."""
    return [line for p in payloads for line in (f"data: {p}\r\n".encode(), b"\r\n")]


def streamed(lines: list[bytes], start: float = 10.0, step: float = 0.01):
    stream = generation.Stream(start)
    for i, line in enumerate(lines):
        stream.feed(line, start + 0.1 + step * (i // 2))
    return stream


TOKEN = '{"model_name":"llm","text_output":"ab","num_output_tokens":1,"finish_reason":"None"}'
LAST = '{"model_name":"llm","text_output":"c","num_output_tokens":1,"finish_reason":"length"}'


def test_a_streamed_answer_is_timed_per_token_event():
    stream = streamed([*events(TOKEN, TOKEN, LAST), b": a comment\r\n"])
    assert (stream.text, stream.events, stream.output_tokens) == ("ababc", 3, 3)
    assert stream.finish_reason == "length"
    assert stream.ttft_s == pytest.approx(0.1)
    assert stream.itl_s == pytest.approx([0.01, 0.01])
    stream.check(max_tokens=3, ignore_eos=True)
    # an event without a token (an empty final one) is no inter-token gap
    empty = '{"text_output":"","num_output_tokens":0,"finish_reason":"length"}'
    assert streamed(events(TOKEN, TOKEN, empty)).itl_s == pytest.approx([0.01])


@pytest.mark.parametrize(
    ("lines", "max_tokens", "ignore_eos", "message"),
    [
        (events(TOKEN, TOKEN), 2, True, "without a finish_reason (None)"),
        (events(TOKEN, LAST), 3, True, "2 tokens, finish_reason length: expected 3"),
        (events(TOKEN, LAST.replace("length", "stop")), 2, True, "expected 2 (ignore_eos)"),
        (events(LAST.replace('"c"', '""')), 1, False, "1 events but no text"),
        ([b"\r\n"], 4, False, "the stream ended without an event"),
        (events(TOKEN, "not json"), 2, True, "event 2 is not JSON: 'not json'"),
        (events('{"error":"engine died"}'), 2, True, "stopped the stream: engine died"),
        (events('{"text_output":1}'), 2, True, "event 1 has no text_output string"),
        (events("[1]"), 2, True, "event 1 is not a JSON object"),
    ],
)
def test_a_wrong_answer_fails_naming_what_is_wrong(lines, max_tokens, ignore_eos, message):
    with pytest.raises(generation.AnswerError, match=re.escape(message)):
        streamed(lines).check(max_tokens, ignore_eos)


def test_an_answer_of_end_of_sequence_tokens_only_may_have_no_text():
    silent = TOKEN.replace('"ab"', '""')
    streamed(events(silent, LAST.replace('"c"', '""'))).check(max_tokens=2, ignore_eos=True)
    stopped = LAST.replace('"c"', '""').replace("length", "stop")
    streamed(events(stopped)).check(max_tokens=8, ignore_eos=False)


def test_an_answer_that_stops_early_passes_only_without_ignore_eos():
    stream = streamed(events(TOKEN, LAST.replace("length", "stop")))
    stream.check(max_tokens=8, ignore_eos=False)
    with pytest.raises(generation.AnswerError):
        stream.check(max_tokens=8, ignore_eos=True)


def test_the_request_asks_for_what_the_checks_read():
    body = json.loads(generation.request_body("Hi", 16, ignore_eos=True))
    assert body == {
        "text_input": "Hi",
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "exclude_input_in_output": True,
        "return_num_output_tokens": True,
        "return_finish_reason": True,
    }
    route = generation.ROUTE
    assert route == f"/v2/models/{contract.LLM_MODEL}/generate_stream"
    # every request a prompt of its own: no answer comes from vLLM's prefix cache
    rng = random.Random(0)
    prompts = {generation.unique("Hi", rng) for _ in range(100)}
    assert len(prompts) == 100 and all(p.endswith("] Hi") for p in prompts)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "loadtest", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--duration", "3x"], "--duration '3x'"),
        (["--max-fail-ratio", "2"], "--max-fail-ratio 2"),
        (["--max-ttft-p99-ms", "50"], "--max-ttft-p99-ms: the LLM's gates; add --llm"),
        (["--llm", "--max-tokens", "0"], "--max-tokens 0: from 1 to 1024"),
        (["--llm", "--host", "127.0.0.1:1"], "cannot reach Triton at 127.0.0.1:1"),
        (["--host", "127.0.0.1:1"], "cannot reach Triton at 127.0.0.1:1"),
    ],
)
def test_cli_mistakes_are_one_line(args, fragment):
    result = run_cli(*args)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert fragment in result.stderr
