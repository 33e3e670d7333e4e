"""`docker compose up` for real: the committed docker-compose.yml + compose.cpu.yml, unchanged
(a third file of the tests' own runs every healthcheck every 2 s: HEALTHCHECK_INTERVAL), on a
private Docker engine holding stand-ins for the official images (tests/standins/).

One stack serves the whole module, every service but Grafana (no build of it is obtainable
here), run from a copy of this checkout to which `tritonstack add-model` added a model of the
tests' own (two inputs, one of them INT64, labels): compose serves, guards, probes and
load-tests it with no edit of any compose file. The tests talk to the stack only through the
ports compose publishes on 127.0.0.1, as an operator would, and run in the order an operator's
first hour goes: start, infer, read the secrets, look at Prometheus, run Locust, scale Triton
and lose a replica, stop under load, start again, open the gateway beyond loopback. Later tests
reconfigure the stack the earlier ones used.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from tritonclient.utils import InferenceServerException

from tests import own_models
from tests.functional.conftest import COMPOSE_TIMINGS
from tests.support import compose_seconds, copy_project, embeddings
from tritonstack.clients.client import infer
from tritonstack.core.settings import load

#: A cold start builds the stand-ins (debootstrap, wheels) before compose builds our images.
pytestmark = pytest.mark.timeout(900)

FILES = ("docker-compose.yml", "compose.cpu.yml")
#: The one setting the tests change, through a third file of their own: every healthcheck runs
#: every HEALTHCHECK_INTERVAL instead of the committed 15 s. `up --wait` waits for each level of
#: `depends_on: service_healthy` in turn (Triton, then the gateway, then what calls it), and
#: Docker 20.10 runs a container's first check one interval after it starts (a faster start
#: interval needs Docker 25): at 15 s the stack's four starts here waited about two minutes for
#: checks that had long since been able to pass. What each check does, and its timeout, retries
#: and start period, stay the committed ones.
HEALTHCHECK_INTERVAL = "2s"
#: The services an operator brings up here: all but Grafana (no image is obtainable) and the
#: GPU bench (a profile, perf_analyzer's SDK image).
SERVICES = (
    "secrets",
    "triton",
    "gateway",
    "prometheus",
    "blackbox",
    "locust-master",
    "locust-worker",
)
HTTP, GRPC = "127.0.0.1:8000", "127.0.0.1:8001"
PROMETHEUS, LOCUST = "http://127.0.0.1:9090", "http://127.0.0.1:8089"
#: What compose interpolates; a developer's shell must not change what the tests run.
INTERPOLATED = ("GRAFANA_", "TRITON", "TRT_", "GATEWAY_", "COMPOSE_", "BENCH_", "LOCUST_")


class Compose:
    """`docker compose -f docker-compose.yml -f compose.cpu.yml` for one project in the engine,
    from the project folder `root`."""

    def __init__(self, engine, env_file: Path, root: Path) -> None:
        self.engine = engine
        self.project = f"tst{os.getpid()}"
        self.env_file = env_file
        self.root = root
        self.intervals = env_file.with_name("healthcheck-intervals.yml")
        committed = yaml.safe_load((root / FILES[0]).read_text())["services"]
        self.intervals.write_text(yaml.safe_dump({"services": {
            name: {"healthcheck": {"interval": HEALTHCHECK_INTERVAL}}
            for name, service in committed.items() if "healthcheck" in service
        }}))  # fmt: skip

    def command(self, *args: str) -> list[str]:
        files = [arg for name in FILES for arg in ("-f", str(self.root / name))]
        files += ["-f", str(self.intervals)]
        return [
            "docker",
            "compose",
            "--progress",
            "plain",
            "--project-name",
            self.project,
            "--project-directory",
            str(self.root),
            "--env-file",
            str(self.env_file),
            *files,
            *args,
        ]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in self.engine.env.items() if not k.startswith(INTERPOLATED)}
        return {**env, **extra}

    def run(self, *args: str, check: bool = True, timeout: float = 600, **extra: str):
        result = subprocess.run(
            self.command(*args),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(**extra),
        )
        if check and result.returncode:
            logs = subprocess.run(
                self.command("logs", "--no-color", "--tail", "40"),
                capture_output=True,
                text=True,
                env=self.env(),
            )
            pytest.fail(
                f"docker compose {' '.join(args)}: exit {result.returncode}\n"
                f"{result.stderr[-3000:]}\n--- logs ---\n{logs.stdout[-6000:]}"
            )
        return result

    def up(self, *flags: str, **extra: str) -> tuple[float, str]:
        """`up -d --wait` (every service healthy or done); seconds it took and its output."""
        started = time.monotonic()
        result = self.run("up", "-d", "--wait", *flags, *SERVICES, **extra)
        return time.monotonic() - started, result.stdout + result.stderr

    def containers(self, service: str) -> list[dict]:
        """`docker inspect` of the service's containers, by container number."""
        ids = self.run("ps", "-a", "-q", service).stdout.split()
        if not ids:
            return []
        found = json.loads(self.docker("inspect", *ids).stdout)
        return sorted(
            found, key=lambda c: int(c["Config"]["Labels"]["com.docker.compose.container-number"])
        )

    def docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", *args],
            capture_output=True,
            text=True,
            check=check,
            env=self.engine.env,
            timeout=120,
        )

    def exec(self, service: str, *command: str, index: int = 1) -> subprocess.CompletedProcess:
        return self.run("exec", "-T", "--index", str(index), service, *command, check=False)

    def secrets(self) -> dict[str, str]:
        """What `docker compose run --rm secrets show` prints, by file name."""
        shown = self.run("run", "--rm", "secrets", "show").stdout
        return dict(line.split(": ", 1) for line in shown.splitlines() if ": " in line)


