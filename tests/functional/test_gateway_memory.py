"""The gateway's memory is bounded and stated, whatever the models (docs/operations.md, "The
gateway's memory"): a model taking 4 MiB requests changes neither HAProxy's buffer nor the
connections it accepts; slow senders of large bodies hold at most GATEWAY_LARGE_BODIES of
Triton's slots while small models keep being served; and connections held open with partial
bodies cost HAProxy no more than the figure stated for the budget.

Natively, `tritonstack serve` on a copy of the checkout with `large` added (1 MiB of FP32 a row,
batches of 4) and a 64 MiB budget, so that the test can open more connections than it allows.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

from tests import own_models
from tests.functional.test_own_models import tritonstack
from tests.functional.test_serve import serve_project
from tests.support import copy_project, embeddings
from tritonstack.core import limits
from tritonstack.core.settings import load

pytestmark = pytest.mark.timeout(600)

BUDGET_MB = 64
ROWS = 4


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = copy_project(tmp_path_factory.mktemp("project") / "tritonstack")
    model = own_models.large_input(tmp_path_factory.mktemp("large") / "large.onnx")
    stack_env = root / "stack.env"
    stack_env.write_text(
        stack_env.read_text().replace("GATEWAY_MEMORY_MB=1024", f"GATEWAY_MEMORY_MB={BUDGET_MB}")
    )
    added = tritonstack(root, "add-model", str(model), "--name", "large",
                        "--max-batch-size", str(ROWS))  # fmt: skip
    assert added.returncode == 0, added.stderr
    return root


@pytest.fixture(scope="module")
def served(project):
    with serve_project(project) as served:
        haproxy = next(
            p for p in psutil.Process(served["process"].pid).children(recursive=True)
            if p.name() == "haproxy"
        )  # fmt: skip
        yield {"http": address(served["http"]), "metrics": address(served["gateway_metrics"]),
               "haproxy": haproxy}  # fmt: skip


def address(host_port: str) -> tuple[str, int]:
    host, port = host_port.rsplit(":", 1)
    return host, int(port)


def project_limits(project: Path) -> limits.Limits:
    return limits.limits(project / "model_repository", load(project / "stack.env"))


def large_request(rows: int = ROWS) -> tuple[bytes, bytes, np.ndarray]:
    """A binary request for `large`: its JSON header and its tensor bytes."""
    pixels = np.random.default_rng(5).uniform(-1, 1, (rows, own_models.LARGE_WIDTH))
    pixels = pixels.astype(np.float32)
    header = json.dumps({
        "inputs": [{"name": "pixels", "shape": list(pixels.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": pixels.nbytes}}],
        "outputs": [{"name": "mean", "parameters": {"binary_data": False}}],
    }).encode()  # fmt: skip
    return header, pixels.tobytes(), pixels


def open_request(address, path: str, headers: dict[str, str], first: bytes) -> socket.socket:
    """A connection that sent a request's head and the first bytes of its body, then waits."""
    sock = socket.create_connection(address, timeout=10)
    head = f"POST {path} HTTP/1.1\r\nHost: gateway\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()
    )
    sock.sendall(head.encode() + b"\r\n" + first)
    return sock


def answer_of(sock: socket.socket, timeout: float) -> bytes:
    """What the gateway answered so far on `sock` (empty: nothing within `timeout`)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(65536)
    except (TimeoutError, OSError):
        return b""


def classifier_ok(address) -> bool:
    client = httpclient.InferenceServerClient(f"{address[0]}:{address[1]}", network_timeout=10)
    try:
        tensor = httpclient.InferInput("features", [1, 128], "FP32")
        tensor.set_data_from_numpy(embeddings(1, seed=1))
        result = client.infer("classifier", [tensor])
        return result.as_numpy("class").shape == (1, 2)
    finally:
        client.close()


def test_a_large_model_leaves_the_buffer_and_the_connections_as_the_budget_says(project):
    lim = project_limits(project)
    environment = (project / "gateway" / "limits.env").read_text()
    assert f"GATEWAY_BUFSIZE={limits.BUFSIZE}\n" in environment
    assert f"GATEWAY_HTTP_CONNECTIONS={lim.http_connections}\n" in environment
    assert lim.worst_case_bytes <= BUDGET_MB * 2**20
    large = next(m for m in lim.models if m.model == "large")
    assert large.binary_body > 4 * 2**20 and large.gateway_json_body == limits.BUFFERED_BODY


def test_a_large_binary_request_streams_through_and_large_json_is_told_to_go_binary(served):
    """Past the buffer, a binary request is checked on its JSON header and streamed: Triton
    answers it as onnxruntime would (the mean of each row); a JSON body of that size is a 413
    naming binary tensors; a binary body whose tensor bytes are short is Triton's 400."""
    header, data, pixels = large_request()
    client = httpclient.InferenceServerClient("{}:{}".format(*served["http"]),
                                              network_timeout=60)  # fmt: skip
    try:
        tensor = httpclient.InferInput("pixels", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels, binary_data=True)
        result = client.infer("large", [tensor]).as_numpy("mean")
    finally:
        client.close()
    np.testing.assert_allclose(result[:, 0], pixels.mean(axis=1), rtol=1e-5, atol=1e-6)
    too_big = open_request(served["http"], "/v2/models/large/infer",
                           {"Content-Length": str(limits.BUFFERED_BODY + 1),
                            "Content-Type": "application/json"}, b"")  # fmt: skip
    answer = answer_of(too_big, 10).decode(errors="replace")
    too_big.close()
    assert answer.startswith("HTTP/1.1 413") and "binary tensors" in answer, answer
    short = open_request(served["http"], "/v2/models/large/infer",
                         {"Content-Length": str(len(header) + len(data) - 4096),
                          "Inference-Header-Content-Length": str(len(header))},
                         header + data[:-4096])  # fmt: skip
    answer = answer_of(short, 30).decode(errors="replace")
    short.close()
    assert answer.startswith("HTTP/1.1 400"), answer


