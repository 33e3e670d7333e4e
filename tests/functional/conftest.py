"""Fixtures of the functional tests: one real tritonserver per session, on free loopback ports,
the real HAProxy gateway in front of it, and the ONNX model run directly as the reference."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tests.support import REPOSITORY, require_tool
from tritonstack import contract
from tritonstack.gateway import Gateway
from tritonstack.runtime import EmbeddedTriton, free_ports


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
    labels = np.array((REPOSITORY / contract.LABELS_FILE).read_text().split("\n")[:2])

    def run(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        probabilities = session.run(["class"], {"features": features})[0]
        return probabilities, labels[probabilities.argmax(axis=1)]

    return run