@pytest.fixture(scope="module")
def stack(docker_engine, tmp_path_factory):
    """The stack as an operator starts it, from an engine that has only the stand-ins: built,
    with two Locust workers, and waited on until every service is healthy."""
    env_file = tmp_path_factory.mktemp("compose") / "empty.env"  # a fresh clone has no .env
    env_file.write_text("")
    root = copy_project(tmp_path_factory.mktemp("project") / "tritonstack")
    models = tmp_path_factory.mktemp("own-model")
    added = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "--project-dir", str(root), "add-model",
         str(own_models.two_inputs(models / "ranker.onnx")), "--name", "ranker",
         "--labels", str(own_models.labels_file(models / "labels.txt"))],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    compose = Compose(docker_engine, env_file, root)
    seconds, output = compose.up("--build", "--scale", "locust-worker=2")
    COMPOSE_TIMINGS["first start to healthy (compose builds our images)"] = seconds
    compose.first_up = output
    yield compose
    compose.run("down", "--volumes", "--remove-orphans", check=False)


def get(url: str, data: bytes | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def call(address: str, method: str, path: str, body: str = "", headers=None) -> tuple[int, str]:
    host, port = address.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def query(expression: str) -> list[dict]:
    parameters = urllib.parse.urlencode({"query": expression})
    status, body = get(f"{PROMETHEUS}/api/v1/query?{parameters}")
    assert status == 200, body
    return json.loads(body)["data"]["result"]


def eventually(check: Callable[[], object], timeout: float, what: str, interval: float = 2.0):
    """check()'s first truthy result within `timeout` seconds, else a failure naming `what`."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, AssertionError, InferenceServerException, http.client.HTTPException) as e:
            last = e
        else:
            if last:
                return last
        time.sleep(interval)
    pytest.fail(f"{what} within {timeout:.0f} s; last: {last!r}")


ROW = json.dumps(
    {
        "inputs": [
            {"name": "features", "shape": [1, 128], "datatype": "FP32", "data": [0.25] * 128}
        ],
        "outputs": [{"name": "label"}],
    }
)


class Clients:
    """`threads` clients each sending pipeline requests through the gateway on a fresh
    connection, recording (start, end, outcome) per request; outcome is the HTTP status or the
    error's name."""

    def __init__(self, threads: int = 4, address: str = HTTP, headers=None) -> None:
        self.address, self.headers = address, headers or {}
        self.results: list[tuple[float, float, object]] = []
        self.running = threading.Event()
        self.running.set()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def _loop(self) -> None:
        deadline = time.monotonic() + 300  # bounded whatever the test does
        while self.running.is_set() and time.monotonic() < deadline:
            started = time.monotonic()
            try:
                outcome: object = call(
                    self.address, "POST", "/v2/models/pipeline/infer", ROW, self.headers
                )[0]
            except (OSError, http.client.HTTPException) as error:
                outcome = type(error).__name__
            self.results.append((started, time.monotonic(), outcome))
            if outcome != 200:
                time.sleep(0.05)

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.running.clear()
        for thread in self.threads:
            thread.join(timeout=30)


# --- start -----------------------------------------------------------------------------------


def test_first_up_builds_each_image_once_and_every_service_is_healthy(stack):
    """From an engine with only the stand-ins: our two images are built once each (the two
    Locust services share one image, which only locust-master builds), every service turns
    healthy, the one-shot secrets service exits 0, and `--scale locust-worker=2` gives two."""
    # BuildKit's plain progress prints a step that outlasts its print interval twice, started
    # and then "... done" (seen on a slower machine: "naming to" twice for one build; "writing
    # image" does the same with a 3 MB layer), so each build is counted by its "done" line.
    built = re.findall(
        r"naming to (?:docker\.io/)?(tritonstack/[\w.:-]+)\b[^\n]* done$", stack.first_up, re.M
    )
    assert sorted(built) == ["tritonstack/locust:2.47.0", "tritonstack/triton:26.08"], built
    for service in SERVICES:
        containers = stack.containers(service)
        assert len(containers) == (2 if service == "locust-worker" else 1), service
        for container in containers:
            state = container["State"]
            if service == "secrets":
                assert state["Status"] == "exited" and state["ExitCode"] == 0, state
            else:
                assert state["Health"]["Status"] == "healthy", (service, state)
    # The stand-ins are what ran: no official image was pulled (no registry is reachable).
    images = {c["Config"]["Image"] for s in SERVICES for c in stack.containers(s)}
    for image in images - {"tritonstack/triton:26.08", "tritonstack/locust:2.47.0"}:
        labels = json.loads(stack.docker("image", "inspect", image).stdout)[0]["Config"]["Labels"]
        assert labels["tritonstack.standin.for"] == image


def test_published_ports_are_loopback_only_and_containers_reach_nothing_outside(stack):
    """Published: the gateway's two ports, Prometheus and Locust's UI, all on 127.0.0.1; and a
    container cannot open a connection beyond its compose networks (here: PyPI)."""
    published = {}
    for service in SERVICES:
        for container in stack.containers(service):
            for port, bindings in (container["NetworkSettings"]["Ports"] or {}).items():
                for binding in bindings or []:
                    published[f"{service}:{port}"] = binding["HostIp"]
    assert published == {
        "gateway:8000/tcp": "127.0.0.1",
        "gateway:8001/tcp": "127.0.0.1",
        "prometheus:9090/tcp": "127.0.0.1",
        "locust-master:8089/tcp": "127.0.0.1",
    }
    probe = (
        "import socket\ntry:\n socket.create_connection(('pypi.org', 443), timeout=3)\n"
        "except OSError as e:\n print('unreachable', e)\nelse:\n print('reached')"
    )
    result = stack.exec("locust-master", "python", "-c", probe)
    assert result.stdout.startswith("unreachable"), result.stdout + result.stderr


#: Run in a source container's network namespace: which of the (address, port) pairs open.
DOOR_PROBE = """
import concurrent.futures, json, socket, sys
def opens(target):
    try:
        socket.create_connection(tuple(target), timeout=2).close()
        return True
    except OSError:
        return False
targets = json.loads(sys.argv[1])
with concurrent.futures.ThreadPoolExecutor(64) as pool:
    print(json.dumps(list(pool.map(opens, targets))))
"""


def documented_reach() -> dict[str, set[str]]:
    """docs/security.md's "Who reaches what": each service's reachable service:port pairs."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    section = text.split("## Who reaches what", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([\w-]+) \| ([\w:\- ]+) \|$", section, re.MULTILINE)
    return {source: set(reached.split()) for source, reached in rows}


def test_each_service_reaches_exactly_what_security_md_says(stack):
    """From each running container's own network namespace (a throwaway container joined to
    it), every port each other service listens on (its compose `expose` and `ports`), at each of
    its addresses: what opens is docs/security.md's table, no more and no less. Prometheus finds
    Triton's metrics port open and its inference ports closed; Locust, the prober and Triton
    never reach Triton or one another past their zone."""
    # Without forwarding, a container reaches only the networks it is on (Docker's isolation
    # rules do the same on a host); a host that forwards would route between the bridges.
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0", (
        "this host forwards IPv4 between interfaces: the private engine (no iptables) cannot "
        "isolate its networks here"
    )
    committed = yaml.safe_load((stack.root / FILES[0]).read_text())["services"]
    listed = {s: committed[s].get("expose", []) + committed[s].get("ports", []) for s in SERVICES}
    ports = {
        service: sorted({int(str(port).split(":")[-1]) for port in listed[service]})
        for service in SERVICES if service != "secrets"
    }  # fmt: skip
    containers = {service: stack.containers(service) for service in ports}
    expected = documented_reach()
    assert set(expected) == set(ports), "docs/security.md's table names every running service"
    for source, sources in containers.items():
        for origin in sources:
            targets = [
                (service, port, network["IPAddress"])
                for service, found in containers.items()
                for container in found if container["Id"] != origin["Id"]
                for network in container["NetworkSettings"]["Networks"].values()
                for port in ports[service]
            ]  # fmt: skip
            probe = stack.docker(
                "run", "--rm", "--network", f"container:{origin['Id']}", "--entrypoint",
                "python", "tritonstack/locust:2.47.0", "-c", DOOR_PROBE,
                json.dumps([[address, port] for _, port, address in targets]),
            )  # fmt: skip
            opened = json.loads(probe.stdout)
            pairs = zip(targets, opened, strict=True)
            reached = {f"{service}:{port}" for (service, port, _), ok in pairs if ok}
            assert reached == expected[source], (source, sorted(reached ^ expected[source]))


# --- inference ---------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_added_model_is_served_through_the_gateway_as_onnx_computes_it(stack, protocol):
    """Two inputs, one INT64, through the gateway (routed, bounded from its config) to the
    Triton image built from the project's repository; its labels through Triton's
    classification extension."""
    rng = np.random.default_rng(11)
    inputs = {
        "query": rng.uniform(-1, 1, (6, own_models.WIDTH)).astype(np.float32),
        "bucket": rng.integers(0, 10, (6, own_models.BUCKETS)).astype(np.int64),
    }
    reference = own_models.two_inputs_reference(**inputs)
    address = HTTP if protocol == "http" else GRPC
    outputs = infer(address, "ranker", inputs, protocol=protocol)
    assert abs(outputs["probs"] - reference["probs"]).max() < 1e-5
    labelled = infer(address, "ranker", inputs, protocol=protocol, classification=1)
    tops = [item.decode().split(":")[2] for item in labelled["probs"].reshape(-1)]
    assert tops == [own_models.LABELS[i] for i in reference["probs"].argmax(axis=1)]
    # what would hurt Triton is refused by the gateway, and Triton keeps serving
    huge = {"inputs": [{"name": "query", "shape": [100000000, 24], "datatype": "FP32",
                        "data": [0]}]}  # fmt: skip
    status, text = call(HTTP, "POST", "/v2/models/ranker/infer", json.dumps(huge))
    assert status == 400 and "ranker takes at most 1664" in text, text
    assert infer(address, "ranker", inputs, protocol=protocol)["probs"].shape == (6, 3)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["classifier", "pipeline", "classify"])
def test_inference_through_the_published_gateway_equals_onnxruntime(
    stack, reference, protocol, model
):
    """What `tritonstack infer` gets from the compose stack equals onnxruntime on model.onnx."""
    features = embeddings(7, seed=7)
    probabilities, labels = reference(features)
    outputs = infer(HTTP if protocol == "http" else GRPC, model, features, protocol=protocol)
    if model in ("classifier", "pipeline"):
        assert outputs["class"].shape == (7, 2)
        assert abs(outputs["class"] - probabilities).max() < 1e-6
    if model in ("pipeline", "classify"):
        assert [b.decode() for b in outputs["label"][:, 0]] == list(labels)


def test_admin_routes_are_refused_even_with_the_generated_admin_key(stack):
    """The gateway routes no admin API, over HTTP or gRPC, whatever key a client sends."""
    key = stack.secrets()["admin-key"]
    headers = {"tritonstack-admin-key": key}
    for method, path, body in (
        ("POST", "/v2/repository/index", "{}"),
        ("GET", "/v2/logging", ""),
        ("GET", "/v2/models/pipeline/stats", ""),
        ("POST", "/v2/repository/models/pipeline/unload", "{}"),
    ):
        status, text = call(HTTP, method, path, body, headers)
        assert status == 404, (path, status, text)
    client = grpcclient.InferenceServerClient(GRPC)
    with pytest.raises(InferenceServerException) as refused:
        client.get_model_repository_index(headers=headers)
    assert "method not routed by the gateway" in refused.value.message()
    assert client.is_model_ready("pipeline")  # the same channel reaches inference


# --- secrets -----------------------------------------------------------------------------------


def test_generated_secrets_are_readable_by_exactly_their_readers(stack):
    """Each file the secrets service generated is 0400 and owned by its one reader, and each
    service sees only the volume it needs: the admin key and Grafana's password are in no
    container that runs as another service's uid (Locust runs as 1000 like Triton). The
    Hugging Face token is yours alone: without secrets/hf-token, none is made up."""
    shown = stack.secrets()
    assert shown.pop("hf-token") == "not set (optional)"
    assert set(shown) == {
        "grafana-admin-password",
        "admin-key",
        "client-api-key",
        "deep-probe-api-key",
        "locust-api-key",
    }
    assert all(re.fullmatch(r"[0-9a-f]{48}", value) for value in shown.values()), shown
    config = yaml.safe_load(stack.run("config").stdout)["services"]
    readers = {}  # file -> uid of its reader
    for entry in config["secrets"]["environment"]["TRITONSTACK_SECRETS"].split():
        path, uid = entry.split(":")[:2]
        readers[path] = int(uid)
    key_map, map_reader = config["secrets"]["environment"]["TRITONSTACK_KEY_MAP"].split(":")
    readers[key_map] = int(map_reader)

    def mounted(name: str) -> list[str]:
        targets = [volume.get("target", "") for volume in config[name].get("volumes", [])]
        return [t for t in targets if t.startswith("/run/secrets/")]

    seen = {name: mounted(name) for name in SERVICES if name != "secrets" and mounted(name)}
    assert seen == {
        "triton": ["/run/secrets/tritonstack"],
        "gateway": ["/run/secrets/tritonstack"],
        "blackbox": ["/run/secrets/tritonstack-clients"],
        "locust-master": ["/run/secrets/tritonstack-clients"],
        "locust-worker": ["/run/secrets/tritonstack-clients"],
    }, seen
    for service, volumes in seen.items():
        uid = int(stack.exec(service, "id", "-u").stdout)
        for path, reader in readers.items():
            visible = any(path.startswith(volume + "/") for volume in volumes)
            mode = stack.exec(service, "stat", "-c", "%a %u", path)
            assert (mode.returncode == 0) == visible, (service, path)
            if not visible:
                continue
            assert mode.stdout.split() == ["400", str(reader)], (service, path, mode.stdout)
            read = stack.exec(service, "cat", path)
            assert (read.returncode == 0) == (uid in (reader, 0)), (service, uid, path)
            if read.returncode == 0 and Path(path).name in shown:
                assert read.stdout == shown[Path(path).name]


def test_no_secret_is_in_a_container_s_command_or_environment(stack):
    """What `docker inspect` shows of every container (its command, entrypoint, arguments and
    environment) holds none of the generated secrets: each service reads its own from a file.
    The processes inside are another matter: tritonserver takes the admin key only as a flag
    (docs/security.md, "Exceptions"), so only its argv holds it."""
    shown = stack.secrets()
    shown.pop("hf-token")  # not set: nothing to look for
    for service in SERVICES:
        for container in stack.containers(service):
            config = container["Config"]
            visible = json.dumps([config.get("Env"), config.get("Cmd"), config.get("Entrypoint"),
                                  container.get("Path"), container.get("Args")])  # fmt: skip
            for name, value in shown.items():
                assert value not in visible, (service, name)
    # docker top runs the host's ps on the container's processes (it needs the pid column;
    # -ww: full command lines, not 80 columns).
    top = stack.docker("top", stack.containers("triton")[0]["Id"], "-ww", "-o", "pid,comm,args")
    lines = top.stdout.splitlines()[1:]
    holders = {line.split()[1] for line in lines if shown["admin-key"] in line}
    assert holders == {"tritonserver"}, holders


# --- Locust --------------------------------------------------------------------------------------


def locust_stats() -> dict:
    status, body = get(f"{LOCUST}/stats/requests")
    assert status == 200, body
    return json.loads(body)


def run_locust(users: int = 4, seconds: float = 20, minimum: int = 200, **options) -> dict:
    """A run started from the web UI's form (what pressing Start sends, with the form's
    `options`, such as model), stopped after `minimum` requests or `seconds`; the final
    statistics."""
    form = {"user_count": users, "spawn_rate": users, "host": "http://gateway:8000", **options}
    status, body = get(f"{LOCUST}/swarm", urllib.parse.urlencode(form).encode())
    assert status == 200 and json.loads(body)["success"] is True, body
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stats = locust_stats()
        total = next(s for s in stats["stats"] if s["name"] == "Aggregated")
        # Until the master spawns (its shape ticks once a second), the statistics shown are
        # the previous run's: Locust clears them only as it starts spawning.
        if stats["state"] in ("spawning", "running") and total["num_requests"] >= minimum:
            break
        time.sleep(1)
    assert get(f"{LOCUST}/stop", b"")[0] == 200
    time.sleep(2)  # the workers' last reports
    return locust_stats()


def test_locust_master_and_workers_run_a_validated_load_through_the_gateway(stack):
    """Headless, through the web UI's HTTP API: both workers take part, every answer passes
    the locustfile's content checks, and Prometheus scrapes every Locust exporter."""
    stats = run_locust()
    assert len(stats["workers"]) == 2, stats["workers"]
    total = next(s for s in stats["stats"] if s["name"] == "Aggregated")
    assert total["num_requests"] >= 100, total
    assert total["num_failures"] == 0, stats.get("errors")
    exported = eventually(
        lambda: query('sum by (instance) (tritonstack_client_requests_total{job="locust"})'),
        60,
        "Prometheus scraping every Locust process's requests",
    )
    assert sum(float(s["value"][1]) for s in exported) > 0, exported


