"""`tritonstack serve` as a user runs it: ready, then stopped by a signal with nothing left over."""

from __future__ import annotations

import collections
import contextlib
import http.client
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.support import REPOSITORY
from tritonstack.core.ports import free_ports

SHM = Path("/dev/shm")


def start_serve(repository: Path = REPOSITORY, *extra: str) -> tuple[subprocess.Popen, list[int]]:
    """Ports: gateway HTTP, gateway gRPC, Triton metrics, Triton HTTP, Triton gRPC, gateway
    metrics (every one free, so that parallel sessions never collide on the defaults)."""
    ports = free_ports(6)
    command = [sys.executable, "-m", "tritonstack.cli", "serve",
               "--model-repository", str(repository),
               "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
               "--metrics-port", str(ports[2]), "--triton-http-port", str(ports[3]),
               "--triton-grpc-port", str(ports[4]), "--gateway-metrics-port", str(ports[5]),
               *extra]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, ports


def wait_for_line(process: subprocess.Popen, text: str, timeout: float = 120) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line.rstrip())
        if text in line:
            return lines
    raise AssertionError(f"{text!r} not printed; got {lines}")


@contextlib.contextmanager
def serve_project(project: Path, timeout: float = 180) -> Iterator[dict]:
    """`tritonstack serve` on the project at `project` (the gateway in front) on free ports,
    until the block ends: its addresses (host:port), the process and what it printed."""
    ports = free_ports(6)
    command = [sys.executable, "-m", "tritonstack.cli", "--project-dir", str(project), "serve",
               "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
               "--metrics-port", str(ports[2]), "--triton-http-port", str(ports[3]),
               "--triton-grpc-port", str(ports[4]),
               "--gateway-metrics-port", str(ports[5])]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = wait_for_line(process, "Ctrl-C stops the server", timeout=timeout)
        # Keep reading what serve (and Triton, whose log is serve's output) prints: a pipe left
        # full blocks Triton's logging, and with it every request, until the server stops.
        threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
        yield {"http": f"127.0.0.1:{ports[0]}", "grpc": f"127.0.0.1:{ports[1]}",
               "triton": f"127.0.0.1:{ports[3]}", "triton_grpc": f"127.0.0.1:{ports[4]}",
               "metrics": f"127.0.0.1:{ports[2]}",
               "gateway_metrics": f"127.0.0.1:{ports[5]}", "process": process,
               "lines": lines}  # fmt: skip
    finally:
        process.terminate()
        process.wait(timeout=60)


def shm_prefix(children: list[psutil.Process]) -> str:
    """This server's shared-memory prefix, read from a stub's command line (its region name),
    so that servers started by other processes at the same time are not mistaken for ours."""
    for child in children:
        if child.name() == "triton_python_backend_stub":
            region = child.cmdline()[2]
            return region[: len("tritonstack_") + 13]
    raise AssertionError("no Python stub among the server's processes")


def segments_of(prefix: str) -> set[str]:
    return {p.name for p in SHM.glob(f"{prefix}*")}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if not gone(pid)]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_stops_triton_and_every_stub(signum):
    process, ports = start_serve()
    lines = wait_for_line(process, "Ctrl-C stops the server")
    printed = "\n".join(lines)
    assert re.search(rf"HTTP \(gateway\) +http://127.0.0.1:{ports[0]}\n", printed)
    assert re.search(rf"gRPC \(gateway\) +127.0.0.1:{ports[1]}\n", printed)
    assert re.search(rf"Triton HTTP \(direct\) +http://127.0.0.1:{ports[3]}\n", printed)
    assert any("ready: classifier, classify, pipeline, postprocess" in line for line in lines)
    assert any("classifier_trt" in line for line in lines)  # says what is left out on CPU
    children = psutil.Process(process.pid).children(recursive=True)
    names = [child.name() for child in children]
    assert "tritonserver" in names and "haproxy" in names
    assert names.count("triton_python_backend_stub") >= 3  # classifier, postprocess, classify
    prefix = shm_prefix(children)
    assert segments_of(prefix), "the Python backend's shared memory regions carry our prefix"

    process.send_signal(signum)
    output, _ = process.communicate(timeout=60)

    assert process.returncode == 0, output
    assert "stopped (tritonserver exit code 0)" in output
    assert wait_gone([child.pid for child in children], timeout=5) == []
    assert not segments_of(prefix), "shared memory left in /dev/shm"


def test_killed_cli_does_not_orphan_triton():
    """If `tritonstack serve` itself is killed -9, tritonserver gets SIGTERM (PDEATHSIG)."""
    process, _ = start_serve()
    wait_for_line(process, "Ctrl-C stops the server")
    children = psutil.Process(process.pid).children(recursive=True)
    process.kill()
    process.wait()
    assert wait_gone([child.pid for child in children], timeout=30) == []


