"""What tests of both kinds share: the checkout's paths, external tools, and test inputs."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tritonstack.core import contract

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"
LLM_REPOSITORY = ROOT / contract.LLM_REPOSITORY
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


#: The demo's embedding width (tests/unit/test_demo.py holds it to the demo's configs).
DEMO_FEATURES = 128


def embeddings(rows: int, seed: int = 0) -> np.ndarray:
    """`rows` random embeddings for the demo's models, the same for the same seed."""
    return np.random.default_rng(seed).standard_normal((rows, DEMO_FEATURES)).astype(np.float32)


def compose_seconds(duration: str) -> float:
    """A compose duration (1m30s, 30s, 500ms) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


#: After "recovered" (Triton ready again), the gateway routes to it at its next health check:
#: every 0.5 s while a replica is down (gateway/haproxy.cfg); 5 s leaves room for a slow machine.
ROUTED_AGAIN_WITHIN = 5


def wait_routed(url: str, path: str = "/v2/health/ready") -> float:
    """Seconds until the gateway at `url` ("host:port") answers 200 on `path`: the replicas
    behind that route are up in its eyes again."""
    started = time.monotonic()
    host, port = url.split(":")
    while True:
        try:
            connection = http.client.HTTPConnection(host, int(port), timeout=2)
            connection.request("GET", path)
            status = connection.getresponse().status
            connection.close()
        except OSError:
            status = None
        waited = time.monotonic() - started
        if status == 200:
            return waited
        assert waited < ROUTED_AGAIN_WITHIN, f"gateway not routing {path} after {waited:.1f} s"
        time.sleep(0.1)


def copy_project(destination: Path) -> Path:
    """A copy of this checkout's files (tracked, and new ones git does not ignore), as a user's
    clone holds them: a project folder for `tritonstack --project-dir` or compose."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree, not yet in git
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)
    return destination


def end_locust_runs() -> None:
    """Ctrl-C to every Locust this process started (tritonstack.load.loadtest.run_headless): it
    quits gracefully with its totals, as a user's Ctrl-C, once a test has read all it needs from a
    run started for a fixed duration."""
    import signal

    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "locust" in " ".join(child.cmdline()[:3]):
                child.send_signal(signal.SIGINT)