def test_locust_loads_the_added_model_from_its_metadata(stack):
    """The web UI's form names the added model: every user asks the gateway for its metadata
    and its answers are checked against it; rows of a `mix` up to its max_batch_size."""
    stats = run_locust(model="ranker", rows="mix")
    rows = [s for s in stats["stats"] if s["name"].startswith("ranker rows=")]
    total = next(s for s in stats["stats"] if s["name"] == "Aggregated")
    assert rows and total["num_requests"] >= 100, stats["stats"]
    assert total["num_failures"] == 0, stats.get("errors")


# --- Prometheus ----------------------------------------------------------------------------------


def test_prometheus_scrapes_every_job_its_rules_have_series_and_the_deep_probe_passes(stack):
    def targets_up() -> dict:
        body = get(f"{PROMETHEUS}/api/v1/targets?state=active")[1]
        health: dict[str, set] = {}
        for target in json.loads(body)["data"]["activeTargets"]:
            health.setdefault(target["labels"]["job"], set()).add(target["health"])
        return health if all(h == {"up"} for h in health.values()) and len(health) == 4 else {}

    health = eventually(targets_up, 90, "jobs triton, gateway, deep_probe and locust up")
    assert set(health) == {"triton", "gateway", "deep_probe", "locust"}
    locusts = query('up{job="locust"}')
    assert len(locusts) == 3, locusts  # the master and both workers, found by DNS
    public = load(stack.root / "stack.env").public_models
    assert "ranker" in public

    def every_probe_passes() -> list:
        passed = query('probe_success{job="deep_probe"} == 1')
        return passed if {p["metric"]["model"] for p in passed} == set(public) else []

    eventually(every_probe_passes, 60, "the deep probe of every public model passing")
    # The LLM's rules need the llm profile (a GPU image, not in this CPU stack); they are run
    # on the embedded vLLM engine by tests/functional/test_observability_llm.py.
    records = [
        rule["record"]
        for path in sorted((stack.root / "prometheus" / "rules").glob("*.yml"))
        if path.name != "llm.yml"
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]
    assert len(records) > 20

    def every_rule_has_a_series() -> bool:
        empty = [record for record in records if not query(record)]
        assert not empty, f"no series yet: {empty}"
        return True

    eventually(every_rule_has_a_series, 120, "every recording rule having a series")