def test_missing_repository_is_one_line_error(tmp_path):
    process, _ = start_serve(tmp_path / "nowhere")
    output, _ = process.communicate(timeout=30)
    assert process.returncode == 1
    assert "Traceback" not in output
    assert "model repository not found" in output


def test_a_model_that_fails_to_load_is_reported_and_the_others_serve(tmp_path):
    """postprocess refuses its labels file, and pipeline (which runs it) cannot load either:
    serve names both with Triton's reason and serves classifier and classify; it stops clean."""
    repository = tmp_path / "model_repository"
    shutil.copytree(REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
    (repository / "postprocess" / "labels.txt").write_text("only one label\n")
    process, ports = start_serve(repository, "--log-file", str(tmp_path / "triton.log"))
    lines = wait_for_line(process, "Ctrl-C stops the server")
    assert "ready: classifier, classify" in lines, lines
    reasons = {line.split(": ")[1]: line for line in lines if line.startswith("not loaded: ")}
    assert set(reasons) == {"pipeline", "postprocess"}, lines
    assert "labels file has 1 labels but input `class` has 2 scores" in reasons["postprocess"]
    connection = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=10)
    body = {"inputs": [{"name": "features", "shape": [1, 128], "datatype": "FP32",
                        "data": [0.0] * 128}]}  # fmt: skip
    connection.request("POST", "/v2/models/classifier/infer", json.dumps(body))
    served = connection.getresponse()
    assert served.status == 200 and json.loads(served.read())["outputs"][0]["name"] == "class"
    connection.request("POST", "/v2/models/pipeline/infer", json.dumps(body))
    refused = connection.getresponse()
    text = refused.read().decode()
    connection.close()
    assert refused.status == 503 and "pipeline is not loaded on this server" in text, text
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    log = (tmp_path / "triton.log").read_text()
    prefix = re.search(r'"shm-region-prefix-name":"(tritonstack_[0-9a-f]+_)"', log).group(1)
    assert not segments_of(prefix)


def test_no_gateway_serves_triton_on_the_client_ports():
    process, ports = start_serve(REPOSITORY, "--no-gateway")
    try:
        lines = wait_for_line(process, "Ctrl-C stops the server")
        assert any(re.search(rf"HTTP \(Triton, no gateway\) +http://127.0.0.1:{ports[0]}$", line)
                   for line in lines), lines  # fmt: skip
        names = [c.name() for c in psutil.Process(process.pid).children(recursive=True)]
        assert "haproxy" not in names
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert process.returncode == 0


def test_public_address_without_keys_is_refused_in_one_line():
    for extra in (("--address", "0.0.0.0"), ("--address", "0.0.0.0", "--no-gateway")):
        process, _ = start_serve(REPOSITORY, *extra)
        output, _ = process.communicate(timeout=30)
        assert process.returncode == 1, output
        assert output.count("\n") == 1 and "refusing to listen on 0.0.0.0" in output


