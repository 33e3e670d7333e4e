"""Shared fixtures: one real tritonserver per test session, on free loopback ports."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tritonstack.gateway import Gateway
from tritonstack.runtime import EmbeddedTriton, free_ports

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"
IN_CI = os.environ.get("CI", "").lower() == "true"


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
