"""Locust as compose runs it: a master and a worker in separate processes, every user type.

A master forwards only the locustfile's own options to its workers, not Locust's built-in ones
such as --host: what works in one process can still die on every worker. The master and the
worker here are started with the commands compose uses (loadtest/locust.conf, --host on the
master only), on 127.0.0.1 against the session's real tritonserver, and they run in a virtualenv
built from loadtest/requirements.txt: the pins the Locust image installs, not the tests' own.
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.support import ROOT
from tritonstack.core.contract import LLM_MODEL
from tritonstack.core.ports import free_ports
from tritonstack.load.loadtest import LOCUST_CONF, LOCUSTFILE
from tritonstack.serve.runtime import default_cache_dir

REQUIREMENTS = ROOT / "loadtest" / "requirements.txt"
#: (user type, model): every user type users.py defines, spread over the three models.
CASES = [("http_json", "pipeline"), ("http_binary", "classify"), ("grpc", "classifier")]
#: What each user type reports as Locust's request type.
REQUEST_TYPES = {"http_json": "POST", "http_binary": "POST", "grpc": "gRPC"}
RUN_S = 5
# Integration: the session's tritonserver. The first test also builds the virtualenv from PyPI
# (about 30 s here, more on a cold CI cache), hence a limit above the suite's 300 s.
pytestmark = pytest.mark.timeout(900)


def image_venv() -> Path:
    """A Python with exactly loadtest/requirements.txt installed, like the Locust image: made
    once into ~/.cache/tritonstack/ under the requirements' hash (tests/prefetch.py makes it
    beside the unit tests)."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    root = default_cache_dir() / f"locust-image-venv-{digest}"
    python = root / "bin" / "python"
    if (root / ".installed").exists():
        return python
    shutil.rmtree(root, ignore_errors=True)
    venv.EnvBuilder(with_pip=True).create(root)
    install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    result = subprocess.run(
        [*install, "-r", str(REQUIREMENTS)], capture_output=True, text=True, timeout=900
    )
    if result.returncode:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"pip install -r {REQUIREMENTS} failed:\n{result.stderr[-2000:]}")
    (root / ".installed").touch()
    return python


@pytest.fixture(scope="session")
def image_python() -> Path:
    return image_venv()


@pytest.fixture(scope="session")
def image_lib(tmp_path_factory) -> Path:
    """The tritonstack package as Dockerfile.locust copies it: on PYTHONPATH, nothing else of
    the checkout beside it."""
    lib = tmp_path_factory.mktemp("locust-lib")
    shutil.copytree(ROOT / "tritonstack", lib / "tritonstack", ignore=shutil.ignore_patterns(
        "__pycache__"))  # fmt: skip
    dockerfile = (ROOT / "Dockerfile.locust").read_text()
    assert "COPY tritonstack /opt/tritonstack/lib/tritonstack" in dockerfile
    assert "ENV PYTHONPATH=/opt/tritonstack/lib" in dockerfile
    return lib


def locust_env(lib: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
    env["LOCUST_METRICS_PORT"] = "0"  # no exporter endpoint: both processes would want 9646
    if lib is not None:
        env["PYTHONPATH"] = str(lib)
    return env


def test_locust_versions_agree(image_python: Path) -> None:
    """The venv runs the same Locust as the tests and the image (no silent resolution drift)."""
    result = subprocess.run(
        [str(image_python), "-m", "locust", "--version"], capture_output=True, text=True
    )
    tests_locust = subprocess.run(
        [sys.executable, "-m", "locust", "--version"], capture_output=True, text=True
    )
    assert result.stdout.split()[:2] == tests_locust.stdout.split()[:2]


def run_master_and_worker(
    image_python: Path, tmp_path: Path, host: str, options: list[str], lib: Path
) -> list[dict]:
    """A master and a worker as compose starts them, for RUN_S seconds with 4 users: the master's
    statistics rows (but the aggregate), once both exited 0 with no traceback, no failure and no
    exception recorded."""
    (master_port,) = free_ports(1)
    common = ["-f", str(LOCUSTFILE), "--config", str(LOCUST_CONF)]
    master = [
        str(image_python), "-m", "locust", *common,
        "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(master_port),
        "--host", host, *options,
        "--headless", "-u", "4", "-r", "4", "-t", f"{RUN_S}s", "--expect-workers", "1",
        "--csv", str(tmp_path / "locust"), "--only-summary",
    ]  # fmt: skip
    worker = [
        str(image_python), "-m", "locust", *common,
        "--worker", "--master-host", "127.0.0.1", "--master-port", str(master_port),
    ]  # fmt: skip
    logs = {name: tmp_path / f"{name}.log" for name in ("master", "worker")}
    processes = {}
    try:
        for name, command in (("master", master), ("worker", worker)):
            with open(logs[name], "wb") as log:
                # cwd: Locust also reads ./locust.conf; the test's folder has none
                processes[name] = subprocess.Popen(
                    command, cwd=tmp_path, env=locust_env(lib), stdout=log, stderr=subprocess.STDOUT
                )
        codes = {name: process.wait(timeout=RUN_S + 120) for name, process in processes.items()}
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    output = {name: path.read_text(errors="replace") for name, path in logs.items()}
    assert codes == {"master": 0, "worker": 0}, output
    assert "Traceback" not in output["worker"], output["worker"]
    with open(tmp_path / "locust_stats.csv") as handle:
        rows = [r for r in csv.DictReader(handle) if r["Name"] != "Aggregated"]
    assert rows, output
    assert sum(int(r["Failure Count"]) for r in rows) == 0, output
    with open(tmp_path / "locust_exceptions.csv") as handle:
        assert list(csv.DictReader(handle)) == []
    return rows


@pytest.mark.parametrize(("user_type", "model"), CASES)
def test_master_and_worker(
    triton, image_python: Path, image_lib: Path, tmp_path: Path, user_type, model
) -> None:
    rows = run_master_and_worker(
        image_python, tmp_path, f"http://{triton.http_url}",
        # compose derives the gRPC address from --host (port 8001); here only the port differs
        ["--grpc-port", str(triton.grpc_port), "--user-type", user_type, "--model", model],
        image_lib,
    )  # fmt: skip
    for row in rows:  # the master's statistics are the worker's reports
        assert row["Type"] == REQUEST_TYPES[user_type]
        assert row["Name"].startswith(f"{model} rows=")
    assert sum(int(r["Request Count"]) for r in rows) > 0


def test_master_and_worker_stream_the_llm(
    llm_triton, image_python: Path, image_lib: Path, tmp_path: Path
) -> None:
    """The LLM's user on a worker: its answers and their time to first token and inter-token
    gaps reach the master as rows of their own."""
    rows = run_master_and_worker(
        image_python, tmp_path, f"http://{llm_triton.http_url}",
        ["--user-type", "llm_stream", "--max-tokens", "16"], image_lib,
    )  # fmt: skip
    counts = {row["Type"]: int(row["Request Count"]) for row in rows}
    assert set(counts) == {"POST", "TTFT", "ITL"}, rows
    assert all(row["Name"] == f"{LLM_MODEL} generate_stream" for row in rows), rows
    # one first token per answer, and gaps between the tokens within answers
    assert counts["POST"] > 0 and counts["TTFT"] == counts["POST"], counts
    assert counts["ITL"] > 0, counts
