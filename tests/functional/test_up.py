"""`tritonstack up` as a user runs it: every service answers, and nothing outlives it."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil

from tests.functional.test_serve import SHM, wait_for_line, wait_gone
from tests.support import require_tool
from tritonstack.core.contract import LLM_MODEL
from tritonstack.core.ports import free_ports
from tritonstack.load.loadtest import LLM_USER_TYPE
from tritonstack.serve.runtime import STUB_EXECUTABLE

READY_LINE = "Ctrl-C stops everything"


def start_up(*extra: str, env: dict | None = None) -> tuple[subprocess.Popen, dict[str, int]]:
    names = ("http", "grpc", "metrics", "prometheus", "locust", "locust-metrics",
             "triton-http", "triton-grpc", "gateway-metrics")  # fmt: skip
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    command = [sys.executable, "-m", "tritonstack.cli", "up",
               "--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
               "--metrics-port", str(ports["metrics"]),
               "--triton-http-port", str(ports["triton-http"]),
               "--triton-grpc-port", str(ports["triton-grpc"]),
               "--gateway-metrics-port", str(ports["gateway-metrics"]),
               "--prometheus-port", str(ports["prometheus"]),
               "--locust-port", str(ports["locust"]),
               "--locust-metrics-port", str(ports["locust-metrics"]), *extra]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    return process, ports


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read()


def our_children(process: subprocess.Popen) -> tuple[list[psutil.Process], str]:
    """Every descendant of `up`, and the /dev/shm prefix its tritonserver was given."""
    children = psutil.Process(process.pid).children(recursive=True)
    (server,) = [child for child in children if child.name() == "tritonserver"]
    (option,) = [arg for arg in server.cmdline() if "shm-region-prefix-name=" in arg]
    return children, option.split("shm-region-prefix-name=")[1]


def locust_process(children: list[psutil.Process]) -> psutil.Process:
    (locust,) = [c for c in children if "locust" in c.cmdline()[1:3]]  # python -m locust
    return locust


def start_swarm(locust_port: int, **options: str | int) -> None:
    """Start 2 users from the web UI, as a user pressing "Start"; `options` fill the form's
    fields of the locustfile's own options."""
    fields = {"user_count": 2, "spawn_rate": 2, **options}
    swarm = urllib.request.Request(
        f"http://127.0.0.1:{locust_port}/swarm", data=urllib.parse.urlencode(fields).encode()
    )
    with urllib.request.urlopen(swarm, timeout=10) as response:
        assert json.loads(response.read())["success"] is True


def assert_sigint_stops_everything(
    process: subprocess.Popen, children: list[psutil.Process], shm_prefix: str
) -> None:
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=90)
    assert process.returncode == 0, output
    assert "SIGINT: stopping" in output and output.rstrip().endswith("stopped"), output
    assert wait_gone([child.pid for child in children], timeout=10) == []
    assert not list(SHM.glob(f"{shm_prefix}*")), "shared memory left in /dev/shm"