# --- scale and lose a replica ---------------------------------------------------------------------


def replica_successes(stack, index: int) -> float:
    """`pipeline`'s successful requests as replica `index`'s own metrics port counts them."""
    read = (
        "import urllib.request as u\n"
        "print(u.urlopen('http://127.0.0.1:8002/metrics', timeout=5).read().decode())"
    )
    result = stack.exec("triton", "python3", "-c", read, index=index)
    assert result.returncode == 0, result.stderr
    lines = [
        line
        for line in result.stdout.splitlines()
        if line.startswith('nv_inference_request_success{model="pipeline"')
    ]
    return sum(float(line.split()[-1]) for line in lines)


def send(count: int) -> None:
    for _ in range(count):
        assert call(HTTP, "POST", "/v2/models/pipeline/infer", ROW)[0] == 200


def test_two_triton_replicas_both_serve_and_losing_one_costs_clients_a_bounded_window(stack):
    """`--scale triton=2`: the gateway finds the second replica by DNS and balances to both.
    Then tritonserver dies inside replica 1 (SIGKILL, as the OOM killer would): the container
    exits, its restart policy brings it back healthy, replica 2 serves throughout, and clients
    see an error only for a request that was already on the killed replica (a 502): the first
    refused connection marks it down and the gateway sends the request to replica 2, so at
    most one error per client, each ending within 2 s of the kill."""
    seconds, _ = stack.up("--scale", "triton=2", "--scale", "locust-worker=2")
    COMPOSE_TIMINGS["second Triton replica to healthy"] = seconds

    def both_serve() -> bool:
        before = [replica_successes(stack, i) for i in (1, 2)]
        send(40)
        after = [replica_successes(stack, i) for i in (1, 2)]
        return all(b > a for a, b in zip(before, after, strict=True))

    eventually(both_serve, 60, "both replicas serving requests sent through the gateway")

    victim = stack.containers("triton")[0]
    restarts = victim["RestartCount"]
    init = victim["State"]["Pid"]  # compose's `init: true`: docker-init, tritonserver its child
    children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    server = next(
        int(pid)
        for pid in children
        if Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"
    )
    with Clients() as clients:
        time.sleep(2)
        killed = time.monotonic()
        os.kill(server, signal.SIGKILL)

        def restarted_and_healthy() -> bool:
            now = stack.containers("triton")[0]
            return (
                now["RestartCount"] > restarts
                and now["State"].get("Health", {}).get("Status") == "healthy"
            )

        eventually(restarted_and_healthy, 180, "the killed replica restarted and healthy")
        survivor_before = replica_successes(stack, 2)
        time.sleep(3)
    assert replica_successes(stack, 2) > survivor_before
    eventually(both_serve, 60, "the restarted replica serving again beside the other")
    # By when each failed request ended, after the kill: only one in flight on the killed
    # replica fails (502); a refused connection marks the replica down and is redispatched.
    failures = [(end - killed, outcome) for _, end, outcome in clients.results if outcome != 200]
    served = sum(1 for *_, outcome in clients.results if outcome == 200)
    last = max((offset for offset, _ in failures), default=0.0)
    COMPOSE_TIMINGS[f"losing a replica: {len(failures)} client errors, the last after"] = last
    assert served > 100, (served, failures[:10])
    assert len(failures) <= len(clients.threads), failures[:20]
    assert all(0 <= offset <= 2 for offset, _ in failures), failures[:20]