def post_fresh(port: int, body: bytes) -> str:
    """One request on its own connection: its status, or what became of it."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/v2/models/pipeline/infer", body=body)
        return str(connection.getresponse().status)
    except ConnectionRefusedError:
        return "refused"  # the listener was closed: the client knows it was never accepted
    except ConnectionResetError:
        return "refused"  # reset while still in the kernel's accept queue, never accepted
    except http.client.RemoteDisconnected:
        return "lost"  # accepted, then closed without an answer
    finally:
        connection.close()


def test_sigterm_drains_gateway_then_triton_and_loses_nothing_in_flight():
    """Under load, SIGTERM: the gateway stops accepting and answers what it accepted, then
    Triton stops. Every accepted request gets its 200; none gets a 502/503 or a bare close."""
    process, ports = start_serve()
    wait_for_line(process, "Ctrl-C stops the server")
    rows = np.random.default_rng(0).standard_normal((64, 128)).round(4).tolist()
    body = json.dumps({"inputs": [{"name": "features", "shape": [64, 128],
                                   "datatype": "FP32", "data": rows}]}).encode()  # fmt: skip
    outcomes: list[str] = []
    halt = threading.Event()

    def load() -> None:
        while not halt.is_set():
            outcome = post_fresh(ports[0], body)
            outcomes.append(outcome)
            if outcome == "refused":
                return

    threads = [threading.Thread(target=load, daemon=True) for _ in range(16)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3)
        before_signal = len(outcomes)
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=90)
    finally:  # a serve that does not stop must not keep the load (and pytest) running
        halt.set()
        if process.poll() is None:
            process.kill()
        for thread in threads:
            thread.join(30)
    counts = {o: outcomes.count(o) for o in set(outcomes)}
    print(f"\n{before_signal} answered before SIGTERM; all outcomes: {counts}")
    assert before_signal > 0 and counts.get("200", 0) >= before_signal
    assert set(counts) <= {"200", "refused"}, counts
    assert process.returncode == 0, output
    drained = output.index("gateway stopped (haproxy exit code 0)")
    assert drained < output.index("stopped (tritonserver exit code 0)")


def test_sighup_reloads_the_api_keys_without_a_restart(tmp_path):
    first, second = "first-" + "1" * 20, "second-" + "2" * 20
    keys = tmp_path / "api-keys"
    keys.write_text(f"{first} ci\n")
    process, ports = start_serve(REPOSITORY, "--api-keys", str(keys))
    try:
        wait_for_line(process, "Ctrl-C stops the server")
        haproxy = [c for c in psutil.Process(process.pid).children() if c.name() == "haproxy"]

        def status(key: str) -> int:
            connection = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=10)
            connection.request(
                "GET", "/v2/models/pipeline", headers={"Authorization": f"Bearer {key}"}
            )
            code = connection.getresponse().status
            connection.close()
            return code

        assert (status(first), status(second)) == (200, 401)
        keys.write_text(f"{second} ci\n")
        process.send_signal(signal.SIGHUP)
        wait_for_line(process, "SIGHUP: 1 API keys loaded", timeout=30)
        assert (status(first), status(second)) == (401, 200)
        keys.write_text("not a valid line\n")
        process.send_signal(signal.SIGHUP)
        wait_for_line(process, "SIGHUP: keys not reloaded", timeout=30)
        assert status(second) == 200  # a bad file keeps the keys in force
        assert [c.pid for c in psutil.Process(process.pid).children() if c.name() == "haproxy"] == [
            h.pid for h in haproxy
        ]
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=90)
    assert process.returncode == 0


def keep_alive_outcomes(port: int, body: bytes, halt: threading.Event, outcomes: list) -> None:
    """A pooled client: one connection, reused until the gateway says `Connection: close`, then
    a new one, until the new one is refused (the gateway stopped listening)."""
    connection = None
    while not halt.is_set():
        if connection is None:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("POST", "/v2/models/pipeline/infer", body=body)
            response = connection.getresponse()
            response.read()
            outcomes.append(str(response.status))
            if response.will_close:
                connection.close()
                connection = None
        except (ConnectionRefusedError, ConnectionResetError):
            outcomes.append("refused")  # a new connection the stopped gateway never accepted
            return
        except (http.client.RemoteDisconnected, BrokenPipeError):
            outcomes.append("lost")  # sent, then closed without an answer
            return


@pytest.mark.parametrize("busy", [0, 8], ids=["idle clients only", "idle and busy clients"])
def test_sigterm_exits_within_20_s_with_idle_keep_alive_clients(busy):
    """Every pooled HTTP client (Locust, tritonclient) holds an idle keep-alive connection. A
    stop closes those within the keep-alive timeout (5 s) instead of waiting for hard-stop-after
    (it took 34.5 s when the gateway waited for each one's next request), answers what is in
    flight, then stops Triton."""
    process, ports = start_serve()
    wait_for_line(process, "Ctrl-C stops the server")
    body = json.dumps({"inputs": [{"name": "features", "shape": [1, 128], "datatype": "FP32",
                                   "data": [0.25] * 128}]}).encode()  # fmt: skip
    idle = []
    for _ in range(3):
        connection = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=30)
        connection.request("GET", "/v2/health/ready")
        connection.getresponse().read()
        idle.append(connection)
    outcomes: list[str] = []
    halt = threading.Event()
    threads = [
        threading.Thread(target=keep_alive_outcomes, args=(ports[0], body, halt, outcomes))
        for _ in range(busy)
    ]
    for thread in threads:
        thread.start()
    time.sleep(2)
    answered_before = outcomes.count("200")
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    seconds = time.monotonic() - started
    halt.set()
    for thread in threads:
        thread.join(30)
    print(f"\nstopped {seconds:.1f} s after SIGTERM; outcomes {collections.Counter(outcomes)}")
    assert process.returncode == 0, output
    assert seconds < 20, output
    assert set(outcomes) <= {"200", "refused"}, collections.Counter(outcomes)
    assert outcomes.count("200") >= answered_before
    for connection in idle:  # closed by the gateway, not left to the client
        assert connection.sock.recv(1) == b""
        connection.close()
