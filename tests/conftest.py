"""Shared fixtures: one real tritonserver per test session, on free loopback ports."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tritonstack.gateway import Gateway
from tritonstack.runtime import EmbeddedTriton, free_ports

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"
IN_CI = os.environ.get("CI", "").lower() == "true"


#: Programs that serve or generate load: a test that starts one needs the `integration` marker,
#: so that `make test-unit` (-m "not integration") stays fast and needs no server.
SERVER_PROGRAMS = frozenset(
    {
        "tritonserver",
        "prometheus",
        "prometheus-blackbox-exporter",
        "haproxy",
        "wrk",
        "locust",
        "uvicorn",
        "mlserver",
    }
)
#: `tritonstack` subcommands that do nothing but start servers. (bench, loadtest and soak start
#: them in-process, where the programs above are seen; their argument errors start nothing.)
SERVING_SUBCOMMANDS = frozenset({"serve", "up"})
#: Arguments that make a server program print or check something and exit without serving.
NOT_SERVING = frozenset({"--help", "-h", "--version", "--config.check"})
#: Server-starting commands each unmarked test ran: {test id: [program]}, filled by the audit hook.
_unmarked_spawns: dict[str, list[str]] = {}
_running_unmarked: list[str] = []


def server_command(args: Sequence[object]) -> str | None:
    """The server or load generator a command line starts, if any (`python -m x` included)."""
    words = [os.path.basename(os.fsdecode(a)) if isinstance(a, (str, bytes, os.PathLike))
             else str(a) for a in args]  # fmt: skip
    if words[:1] and words[0].startswith("python") and words[1:2] == ["-m"]:
        words = words[2:]
    if not words or NOT_SERVING & set(words):
        return None
    program = words[0].split(".")[0]
    if program in SERVER_PROGRAMS:
        return program
    if program == "tritonstack" and len(words) > 1 and words[1] in SERVING_SUBCOMMANDS:
        return f"tritonstack {words[1]}"
    return None


def _audit(event: str, args: tuple) -> None:
    if event == "subprocess.Popen" and _running_unmarked:
        executable, command = args[0], args[1]
        if isinstance(command, (str, bytes)):
            command = shlex.split(os.fsdecode(command))
        found = server_command(list(command) or [executable])
        if found:
            _unmarked_spawns.setdefault(_running_unmarked[-1], []).append(found)


sys.addaudithook(_audit)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of a test without the `integration` marker: watch what it starts."""
    _running_unmarked.clear()
    if item.get_closest_marker("integration") is None:
        _running_unmarked.append(item.nodeid)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_server(request):
    """A test without the `integration` marker fails if it (or a fixture) starts a server."""
    yield
    _running_unmarked.clear()
    started = _unmarked_spawns.pop(request.node.nodeid, [])
    if started:
        pytest.fail(
            f"{request.node.nodeid} starts {sorted(set(started))} but is not marked "
            "@pytest.mark.integration: `make test-unit` would run it"
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the shared server must carry the `integration` marker (caught early)."""
    unmarked = [
        item.nodeid
        for item in items
        if "triton" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("integration") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests using the `triton` fixture need @pytest.mark.integration: " + ", ".join(unmarked)
        )


def require_tool(name: str) -> str:
    """Path of an external tool; skips on a laptop without it, fails in CI (CI=true)."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (.ci/run installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def triton(tmp_path_factory) -> EmbeddedTriton:
    """The embedded runtime serving this checkout's model repository."""
    http, grpc, metrics = free_ports(3)
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    server = EmbeddedTriton(REPOSITORY, http, grpc, metrics, log_path=log)
    with server:
        yield server


@pytest.fixture(scope="session")
def gateway(triton, tmp_path_factory) -> Gateway:
    """The real HAProxy running gateway/haproxy.cfg in front of the session's Triton."""
    require_tool("haproxy")
    http, grpc, metrics = free_ports(3)
    log = tmp_path_factory.mktemp("gateway") / "haproxy.log"
    with Gateway.for_triton(triton, http_port=http, grpc_port=grpc, metrics_port=metrics,
                            log_path=log) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="session")
def reference():
    """The committed model.onnx run directly with onnxruntime: what Triton must reproduce."""
    session = ort.InferenceSession(
        str(REPOSITORY / "classifier" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    labels = np.array((REPOSITORY / "postprocess" / "labels.txt").read_text().split("\n")[:2])

    def run(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        probabilities = session.run(["class"], {"features": features})[0]
        return probabilities, labels[probabilities.argmax(axis=1)]

    return run


def embeddings(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 128)).astype(np.float32)