# --- stop, start again -------------------------------------------------------------------------


def test_stop_under_load_loses_nothing_in_flight_and_start_keeps_the_secrets(stack):
    """`docker compose stop` while clients send: every request already sent when the stop
    began is answered 200 (HAProxy's soft stop, then Triton's drain), each service exits on its
    stop signal within its stop_grace_period (no SIGKILL), and `down` then `up` (the warm
    start) keeps the generated secrets."""
    stack.up("--scale", "triton=1", "--scale", "locust-worker=2")
    secrets = stack.secrets()
    config = yaml.safe_load(stack.run("config").stdout)["services"]
    since = str(int(time.time()) - 1)
    with Clients() as clients:
        time.sleep(3)
        stopping = time.monotonic()
        stack.run("stop")
    in_flight = [(s - stopping, outcome) for s, _, outcome in clients.results if s < stopping]
    assert len(in_flight) > 50, len(in_flight)
    lost = [result for result in in_flight if result[1] != 200]
    assert not lost, lost[:20]
    events = stack.docker(
        "events",
        "--since",
        since,
        "--until",
        str(int(time.time()) + 1),
        "--filter",
        "type=container",
        "--format",
        "{{json .}}",
    ).stdout
    signalled, died = {}, {}
    for line in events.splitlines():
        event = json.loads(line)
        attributes = event["Actor"]["Attributes"]
        name = attributes.get("com.docker.compose.service")
        if event["Action"] == "kill":
            signalled.setdefault(attributes["name"], (name, event["timeNano"] / 1e9))
        elif event["Action"] == "die":
            died[attributes["name"]] = (int(attributes["exitCode"]), event["timeNano"] / 1e9)
    assert {service for service, _ in signalled.values()} == set(SERVICES) - {"secrets"}
    for container, (service, at) in signalled.items():
        code, gone = died[container]
        grace = compose_seconds(config[service].get("stop_grace_period", "10s"))
        assert gone - at <= grace and code != 137, (container, gone - at, grace, code)

    stack.run("down")
    seconds, _ = stack.up("--scale", "locust-worker=2")
    COMPOSE_TIMINGS["warm start to healthy (down, then up)"] = seconds
    assert stack.secrets() == secrets
    send(5)


