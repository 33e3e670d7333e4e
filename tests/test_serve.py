"""`tritonstack serve` as a user runs it: ready, then stopped by a signal with nothing left over."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPOSITORY, free_ports

pytestmark = pytest.mark.integration

SHM = Path("/dev/shm")


def start_serve(repository: Path = REPOSITORY, *extra: str) -> tuple[subprocess.Popen, list[int]]:
    ports = free_ports(3)
    command = [sys.executable, "-m", "tritonstack.cli", "serve",
               "--model-repository", str(repository),
               "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
               "--metrics-port", str(ports[2]), *extra]  # fmt: skip
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
    assert f"  HTTP     http://127.0.0.1:{ports[0]}" in lines
    assert any("ready: classifier, classify, pipeline, postprocess" in line for line in lines)
    assert any("classifier_trt" in line for line in lines)  # says what is left out on CPU
    children = psutil.Process(process.pid).children(recursive=True)
    names = [child.name() for child in children]
    assert "tritonserver" in names
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


def test_model_that_fails_to_load_is_reported_and_cleaned_up(tmp_path):
    repository = tmp_path / "model_repository"
    shutil.copytree(REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
    (repository / "postprocess" / "labels.txt").write_text("only one label\n")
    process, _ = start_serve(repository, "--log-file", str(tmp_path / "triton.log"))
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1
    assert "Traceback" not in output.split("errors in")[0]
    assert "tritonserver exited with code" in output
    assert "labels file has 1 labels but input `class` has 2 scores" in output
    log = (tmp_path / "triton.log").read_text()
    prefix = re.search(r'"shm-region-prefix-name":"(tritonstack_[0-9a-f]+_)"', log).group(1)
    assert not segments_of(prefix)
