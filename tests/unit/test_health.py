"""The health check (tritonstack/core/health.py, the image's healthcheck.py) against a stand-in
Triton for the answers this machine cannot make a real one give on demand: load shedding (503), a
dead stub behind a 503, a wrong answer, an answer that never comes. The real server's side is in
tests/functional (test_compose.py, test_reliability.py: a killed stub, a slow model)."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.support import ROOT
from tritonstack.core import health

HEALTHCHECK = ROOT / "tritonstack" / "core" / "health.py"
#: A model of the stand-in: two inputs (one INT64), an output with labels and one without.
METADATA = {
    "name": "ranker",
    "inputs": [
        {"name": "query", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "bucket", "datatype": "INT64", "shape": [-1, 2]},
    ],
    "outputs": [
        {"name": "probs", "datatype": "FP32", "shape": [-1, 2]},
        {"name": "logits", "datatype": "FP32", "shape": [-1, 2]},
    ],
}
CONFIG = {"max_batch_size": 8, "output": [{"name": "probs", "label_filename": "labels.txt"}]}
GOOD = {
    "outputs": [
        {"name": "probs", "datatype": "BYTES", "shape": [1, 1], "data": ["0.9:1:high"]},
        {"name": "logits", "datatype": "FP32", "shape": [1, 2], "data": [0.1, 2.3]},
    ]
}


def healthcheck(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


class StandInTriton:
    """Answers metadata and config as Triton does; after `good` healthy inferences it answers
    every inference with `status` and `body`, after `delay` seconds. Records what it was sent."""

    def __init__(self, status: int = 200, body: str = "", delay: float = 0.0, good: int = 0):
        outer = self
        self.requests = 0
        self.bodies: list[dict] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                answer = CONFIG if self.path.endswith("/config") else METADATA
                self.answer(200, answer)

            def do_POST(self) -> None:
                outer.bodies.append(
                    json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                )
                outer.requests += 1
                if outer.requests <= good or status == 200:
                    self.answer(200, GOOD if not body else json.loads(body))
                else:
                    threading.Event().wait(delay)
                    self.answer(status, {"error": body})

            def answer(self, code: int, answer: dict) -> None:
                payload = json.dumps(answer).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first: what the slow case is about

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> StandInTriton:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_healthy_model_is_sent_zeros_shaped_from_its_metadata_four_times():
    with StandInTriton() as server:
        result = healthcheck("--url", server.url, "--model", "ranker")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("healthy: ranker: probs=")
    assert server.requests == 4
    sent = server.bodies[0]
    assert sent["inputs"] == [
        {"name": "query", "shape": [1, 3], "datatype": "FP32", "data": [0.0] * 3},
        {"name": "bucket", "shape": [1, 2], "datatype": "INT64", "data": [0, 0]},
    ]
    # the labelled output through the classification extension, the other as it is
    assert sent["outputs"] == [
        {"name": "probs", "parameters": {"classification": 1}},
        {"name": "logits"},
    ]


def test_the_models_default_to_public_models_then_stack_env(tmp_path):
    assert health.public_models({"PUBLIC_MODELS": "a b"}, tmp_path / "none") == ["a", "b"]
    stack_env = tmp_path / "stack.env"
    stack_env.write_text("# comment\nPUBLIC_MODELS=c d\nGATEWAY_MAXCONN=1\n")
    assert health.public_models({}, stack_env) == ["c", "d"]
    with StandInTriton() as server:
        named = healthcheck("--url", server.url, env={"PUBLIC_MODELS": "ranker", "PATH": ""})
    assert named.returncode == 0 and named.stdout.startswith("healthy: ranker"), named.stderr


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"outputs": [GOOD["outputs"][0]]}, "no logits in the answer"),
        (
            {"outputs": [GOOD["outputs"][0], {**GOOD["outputs"][1], "data": [1.0]}]},
            "logits holds 1 values, the metadata says 2",
        ),
    ],
)
def test_an_answer_short_of_the_metadata_is_dead(answer, reason):
    with StandInTriton(200, json.dumps(answer)) as server:
        result = healthcheck("--url", server.url, "--model", "ranker")
    assert result.returncode == 1
    assert f"unhealthy: ranker: {reason}" in result.stderr


def test_a_busy_server_passes():
    """Load shedding is not death: a 503 (here a queue policy's full queue) passes, with a
    `busy:` line, so neither Docker's healthcheck nor the watchdog restarts a loaded server."""
    full = "Exceeds maximum queue size"
    with StandInTriton(503, full) as server:
        result = healthcheck("--url", server.url, "--model", "ranker", "--model", "ranker")
        assert result.returncode == 0, result.stderr
        assert (
            result.stdout.splitlines()
            == [f"busy: ranker: HTTP 503: {json.dumps({'error': full})}"] * 2
        )
        assert server.requests == 2  # one busy answer is enough to know; no hammering


def test_a_slow_server_is_busy_within_the_deadline():
    """Docker counts a healthcheck that outlives its timeout as failed: whatever the server's
    pace, the check ends by its deadline and calls a slow server busy (exit 0)."""
    with StandInTriton(503, "late", delay=5.0, good=0) as server:
        started = time.monotonic()
        result = healthcheck("--url", server.url, "--model", "ranker", "--deadline", "1.5")
        took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("busy: ranker: no answer within"), result.stdout
    # Python's start included, with every core busy (`make test-unit` runs on all of them): the
    # room Docker's timeout leaves past the deadline in the product (10 - 8 s).
    assert took < 1.5 + 2.0, f"the check took {took:.1f} s"


def test_a_dead_stub_fails_even_behind_a_503():
    """UNAVAILABLE that names a dead stub is death, whatever the status code."""
    dead = "Stub process 'ranker_0_0' is not healthy."
    with StandInTriton(503, dead) as server:
        result = healthcheck("--url", server.url, "--model", "ranker")
    assert result.returncode == 1
    assert "unhealthy: ranker: HTTP 503 for /v2/models/ranker/infer" in result.stderr
    assert dead in result.stderr


def test_no_server_is_dead_and_no_model_named_is_a_usage_error(tmp_path):
    from tritonstack.core.ports import free_ports

    (port,) = free_ports(1)
    result = healthcheck("--url", f"127.0.0.1:{port}", "--model", "ranker")
    assert result.returncode == 1 and "no answer from" in result.stderr
    # As the image runs it, a copy with no stack.env beside it and no PUBLIC_MODELS:
    alone = tmp_path / "healthcheck.py"
    alone.write_text(HEALTHCHECK.read_text())
    bare = subprocess.run(
        [sys.executable, str(alone)], capture_output=True, text=True, timeout=60, env={}
    )
    assert bare.returncode == 2
    assert bare.stderr.strip() == "error: no model to call: pass --model, or set PUBLIC_MODELS"


def test_ready_asks_readiness_only_where_the_serving_name_resolves():
    """--ready (the LLM's check): readiness, no inference; the address comes from
    $TRITONSTACK_SERVING_NAME, this container's among the name's; a server that is gone is
    `not ready` (exit 1), a name that is not this container's one line (exit 2)."""
    with StandInTriton() as server:
        port = server.url.rsplit(":", 1)[1]
        env = {**os.environ, health.SERVING_NAME: "localhost", "TRITON_HTTP_PORT": port}
        result = healthcheck("--ready", "--model", "llm", env=env)
        assert result.returncode == 0, result.stderr
        assert server.requests == 0
    gone = healthcheck("--ready", "--model", "llm", "--url", server.url)
    assert gone.returncode == 1 and gone.stderr.startswith("not ready: llm: no answer")
    stray = healthcheck("--address-of", "no-such-alias.invalid")
    assert stray.returncode == 2 and len(stray.stderr.splitlines()) == 1, stray.stderr
    assert health.serving_address("localhost") == "127.0.0.1"


def test_models_the_launcher_left_out_are_named_without_failing_the_check(tmp_path):
    """A model whose TensorRT plan could not be built is not served; the check says which and
    why, and passes while the others answer (restarting would not build the plan)."""
    status = tmp_path / "launch.json"
    status.write_text(json.dumps({"ranker_trt": "ranker_trt: trtexec failed; full log in x"}))
    env = {**os.environ, health.LAUNCH_STATUS_ENV: str(status)}
    with StandInTriton() as server:
        result = healthcheck("--url", server.url, "--model", "ranker", env=env)
    assert result.returncode == 0, result.stderr
    assert "not served: ranker_trt: ranker_trt: trtexec failed; full log in x" in result.stderr
    assert health.left_out({health.LAUNCH_STATUS_ENV: str(tmp_path / "absent")}) == []
