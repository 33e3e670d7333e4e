"""The servers under test, started fresh per scenario group, and their CPU and memory.

Triton is the embedded runtime (tritonstack.serve.runtime) on a repository variant. The baselines
run from their own virtualenv (`baseline_venv`), created on first use from
bench/requirements-baselines.txt so their pins never touch the project's environment.
CPU and RSS are summed over the server's whole process tree: tritonserver and its Python stubs,
uvicorn, MLServer's front end and inference worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tritonstack import DEFAULT_MODEL_REPOSITORY
from tritonstack.core.errors import UserError
from tritonstack.core.ports import free_ports
from tritonstack.serve.processes import http_ok, rss_bytes, spawn, tree, wait_ready
from tritonstack.serve.processes import stop as stop_group
from tritonstack.serve.runtime import EmbeddedTriton, default_cache_dir

BENCH_DIR = Path(__file__).resolve().parent
REQUIREMENTS = BENCH_DIR / "requirements-baselines.txt"
MODEL_ONNX = DEFAULT_MODEL_REPOSITORY / "classifier" / "1" / "model.onnx"
LABELS = DEFAULT_MODEL_REPOSITORY / "postprocess" / "labels.txt"


class ProcessTree:
    """CPU seconds and RSS of a process and all its descendants (of several, for a server made
    of separate processes: Triton and the gateway in front of it)."""

    def __init__(self, pid: int, *more: int):
        self.roots = [psutil.Process(p) for p in (pid, *more)]
        self.root = self.roots[0]  # the server proper (tritonserver: its children are the stubs)

    def processes(self) -> list[psutil.Process]:
        return tree(*(root.pid for root in self.roots))

    def cpu_seconds(self) -> dict[int, float]:
        times = {}
        for process in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                cpu = process.cpu_times()
                times[process.pid] = cpu.user + cpu.system
        return times

    def cpu_seconds_by_role(self) -> dict[str, float]:
        """CPU seconds per role: `tritonserver`, each stub's model name, else the process name."""
        roles: dict[str, float] = {}
        for process in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                cpu = process.cpu_times()
                name = process_role(process)
                roles[name] = roles.get(name, 0.0) + cpu.user + cpu.system
        return roles

    def rss_bytes(self) -> int:
        return rss_bytes(self.processes())