def wait_targets_up(prometheus: int, jobs: set[str], timeout: float = 40) -> dict[str, str]:
    """Each job's target health once Prometheus has scraped them all (5 s interval)."""
    deadline = time.monotonic() + timeout
    while True:
        _, body = get(f"http://127.0.0.1:{prometheus}/api/v1/targets")
        targets = json.loads(body)["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets}
        if all(health.get(job) == "up" for job in jobs) or time.monotonic() > deadline:
            return health
        time.sleep(1)


def test_up_serves_triton_prometheus_and_locust_and_sigint_stops_all():
    require_tool("prometheus")
    process, ports = start_up()
    try:
        lines = wait_for_line(process, READY_LINE, timeout=240)
        children, shm_prefix = our_children(process)
        names = {child.name() for child in children}
        assert {"tritonserver", "haproxy", "prometheus", "triton_python_backend_stub"} <= names
        locust = locust_process(children)

        printed = {line.split()[-1]: line for line in lines if line.startswith("  ")}
        assert "HTTP (gateway)" in printed[f"http://127.0.0.1:{ports['http']}"]
        assert "Triton HTTP (direct)" in printed[f"http://127.0.0.1:{ports['triton-http']}"]
        assert "gateway metrics" in printed[f"http://127.0.0.1:{ports['gateway-metrics']}/metrics"]
        assert "Prometheus" in printed[f"http://127.0.0.1:{ports['prometheus']}"]
        assert "Locust web UI" in printed[f"http://127.0.0.1:{ports['locust']}"]
        assert get(f"http://127.0.0.1:{ports['http']}/v2/health/ready")[0] == 200
        assert get(f"http://127.0.0.1:{ports['prometheus']}/-/ready")[0] == 200
        rules = get(f"http://127.0.0.1:{ports['prometheus']}/api/v1/rules")[1]
        assert json.loads(rules)["data"]["groups"], "the project's rules are loaded"
        status, page = get(f"http://127.0.0.1:{ports['locust']}/")
        assert status == 200 and b"locust" in page.lower()
        start_swarm(ports["locust"])
        # Prometheus scrapes Triton, the gateway and Locust's exporter on the ports given to `up`.
        health = wait_targets_up(ports["prometheus"], {"triton", "locust", "gateway"})
        assert health == {"triton": "up", "locust": "up", "gateway": "up"}, health
        exported = get(f"http://127.0.0.1:{ports['locust-metrics']}/metrics")[1].decode()
        assert "tritonstack_client_" in exported
        # Locust's requests reach Triton: `top` sees them on the metrics port `up` printed.
        top = subprocess.run(
            [sys.executable, "-m", "tritonstack.cli", "top", "--once",
             "--url", f"http://127.0.0.1:{ports['metrics']}/metrics"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert top.returncode == 0, top.stderr
        pipeline = [line.split() for line in top.stdout.splitlines() if line.startswith("pipeline")]
        assert float(pipeline[0][1]) > 0, top.stdout
        # ...through the gateway, where a user's client would send them.
        gateway = get(f"http://127.0.0.1:{ports['gateway-metrics']}/metrics")[1].decode()
        (line,) = [x for x in gateway.splitlines() if x.startswith(
            'haproxy_frontend_http_responses_total{proxy="http",code="2xx"}')]  # fmt: skip
        assert float(line.split()[-1]) > 0, line
        assert locust.is_running()
    except BaseException:
        process.kill()
        raise

    assert_sigint_stops_everything(process, children, shm_prefix)


def prometheus_value(port: int, query: str) -> float:
    """The query's single value, 0 while it has none."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    result = json.loads(get(url)[1])["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def test_up_llm_serves_the_llm_to_locust_and_prometheus_and_sigint_stops_all():
    """`up --llm`: the LLM beside the classifiers, routed by the gateway; Locust's web UI loads it
    with the llm_stream user, and Prometheus reads both sides (the engine's `vllm:*` counters on
    Triton's port, the client's on Locust's exporter); SIGINT leaves no engine process behind."""
    require_tool("prometheus")
    process, ports = start_up("--llm")
    try:
        lines = wait_for_line(process, READY_LINE, timeout=300)
        text = "\n".join(lines)
        assert "serving the tiny random-weight Llama" in text, text
        assert f"ready: classifier, classify, pipeline, postprocess, {LLM_MODEL}" in text, text
        route = f"http://127.0.0.1:{ports['http']}/v2/models/{LLM_MODEL}/generate_stream"
        assert any("LLM generate (gateway)" in line and route in line for line in lines), text
        assert f"user-type {LLM_USER_TYPE}" in text, text
        children, shm_prefix = our_children(process)
        assert any(child.name().startswith("VLLM") for child in children), "no vLLM engine"

        start_swarm(ports["locust"], user_type=LLM_USER_TYPE, max_tokens=8)
        client = f'tritonstack_client_llm_output_tokens_total{{user_type="{LLM_USER_TYPE}"}}'
        engine = f'vllm:generation_tokens_total{{model="{LLM_MODEL}"}}'
        deadline = time.monotonic() + 60
        while not (
            prometheus_value(ports["prometheus"], client) > 0
            and prometheus_value(ports["prometheus"], engine) > 0
        ):
            assert time.monotonic() < deadline, "Prometheus saw no LLM tokens in 60 s"
            time.sleep(1)
        failures = f'tritonstack_client_failures_total{{user_type="{LLM_USER_TYPE}"}}'
        assert prometheus_value(ports["prometheus"], failures) == 0
    except BaseException:
        process.kill()
        raise

    assert_sigint_stops_everything(process, children, shm_prefix)


def test_prometheus_missing_from_path_is_one_line_how_to(monkeypatch, tmp_path, capsys):
    from tritonstack.stack import find_prometheus

    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_prometheus(None) is None
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("Prometheus not started: prometheus is not on PATH.")
    assert "apt-get install prometheus" in line and "--prometheus-bin" in line


def test_up_without_prometheus_serves_the_rest_and_stops_when_a_child_dies(tmp_path):
    """No Prometheus binary: one line says how to get it; a killed Locust stops the rest."""
    missing = tmp_path / "bin" / "prometheus"
    process, ports = start_up("--prometheus-bin", str(missing))
    try:
        lines = wait_for_line(process, READY_LINE, timeout=240)
        message = [line for line in lines if line.startswith("Prometheus not started")]
        assert len(message) == 1, lines
        assert f"{missing} is not an executable file" in message[0]
        assert "apt-get install prometheus" in message[0]
        assert not any("Prometheus  " in line for line in lines), lines
        assert get(f"http://127.0.0.1:{ports['http']}/v2/health/ready")[0] == 200
        assert get(f"http://127.0.0.1:{ports['locust']}/")[0] == 200
        children, shm_prefix = our_children(process)
        assert "prometheus" not in {child.name() for child in children}
    except BaseException:
        process.kill()
        raise

    locust_process(children).kill()
    output, _ = process.communicate(timeout=90)

    assert process.returncode == 1, output
    assert "tritonstack up: error: locust exited unexpectedly" in output, output
    assert "Traceback" not in output
    # After a failure the logs outlive the temporary directory, and the output says where.
    (kept,) = [line.removeprefix("logs kept in ") for line in output.splitlines()
               if line.startswith("logs kept in ")]  # fmt: skip
    assert sorted(p.name for p in Path(kept).iterdir()) == [
        "haproxy.log",
        "locust.log",
        "triton.log",
    ]
    shutil.rmtree(kept)
    assert wait_gone([child.pid for child in children], timeout=10) == []
    assert not list(SHM.glob(f"{shm_prefix}*")), "shared memory left in /dev/shm"


def test_a_port_in_use_is_one_line_error_before_anything_starts():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process, _ = start_up("--no-locust", "--http-port", str(port))
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    assert f"127.0.0.1:{port} is not free" in output and "--http-port" in output, output
    assert "starting Triton" not in output and "Traceback" not in output


def test_sigterm_while_starting_stops_cleanly(tmp_path):
    """A stop requested before everything is ready still leaves nothing running."""
    process, ports = start_up("--no-locust", "--prometheus-bin", str(tmp_path / "none"))
    try:
        wait_for_line(process, "starting Triton", timeout=60)
        deadline = time.monotonic() + 60
        while "tritonserver" not in {c.name() for c in psutil.Process(process.pid).children()}:
            assert time.monotonic() < deadline, "tritonserver not started"
            time.sleep(0.1)
        # Loading models: wait for a stub (and so its shared memory) to exist.
        while not any(
            c.name() == STUB_EXECUTABLE for c in psutil.Process(process.pid).children(True)
        ):
            assert time.monotonic() < deadline, "no model's stub started"
            time.sleep(0.1)
        children, shm_prefix = our_children(process)
    except BaseException:
        process.kill()
        raise

    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=90)

    assert process.returncode == 0, output
    assert "SIGTERM: stopping" in output and "Traceback" not in output, output
    assert wait_gone([child.pid for child in children], timeout=10) == []
    assert not list(SHM.glob(f"{shm_prefix}*")), "shared memory left in /dev/shm"
    flag = f"--http-port={ports['triton-http']}"
    assert not [p for p in psutil.process_iter(["cmdline"]) if flag in (p.info["cmdline"] or ())]


def test_killed_up_orphans_nothing():
    """`up` killed -9 cannot clean up: PR_SET_PDEATHSIG makes every child stop by itself."""
    require_tool("prometheus")
    process, _ = start_up()
    try:
        wait_for_line(process, READY_LINE, timeout=240)
        children, shm_prefix = our_children(process)
        assert {"tritonserver", "prometheus"} <= {child.name() for child in children}
        locust_process(children)
        (prometheus,) = [child for child in children if child.name() == "prometheus"]
        (config,) = [a for a in prometheus.cmdline() if a.startswith("--config.file=")]
        run_dir = Path(config.removeprefix("--config.file=")).parent
    except BaseException:
        process.kill()
        raise
    process.kill()
    process.wait()
    assert wait_gone([child.pid for child in children], timeout=30) == []
    assert not list(SHM.glob(f"{shm_prefix}*")), "Triton removes its segments on SIGTERM"
    shutil.rmtree(run_dir)  # the only leftover: `up` had no chance to remove its temp dir