# --- beyond loopback ------------------------------------------------------------------------------


def test_gateway_published_beyond_loopback_requires_keys_and_the_probe_and_locust_still_pass(
    stack,
):
    """GATEWAY_BIND beyond loopback: every request needs a key; the deep probe and Locust,
    which call the gateway from inside the compose network, still succeed (they get keys of
    their own from the secrets service).

    127.0.0.2, not 0.0.0.0: the gateway treats every address but the literal loopback names
    (127.0.0.1, ::1, localhost) as public, so this runs the same keys path that 0.0.0.0 does,
    without publishing the gateway on this machine's network interfaces during a test."""
    address = "127.0.0.2"
    stack.up("--scale", "locust-worker=2", GATEWAY_BIND=address)
    gateway = stack.containers("gateway")[0]
    bound = {b["HostIp"] for p in gateway["NetworkSettings"]["Ports"].values() for b in p or []}
    assert bound == {address}
    http = f"{address}:8000"
    anonymous = call(http, "POST", "/v2/models/pipeline/infer", ROW)
    assert anonymous[0] == 401, anonymous
    key = stack.secrets()["client-api-key"]
    keyed = call(http, "POST", "/v2/models/pipeline/infer", ROW, {"Authorization": f"Bearer {key}"})
    assert keyed[0] == 200, keyed
    fresh = time.time()

    def probe_passes_after_the_change() -> bool:
        samples = query('probe_success{job="deep_probe"}')
        return (
            bool(samples)
            and float(samples[0]["value"][0]) > fresh + 6
            and samples[0]["value"][1] == "1"
        )

    eventually(probe_passes_after_the_change, 60, "the deep probe passing with keys")
    stats = run_locust()
    total = next(s for s in stats["stats"] if s["name"] == "Aggregated")
    assert total["num_requests"] >= 100 and total["num_failures"] == 0, stats.get("errors")
