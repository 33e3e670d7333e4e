"""Fixtures of the functional tests: one real tritonserver per session, on free loopback ports,
the real HAProxy gateway in front of it, the ONNX model run directly as the reference, and a
private Docker engine holding the stand-in images for the compose stack's tests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.standins.build import build as build_standins
from tests.standins.engine import PrivateEngine, missing_tools
from tests.support import IN_CI, LLM_REPOSITORY, REPOSITORY, require_tool
from tritonstack.core.ports import free_ports
from tritonstack.serve.gateway import Gateway
from tritonstack.serve.runtime import EmbeddedTriton, default_cache_dir


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
    with gateway_in_front_of(triton, tmp_path_factory.mktemp("gateway")) as server:
        yield server


@contextlib.contextmanager
def gateway_in_front_of(triton: EmbeddedTriton, log_dir: Path) -> Iterator[Gateway]:
    require_tool("haproxy")
    http, grpc, metrics = free_ports(3)
    with Gateway.for_triton(triton, http_port=http, grpc_port=grpc, metrics_port=metrics,
                            log_path=log_dir / "haproxy.log") as server:  # fmt: skip
        yield server


@contextlib.contextmanager
def llm_triton_serving(log_dir: Path) -> Iterator[EmbeddedTriton]:
    """A new embedded runtime serving what `tritonstack serve --llm` serves: the classifier
    family and `llm` (the tiny local Llama on the real vLLM engine)."""
    from tritonstack.serve.tinyllm import ensure_tiny_model

    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(
        REPOSITORY,
        http,
        grpc,
        metrics,
        log_path=log_dir / "tritonserver.log",
        extra_repositories=[LLM_REPOSITORY],
        llm_model=str(ensure_tiny_model(default_cache_dir())),
    )
    with server:
        yield server


@pytest.fixture(scope="session")
def llm_triton(tmp_path_factory) -> EmbeddedTriton:
    """One per session: the engine takes about a minute to start on two cores, and every LLM
    test shares it."""
    with llm_triton_serving(tmp_path_factory.mktemp("llm-triton")) as server:
        yield server


@pytest.fixture(scope="session")
def llm_gateway(llm_triton, tmp_path_factory) -> Gateway:
    """The real HAProxy gateway in front of the LLM session's Triton."""
    with gateway_in_front_of(llm_triton, tmp_path_factory.mktemp("llm-gateway")) as server:
        yield server


@pytest.fixture
def new_llm_pair(tmp_path):
    """Starts another LLM Triton with its own gateway in front, each time it is entered:
    `with new_llm_pair() as (triton, gateway):`."""
    count = 0

    @contextlib.contextmanager
    def start() -> Iterator[tuple[EmbeddedTriton, Gateway]]:
        nonlocal count
        count += 1
        log_dir = tmp_path / f"pair-{count}"
        log_dir.mkdir()
        with llm_triton_serving(log_dir) as triton, gateway_in_front_of(triton, log_dir) as gw:
            yield triton, gw

    return start


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


#: Seconds the compose part of the session took, by step; printed at the end of the run.
COMPOSE_TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def docker_engine():
    """A private Docker engine with every stand-in image built into it (tests/standins/).

    Started for the module that uses it and removed with everything in it afterwards, so the
    rest of the suite runs without it (and its timings are the compose part's alone); the
    machine's own engine, if it has one, is never used. Fails in CI when a tool is missing
    (.ci/run installs them), skips on a laptop without them.
    """
    missing = missing_tools()
    if missing:
        message = f"not installed: {', '.join(missing)} (.ci/run installs them)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    started = time.monotonic()
    with PrivateEngine() as engine:
        COMPOSE_TIMINGS["private engine started"] = time.monotonic() - started
        built = time.monotonic()
        steps = build_standins(engine.host, log=lambda line: None)
        COMPOSE_TIMINGS["stand-in downloads (0 when cached)"] = steps["downloads"]
        COMPOSE_TIMINGS["stand-in images built"] = time.monotonic() - built - steps["downloads"]
        yield engine
        stopping = time.monotonic()
    COMPOSE_TIMINGS["private engine stopped and removed"] = time.monotonic() - stopping
    COMPOSE_TIMINGS["compose part in all"] = time.monotonic() - started


def pytest_terminal_summary(terminalreporter) -> None:
    """The compose stack's timings (first and warm start to healthy, what the part adds)."""
    if COMPOSE_TIMINGS:
        terminalreporter.section("compose stack timings")
        for step, seconds in COMPOSE_TIMINGS.items():
            terminalreporter.write_line(f"{step}: {seconds:.0f} s")
