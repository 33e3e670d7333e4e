"""The gateway natively: Debian's haproxy running gateway/haproxy.cfg in front of Triton.

The config is the one compose and Kubernetes run; this module only fills in its environment
(ports, Triton's address, stack.env's admission settings, the limits tritonstack.core.limits derives
from the model repository as a map file of its own, keys, certificate) and drives HAProxy's
runtime API for what changes while it runs: more Triton replicas (`add server`) and API-key
rotation (`prepare map` / `add map` / `commit map`, atomic, no restart).

    with EmbeddedTriton(repo, *free_ports(3)) as triton, Gateway.for_triton(triton) as gateway:
        client = tritonclient.http.InferenceServerClient(gateway.http_url)
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tritonstack import DEFAULT_MODEL_REPOSITORY
from tritonstack.core.contract import (
    GATEWAY_METRICS_PORT,
    GRPC_PORT,
    HTTP_PORT,
    LLM_MODEL,
    LOOPBACK,
    TRITON_GRPC_PORT,
    TRITON_HTTP_PORT,
)
from tritonstack.core.errors import UserError
from tritonstack.core.limits import limits
from tritonstack.core.project import project_dir
from tritonstack.core.settings import Settings, load
from tritonstack.serve import processes

CONFIG = project_dir() / "gateway" / "haproxy.cfg"
#: `-dMglobal`: keep freed buffers in HAProxy's global pool. With glibc (Debian's build) HAProxy
#: leaves that pool off and returns each freed request buffer (tune.bufsize, 256 kB here) to
#: malloc, which trims and regrows the heap for every request: strace counted 1.5 brk() and 0.3
#: madvise() calls per request without it, none with it. musl builds (the alpine image) keep
#: the pool on by default, so compose and Kubernetes pass the flag to the same effect.
HAPROXY_FLAGS = ("-dMglobal",)
#: HAProxy threads natively, where the gateway shares the machine with Triton: one thread spends
#: less CPU per request than one per core (2 cores, 16 clients, classifier: 184 vs 206 us per
#: request for haproxy, tritonserver and stubs together). A container leaves HAProxy's default.
THREADS = 1
#: How long a soft stop may take: haproxy.cfg's hard-stop-after (a test holds them equal).
SOFT_STOP_SECONDS = 15


def haproxy_binary(option: str | None = None) -> str:
    """The haproxy to run: the option, else PATH, else Debian's /usr/sbin (not on users' PATH)."""
    candidates = [option] if option else [shutil.which("haproxy"), "/usr/sbin/haproxy"]
    for path in candidates:
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            return path
    where = f"{option} is not an executable file" if option else "haproxy is not installed"
    raise UserError(
        f"{where}: `sudo apt-get install haproxy` (Debian/Ubuntu, 2.6 or newer), "
        "or pass --no-gateway to call Triton directly"
    )


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def check_publishing(address: str, api_keys: Path | None) -> None:
    """Listening beyond loopback without API keys would hand the models to the network."""
    if not is_loopback(address) and api_keys is None:
        raise UserError(
            f"refusing to listen on {address} without API keys: pass --api-keys FILE "
            "(lines `<key> <client name>`), or listen on 127.0.0.1"
        )
    if api_keys is not None and not Path(api_keys).is_file():
        raise UserError(f"{api_keys}: API keys file not found")


@dataclass
class Gateway(processes.Endpoints):
    """One haproxy process running gateway/haproxy.cfg natively; a context manager.

    Admission (`maxconn`, `queue_per_replica`, `queue_timeout_ms` and the LLM's) defaults to
    stack.env's settings."""

    triton_http_port: int
    triton_grpc_port: int
    http_port: int = HTTP_PORT
    grpc_port: int = GRPC_PORT
    metrics_port: int = GATEWAY_METRICS_PORT
    address: str = LOOPBACK
    triton_host: str = LOOPBACK
    api_keys: Path | None = None
    tls_cert: Path | None = None
    maxconn: int | None = None
    queue_per_replica: int | None = None
    queue_timeout_ms: int | None = None
    model_repository: Path = DEFAULT_MODEL_REPOSITORY
    settings: Settings | None = None
    #: A Triton serving the LLM (natively the same one); None: the LLM routes answer 503.
    llm_host: str | None = None
    llm_http_port: int = HTTP_PORT
    llm_grpc_port: int = GRPC_PORT
    llm_streams: int | None = None
    llm_queue_per_replica: int | None = None
    llm_queue_timeout_ms: int | None = None
    log_path: Path | None = None
    haproxy_bin: str | None = None
    config: Path = CONFIG
    process: subprocess.Popen | None = field(default=None, init=False)
    replicas: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        from tritonstack.core.settings import milliseconds

        settings = self.settings = load() if self.settings is None else self.settings
        defaults = {
            "maxconn": settings.GATEWAY_MAXCONN,
            "queue_per_replica": settings.GATEWAY_QUEUE_PER_REPLICA,
            "queue_timeout_ms": milliseconds(settings.GATEWAY_QUEUE_TIMEOUT),
            "llm_streams": settings.GATEWAY_LLM_STREAMS,
            "llm_queue_per_replica": settings.GATEWAY_LLM_QUEUE_PER_REPLICA,
            "llm_queue_timeout_ms": milliseconds(settings.GATEWAY_LLM_QUEUE_TIMEOUT),
        }
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    @classmethod
    def for_triton(cls, triton, **kwargs) -> Gateway:
        """A gateway in front of an EmbeddedTriton (on its loopback ports), routing the LLM to
        it as well when it serves one."""
        kwargs.setdefault("model_repository", triton.model_repository)
        if LLM_MODEL in triton.served:
            kwargs.setdefault("llm_host", triton.address)
            kwargs.setdefault("llm_http_port", triton.http_port)
            kwargs.setdefault("llm_grpc_port", triton.grpc_port)
        return cls(triton.http_port, triton.grpc_port, triton_host=triton.address, **kwargs)

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    def environment(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("GATEWAY_", "TRITON_", "LLM_"))  # only what is set here counts
        }
        env.update(
            self.settings.environment(),
            GATEWAY_ADDRESS=self.address,
            GATEWAY_PUBLISH_ADDRESS=self.address,
            GATEWAY_HTTP_PORT=str(self.http_port),
            GATEWAY_GRPC_PORT=str(self.grpc_port),
            GATEWAY_METRICS_PORT=str(self.metrics_port),
            GATEWAY_RUNTIME_SOCKET=str(self.runtime_socket),
            GATEWAY_MODELS_MAP=str(self.models_map),
            GATEWAY_MAXCONN=str(self.maxconn),
            GATEWAY_QUEUE_PER_REPLICA=str(self.queue_per_replica),
            GATEWAY_QUEUE_TIMEOUT=f"{self.queue_timeout_ms}ms",
            GATEWAY_THREADS=str(THREADS),
            **self.limits.environment(),
            TRITON_HOST=self.triton_host,
            TRITON_HTTP_PORT=str(self.triton_http_port),
            TRITON_GRPC_PORT=str(self.triton_grpc_port),
            GATEWAY_LLM_STREAMS=str(self.llm_streams),
            GATEWAY_LLM_QUEUE_PER_REPLICA=str(self.llm_queue_per_replica),
            GATEWAY_LLM_QUEUE_TIMEOUT=f"{self.llm_queue_timeout_ms}ms",
        )
        if self.llm_host is not None:
            env.update(
                LLM_HOST=self.llm_host,
                LLM_HTTP_PORT=str(self.llm_http_port),
                LLM_GRPC_PORT=str(self.llm_grpc_port),
            )
        if self.api_keys is not None:
            env["GATEWAY_API_KEYS"] = str(Path(self.api_keys).resolve())
        if self.tls_cert is not None:
            env["GATEWAY_TLS_CERT"] = str(Path(self.tls_cert).resolve())
        return env

    def start(self, timeout: float = 30.0) -> Gateway:
        """Start haproxy; return once it answers through to a ready Triton."""
        check_publishing(self.address, self.api_keys)
        binary = haproxy_binary(self.haproxy_bin)
        # The public models' bounds for the repository this gateway fronts: a map of its own,
        # so a repository other than the project's (serve --model-repository) gets its own.
        self.limits = limits(self.model_repository, self.settings)
        self._run_dir = Path(tempfile.mkdtemp(prefix="tritonstack-gateway-"))
        self.runtime_socket = self._run_dir / "runtime.sock"
        self.models_map = self._run_dir / "models.map"
        self.models_map.write_text(self.limits.models_map())
        if self.log_path is None:
            self.log_path = self._run_dir / "haproxy.log"
        self.process = processes.spawn(
            [binary, "-db", *HAPROXY_FLAGS, "-f", str(self.config)],
            self.log_path,
            env=self.environment(),
        )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop(grace=0)
            raise
        return self

    def _ready(self) -> bool:
        import ssl

        context = ssl._create_unverified_context() if self.tls_cert else None
        return processes.http_ok(
            f"{self.scheme}://{self.http_url}/v2/health/ready", context=context
        )

    def _wait_ready(self, timeout: float) -> None:
        processes.wait_ready(
            self.process,
            self._ready,
            timeout,
            "haproxy",
            waiting_for=lambda: f"the gateway at {self.http_url}",
            details=lambda: ":\n" + self.log_tail(),
            interval=0.1,
        )

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace").splitlines()
        except (OSError, TypeError):
            return "  haproxy| (no log)"
        return "\n".join(f"  haproxy| {line}" for line in text[-lines:])

    def runtime(self, command: str) -> str:
        """One command on HAProxy's runtime API (the admin-level stats socket)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(str(self.runtime_socket))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def add_replica(self, http_port: int, grpc_port: int, host: str = LOOPBACK) -> str:
        """Put one more Triton behind both backends without a restart; returns its server name."""
        self.replicas += 1
        name = f"triton{self.replicas}"
        common = f"check inter 2s fall 2 rise 1 maxconn {self.maxconn}"
        for backend, line in (
            ("triton_http", f"{host}:{http_port} {common}"),
            (
                "triton_grpc",
                f"{host}:{grpc_port} proto h2 {common} check-proto h1 port {http_port}",
            ),
        ):
            for command in (
                f"add server {backend}/{name} {line}",
                f"enable health {backend}/{name}",
                f"enable server {backend}/{name}",
            ):
                answer = self.runtime(command).strip()
                if answer and not answer.startswith("New server registered"):
                    raise UserError(f"haproxy refused `{command}`: {answer}")
        return name

    def reload_keys(self) -> int:
        """Swap in the API keys file's current content atomically; returns the number of keys."""
        if self.api_keys is None:
            raise UserError("this gateway runs without API keys; start it with --api-keys FILE")
        path = str(Path(self.api_keys).resolve())
        entries = parse_keys(Path(path))
        answer = self.runtime(f"prepare map {path}")
        version = answer.strip().rpartition(":")[2].strip()  # "New version created: 3"
        if not version.isdigit():
            raise UserError(f"haproxy refused `prepare map`: {answer.strip()}")
        for key, name in entries.items():
            answer = self.runtime(f"add map @{version} {path} {key} {name}").strip()
            if answer:
                raise UserError(f"haproxy refused a key: {answer}")
        answer = self.runtime(f"commit map @{version} {path}").strip()
        if answer:
            raise UserError(f"haproxy refused `commit map`: {answer}")
        return len(entries)

    def stop(self, grace: float = SOFT_STOP_SECONDS + 5) -> int | None:
        """Soft stop (SIGUSR1: stop accepting, finish in-flight requests, exit) for up to `grace`
        seconds, then kill what is left; remove the run directory."""
        code = None
        if self.process is not None:
            drain = signal.SIGUSR1 if grace > 0 else None
            code = processes.stop(self.process, grace, drain, whole_group=False)
        run_dir = getattr(self, "_run_dir", None)
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        return code

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def parse_keys(path: Path) -> dict[str, str]:
    """`<key> <client name>` per line (# comments); a bad line names its number."""
    entries: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or len(parts[0]) < 16:
            raise UserError(
                f"{path}:{number}: expected `<key> <client name>` with a key of 16+ characters"
            )
        entries[parts[0]] = parts[1]
    return entries


