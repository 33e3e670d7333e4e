"""`tritonstack up`: Triton, the gateway, Prometheus and the Locust web UI on loopback, no Docker.

The same services as the compose stack, on one machine: the embedded Triton
(tritonstack.serve.runtime) behind the HAProxy gateway (tritonstack.serve.gateway, `--no-gateway` to
skip it), Prometheus with the project's scrape jobs and rules rendered for loopback
(tritonstack.render.promconfig), and Locust's web UI driving Triton with the project's locustfile
and serving its client-side metrics to Prometheus. Prometheus is optional: without the binary the
rest runs and one line says how to get it. With `--llm` the LLM (tritonstack.serve.llm) is served
beside the classifiers: the gateway routes its generate routes, Prometheus reads its `vllm:*`
metrics on Triton's port, and Locust's `llm_stream` user type loads it.

Every child runs in its own process group with PR_SET_PDEATHSIG, so Ctrl-C, SIGTERM, a crash of
one child, or a kill of this process itself leaves nothing running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tritonstack import DEFAULT_MODEL_REPOSITORY
from tritonstack.core.contract import (
    GRPC_PORT,
    HTTP_PORT,
    LOCUST_METRICS_PORT,
    LOCUST_WEB_PORT,
    LOOPBACK,
    METRICS_PORT,
)
from tritonstack.core.errors import UserError
from tritonstack.core.project import project_dir
from tritonstack.core.settings import load
from tritonstack.load.loadtest import LLM_USER_TYPE
from tritonstack.serve import processes

ROOT = project_dir()
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
LOCUST_CONF = ROOT / "loadtest" / "locust.conf"
ADDRESS = LOOPBACK
HOW_TO_GET_PROMETHEUS = (
    "`sudo apt-get install prometheus` (Debian/Ubuntu; then `sudo systemctl disable --now "
    "prometheus` if you do not want the system service) or a release from "
    "https://prometheus.io/download/, then put it on PATH or pass --prometheus-bin"
)


class _Interrupted(BaseException):
    """SIGINT or SIGTERM arrived while the stack was still starting.

    A BaseException, like KeyboardInterrupt: the signal handler raises it wherever the main
    thread happens to be, and a library's `except Exception` there must not swallow the stop."""


@dataclass
class Child:
    """A helper process (Prometheus, Locust) in its own process group, logging to a file."""

    name: str
    command: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    process: subprocess.Popen | None = field(default=None, init=False)

    def start(self) -> Child:
        self.process = processes.spawn(self.command, self.log_path, env=self.env, cwd=self.cwd)
        return self

    def poll(self) -> int | None:
        return self.process.poll() if self.process else None

    def terminate(self) -> None:
        """SIGTERM to the whole group (both exit cleanly on it); wait() finishes the job."""
        if self.process is not None:
            processes.signal_group(self.process, signal.SIGTERM)

    def wait(self, timeout: float = 20.0) -> int | None:
        """Wait for the exit, SIGKILL the group if it is late, and reap stray group members."""
        return None if self.process is None else processes.finish(self.process, timeout)

    def log_tail(self) -> str:
        return _tail(self.name, self.log_path)