def test_slow_large_bodies_hold_a_bounded_share_and_small_models_keep_serving(served, project):
    """Many clients send a large body's first 300 kB and stall: GATEWAY_LARGE_BODIES of them
    are streamed to Triton (holding that many of its slots), every other one is refused at once
    with a 503, and the classifier answers throughout."""
    cap = load(project / "stack.env").GATEWAY_LARGE_BODIES
    header, data, _ = large_request()
    headers = {"Content-Length": str(len(header) + len(data)),
               "Inference-Header-Content-Length": str(len(header))}  # fmt: skip
    slow = [open_request(served["http"], "/v2/models/large/infer", headers,
                         header + data[:300_000]) for _ in range(3 * cap)]  # fmt: skip
    try:
        # Refusals come at once; a streamed body hears nothing, which only a wait can show.
        time.sleep(3)
        answers = [answer_of(sock, 0.05) for sock in slow]
        refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
        waiting = [a for a in answers if not a]
        assert len(refused) == 2 * cap and len(waiting) == cap, answers
        assert b"streaming as many large bodies" in refused[0]
        assert all(classifier_ok(served["http"]) for _ in range(20))
    finally:
        for sock in slow:
            sock.close()


def current_sessions(metrics: tuple[str, int], proxy: str) -> int:
    """HAProxy's exporter: the connections a frontend holds now."""
    with urllib.request.urlopen("http://{}:{}/metrics".format(*metrics), timeout=10) as answer:
        text = answer.read().decode()
    found = re.search(
        rf'^haproxy_frontend_current_sessions{{proxy="{proxy}"}} (\S+)$', text, re.MULTILINE
    )
    assert found, "no haproxy_frontend_current_sessions for " + proxy
    return int(float(found[1]))


def test_connections_held_with_partial_bodies_cost_at_most_the_stated_figure(served, project):
    """Twice as many connections as the budget allows each send all but the last byte of the
    classifier's largest JSON body, then stall: HAProxy holds GATEWAY_HTTP_CONNECTIONS of them
    (the rest wait in the kernel's queue), its memory grows by at most what the budget states
    for them, and once it has cut the stalled ones (5 s without the whole body) requests pass
    again."""
    lim = project_limits(project)
    haproxy = served["haproxy"]
    before = haproxy.memory_info().rss
    body = next(m for m in lim.models if m.model == "classifier").gateway_json_body
    held = []
    try:
        for _ in range(2 * lim.http_connections - 4):
            sock = open_request(served["http"], "/v2/models/classifier/infer",
                                {"Content-Length": str(body)}, b"")  # fmt: skip
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # a queued one takes what the kernel holds
                sock.send(b"{" + b" " * (body - 2))
            held.append(sock)
        time.sleep(1)
        sessions = current_sessions(served["metrics"], "http")
        grown = haproxy.memory_info().rss - before
        stated = lim.http_connections * (2 * lim.bufsize + limits.CONNECTION_OVERHEAD)
        print(f"HAProxy held {sessions} of {len(held)} connections; its RSS grew by "
              f"{grown / 2**20:.1f} MiB (stated: at most {stated / 2**20:.1f} MiB)")  # fmt: skip
        assert sessions == lim.http_connections
        assert grown <= stated
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(Exception):
            if classifier_ok(served["http"]):
                break
        assert time.monotonic() < deadline, "the gateway did not serve again"
        time.sleep(0.5)