#: Where Triton listens natively when the gateway takes the client ports (loopback only).


def add_arguments(parser) -> None:
    """The gateway's options, shared by `tritonstack serve` and `tritonstack up`."""
    group = parser.add_argument_group("gateway (HAProxy in front of Triton)")
    group.add_argument(
        "--no-gateway",
        dest="gateway",
        action="store_false",
        help="no gateway: Triton itself listens on --http-port/--grpc-port (loopback only)",
    )
    group.add_argument(
        "--triton-http-port",
        type=int,
        default=TRITON_HTTP_PORT,
        help=f"Triton's own HTTP port behind the gateway (default: {TRITON_HTTP_PORT})",
    )
    group.add_argument(
        "--triton-grpc-port",
        type=int,
        default=TRITON_GRPC_PORT,
        help=f"Triton's own gRPC port behind the gateway (default: {TRITON_GRPC_PORT})",
    )
    group.add_argument(
        "--gateway-metrics-port",
        type=int,
        default=GATEWAY_METRICS_PORT,
        help=f"the gateway's Prometheus endpoint (default: {GATEWAY_METRICS_PORT})",
    )
    group.add_argument(
        "--api-keys",
        type=Path,
        default=None,
        help="file of `<key> <client name>` lines; required to listen beyond loopback",
    )
    group.add_argument(
        "--tls-cert", type=Path, default=None, help="PEM with certificate chain and key: HTTPS/TLS"
    )
    group.add_argument(
        "--maxconn",
        type=int,
        default=None,
        help="requests in flight per Triton replica and protocol (default: stack.env's "
        "GATEWAY_MAXCONN)",
    )
    group.add_argument("--haproxy-bin", default=None, help="default: haproxy on PATH or /usr/sbin")


