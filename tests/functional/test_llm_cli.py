"""The LLM as a user meets it: `tritonstack serve --llm`, then `tritonstack generate` through the
gateway, then SIGTERM with nothing left running (the vLLM engine's own processes included)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from tests.functional.test_llm import post
from tests.functional.test_serve import start_serve, wait_for_line, wait_gone
from tests.support import REPOSITORY, wait_routed
from tritonstack.core.contract import LLM_MODEL


def generate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "generate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_generate_streams_the_greedy_answer_to_stdout_and_its_numbers_to_stderr(llm_triton):
    status, whole = post(
        llm_triton,
        "generate",
        {
            "text_input": "Tell me",
            "max_tokens": 16,
            "temperature": 0,
            "exclude_input_in_output": True,
        },
    )
    assert status == 200, whole
    url = f"http://{llm_triton.http_url}"
    result = generate("Tell me", "--url", url, "--max-tokens", "16")
    assert result.returncode == 0, result.stderr
    assert result.stdout == whole["text_output"] + "\n"
    assert "16 tokens, finish_reason length" in result.stderr
    assert generate("Tell me", "--url", url, "--max-tokens", "16", "--no-stream").stdout == (
        result.stdout
    )


def test_generate_failures_are_one_line(llm_triton):
    url = f"http://{llm_triton.http_url}"
    for args, words in (
        (["x", "--url", url, "--max-tokens", "0"], "--max-tokens 0: give at least 1"),
        (["x", "--url", url, "--model", "classifier"], "answered 400"),
        (["x", "--url", "http://127.0.0.1:1"], "is `tritonstack serve --llm` running?"),
    ):
        result = generate(*args)
        assert result.returncode == 1, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], result.stderr


def engine_processes(root: psutil.Process) -> list[psutil.Process]:
    return [p for p in root.children(recursive=True) if p.name().startswith("VLLM")]


def test_serve_llm_serves_it_through_the_gateway_and_stops_with_nothing_left(tmp_path):
    """Also: the vLLM engine killed under it (the stub lives on, answering errors) is found by
    the supervisor's one-token probe and Triton is restarted; and the stop after generations
    leaves no crash in Triton's log (the 2.51 stub crashed freeing vLLM's metrics at exit)."""
    log = tmp_path / "triton.log"
    process, ports = start_serve(REPOSITORY, "--llm", "--log-file", str(log))
    gateway = f"http://127.0.0.1:{ports[0]}"
    try:
        lines = wait_for_line(process, "Ctrl-C stops the server", timeout=240)
        text = "\n".join(lines)
        assert "serving the tiny random-weight Llama" in text, text
        assert f"ready: classifier, classify, pipeline, postprocess, {LLM_MODEL}" in text, text
        engines = engine_processes(psutil.Process(process.pid))
        assert engines, "no vLLM engine process under tritonstack serve"
        result = generate("Through the gateway", "--url", gateway, "--max-tokens", "8")
        assert result.returncode == 0, result.stderr
        assert "8 tokens" in result.stderr

        for engine in engines:
            engine.kill()
        lines = wait_for_line(process, "recovered:", timeout=240)
        found = [line for line in lines if line.startswith(("dead:", "deep probe failed"))]
        assert found and LLM_MODEL in found[0], found or lines[-20:]
        # Ready again in Triton is not yet routed: the gateway sees it at its next check.
        waited = wait_routed(gateway.removeprefix("http://"), f"/v2/models/{LLM_MODEL}/ready")
        print(f"\nLLM routed by the gateway again {waited:.1f} s after 'recovered'")
        result = generate("Again", "--url", gateway, "--max-tokens", "4")
        assert result.returncode == 0, result.stderr
        engines = engine_processes(psutil.Process(process.pid))

        logged_before_stop = log.stat().st_size
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        took = time.monotonic() - started
        assert took < 20, f"serve --llm took {took:.1f} s to stop"
        assert not wait_gone([p.pid for p in engines], timeout=5), "vLLM processes left running"
        with open(log, "rb") as handle:
            handle.seek(logged_before_stop)
            stop_log = handle.read().decode(errors="replace")
        assert "Segfault" not in stop_log, stop_log[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_serve_llm_with_a_broken_model_json_says_which_file(tmp_path):
    repository = tmp_path / "llm_repository"
    (repository / LLM_MODEL / "1").mkdir(parents=True)
    (repository / LLM_MODEL / "1" / "model.json").write_text("{not json")
    result = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "serve", "--llm", "--no-gateway",
         "--llm-repository", str(repository)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "model.json: not a JSON object of engine arguments" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
