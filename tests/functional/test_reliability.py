"""Bad days, natively: a crashed Python stub, a request that aborts Triton, locked-down APIs.

The numbers the crash test measures (time to detect, time to recover, requests lost) are printed
and recorded in docs/operations.md.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.functional.test_serve import segments_of, shm_prefix, start_serve, wait_for_line
from tests.support import REPOSITORY, wait_routed
from tritonstack.clients.client import ClosedLoop, infer
from tritonstack.core.contract import ADMIN_HEADER
from tritonstack.core.ports import free_ports
from tritonstack.serve.runtime import STUB_EXECUTABLE, EmbeddedTriton, stub_instance


class Output(threading.Thread):
    """Collects `tritonstack serve` output lines as they come, with their arrival time."""

    def __init__(self, process):
        super().__init__(daemon=True)
        self.process = process
        self.lines: list[tuple[float, str]] = []

    def run(self) -> None:
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def wait_for(self, pattern: str, after: float, timeout: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for at, line in list(self.lines):
                if at >= after and re.search(pattern, line):
                    return at, line
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r}; got {[x for _, x in self.lines]}")


def stub_of(serve_pid: int, instance: str) -> psutil.Process:
    """The stub of one model instance (`postprocess_0_1`) under `tritonstack serve`."""
    for child in psutil.Process(serve_pid).children(recursive=True):
        if child.name() == STUB_EXECUTABLE and stub_instance(child) == instance:
            return child
    raise AssertionError(f"no stub for {instance}")


@contextlib.contextmanager
def cpu_contention():
    """One busy process per core this test may run on (at most 4), as when the rest of the
    suite runs next to it: the supervisor must detect a dead stub just as surely when its own
    checks run slowly. os.cpu_count() would count a big host's cores, not a container's share."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(min(len(os.sched_getaffinity(0)), 4))
    ]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(10)


@pytest.fixture(scope="module")
def supervised():
    """`tritonstack serve` (gateway in front): the process, the gateway's URL, its output, and
    Triton's own URL (what a client that bypasses the gateway reaches)."""
    process, ports = start_serve(REPOSITORY)
    wait_for_line(process, "Ctrl-C stops the server")
    output = Output(process)
    output.start()
    yield process, f"127.0.0.1:{ports[0]}", output, f"127.0.0.1:{ports[3]}"
    process.send_signal(signal.SIGTERM)
    process.wait(60)


#: Upper bound from a kill to "restarting Triton", whichever instance died: the stubs are looked at
#: before each deep probe, so at most one check already under way (its probe: at most 4 requests
#: of 2 s timeout) plus the 1 s interval pass first. A busy machine slows a check; it cannot hide
#: the dead stub, so the bound needs no probe luck. Typically about 1 s.
DETECT_WITHIN = 10


def test_killed_stub_is_detected_and_triton_restarted(supervised):
    process, url, output, _triton = supervised
    load = ClosedLoop(url, "pipeline", timeout=5)
    load.start()
    time.sleep(2)
    with cpu_contention():
        killed_at = time.monotonic()
        stub_of(process.pid, "postprocess_0_0").kill()
        _, dead = output.wait_for(r"^dead: ", killed_at, timeout=DETECT_WITHIN + 10)
        detected_at, _ = output.wait_for(r"restarting Triton", killed_at, timeout=20)
    recovered_at, line = output.wait_for(r"^recovered:", killed_at, timeout=120)
    time.sleep(2)
    succeeded, failed = load.stop()

    answered = [at for at, latency in load.outcomes if latency is not None]
    first_good_after = min(at for at in answered if at > recovered_at - 1)
    print(
        f"\nstub crash: detected {detected_at - killed_at:.1f} s after kill -9 ({dead}), serving "
        f"again {first_good_after - killed_at:.1f} s after it; {failed} requests failed, "
        f"{succeeded} succeeded; supervisor: {line}"
    )
    assert process.poll() is None, "tritonstack serve kept running"
    # either the stub watch or Triton's own error named the instance: both are certain
    assert "postprocess_0_0" in dead, dead
    assert detected_at - killed_at < DETECT_WITHIN
    assert any(at > recovered_at for at in answered)
    assert failed > 0  # the crash was real: requests failed until the restart
    assert infer(url, "pipeline", np.zeros((2, 128), np.float32))["label"].shape == (2, 1)