def triton_ports(args) -> tuple[int, int]:
    """Where Triton listens: behind the gateway its own ports, else the client ports."""
    if args.gateway:
        return args.triton_http_port, args.triton_grpc_port
    return args.http_port, args.grpc_port


def check_arguments(args) -> None:
    """Refuse before anything starts: a public address needs the gateway and API keys."""
    if not args.gateway and not is_loopback(args.address):
        raise UserError(
            f"refusing to listen on {args.address} without the gateway: Triton alone has no "
            "API keys; drop --no-gateway and pass --api-keys FILE"
        )
    if args.gateway:
        haproxy_binary(args.haproxy_bin)
        check_publishing(args.address, args.api_keys)
        if args.tls_cert is not None and not args.tls_cert.is_file():
            raise UserError(f"{args.tls_cert}: certificate file not found")


def from_arguments(args, triton, log_path: Path | None = None) -> Gateway:
    return Gateway.for_triton(
        triton,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.gateway_metrics_port,
        address=args.address,
        api_keys=args.api_keys,
        tls_cert=args.tls_cert,
        maxconn=args.maxconn,
        log_path=log_path,
        haproxy_bin=args.haproxy_bin,
    )


def endpoint_rows(triton, gateway: Gateway | None) -> dict[str, str]:
    """What `serve` and `up` print: which address is the gateway and which is Triton itself."""
    if gateway is None:
        return {
            "HTTP (Triton, no gateway)": f"http://{triton.http_url}",
            "gRPC (Triton, no gateway)": triton.grpc_url,
            "Triton metrics": triton.metrics_url,
        }
    rows = {
        "HTTP (gateway)": f"{gateway.scheme}://{gateway.http_url}",
        "gRPC (gateway)": gateway.grpc_url + (" (TLS)" if gateway.tls_cert else ""),
    }
    if gateway.llm_host is not None:
        route = f"/v2/models/{LLM_MODEL}/generate_stream"
        rows["LLM generate (gateway)"] = f"{gateway.scheme}://{gateway.http_url}{route}"
    return rows | {
        "gateway metrics": gateway.metrics_url,
        "Triton HTTP (direct)": f"http://{triton.http_url}",
        "Triton gRPC (direct)": triton.grpc_url,
        "Triton metrics": triton.metrics_url,
    }


