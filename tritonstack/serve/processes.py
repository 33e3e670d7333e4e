"""The servers tritonstack starts (tritonserver, HAProxy, Prometheus, Locust, benchmark baselines).

Each runs in its own process group with PR_SET_PDEATHSIG, so Ctrl-C, SIGTERM, a crash of the
parent or a killed test leaves nothing behind: a stop signals the group (or only the leader,
when it must drain first), waits, and SIGKILLs whatever of the group is still there.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from tritonstack.core.errors import UserError

PR_SET_PDEATHSIG = 1


class Endpoints:
    """The addresses of a KServe v2 server (Triton, or the gateway in front of it) that listens
    on `address` at `http_port`, `grpc_port` and `metrics_port`."""

    address: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http_url(self) -> str:
        """host:port, what tritonclient.http takes."""
        return f"{self.address}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.address}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}:{self.metrics_port}/metrics"


def die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the parent dies, so no server is orphaned."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    command: Sequence[str],
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen:
    """Start `command` in a new process group that dies with this process.

    Output is appended to `log_path`, or shared with this process's when there is none.
    """
    log = open(log_path, "ab") if log_path else None  # noqa: SIM115
    try:
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT if log else None,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    finally:
        if log:
            log.close()


def signal_group(process: subprocess.Popen, sig: int) -> None:
    """`sig` to every process of the group, if its leader still runs."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)


def stop(
    process: subprocess.Popen,
    grace: float,
    sig: int | None = signal.SIGTERM,
    whole_group: bool = True,
) -> int:
    """Send `sig` (to the group, or with `whole_group=False` to the leader only, for a server
    that drains and then ends its own children), wait up to `grace` seconds for the leader, then
    SIGKILL the group: a late leader and any member that outlived it. Returns the exit code."""
    if sig is not None and process.poll() is None:
        if whole_group:
            signal_group(process, sig)
        else:
            process.send_signal(sig)
    return finish(process, grace)


def finish(process: subprocess.Popen, grace: float) -> int:
    """Wait up to `grace` seconds for the leader to exit, then SIGKILL what is left of the group."""
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.returncode


def http_ok(url: str, timeout: float = 2.0, context=None) -> bool:
    """Whether `url` answers 200 (any error, refused connection or timeout is a no)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(
    process: subprocess.Popen,
    ready: Callable[[], bool],
    timeout: float,
    name: str,
    waiting_for: Callable[[], str],
    details: Callable[[], str] = str,
    interval: float = 0.2,
) -> None:
    """Poll `ready()` until it is true; the process exiting or `timeout` passing is a UserError
    naming `name`, what it was `waiting_for()`, and its `details()` (e.g. its log's last lines)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            raise UserError(
                f"{name} exited with code {process.returncode} while starting{details()}"
            )
        if time.monotonic() > deadline:
            raise UserError(f"{name}: {waiting_for()} not ready after {timeout:.0f} s{details()}")
        time.sleep(interval)


def tree(*pids: int) -> list[psutil.Process]:
    """The processes `pids` and all their descendants that still exist."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            found += [root, *root.children(recursive=True)]
    return found


def kill_survivors(processes: Sequence[psutil.Process]) -> None:
    """SIGKILL those of `processes` still running (psutil compares creation times, so a reused
    pid is never hit)."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.is_running():
                process.kill()


def rss_bytes(processes: Sequence[psutil.Process]) -> int:
    """Resident memory of `processes` together (ones that exited meanwhile count 0)."""
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total