def test_dead_stub_that_no_probe_reaches_is_detected(supervised):
    """`classify`'s second instance: the deep probe reaches it only when the batcher happens to
    hand it a probe request, so a probe alone could leave it dead for long. The stub watch
    restarts Triton anyway; when the probe's request does land on it first, Triton's own words
    for that stub are the detection, just as certain."""
    process, url, output, _triton = supervised
    with cpu_contention():
        killed_at = time.monotonic()
        stub_of(process.pid, "classify_0_1").kill()
        at, dead = output.wait_for(r"^dead: ", killed_at, timeout=DETECT_WITHIN + 10)
    output.wait_for(r"^recovered:", killed_at, timeout=120)
    wait_routed(url)
    print(f"\nclassify stub crash: detected {at - killed_at:.1f} s after kill -9: {dead}")
    assert dead in (
        "dead: Python stub exited: classify_0_1",
        "dead: unhealthy: classify: HTTP 500 for /v2/models/classify/infer: "
        '{"error":"Stub process \'classify_0_1\' is not healthy."}',
    ), dead
    assert at - killed_at < DETECT_WITHIN
    for _ in range(4):  # both instances answer again
        assert infer(url, "classify", np.zeros((1, 128), np.float32))["score"].shape == (1, 1)


def test_upstream_pin_2_51_bad_alloc_abort_is_survived(supervised):
    """Upstream Triton 2.51: a JSON shape declaring ~1e8 rows makes the HTTP frontend allocate
    that much and abort (std::bad_alloc); releases from 2.59 check the size first. The gateway
    refuses the shape (tests/functional/test_gateway.py); this is a client that reaches Triton
    directly, and the supervisor's job is to bring the server back."""
    _process, url, output, triton_url = supervised
    host, port = triton_url.split(":")
    body = json.dumps(
        {"inputs": [{"name": "features", "shape": [10**8, 128], "datatype": "FP32",
                     "data": [0.5] * 128}]}
    )  # fmt: skip
    sent_at = time.monotonic()
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        connection.request("POST", "/v2/models/classifier/infer", body=body)
        connection.getresponse()
    connection.close()
    output.wait_for(r"tritonserver exited with code", sent_at, timeout=20)
    output.wait_for(r"^recovered:", sent_at, timeout=120)
    wait_routed(url)
    assert infer(url, "classify", np.zeros((1, 128), np.float32))["score"].shape == (1, 1)


#: Each restricted API group's call, and whether the admin key opens it by default (what the
#: stack's tools call: contract.ADMIN_APIS) or it stays shut.
RESTRICTED = [
    ("POST", "/v2/repository/index", "", True),
    ("GET", "/v2/models/classifier/stats", None, True),
    ("GET", "/v2/logging", None, False),
    ("GET", "/v2/trace/setting", None, False),
    ("GET", "/v2/systemsharedmemory/status", None, False),
]


def status_of(url: str, method: str, path: str, body, headers) -> int:
    host, port = url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    connection.close()
    return response.status


@pytest.mark.parametrize(
    ("method", "path", "body", "opened"), RESTRICTED, ids=[r[1] for r in RESTRICTED]
)
def test_admin_apis_need_the_secret_header_and_the_rest_stay_shut(
    triton, method, path, body, opened
):
    def call(headers):
        return status_of(triton.http_url, method, path, body, headers)

    assert call({}) == 403
    assert call({ADMIN_HEADER: "wrong"}) == 403
    assert call(triton.admin_headers) == (200 if opened else 403)