def check_config(
    config: Path = CONFIG, haproxy_bin: str | None = None, **overrides: str | None
) -> str:
    """`haproxy -c` on `config` with the environment a native gateway in front of the project's
    repository gets (`overrides` over it; None unsets a variable); its output, or a UserError
    with HAProxy's complaint."""
    gateway = Gateway(TRITON_HTTP_PORT, TRITON_GRPC_PORT, config=config)
    gateway.limits = limits(gateway.model_repository, gateway.settings)
    with tempfile.TemporaryDirectory(prefix="tritonstack-gateway-check-") as run_dir:
        gateway.runtime_socket = Path(run_dir) / "runtime.sock"
        gateway.models_map = Path(run_dir) / "models.map"
        gateway.models_map.write_text(gateway.limits.models_map())
        env = {**gateway.environment(), **overrides}
        env = {key: value for key, value in env.items() if value is not None}
        result = subprocess.run(
            [haproxy_binary(haproxy_bin), "-c", "-dW", "-f", str(config)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        raise UserError(f"haproxy -c refused {config}:\n{output}")
    return output


def main(argv: list[str] | None = None) -> int:
    """`python -m tritonstack.serve.gateway --check`: parse gateway/haproxy.cfg as `serve` runs
    it."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m tritonstack.serve.gateway")
    parser.add_argument(
        "--check", action="store_true", required=True, help="haproxy -c, warnings fatal"
    )
    parser.parse_args(argv)
    try:
        print(check_config())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
