"""Helpers that outlive the launcher's exec: forked before it, they watch the server it became.

Each runs in a child process whose parent is tritonserver (the launcher's PID, kept by exec), and
ends when that parent is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

from tritonstack.launcher.messages import log


def fork(task: Callable[[int], None]) -> None:
    """Run task(server PID) in a child process; the caller goes on (to exec the server)."""
    server = os.getpid()
    sys.stderr.flush()
    if os.fork() == 0:
        try:
            task(server)
        finally:
            os._exit(0)


def _serving(server: int) -> bool:
    return os.getppid() == server


def shell_probe(command: str) -> Callable[[], bool]:
    def run() -> bool:
        return (
            subprocess.run(["bash", "-c", command], capture_output=True, check=False).returncode
            == 0
        )

    return run


def ready_probe(url: str) -> Callable[[], bool]:
    def run() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            return False

    return run


def watchdog(
    probe: Callable[[], bool], interval: float, failures_allowed: int
) -> Callable[[int], None]:
    """ "Ready" does not prove answers; a real inference does. Armed by the first successful
    probe (models have loaded), it sends SIGTERM to tritonserver after `failures_allowed` failed
    probes in a row: the container exits and the restart policy starts a new one (Docker does
    not restart a container that is merely unhealthy). The probe (healthcheck.py) fails only for
    a dead server: a busy one (a 503, a timeout under load) passes, since restarting it would
    only turn load into an outage."""

    def task(server: int) -> None:
        failures, armed = 0, False
        while True:
            time.sleep(interval)
            if not _serving(server):
                return
            if probe():
                if not armed:
                    log(f"watchdog: deep probe passed; watching every {interval:g}s")
                armed, failures = True, 0
            elif armed:
                failures += 1
                log(f"watchdog: deep probe failed ({failures}/{failures_allowed})")
                if failures >= failures_allowed:
                    log("watchdog: stopping tritonserver so the restart policy starts afresh")
                    os.kill(server, signal.SIGTERM)
                    return

    return task


def engine_guard(probe: Callable[[], bool], timeout: float) -> Callable[[int], None]:
    """Hold ONNX Runtime's engine cache until this replica's models are ready. ONNX Runtime
    writes an engine with a plain file write while a model warms up, so a replica loading at the
    same moment could read it half-written: the next replica waits for the lock this child
    inherited (tritonserver does not: the launcher's descriptors close on exec). It goes when
    the models are ready, when tritonserver exits, or after the timeout."""

    def task(server: int) -> None:
        deadline = time.monotonic() + timeout
        while True:
            time.sleep(0.5)
            if not _serving(server):
                return
            if probe():
                log("models ready: ONNX Runtime's engine cache is released to the other replicas")
                return
            if time.monotonic() >= deadline:
                log(f"WARNING: models not ready after {timeout:g}s; releasing the engine cache")
                return

    return task