def _tail(name: str, path: Path, lines: int = 15) -> str:
    """The last lines of a service's log, prefixed with its name (logs live in a temp dir)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"  {name}| (no log)"
    return "\n".join(f"  {name}| {line}" for line in text[-lines:])


def _check_ports(ports: dict[str, int]) -> None:
    """One clear error for a port that is taken, before anything starts."""
    seen: dict[int, str] = {}
    for option, port in ports.items():
        if port in seen:
            raise UserError(f"{option} and {seen[port]} are both {port}; give each its own port")
        seen[port] = option
        with socket.socket() as s:
            try:
                s.bind((ADDRESS, port))
            except OSError as exc:
                raise UserError(
                    f"{ADDRESS}:{port} is not free ({exc.strerror}); pick another with {option}"
                ) from None


def _wait_http(child: Child, url: str, timeout: float) -> None:
    """Until `url` answers 200; a child that exits or a deadline passed is a UserError."""
    processes.wait_ready(
        child.process,
        lambda: processes.http_ok(url),
        timeout,
        child.name,
        waiting_for=lambda: url,
        details=lambda: ":\n" + child.log_tail(),
        interval=0.3,
    )


def find_prometheus(option: str | None) -> str | None:
    """The binary to run, or None after one line saying how to get it."""
    path = option or shutil.which("prometheus")
    if path and Path(path).is_file() and os.access(path, os.X_OK):
        return path
    where = f"{option} is not an executable file" if option else "prometheus is not on PATH"
    print(
        f"Prometheus not started: {where}. Get it with {HOW_TO_GET_PROMETHEUS}.",
        file=sys.stderr,
        flush=True,
    )
    return None


def prometheus_child(binary: str, args: argparse.Namespace, run_dir: Path, logs: Path) -> Child:
    from tritonstack.render.promconfig import render

    exporters = [] if args.no_locust else [f"{ADDRESS}:{args.locust_metrics_port}"]
    gateway_metrics = f"{ADDRESS}:{args.gateway_metrics_port}" if args.gateway else None
    config = run_dir / "prometheus.yml"
    config.write_text(
        render(f"{ADDRESS}:{args.metrics_port}", exporters, gateway_metrics=gateway_metrics)
    )
    data = args.prometheus_data or run_dir / "prometheus-data"
    return Child(
        "prometheus",
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address={ADDRESS}:{args.prometheus_port}",
            "--storage.tsdb.retention.time=1d",
        ],
        logs / "prometheus.log",
    )


def locust_child(args: argparse.Namespace, logs: Path) -> Child:
    locustfile = Path(args.locustfile).resolve()
    if not locustfile.is_file():
        raise UserError(f"{locustfile} not found; pass --locustfile or --no-locust")
    command = [sys.executable, "-m", "locust", "-f", str(locustfile)]
    if args.locust_config is not None:
        if not Path(args.locust_config).exists():
            raise UserError(f"{args.locust_config} not found; pass --locust-config")
        command += ["--config", str(Path(args.locust_config).resolve())]
    command += [
        "--web-host", ADDRESS,
        "--web-port", str(args.locust_port),
        "--host", f"http://{ADDRESS}:{args.http_port}",
    ]  # fmt: skip
    if locustfile == LOCUSTFILE:  # the project's locustfile defines --grpc-host
        command += ["--grpc-host", f"{ADDRESS}:{args.grpc_port}"]
    env = dict(os.environ)
    env["LOCUST_METRICS_ADDR"] = ADDRESS
    env["LOCUST_METRICS_PORT"] = str(args.locust_metrics_port)
    # The models the form offers, the first by default, as compose passes stack.env to Locust.
    env["PUBLIC_MODELS"] = " ".join(load().public_models)
    return Child("locust", command, logs / "locust.log", env=env, cwd=ROOT)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=DEFAULT_MODEL_REPOSITORY,
        help="model repository directory (default: this checkout's model_repository/)",
    )
    ports = parser.add_argument_group(f"ports (all on {ADDRESS})")
    for option, default, what in (
        ("--http-port", HTTP_PORT, "clients' HTTP (the gateway; Triton with --no-gateway)"),
        ("--grpc-port", GRPC_PORT, "clients' gRPC (the gateway; Triton with --no-gateway)"),
        ("--metrics-port", METRICS_PORT, "Triton metrics"),
        ("--prometheus-port", 9090, "Prometheus"),
        ("--locust-port", LOCUST_WEB_PORT, "Locust web UI"),
        (
            "--locust-metrics-port",
            LOCUST_METRICS_PORT,
            "Locust's client metrics (scraped by Prometheus)",
        ),
    ):
        ports.add_argument(option, type=int, default=default, help=f"{what} (default: {default})")
    parser.add_argument(
        "--prometheus-bin", default=None, help="Prometheus binary (default: `prometheus` on PATH)"
    )
    parser.add_argument(
        "--prometheus-data",
        type=Path,
        default=None,
        help="keep Prometheus' TSDB here (default: a temporary directory removed on exit)",
    )
    parser.add_argument(
        "--locustfile", type=Path, default=LOCUSTFILE, help="default: loadtest/locustfile.py"
    )
    parser.add_argument(
        "--locust-config", type=Path, default=LOCUST_CONF, help="default: loadtest/locust.conf"
    )
    parser.add_argument("--no-locust", action="store_true", help="do not start Locust")
    parser.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep each service's log here (default: a temporary directory removed on exit)",
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for each service"
    )
    from tritonstack.serve.gateway import add_arguments
    from tritonstack.serve.llm import add_arguments as add_llm_arguments

    add_arguments(parser)
    add_llm_arguments(parser)


@dataclass
class _Stack:
    triton: object | None = None
    gateway: object | None = None
    children: list[Child] = field(default_factory=list)

    def stop(self) -> None:
        """Load generator first, then Prometheus, then the gateway (answers what it accepted),
        then Triton (which drains in-flight requests)."""
        for child in reversed(self.children):
            child.terminate()
        if self.gateway is not None:
            self.gateway.stop()
        if self.triton is not None:
            self.triton.stop()
        for child in reversed(self.children):
            child.wait()


def run(args: argparse.Namespace) -> int:
    from tritonstack.serve import gateway as gw
    from tritonstack.serve import llm
    from tritonstack.serve.runtime import EmbeddedTriton, default_cache_dir

    args.address = ADDRESS
    gw.check_arguments(args)
    ports = {
        "--http-port": args.http_port,
        "--grpc-port": args.grpc_port,
        "--metrics-port": args.metrics_port,
    }
    if args.gateway:
        ports["--triton-http-port"] = args.triton_http_port
        ports["--triton-grpc-port"] = args.triton_grpc_port
        ports["--gateway-metrics-port"] = args.gateway_metrics_port
    prometheus = find_prometheus(args.prometheus_bin)
    if prometheus:
        ports["--prometheus-port"] = args.prometheus_port
    if not args.no_locust:
        ports["--locust-port"] = args.locust_port
        ports["--locust-metrics-port"] = args.locust_metrics_port
    _check_ports(ports)
    llm_plan = llm.plan(args, default_cache_dir())

    requested: list[int] = []
    starting, failed = True, False

    def request_stop(signum, _frame):
        # Only an append: an Event.set() or a print() here can deadlock on a lock the main
        # thread holds when the signal lands (inside Event.wait(), inside another print).
        if requested:
            return  # already stopping; a second Ctrl-C must not interrupt the cleanup
        requested.append(signum)
        if starting:
            raise _Interrupted

    run_dir = Path(tempfile.mkdtemp(prefix="tritonstack-up-"))
    logs = args.log_dir or run_dir
    logs.mkdir(parents=True, exist_ok=True)
    stack = _Stack()
    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        children = []
        if prometheus:
            children.append(prometheus_child(prometheus, args, run_dir, logs))
        if not args.no_locust:
            children.append(locust_child(args, logs))
        print(f"starting Triton (models in {args.model_repository})", flush=True)
        if llm_plan:
            print(llm_plan.describe(), flush=True)
        triton_http_port, triton_grpc_port = gw.triton_ports(args)
        stack.triton = EmbeddedTriton(
            model_repository=args.model_repository,
            http_port=triton_http_port,
            grpc_port=triton_grpc_port,
            metrics_port=args.metrics_port,
            address=ADDRESS,
            log_path=logs / "triton.log",
            **llm.runtime_options(llm_plan),
        )
        stack.triton.start(timeout=args.timeout)
        if args.gateway:
            print("starting the gateway", flush=True)
            stack.gateway = gw.from_arguments(args, stack.triton, log_path=logs / "haproxy.log")
            stack.gateway.start()
        urls = {}
        for child in children:
            print(f"starting {child.name}", flush=True)
            stack.children.append(child)  # before start(): an interrupt must not lose it
            child.start()
        for child in children:
            if child.name == "prometheus":
                base = f"http://{ADDRESS}:{args.prometheus_port}"
                _wait_http(child, f"{base}/-/ready", args.timeout)
                urls["Prometheus"] = base
            else:
                base = f"http://{ADDRESS}:{args.locust_port}"
                _wait_http(child, base + "/", args.timeout)
                urls["Locust web UI"] = base
                urls["Locust metrics"] = f"http://{ADDRESS}:{args.locust_metrics_port}/metrics"
        starting = False

        triton = stack.triton
        print(f"ready: {', '.join(triton.loaded)}", flush=True)
        for name, reason in triton.failed.items():
            print(f"not loaded: {name}: {reason}", flush=True)
        if triton.skipped:
            print(f"not served on CPU (GPU only): {', '.join(triton.skipped)}", flush=True)
        rows = {**gw.endpoint_rows(triton, stack.gateway), **urls}
        for label, url in rows.items():
            print(f"  {label:<26} {url}", flush=True)
        if llm_plan and not args.no_locust:
            print(
                f"Locust loads the LLM with user-type {LLM_USER_TYPE} (a field of its start form)",
                flush=True,
            )
        if args.log_dir:
            print(f"logs in {args.log_dir}", flush=True)
        print("Ctrl-C stops everything", flush=True)

        while not requested:
            time.sleep(0.2)
            if triton.process.poll() is not None:
                print(_tail("tritonserver", logs / "triton.log"), file=sys.stderr)
                raise UserError(
                    f"tritonserver exited unexpectedly with code {triton.process.returncode}; "
                    "stopped the rest"
                )
            if stack.gateway is not None and stack.gateway.process.poll() is not None:
                print(stack.gateway.log_tail(), file=sys.stderr)
                raise UserError(
                    f"haproxy exited unexpectedly with code {stack.gateway.process.returncode}; "
                    "stopped the rest"
                )
            for child in stack.children:
                if child.poll() is not None:
                    print(child.log_tail(), file=sys.stderr)
                    raise UserError(
                        f"{child.name} exited unexpectedly with code {child.poll()}; "
                        "stopped the rest"
                    )
    except _Interrupted:
        pass  # stop requested before everything was ready: clean up below, exit 0
    except BaseException:
        failed = True
        raise
    finally:
        starting = False
        if requested:
            print(f"{signal.Signals(requested[0]).name}: stopping", flush=True)
        try:
            stack.stop()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            _clean_run_dir(run_dir, keep_logs=failed and args.log_dir is None)
    print("stopped", flush=True)
    return 0


def _clean_run_dir(run_dir: Path, keep_logs: bool) -> None:
    """Remove the rendered config and the TSDB; after a failure keep the logs and say where."""
    if not keep_logs or not any(run_dir.glob("*.log")):
        shutil.rmtree(run_dir, ignore_errors=True)
        return
    for path in run_dir.iterdir():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.suffix != ".log":
            path.unlink(missing_ok=True)
    print(f"logs kept in {run_dir}", file=sys.stderr, flush=True)