def test_asking_for_a_restricted_api_opens_it_with_the_admin_key(tmp_path, monkeypatch):
    """TRITONSTACK_ADMIN_APIS names groups the admin key opens besides the stack's own (the
    repository index, which the runtime's readiness reads, and statistics); the others stay
    shut."""
    from tritonstack.core.contract import ADMIN_APIS_ENV

    monkeypatch.setenv(ADMIN_APIS_ENV, "trace")
    empty = tmp_path / "repository"
    empty.mkdir()
    with EmbeddedTriton(empty, *free_ports(3), exit_timeout_secs=2) as server:
        opened = {
            path: status_of(server.http_url, method, path, body, server.admin_headers)
            for method, path, body, _ in RESTRICTED
            if "classifier" not in path  # the empty repository has no model
        }
    assert opened == {
        "/v2/repository/index": 200,
        "/v2/logging": 403,
        "/v2/trace/setting": 200,
        "/v2/systemsharedmemory/status": 403,
    }


def test_inference_and_health_stay_open(triton):
    host, port = triton.http_url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/v2/health/ready")
    assert connection.getresponse().status == 200
    connection.close()
    assert infer(triton.http_url, "pipeline", np.zeros((1, 128), np.float32))


def test_grpc_statistics_need_the_secret_header(triton):
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.get_inference_statistics("classifier")
    assert "This protocol is restricted" in caught.value.message()
    stats = client.get_inference_statistics("classifier", headers=triton.grpc_admin_headers)
    assert stats.model_stats[0].name == "classifier"
    client.close()


def test_admin_key_is_generated_private_and_not_in_the_repository(tmp_path, monkeypatch):
    from tritonstack.launcher.flags import local_admin_key

    monkeypatch.delenv("TRITONSTACK_ADMIN_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    key = local_admin_key()
    path = tmp_path / "tritonstack" / "admin-key"
    assert len(key) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert local_admin_key() == key  # stable across starts
    monkeypatch.setenv("TRITONSTACK_ADMIN_KEY", "from-the-environment")
    assert local_admin_key() == "from-the-environment"
    assert not list(REPOSITORY.parent.glob("**/admin-key"))


class KeepAliveClient(threading.Thread):
    """One persistent connection sending 8-row requests, recording (sent, answered, outcome)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.halt = threading.Event()
        self.records: list[tuple[float, float, str]] = []

    def run(self) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.url, network_timeout=10)
        while not self.halt.is_set():
            tensor = httpclient.InferInput("features", [8, 128], "FP32")
            tensor.set_data_from_numpy(np.ones((8, 128), np.float32))
            sent = time.monotonic()
            try:
                client.infer("pipeline", [tensor])
                outcome = "ok"
            except Exception as exc:
                outcome = type(exc).__name__
                time.sleep(0.05)
                client.close()
                client = httpclient.InferenceServerClient(self.url, network_timeout=10)
            self.records.append((sent, time.monotonic(), outcome))
        client.close()


def test_sigterm_under_load_completes_accepted_requests():
    """Requests in flight when SIGTERM arrives complete with 200; Triton keeps answering on
    open keep-alive connections while it drains, refuses new connections, and exits within
    its exit timeout (10 s) plus the time to unload; no stub or shared memory is left."""
    process, ports = start_serve(REPOSITORY, "--no-supervise")
    wait_for_line(process, "Ctrl-C stops the server")
    children = psutil.Process(process.pid).children(recursive=True)
    prefix = shm_prefix(children)
    clients = [KeepAliveClient(f"127.0.0.1:{ports[0]}") for _ in range(6)]
    for client in clients:
        client.start()
    time.sleep(2)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    exited = time.monotonic()
    for client in clients:
        client.halt.set()
        client.join(15)

    records = [record for client in clients for record in client.records]
    in_flight = [outcome for sent, done, outcome in records if sent < signalled < done]
    refused = [o for sent, _, o in records if sent > exited and o == "ConnectionRefusedError"]
    print(
        f"\nSIGTERM: {len(in_flight)} in flight, all {set(in_flight)}; exit after "
        f"{exited - signalled:.1f} s; {len(refused)} new connections refused after exit"
    )
    assert in_flight and set(in_flight) == {"ok"}
    assert process.returncode == 0, output
    assert exited - signalled < 10 + 15
    assert refused, "new connections must be refused once the server is gone"
    assert all(not psutil.pid_exists(c.pid) or c.status() == psutil.STATUS_ZOMBIE for c in children)
    assert not segments_of(prefix)