def process_role(process: psutil.Process) -> str:
    """A Python backend stub is named after its model: its first argument is
    `<repository>/<model>/<version>/model.py` (or the model file a Python-based backend serves).
    """
    command = process.cmdline()
    if command and command[0].endswith("triton_python_backend_stub") and len(command) > 1:
        return Path(command[1]).parents[1].name
    return process.name()


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between two readings (processes present in both)."""
    return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())


@dataclass
class Server:
    """A started server: where to send each protocol, its process tree, how to stop it."""

    name: str
    http: str  # host:port
    grpc: str | None
    metrics: str | None  # full URL of a Prometheus endpoint
    pid: int
    stop_callback: object = field(repr=False, default=None)
    #: Processes outside `pid`'s tree that serve the same requests (the gateway's haproxy).
    other_pids: tuple[int, ...] = ()

    def url(self, protocol: str, model: str) -> str:
        if protocol == "grpc":
            if self.grpc is None:
                raise UserError(f"{self.name} is not benchmarked over gRPC")
            return self.grpc
        return f"http://{self.http}/v2/models/{model}/infer"

    def tree(self) -> ProcessTree:
        return ProcessTree(self.pid, *self.other_pids)

    def stop(self) -> None:
        if self.stop_callback is not None:
            self.stop_callback()
            self.stop_callback = None


def start_triton(repository: Path, log_path: Path, name: str) -> Server:
    http, grpc, metrics = free_ports(3)
    triton = EmbeddedTriton(repository, http, grpc, metrics, log_path=log_path)
    triton.start(timeout=180)
    return Server(
        name, triton.http_url, triton.grpc_url, triton.metrics_url, triton.process.pid, triton.stop
    )


def start_gateway(repository: Path, log_path: Path, name: str, config: str) -> Server:
    """Triton on `repository` behind HAProxy running `config` (relative to the checkout; the
    gateway's own is gateway/haproxy.cfg, with its committed limits): requests go to HAProxy's
    ports; CPU and memory count tritonserver and haproxy."""
    from tritonstack.core.project import project_dir
    from tritonstack.serve.gateway import Gateway

    http, grpc, metrics = free_ports(3)
    gateway_http, gateway_grpc, gateway_metrics = free_ports(3)
    triton = EmbeddedTriton(repository, http, grpc, metrics, log_path=log_path)
    triton.start(timeout=180)
    gateway = Gateway(
        http,
        grpc,
        http_port=gateway_http,
        grpc_port=gateway_grpc,
        metrics_port=gateway_metrics,
        model_repository=repository,
        log_path=log_path.with_suffix(".haproxy.log"),
        config=project_dir() / config,
    )
    try:
        gateway.start()
    except BaseException:
        triton.stop()
        raise

    def stop() -> None:
        try:
            gateway.stop()  # drains first: nothing in flight is cut
        finally:
            triton.stop()

    return Server(
        name,
        gateway.http_url,
        gateway.grpc_url,
        triton.metrics_url,
        triton.process.pid,
        stop,
        other_pids=(gateway.process.pid,),
    )


def baseline_venv(cache_dir: Path | None = None, progress=print) -> Path:
    """The baselines' virtualenv, (re)created when bench/requirements-baselines.txt changes."""
    if sys.version_info >= (3, 13):
        raise UserError(
            "the MLServer baseline (1.7.1) supports Python 3.9-3.12; run the bench from a "
            "3.10-3.12 virtualenv, or leave the baselines out: --scenarios without `baselines`"
        )
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    venv = Path(cache_dir or default_cache_dir()) / f"bench-venv-{digest}"
    python = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    progress(f"installing the baselines (FastAPI, MLServer) into {venv} (once, about 30 s)")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
                str(REQUIREMENTS),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(venv, ignore_errors=True)
        raise UserError(
            f"installing the baselines from {REQUIREMENTS} failed (needs PyPI access):\n"
            f"{(exc.stderr or '').strip()[-2000:]}"
        ) from None
    (venv / ".installed").touch()
    return venv


def _wait_http(url: str, process: subprocess.Popen, timeout: float, log: Path) -> None:
    wait_ready(
        process,
        lambda: http_ok(url),
        timeout,
        url,
        waiting_for=lambda: "the server",
        details=lambda: ":\n" + log.read_text(errors="replace")[-2000:],
    )


def _stopper(process: subprocess.Popen, workdir: Path | None = None):
    def stop() -> None:
        stop_group(process, 20)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    return stop


def start_fastapi(venv: Path, log_path: Path, name: str, workers: int = 1) -> Server:
    """The classifier's FastAPI app: uvicorn with one worker (its default) or more."""
    env = {"BENCH_MODEL_ONNX": str(MODEL_ONNX), "BENCH_LABELS": str(LABELS)}
    return start_uvicorn(venv, log_path, name, "fastapi_app:app", env, workers)


def start_uvicorn(
    venv: Path, log_path: Path, name: str, app: str, env: dict[str, str], workers: int = 1
) -> Server:
    """A FastAPI app of bench/ in uvicorn, access log off as in production; `env` configures it."""
    (port,) = free_ports(1)
    env = dict(os.environ, **env)
    command = [
        str(venv / "bin" / "python"),
        "-m",
        "uvicorn",
        app,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    process = spawn(command, log_path, env=env, cwd=BENCH_DIR)
    server = Server(name, f"127.0.0.1:{port}", None, None, process.pid, _stopper(process))
    try:
        _wait_http(f"http://127.0.0.1:{port}/v2/health/ready", process, 60, log_path)
    except BaseException:
        server.stop()
        raise
    return server


def start_mlserver(venv: Path, log_path: Path, max_batch_time_s: float = 0.0001) -> Server:
    """MLServer 1.7.1 with the custom ONNX runtime and adaptive batching (64 rows, 100 us)."""
    http, grpc, metrics = free_ports(3)
    workdir = Path(tempfile.mkdtemp(prefix="tritonstack-mlserver-"))
    model_dir = workdir / "classifier"
    model_dir.mkdir()
    shutil.copy2(BENCH_DIR / "mlserver_runtime.py", model_dir / "mlserver_runtime.py")
    settings = {
        "host": "127.0.0.1",
        "http_port": http,
        "grpc_port": grpc,
        "metrics_port": metrics,
        "debug": False,
        "metrics_dir": str(workdir / "metrics"),
    }
    (workdir / "settings.json").write_text(json.dumps(settings))
    model_settings = {
        "name": "classifier",
        "implementation": "mlserver_runtime.OnnxClassifier",
        "max_batch_size": 64,
        "max_batch_time": max_batch_time_s,
        "parameters": {"uri": str(MODEL_ONNX), "extra": {"labels": str(LABELS)}},
    }
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings))
    process = spawn(
        [str(venv / "bin" / "mlserver"), "start", str(workdir)],
        log_path,
        env=dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"),
        cwd=workdir,
    )
    server = Server(
        "mlserver",
        f"127.0.0.1:{http}",
        None,
        f"http://127.0.0.1:{metrics}/metrics",
        process.pid,
        _stopper(process, workdir),
    )
    try:
        _wait_http(f"http://127.0.0.1:{http}/v2/models/classifier/ready", process, 120, log_path)
    except BaseException:
        server.stop()
        raise
    return server
