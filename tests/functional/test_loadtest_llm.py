"""The LLM's Locust user (llm_stream) against the real vLLM engine behind the embedded Triton,
directly and through the gateway: valid answers, time to first token and inter-token latency
measured and exported, and the gates on them passing or failing with one line.

Locust runs as a subprocess, as in tests/functional/test_loadtest.py; counts are compared,
never absolute latencies.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from tests.functional.test_loadtest import client_value, exposition
from tests.support import ROOT
from tests.unit.test_loadtest import gates, run_cli
from tritonstack.core.contract import LLM_MODEL
from tritonstack.load.loadtest import LLM_USER_TYPE

MAX_TOKENS = 16
#: docs/loadtesting.md's LLM run: limits a tiny model on two busy cores meets with room.
DOCS_COMMAND = (
    f"tritonstack loadtest --llm --users 4 --duration 6s --max-tokens {MAX_TOKENS} "
    "--max-ttft-p99-ms 2000 --max-itl-p99-ms 500 --max-fail-ratio 0"
)
# The session's LLM Triton starts in about a minute; each run here lasts a few seconds.
pytestmark = pytest.mark.timeout(600)


def engine_counts(triton) -> tuple[float, float]:
    """(answers whose first token vLLM timed, tokens it generated): Triton's vllm:* metrics."""
    with urllib.request.urlopen(triton.metrics_url, timeout=10) as answer:
        samples = exposition(answer.read().decode())
    labels = {"model": LLM_MODEL, "version": "1"}
    return (
        client_value(samples, "vllm:time_to_first_token_seconds_count", **labels),
        client_value(samples, "vllm:generation_tokens_total", **labels),
    )


def test_documented_llm_run_streams_valid_answers_and_passes_its_gates(llm_triton, tmp_path):
    """docs/loadtesting.md's command, against the session's LLM Triton."""
    assert DOCS_COMMAND in (ROOT / "docs" / "loadtesting.md").read_text()
    answers_before, tokens_before = engine_counts(llm_triton)
    args = DOCS_COMMAND.split()[2:]
    done = run_cli(*args, "--host", llm_triton.http_url, "--results", str(tmp_path))
    answers_after, tokens_after = engine_counts(llm_triton)
    log = (tmp_path / "locust.log").read_text()[-3000:]
    result = json.loads((tmp_path / "verdict.json").read_text())

    # Every answer streamed, validated (ignore_eos: exactly MAX_TOKENS tokens, finish_reason
    # length) and within every gate.
    assert done.returncode == 0 and result["failed"] == [], done.stderr + log
    assert result["failures"] == 0 and result["requests"] >= 4, log
    requests, ttft, itl = result["requests"], result["ttft"], result["itl"]
    # One time to first token per answer, and inter-token gaps within each: a stream that came
    # in one piece would have none, one event per token MAX_TOKENS - 1 per answer.
    assert ttft["count"] == requests
    assert requests <= itl["count"] <= requests * (MAX_TOKENS - 1)
    assert 0 < ttft["p50_ms"] <= ttft["p99_ms"]
    assert result["p50_ms"] <= result["p99_ms"]  # the answers' own totals, without the timings
    # The engine behind Triton did the work (requests cut at the end of the run count there too).
    assert answers_after - answers_before >= requests
    assert tokens_after - tokens_before >= requests * MAX_TOKENS

    # The exporter counts answers as requests, and the timings in histograms of their own.
    final = exposition((tmp_path / "exporter.prom").read_text())
    labels = {"user_type": LLM_USER_TYPE, "model": LLM_MODEL}
    assert client_value(final, "tritonstack_client_requests_total", **labels) == requests
    assert client_value(final, "tritonstack_client_failures_total", **labels) == 0
    for name, count in (
        ("tritonstack_client_llm_request_duration_seconds_count", requests),
        ("tritonstack_client_llm_time_to_first_token_seconds_count", ttft["count"]),
        ("tritonstack_client_llm_inter_token_latency_seconds_count", itl["count"]),
        ("tritonstack_client_llm_output_tokens_total", requests * MAX_TOKENS),
    ):
        assert client_value(final, name, **labels) == count, name
    # ... and keeps them out of the classifier's latency histogram.
    assert client_value(final, "tritonstack_client_request_duration_seconds_count") == 0


def test_cli_through_the_gateway_fails_an_impossible_ttft_gate_with_one_line(llm_gateway, tmp_path):
    started = time.monotonic()
    result = run_cli(
        "--llm", "--host", llm_gateway.http_url, "--users", "2", "--duration", "3s",
        "--max-tokens", str(MAX_TOKENS), "--max-fail-ratio", "0",
        "--max-ttft-p99-ms", "0.001", "--max-itl-p99-ms", "60000", "--results", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == gates.GATE_FAILED_EXIT_CODE, result.stderr
    # Locust rounds times below 100 ms to whole milliseconds: the p99 is at least 1 ms.
    assert re.fullmatch(r"gate failed: TTFT p99 \d+ ms > --max-ttft-p99-ms 0\.001\n", result.stderr)
    first, summary = result.stdout.strip().splitlines()[-2:]
    assert first == (
        f"loadtest: {LLM_MODEL} generate_stream, 2 users, {MAX_TOKENS} tokens per answer, "
        f"constant for 3 s against {llm_gateway.http_url}"
    )
    assert re.match(
        r"\d+ requests, 0 failed \(0\.00%\), [\d.]+ req/s, p50 \d+ ms, p95 \d+ ms, p99 \d+ ms; "
        r"time to first token p50 \d+ ms, p99 \d+ ms \(\d+ answers\); "
        r"inter-token latency p50 \d+ ms, p99 \d+ ms \(\d+ gaps\); results in ",
        summary,
    ), summary
    assert time.monotonic() - started < 60
