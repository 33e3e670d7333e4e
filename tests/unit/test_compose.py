"""The compose stack, validated statically: no Docker engine and no GPU exist here.

Real validators only: Debian's docker-compose (v1) `config` merges and validates the files
offline, check-jsonschema checks them against the compose specification's JSON schema, hadolint
reads both Dockerfiles, shellcheck every shell script, yamllint every YAML file. Then the wiring
between files: every host:port Prometheus, Grafana and Locust use names a compose service and a
port it listens on, every mount source exists, every model is exercised by the healthcheck.
tests/functional/test_compose.py runs the healthcheck and the gateway's config for real."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support import IN_CI, LLM_REPOSITORY, REPOSITORY, ROOT, compose_seconds, require_tool
from tritonstack.core import contract
from tritonstack.core.limits import limits
from tritonstack.core.repository import iter_models
from tritonstack.core.settings import load
from tritonstack.launcher.flags import EXIT_TIMEOUT_SECS

COMPOSE = ROOT / "docker-compose.yml"
CPU = ROOT / "compose.cpu.yml"
#: Where triton-llm finds the LLM's repository and the shared flags.
LLM_TARGET = "/opt/tritonstack/llm_repository"
FLAGS = ROOT / "scripts" / "tritonserver.flags"
SKIP_DIRS = {".git", ".venv", "venv", ".pytest_cache", ".ruff_cache", "__pycache__", "build"}


def tool(name: str) -> str:
    """A venv-provided tool next to this interpreter first (PATH may not include the venv)."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.is_file() else require_tool(name)


def run(*command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Without the variables compose interpolates, so a developer's shell changes nothing;
    `env`: the ones a test sets."""
    prefixes = ("GRAFANA_", "GATEWAY_", "TRITON", "TRT_", "COMPOSE_", "DOCKER_", "HF_")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**clean, **(env or {})})  # fmt: skip


def _bytes(size: str | int) -> int:
    """Compose byte values: 256m, 1g, or a plain number."""
    number, unit = re.fullmatch(r"(\d+)([kmg]?)b?", str(size).lower()).groups()
    return int(number) * 1024 ** " kmg".index(unit or " ")


def repo_files() -> list[Path]:
    files = []
    for directory, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        files.extend(Path(directory) / name for name in names)
    return sorted(files)


# --- compose files: `!reset` ---------------------------------------------------------------------


class Reset:
    """compose's `!reset` tag: the attribute is removed from the merged model."""

    def __init__(self, value: object) -> None:
        self.value = value


class ComposeLoader(yaml.SafeLoader):
    pass


def _reset(loader: yaml.SafeLoader, node: yaml.Node) -> Reset:
    if isinstance(node, yaml.SequenceNode):
        return Reset(loader.construct_sequence(node))
    if isinstance(node, yaml.MappingNode):
        return Reset(loader.construct_mapping(node))
    return Reset(loader.construct_scalar(node))


ComposeLoader.add_constructor("!reset", _reset)


def split_resets(node: object, path: tuple[str, ...] = ()) -> tuple[object, list, object]:
    """(the file without its !reset entries, their paths, the file with each reset's value).

    docker-compose v1 and check-jsonschema's YAML parser reject unknown tags; compose v2 reads
    `key: !reset value` as "remove key". The first form is what v1 merges, the third what the
    schema validates (as compose v2 does, file by file, before merging).
    """
    if not isinstance(node, dict):
        return node, [], node
    stripped, resets, valued = {}, [], {}
    for key, value in node.items():
        if isinstance(value, Reset):
            resets.append((*path, key))
            valued[key] = value.value
            continue
        inner, inner_resets, inner_valued = split_resets(value, (*path, key))
        resets.extend(inner_resets)
        valued[key] = inner_valued
        if inner != {} or value == {}:
            stripped[key] = inner
    return stripped, resets, valued


@pytest.fixture(scope="module")
def env_file(tmp_path_factory) -> Path:
    """An empty one: what a fresh clone has (no .env), whatever a developer's own .env says."""
    path = tmp_path_factory.mktemp("compose") / "empty.env"
    path.write_text("")
    return path


def compose_config(env_file: Path, *files: Path) -> dict:
    result = run(
        tool("docker-compose"),
        "--project-directory",
        str(ROOT),
        "--env-file",
        str(env_file),
        *(arg for f in files for arg in ("-f", str(f))),
        "config",
    )
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.fixture(scope="module")
def gpu(env_file: Path) -> dict:
    """docker-compose.yml as docker-compose v1 resolves and validates it."""
    return compose_config(env_file, COMPOSE)


@pytest.fixture(scope="module")
def cpu(env_file: Path, tmp_path_factory) -> dict:
    """docker-compose.yml + compose.cpu.yml merged: v1 merges, then the resets apply."""
    override = yaml.load(CPU.read_text(), Loader=ComposeLoader)
    stripped, resets, _ = split_resets(override)
    assert resets, "compose.cpu.yml is expected to !reset the GPU reservation"
    folder = tmp_path_factory.mktemp("cpu")
    (folder / "override.yml").write_text(yaml.safe_dump(stripped))
    merged = compose_config(env_file, COMPOSE, folder / "override.yml")
    for path in resets:
        parent = merged
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]
    # The result must still be a valid compose model for both validators.
    (folder / "merged.yml").write_text(yaml.safe_dump(merged))
    final = compose_config(env_file, folder / "merged.yml")
    schema = run(
        tool("check-jsonschema"),
        "--builtin-schema",
        "vendor.compose-spec",
        str(folder / "merged.yml"),
    )
    assert schema.returncode == 0, schema.stdout + schema.stderr
    return final


def test_compose_files_match_the_compose_spec_schema(tmp_path: Path) -> None:
    _, _, valued = split_resets(yaml.load(CPU.read_text(), Loader=ComposeLoader))
    (tmp_path / "compose.cpu.yml").write_text(yaml.safe_dump(valued))
    for path in (COMPOSE, tmp_path / "compose.cpu.yml"):
        result = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path))
        assert result.returncode == 0, result.stdout + result.stderr
    assert "version" not in yaml.safe_load(COMPOSE.read_text())  # compose spec: no version key


def test_gpu_variant_reserves_a_gpu_with_triton_limits(gpu: dict) -> None:
    triton = gpu["services"]["triton"]
    assert triton["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    ]
    assert triton["environment"]["TRITONSTACK_DEVICE"] == "auto"
    assert _bytes(triton["shm_size"]) >= 256 * 2**20
    # No memlock: rootless Docker and LXC refuse to raise it (runc "setting rlimit type 8").
    assert triton["ulimits"] == {"stack": 67108864}
    grace = compose_seconds(triton["stop_grace_period"])
    assert int(triton["environment"]["TRITON_EXIT_TIMEOUT_SECS"]) < grace
    assert grace > EXIT_TIMEOUT_SECS  # the launcher's default
    # The start budget: the launcher's longest wait (plan builds, another replica's engines).
    from tritonstack.launcher.start import Settings

    budget = Settings.from_environment({}).lock_timeout
    assert compose_seconds(triton["healthcheck"]["start_period"]) >= budget
    dockerfile = (ROOT / "Dockerfile.triton").read_text()
    assert compose_seconds(re.search(r"--start-period=(\w+)", dockerfile)[1]) >= budget


def test_cpu_variant_drops_the_gpu_and_nothing_else(gpu: dict, cpu: dict) -> None:
    triton = cpu["services"]["triton"]
    assert "devices" not in triton["deploy"]["resources"]["reservations"]
    assert "nvidia" not in json.dumps(triton)
    assert triton["environment"]["TRITONSTACK_DEVICE"] == "cpu"

    # Everything else is the GPU stack's (docker-compose v1 reorders volumes when it merges).
    def same(service: dict, *drop: str) -> dict:
        kept = {k: v for k, v in service.items() if k not in drop}
        # v1 writes a list of networks as a map of nulls when it merges files.
        networks = kept.get("networks", {})
        networks = {name: (networks[name] if isinstance(networks, dict) else None) or {}
                    for name in networks}  # fmt: skip
        return {**kept, "volumes": sorted(kept.get("volumes", [])), "networks": networks}

    # docker-compose v1 drops every `pull_policy` when it merges files (it predates the key's
    # merge rule); Compose v2 keeps them, and the override does not mention the key.
    assert "pull_policy" not in CPU.read_text()
    drop = ("deploy", "environment", "pull_policy")
    assert same(triton, *drop) == same(gpu["services"]["triton"], *drop)
    assert set(cpu["services"]) == set(gpu["services"])
    for name in set(gpu["services"]) - {"triton"}:
        assert same(cpu["services"][name], "pull_policy") == same(
            gpu["services"][name], "pull_policy"
        ), name


def test_compose_needs_no_env_file_and_ships_no_secret(tmp_path: Path, gpu: dict) -> None:
    """A fresh clone: `docker-compose config` succeeds with no .env in a copy of the project,
    and no password or key has a default anywhere in the compose model."""
    for name in ("docker-compose.yml", "compose.cpu.yml", "stack.env", "gateway/limits.env"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    assert not (tmp_path / ".env").exists()
    plain = run(tool("docker-compose"), "--project-directory", str(tmp_path), "config", "-q")
    assert plain.returncode == 0, plain.stderr
    grafana = gpu["services"]["grafana"]["environment"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana
    secret_file = grafana["GF_SECURITY_ADMIN_PASSWORD__FILE"]
    triton = gpu["services"]["triton"]["environment"]
    assert "TRITONSTACK_ADMIN_KEY" not in triton  # a file, not `docker inspect`-able env
    key_file = triton["TRITONSTACK_ADMIN_KEY_FILE"]
    secrets = gpu["services"]["secrets"]
    generated = {
        entry.split(":")[0] for entry in secrets["environment"]["TRITONSTACK_SECRETS"].split()
    }
    key_map = gpu["services"]["gateway"]["environment"]["GATEWAY_GENERATED_API_KEYS"]
    assert secrets["environment"]["TRITONSTACK_KEY_MAP"].split(":")[0] == key_map
    # Each caller of a gateway published beyond loopback reads its own generated key.
    modules = yaml.safe_load((ROOT / "prometheus" / "blackbox.yml").read_text())["modules"]
    (probe_key,) = {m["http"]["authorization"]["credentials_file"] for m in modules.values()}
    locust_key = gpu["services"]["locust-master"]["environment"]["LOCUST_API_KEY_FILE"]
    assert gpu["services"]["locust-worker"]["environment"]["LOCUST_API_KEY_FILE"] == locust_key
    client_key = "/run/secrets/tritonstack/client-api-key"  # yours: `secrets show` prints it
    assert generated == {secret_file, key_file, client_key, probe_key, locust_key}
    # Overrides come from files in secrets/, mounted read-only into this service alone: no
    # variable carries a secret's value into any container's environment.
    assert set(secrets["environment"]) == {
        "TRITONSTACK_SECRETS", "TRITONSTACK_KEY_MAP", "TRITONSTACK_OPTIONAL_SECRETS"
    }  # fmt: skip
    for service in gpu["services"].values():
        assert "HF_TOKEN" not in service.get("environment", {})
    overrides = f"{ROOT / 'secrets'}:/run/tritonstack-overrides:ro"  # compose config's paths
    assert [n for n, s in gpu["services"].items() if overrides in s.get("volumes", [])] == [
        "secrets"
    ]
    private = "secrets:/run/secrets/tritonstack:ro"  # the admin key, Grafana's password
    callers = "client-keys:/run/secrets/tritonstack-clients:ro"  # the probe's and Locust's keys
    mounts = {name: s.get("volumes", []) for name, s in gpu["services"].items()}
    # perf-analyzer (the bench profile) reads the admin key for the statistics API; triton-llm
    # (the llm profile) guards its admin APIs with it, as triton does.
    readers = {n for n, v in mounts.items() if private in v}
    assert readers == {"grafana", "triton", "gateway", "perf-analyzer", "triton-llm"}
    assert {n for n, v in mounts.items() if callers in v} == {
        "blackbox", "locust-master", "locust-worker"
    }  # fmt: skip
    assert {probe_key, locust_key} == {
        p for p in generated if p.startswith("/run/secrets/tritonstack-clients/")
    }  # fmt: skip
    for name in ("grafana", "triton", "gateway", "blackbox", "locust-master", "locust-worker",
                 "triton-llm"):  # fmt: skip
        service = gpu["services"][name]
        assert service["depends_on"]["secrets"]["condition"] == "service_completed_successfully"
    assert "secrets:/run/secrets/tritonstack:rw" in secrets["volumes"]
    assert "client-keys:/run/secrets/tritonstack-clients:rw" in secrets["volumes"]
    assert secrets["network_mode"] == "none" and secrets["restart"] == "no"
    assert "admin/admin" not in COMPOSE.read_text()
    example = (ROOT / ".env.example").read_text()
    assert not re.search(r"^[A-Z_]+=", example, re.MULTILINE), "overrides stay commented out"


SECRETS_SCRIPT = ROOT / "scripts" / "secrets.sh"


def secrets_run(
    spec: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """scripts/secrets.sh under /bin/sh (POSIX, as busybox's sh runs it in compose)."""
    environment = {"PATH": "/usr/bin:/bin", "TRITONSTACK_SECRETS": spec, **(env or {})}
    return subprocess.run(
        ["/bin/sh", str(SECRETS_SCRIPT), *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_secrets_are_generated_once_private_and_printed_by_one_command(tmp_path: Path) -> None:
    """The compose `secrets` service's script, run for real: random secrets on first start,
    mode 0400 owned by the reading service's uid (when run as root, as in compose), directory
    not listable, unchanged on every later start, overridable, and `show` prints them."""
    folder = tmp_path / "run" / "secrets"
    mine = tmp_path / "checkout-secrets"  # the checkout's secrets/ folder
    mine.mkdir()
    spec = (
        f"{folder}/grafana-admin-password:472:{mine}/grafana-admin-password "
        f"{folder}/admin-key:1000:{mine}/admin-key"
    )
    first = secrets_run(spec, "generate")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [
        "secrets: grafana-admin-password generated",
        "secrets: admin-key generated",
    ]
    values = {}
    for name, uid in (("grafana-admin-password", 472), ("admin-key", 1000)):
        path = folder / name
        values[name] = path.read_text()
        assert re.fullmatch(r"[0-9a-f]{48}", values[name]), values[name]
        assert path.stat().st_mode & 0o777 == 0o400
        if os.geteuid() == 0:
            assert path.stat().st_uid == uid
        assert values[name] not in first.stdout + first.stderr  # never logged
    assert values["grafana-admin-password"] != values["admin-key"]
    assert folder.stat().st_mode & 0o777 == 0o711
    again = secrets_run(spec, "generate")
    assert again.returncode == 0, again.stderr
    assert "generated" not in again.stdout
    assert {n: (folder / n).read_text() for n in values} == values  # idempotent
    (mine / "grafana-admin-password").write_text("my own\n")  # as `echo` writes it
    override = secrets_run(spec, "generate")
    assert "grafana-admin-password set from your secrets/grafana-admin-password" in override.stdout
    assert (folder / "grafana-admin-password").read_text() == "my own"
    assert (folder / "admin-key").read_text() == values["admin-key"]
    assert "my own" not in override.stdout + override.stderr
    shown = secrets_run(spec, "show")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == f"grafana-admin-password: my own\nadmin-key: {values['admin-key']}\n"
    bad = secrets_run(f"{folder}/x:notauid", "generate")
    assert bad.returncode == 2 and "expected <file>:<uid>[:<override file>]" in bad.stderr
    relative = secrets_run(f"{folder}/x:0:secrets/x", "generate")
    assert relative.returncode == 2, relative.stdout


def test_an_optional_secret_is_yours_alone_copied_while_you_give_it(tmp_path: Path) -> None:
    """TRITONSTACK_OPTIONAL_SECRETS (the Hugging Face token): never generated, since a made-up
    token is refused by the Hub even for a public model; copied private while the checkout's
    file holds a value, removed once it is gone; `show` names it but never prints it."""
    folder = tmp_path / "run" / "secrets-llm"
    mine = tmp_path / "checkout-secrets"
    mine.mkdir()
    env = {"TRITONSTACK_OPTIONAL_SECRETS": f"{folder}/hf-token:1000:{mine}/hf-token"}
    token = folder / "hf-token"
    absent = secrets_run("", "generate", env=env)
    assert absent.returncode == 0, absent.stderr
    assert absent.stdout == "secrets: hf-token not set (optional: your secrets/hf-token)\n"
    assert not token.exists()
    assert secrets_run("", "show", env=env).stdout == "hf-token: not set (optional)\n"
    (mine / "hf-token").write_text("hf_my_own_token\n")
    given = secrets_run("", "generate", env=env)
    assert given.returncode == 0, given.stderr
    assert "hf-token set from your secrets/hf-token" in given.stdout
    assert token.read_text() == "hf_my_own_token"
    assert token.stat().st_mode & 0o777 == 0o400
    if os.geteuid() == 0:
        assert token.stat().st_uid == 1000
    shown = secrets_run("", "show", env=env)
    assert shown.stdout == "hf-token: set from your secrets/hf-token\n"
    assert "hf_my_own" not in given.stdout + given.stderr + shown.stdout
    (mine / "hf-token").unlink()  # you take it back: the reader must not keep it
    assert secrets_run("", "generate", env=env).returncode == 0
    assert not token.exists()
    nameless = secrets_run("", "generate", env={"TRITONSTACK_OPTIONAL_SECRETS": f"{token}:1000"})
    assert nameless.returncode == 2
    assert "expected <file>:<uid>:<override file>" in nameless.stderr


def test_locally_built_images_are_never_pulled(gpu: dict) -> None:
    """Compose pulls an `image:` name that is missing locally before building it, and ignores a
    failed pull only when it can build: whoever registers tritonstack/* on a public registry
    would otherwise run on this host. `pull_policy: build` on every service that builds."""
    built = {name: s for name, s in gpu["services"].items() if "build" in s}
    assert set(built) == {"triton", "locust-master"}
    for name, service in built.items():
        assert service.get("pull_policy") == "build", name
    # A service that shares a built image (locust-worker) never pulls it and builds nothing:
    # two builds of one tag would race on every `up`.
    images = {service["image"]: name for name, service in built.items()}
    for name, service in gpu["services"].items():
        if service["image"].startswith("tritonstack/") and name not in built:
            assert service["image"] in images, name
            assert service.get("pull_policy") == "never", name


def test_every_service_is_pinned_healthy_and_restarting(gpu: dict) -> None:
    for name, service in gpu["services"].items():
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), name
        if service.get("profiles") == ["bench"]:  # a job run by hand: neither healthy nor restarted
            assert "restart" not in service and "ports" not in service, name
            continue
        # One-shot, before the services that read their files: the secrets, the LLM's cache owner.
        if name in ("secrets", "llm-cache"):
            assert service["restart"] == "no" and "ports" not in service
            assert service["network_mode"] == "none", name
            continue
        assert service["healthcheck"]["test"][0] == "CMD", name
        assert service["restart"] == "unless-stopped", name
    for dockerfile in ("Dockerfile.triton", "Dockerfile.locust"):
        bases = re.findall(r"^FROM\s+(\S+)", (ROOT / dockerfile).read_text(), re.MULTILINE)
        assert bases and all(re.search(r":\d[\w.-]*$", b) for b in bases), (dockerfile, bases)
    assert set(gpu["volumes"]) == {
        "secrets",
        "client-keys",
        "llm-secrets",
        "triton-cache",
        "hf-cache",
        "prometheus-data",
        "grafana-data",
    }


def test_published_ports_stay_on_loopback_by_default(gpu: dict) -> None:
    published = {
        name: [p.get("host_ip", "*") if isinstance(p, dict) else p.split(":")[0] for p in ports]
        for name, service in gpu["services"].items()
        for ports in [service.get("ports", [])]
    }
    assert published == {
        "gateway": ["127.0.0.1", "127.0.0.1"],
        "triton": [],  # clients reach Triton only through the gateway
        "triton-llm": [],  # ... and the LLM's Triton too
        "llm-cache": [],
        "prometheus": ["127.0.0.1"],
        "blackbox": [],
        "secrets": [],
        "perf-analyzer": [],
        "grafana": ["127.0.0.1"],
        "locust-master": ["127.0.0.1"],
        "locust-worker": [],
    }
    ports = [p.split(":")[-1] for p in gpu["services"]["gateway"]["ports"]]
    assert ports == ["8000/tcp", "8001/tcp"]  # its metrics (8404) only on the compose network
    assert "${GATEWAY_BIND:-127.0.0.1}:8000:8000" in COMPOSE.read_text()
    from tritonstack.core.contract import GRPC_PORT, HTTP_PORT

    assert [int(p.split(":")[-2]) for p in gpu["services"]["gateway"]["ports"]] == [
        HTTP_PORT,
        GRPC_PORT,
    ]


# --- cross-file wiring ----------------------------------------------------------------------------


def listens_on(service: dict) -> set[int]:
    """Container ports a service declares (published or exposed)."""
    ports = {
        int(p["target"]) if isinstance(p, dict) else int(p.split(":")[-1].split("/")[0])
        for p in service.get("ports", [])
    }
    return ports | {int(str(p).split("/")[0]) for p in service.get("expose", [])}


def assert_listens(gpu: dict, host: str, port: int, where: str) -> None:
    assert host in gpu["services"], f"{where}: {host} is not a compose service"
    assert port in listens_on(gpu["services"][host]), f"{where}: {host} does not listen on {port}"


def test_prometheus_targets_are_compose_services(gpu: dict) -> None:
    config = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    targets = []
    mounts = dict(v.split(":")[:2][::-1] for v in gpu["services"]["prometheus"]["volumes"])
    for job in config["scrape_configs"]:
        if job["job_name"] == "deep_probe":  # probed through the blackbox exporter
            (files,) = job["file_sd_configs"]
            (mounted,) = files["files"]
            groups = yaml.safe_load(Path(mounts[mounted]).read_text())
            probed = {urlsplit(t).netloc for group in groups for t in group["targets"]}
            assert probed == {"gateway:8000"}
            targets.extend(["gateway:8000", job["relabel_configs"][-1]["replacement"]])
        for static in job.get("static_configs", []):
            targets.extend(static["targets"])
        for dns in job.get("dns_sd_configs", []):
            targets.extend(f"{name}:{dns['port']}" for name in dns["names"])
    assert targets == [
        "triton:8002", "triton-llm:8002", "gateway:8404", "gateway:8000", "blackbox:9115",
        "locust-master:9646", "locust-worker:9646",
    ]  # fmt: skip
    blackbox = gpu["services"]["blackbox"]["volumes"][0].split(":")[0]
    assert Path(ROOT / blackbox).resolve() == ROOT / "prometheus" / "blackbox.yml"
    for target in targets:
        host, port = target.rsplit(":", 1)
        assert_listens(gpu, host, int(port), "prometheus.yml")
    for name in ("locust-master", "locust-worker"):
        assert gpu["services"][name]["environment"]["LOCUST_METRICS_PORT"] == "9646"
    # Rules are read from where compose mounts them.
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    assert Path(mounts["/etc/prometheus/rules"]) == ROOT / "prometheus" / "rules"
    command = gpu["services"]["prometheus"]["command"]
    assert Path(mounts["/etc/prometheus/prometheus.yml"]) == ROOT / "prometheus" / "prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in command


def test_grafana_datasource_and_dashboards_are_wired(gpu: dict) -> None:
    datasources = yaml.safe_load(
        (ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    for datasource in datasources:
        url = urlsplit(datasource["url"])
        assert_listens(gpu, url.hostname, url.port, "grafana datasource")
    grafana = gpu["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert Path(mounts["/etc/grafana/provisioning"]) == ROOT / "grafana" / "provisioning"
    assert Path(mounts["/var/lib/grafana/dashboards"]) == ROOT / "grafana" / "dashboards"
    # Any dashboard provider reads a directory compose mounts.
    for provider_file in (ROOT / "grafana" / "provisioning" / "dashboards").glob("*.y*ml"):
        for provider in yaml.safe_load(provider_file.read_text()).get("providers", []):
            path = provider["options"]["path"]
            assert any(path == m or path.startswith(m + "/") for m in mounts), provider_file


def test_locust_talks_to_the_gateway_and_its_master(gpu: dict) -> None:
    master = gpu["services"]["locust-master"]
    worker = gpu["services"]["locust-worker"]
    host = re.search(r"--host (\S+)", master["command"]).group(1)
    url = urlsplit(host)
    assert url.hostname == "gateway", "Locust sends where a user's client would"
    assert_listens(gpu, url.hostname, url.port, "locust --host")
    master_host = re.search(r"--master-host (\S+)", worker["command"]).group(1)
    assert_listens(gpu, master_host, 5557, "locust --master-host")
    for service in (master, worker):
        assert service["depends_on"]["gateway"]["condition"] == "service_healthy"
        files = re.findall(r"(/mnt/loadtest/\S+)", service["command"])
        mount = next(v for v in service["volumes"] if ":/mnt/loadtest" in v)
        assert Path(mount.split(":")[0]) == ROOT / "loadtest"
        for path in files:  # written by the load-testing issue (#5)
            assert (ROOT / "loadtest" / Path(path).name).is_file(), path
    assert (ROOT / "loadtest" / "requirements.txt").is_file()  # Dockerfile.locust installs it


def test_the_services_that_name_models_read_stack_env(gpu: dict) -> None:
    """The public models come from stack.env into every service that names them (the
    healthcheck's models, Locust's default) and the gateway reads the derived limits beside it;
    nothing mounts a model's files into Locust (its users ask the server)."""
    raw = yaml.safe_load(COMPOSE.read_text())["services"]
    for name in ("triton", "locust-master", "locust-worker"):
        assert raw[name]["env_file"] == ["stack.env"], name
    assert raw["gateway"]["env_file"] == ["stack.env", "gateway/limits.env"]
    public = " ".join(load().public_models)
    for name in ("triton", "locust-master", "locust-worker", "gateway"):  # as compose merges it
        assert gpu["services"][name]["environment"]["PUBLIC_MODELS"] == public, name
    derived = limits().environment()
    assert {k: gpu["services"]["gateway"]["environment"][k] for k in derived} == derived
    for name in ("locust-master", "locust-worker"):
        mounts = [str(v).split(":")[0] for v in gpu["services"][name]["volumes"]]
        assert not [m for m in mounts if "model_repository" in m], name


def test_every_mount_source_exists(gpu: dict) -> None:
    for name, service in gpu["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source == str(ROOT / "results"):  # the GPU bench's output; Docker creates it
                assert service.get("profiles") == ["bench"], name
            elif source.startswith("/"):
                assert Path(source).exists(), f"{name}: {source}"
            else:
                assert source in gpu["volumes"], f"{name}: {source}"


def test_healthcheck_exercises_every_model(gpu: dict) -> None:
    """The healthcheck calls the public models (stack.env), and through them every model of the
    repository is reached: ensemble steps and the models a BLS model names."""
    command = gpu["services"]["triton"]["healthcheck"]["test"]
    assert command == ["CMD", "python3", "/opt/tritonstack/healthcheck.py"]
    dockerfile = (ROOT / "Dockerfile.triton").read_text()
    assert ", ".join(f'"{a}"' for a in command[1:]) in dockerfile  # same in the image
    models = {m.name: m for m in iter_models(REPOSITORY)}
    reached = set(load().public_models)
    for name in list(reached):
        config = models[name].config
        reached |= {step.model_name for step in config.ensemble_scheduling.step}
        reached |= {models[name].parameter(k) for k in ("preferred_model", "fallback_model")}
    assert reached - {None} == set(models)


def test_images_match_the_pinned_releases(gpu: dict) -> None:
    """Triton 26.08 (2.72) in the image, the SDK image and the built image's tag alike; numpy as
    the tests run it; Locust as pyproject.toml pins it."""
    dockerfile = (ROOT / "Dockerfile.triton").read_text()
    release = re.search(r"^FROM nvcr\.io/nvidia/tritonserver:(\d\d\.\d\d)-py3$", dockerfile, re.M)
    assert release and release[1] == "26.08"
    assert "Triton 2.72.0" in dockerfile
    assert re.search(r"^ARG TRITON_PYTHON=3\.12$", dockerfile, re.M)  # Ubuntu 24.04's Python
    assert gpu["services"]["triton"]["image"] == f"tritonstack/triton:{release[1]}"
    assert gpu["services"]["perf-analyzer"]["image"] == (
        f"nvcr.io/nvidia/tritonserver:{release[1]}-py3-sdk"
    )
    # The LLM runs Triton's vLLM image of the same release (26.08: vLLM 0.27.1).
    assert gpu["services"]["triton-llm"]["image"] == (
        f"nvcr.io/nvidia/tritonserver:{release[1]}-vllm-python-py3"
    )
    pins = dict(re.findall(r'"([\w-]+)==([^"]+)"', (ROOT / "pyproject.toml").read_text()))
    assert f"FROM locustio/locust:{pins['locust']}" in (ROOT / "Dockerfile.locust").read_text()
    assert f"numpy=={pins['numpy']}" in dockerfile


def test_image_layout_matches_the_launchers_defaults(gpu: dict) -> None:
    from tritonstack.launcher.start import Settings
    from tritonstack.launcher.tensorrt import ENGINE_LINKS

    dockerfile = (ROOT / "Dockerfile.triton").read_text()
    image_env = dict(re.findall(r"^(?:ENV\s+|\s+)(\w+)=(\S+?)(?:\s+\\)?$", dockerfile, re.M))
    defaults = Settings.from_environment(image_env)
    assert defaults.flags_file == Path("/opt/tritonstack/tritonserver.flags")
    assert defaults.repository == Path("/opt/tritonstack/model_repository")
    assert "COPY scripts/tritonserver.flags stack.env /opt/tritonstack/" in dockerfile
    assert "COPY model_repository /opt/tritonstack/model_repository" in dockerfile
    # The launcher runs from the package's copy, on the image's Python path.
    assert "COPY tritonstack /opt/tritonstack/python/tritonstack" in dockerfile
    assert image_env["PYTHONPATH"] == "/opt/tritonstack/python"
    assert '"python3", "-m", "tritonstack.launcher"]' in dockerfile
    assert "USER triton-server" in dockerfile
    assert f"triton-cache:{defaults.cache}" in gpu["services"]["triton"]["volumes"][0]
    gpu_config = (REPOSITORY / "classifier" / "configs" / "gpu.pbtxt").read_text()
    assert defaults.engine_links == Path(ENGINE_LINKS)
    assert f'value: "{ENGINE_LINKS}/classifier"' in gpu_config  # the link the launcher keys


def test_dockerignore_lets_every_copy_source_through() -> None:
    patterns = (ROOT / ".dockerignore").read_text().split()
    allowed = [p[1:].rstrip("/") for p in patterns if p.startswith("!")]
    assert patterns[patterns.index("*")] == "*" and ".env" not in allowed
    for dockerfile in ("Dockerfile.triton", "Dockerfile.locust"):
        for line in re.findall(r"^COPY\s+(.+)$", (ROOT / dockerfile).read_text(), re.MULTILINE):
            sources = [s for s in line.split()[:-1] if not s.startswith("--")]
            for source in sources:
                assert any(source == a or source.startswith(a + "/") for a in allowed), source


# --- the llm profile: the LLM's Triton --------------------------------------------------------


def compose_v2() -> str:
    """`docker` with the Compose v2 plugin, the one that knows profiles (v1's `config` lists
    every service whatever the profile)."""
    docker = require_tool("docker")
    version = run(docker, "compose", "version", "--short")
    if version.returncode or not version.stdout.startswith("2."):
        message = "docker compose (v2) is not installed (.ci/run installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return docker


def test_the_llm_never_starts_without_its_profile(env_file: Path) -> None:
    """What `up` starts is what `config --services` lists: triton-llm and its cache's one-shot
    only with `--profile llm`, on the GPU file and with the CPU overlay alike."""
    docker = compose_v2()
    llm = {"triton-llm", "llm-cache"}
    for files in ((COMPOSE,), (COMPOSE, CPU)):
        base = [docker, "compose", "--project-directory", str(ROOT), "--env-file", str(env_file)]
        base += [arg for f in files for arg in ("-f", str(f))]
        plain = run(*base, "config", "--services")
        with_profile = run(*base, "--profile", "llm", "config", "--services")
        assert plain.returncode == 0 and with_profile.returncode == 0, plain.stderr
        assert not llm & set(plain.stdout.split()), plain.stdout
        assert set(with_profile.stdout.split()) == set(plain.stdout.split()) | llm


def test_llm_shares_triton_s_gpu_network_and_user(gpu: dict) -> None:
    from tritonstack.core.mounts import READERS

    llm, triton = gpu["services"]["triton-llm"], gpu["services"]["triton"]
    assert llm["profiles"] == ["llm"]
    assert llm["deploy"] == triton["deploy"]  # one GPU, reserved the same way
    # On the serving network the gateway shares with triton, under an alias of its own that
    # its HTTP and gRPC bind to; its metrics on a network of its own with Prometheus; nothing
    # depends on it, so nothing without the profile asks for it.
    assert llm["networks"]["serving"] == {"aliases": ["triton-llm-serving"]}
    assert triton["networks"]["serving"] == {"aliases": ["triton-serving"]}
    assert set(llm["networks"]) == {"serving", "llm-metrics"} and "network_mode" not in llm
    assert llm["environment"]["TRITONSTACK_SERVING_NAME"] == "triton-llm-serving"
    assert "ports" not in llm
    ports = {contract.HTTP_PORT, contract.GRPC_PORT, contract.METRICS_PORT}
    assert {int(p) for p in llm["expose"]} == ports
    assert all("triton-llm" not in s.get("depends_on", {}) for s in gpu["services"].values())
    gateway = gpu["services"]["gateway"]["environment"]
    assert gateway["LLM_DNS_NAME"] == "triton-llm"
    assert int(gateway["LLM_HTTP_PORT"]) == contract.HTTP_PORT
    assert int(gateway["LLM_GRPC_PORT"]) == contract.GRPC_PORT
    # After the classifier's Triton is healthy: vLLM counts the GPU memory free at its start.
    assert llm["depends_on"]["triton"]["condition"] == "service_healthy"
    assert llm["depends_on"]["secrets"]["condition"] == "service_completed_successfully"
    # NVIDIA's non-root user, as triton; the admin key is written for it.
    uid, gid = (int(n) for n in llm["user"].split(":"))
    assert (uid, gid) == (READERS["triton-llm"].uid, READERS["triton-llm"].gid)
    assert uid == READERS["triton"].uid


def test_llm_runs_read_only_and_writes_only_to_its_volumes(gpu: dict) -> None:
    """A read-only root: the Hugging Face cache is the hf-cache volume, made writable for the
    server's user by the one-shot llm-cache, and every other cache is under the /tmp tmpfs,
    which allows exec (compiled kernels are loaded from there)."""
    llm = gpu["services"]["triton-llm"]
    env = llm["environment"]
    assert llm["read_only"] is True
    assert llm["cap_drop"] == ["ALL"] and llm["security_opt"] == ["no-new-privileges:true"]
    assert llm["init"] is True
    mounts = {v.split(":")[1]: v.split(":")[0] for v in llm["volumes"]}
    assert mounts[env["HF_HOME"]] == "hf-cache"
    (tmp,) = llm["tmpfs"]
    path, options = tmp.split(":")
    assert path == "/tmp" and "exec" in options.split(",") and "noexec" not in options
    assert env["HOME"].startswith(path)
    cache = gpu["services"]["llm-cache"]
    assert cache["profiles"] == llm["profiles"]
    assert f"hf-cache:{env['HF_HOME']}:rw" in cache["volumes"]
    assert cache["command"] == ["chown", llm["user"], env["HF_HOME"]]
    assert cache["cap_add"] == ["CHOWN"] and cache["cap_drop"] == ["ALL"]
    assert llm["depends_on"]["llm-cache"]["condition"] == "service_completed_successfully"
    assert _bytes(llm["shm_size"]) >= _bytes(gpu["services"]["triton"]["shm_size"])
    # The Hugging Face token: yours alone (secrets/hf-token), a file in a volume no other
    # service mounts, copied there by the secrets service, never generated.
    assert "HF_TOKEN" not in env
    secrets = gpu["services"]["secrets"]
    (token,) = secrets["environment"]["TRITONSTACK_OPTIONAL_SECRETS"].split()
    path, reader, override = token.split(":")
    assert env["HF_TOKEN_PATH"] == path and reader == llm["user"].split(":")[0]
    assert override == "/run/tritonstack-overrides/hf-token"
    volume = f"llm-secrets:{os.path.dirname(path)}"
    mounts = {n: s.get("volumes", []) for n, s in gpu["services"].items()}
    assert {n for n, v in mounts.items() if any(m.startswith(volume) for m in v)} == {
        "secrets", "triton-llm"
    }  # fmt: skip
    assert f"{volume}:ro" in llm["volumes"] and f"{volume}:rw" in secrets["volumes"]
    assert env["VLLM_NO_USAGE_STATS"] == "1" and env["HF_HUB_DISABLE_TELEMETRY"] == "1"


def test_llm_drains_within_the_gateway_s_stop_bounds(gpu: dict) -> None:
    """Compose stops the gateway and triton-llm at once (neither depends on the other): Triton's
    drain outlasts the gateway's soft stop, so no stream the gateway relays is cut by Triton,
    and Docker's SIGKILL comes after both."""
    from tritonstack.serve.gateway import SOFT_STOP_SECONDS

    llm = gpu["services"]["triton-llm"]
    gateway = gpu["services"]["gateway"]
    drain = int(llm["environment"]["TRITON_EXIT_TIMEOUT_SECS"])
    assert SOFT_STOP_SECONDS < drain < compose_seconds(llm["stop_grace_period"])
    assert compose_seconds(gateway["stop_grace_period"]) <= compose_seconds(
        llm["stop_grace_period"]
    )
    assert drain == int(gpu["services"]["triton"]["environment"]["TRITON_EXIT_TIMEOUT_SECS"])


def test_llm_healthcheck_waits_for_the_model_and_its_first_download(gpu: dict) -> None:
    check = gpu["services"]["triton-llm"]["healthcheck"]
    # Readiness only (a generation would count in the LLM's metrics), asked where the
    # container serves (its serving address), by the health check the triton image runs.
    script = "/opt/tritonstack/healthcheck.py"
    assert check["test"] == ["CMD", "python3", script, "--ready", "--model", contract.LLM_MODEL]
    mounts = [str(v) for v in gpu["services"]["triton-llm"]["volumes"]]
    assert f"{ROOT / 'tritonstack' / 'core' / 'health.py'}:{script}:ro" in mounts
    assert compose_seconds(check["timeout"]) > 4  # the request gives up first, with its error
    assert compose_seconds(check["start_period"]) >= 600  # ~1 GB download + vLLM's start


def run_llm_command(gpu: dict, tmp_path: Path, **env: str) -> list[str]:
    """The command, run with its mounts' host paths and a fake tritonserver that records the
    arguments it was exec'd with."""
    from tritonstack.launcher.start import Settings

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "tritonserver").exists():
        (bin_dir / "tritonserver").symlink_to(ROOT / "tests" / "fakes" / "fake_tritonserver")
    service = gpu["services"]["triton-llm"]
    command = service["command"]
    assert command[:3] == ["python3", "-m", "tritonstack.launcher"]
    mounts = dict(reversed(str(v).split(":")[:2]) for v in service["volumes"])  # target: source
    service_env = service["environment"]
    package = Path(mounts[f"{service_env['PYTHONPATH']}/tritonstack"])
    defaults = Settings.from_environment({k: str(v) for k, v in service_env.items()})
    argv = tmp_path / "argv"
    environment = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_ARGV": str(argv),
        "PYTHONPATH": str(package.parent),
        "MODEL_REPOSITORY": mounts[str(defaults.repository)],
        "TRITONSTACK_FLAGS": mounts[str(defaults.flags_file)],
        "TRITONSTACK_CACHE": str(tmp_path / "cache"),
        "TRITON_EXIT_TIMEOUT_SECS": service_env["TRITON_EXIT_TIMEOUT_SECS"],
        **env,
    }
    result = subprocess.run([sys.executable, *command[1:]], env=environment, capture_output=True,
                            text=True, timeout=30)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return argv.read_text().splitlines()


def restricted(key: str) -> list[str]:
    """The admin APIs behind `key`."""
    api = f"{contract.ADMIN_APIS}:{contract.ADMIN_HEADER}={key}"
    return [f"--http-restricted-api={api}", f"--grpc-restricted-protocol={api}"]


def shut_key(argv: list[str]) -> str:
    """The key the last two flags shut every other restricted API behind (drawn at each start),
    after checking that they do."""
    shut = ",".join(
        api
        for api in contract.RESTRICTED_APIS.split(",")
        if api not in contract.ADMIN_APIS.split(",")
    )
    http, grpc = argv[-2:]
    prefix = f"--http-restricted-api={shut}:{contract.SHUT_HEADER}="
    assert http.startswith(prefix) and grpc == http.replace(
        "http-restricted-api", "grpc-restricted-protocol"
    )
    key = http.removeprefix(prefix)
    assert re.fullmatch(r"[0-9a-f]{48}", key), key
    return key


def test_llm_command_passes_the_shared_flags_and_the_admin_key(gpu: dict, tmp_path: Path) -> None:
    """The flags scripts/tritonserver.flags gives every Triton of the stack, the LLM's repository
    (mounted read-only), the contract's ports, and the admin APIs behind the generated key."""
    key_file = tmp_path / "admin-key"
    key_file.write_text("k" * 48)
    argv = run_llm_command(gpu, tmp_path, TRITONSTACK_ADMIN_KEY_FILE=str(key_file))
    shared = [
        line.strip()
        for line in FLAGS.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert argv == [
        f"--model-repository={LLM_REPOSITORY}",
        *shared,
        "--exit-timeout-secs=20",
        "--http-address=0.0.0.0",
        f"--http-port={contract.HTTP_PORT}",
        "--grpc-address=0.0.0.0",
        f"--grpc-port={contract.GRPC_PORT}",
        "--metrics-address=0.0.0.0",
        f"--metrics-port={contract.METRICS_PORT}",
        "--allow-gpu-metrics=false",
        *restricted("k" * 48),
        *argv[-2:],
    ]
    shut_key(argv)
    # The key file is the one the secrets service writes for triton-llm's user.
    llm = gpu["services"]["triton-llm"]
    secrets = gpu["services"]["secrets"]["environment"]["TRITONSTACK_SECRETS"].split()
    owners = {entry.split(":")[0]: entry.split(":")[1] for entry in secrets}
    assert owners[llm["environment"]["TRITONSTACK_ADMIN_KEY_FILE"]] == llm["user"].split(":")[0]


def test_llm_command_takes_a_key_from_the_environment_or_keeps_the_admin_apis_shut(
    gpu: dict, tmp_path: Path
) -> None:
    """A key given as TRITONSTACK_ADMIN_KEY is used; with no key at all (Kubernetes without its
    Secret) each container generates one into its own /tmp (TRITONSTACK_CACHE), which nobody
    knows."""
    given = run_llm_command(gpu, tmp_path, TRITONSTACK_ADMIN_KEY="e" * 40)
    assert given[-4:-2] == restricted("e" * 40)
    assert gpu["services"]["triton-llm"]["environment"]["TRITONSTACK_CACHE"].startswith("/tmp/")
    first, second = (
        run_llm_command(gpu, tmp_path, TRITONSTACK_CACHE=str(tmp_path / n))[-3].rsplit("=", 1)[1]
        for n in ("one", "two")
    )
    assert len(first) >= 32 and first != second
    # The other restricted APIs: a new key at each start, as both runtimes draw it.
    assert shut_key(given) != shut_key(run_llm_command(gpu, tmp_path))
    # Asked for: every restricted API behind the admin key, none shut.
    everything = run_llm_command(gpu, tmp_path, TRITONSTACK_ADMIN_KEY="e" * 40,
                                 TRITONSTACK_ADMIN_APIS="trace,shared-memory,logging")  # fmt: skip
    api = f"{contract.RESTRICTED_APIS}:{contract.ADMIN_HEADER}={'e' * 40}"
    assert everything[-2:] == [f"--http-restricted-api={api}", f"--grpc-restricted-protocol={api}"]
    assert not any(contract.SHUT_HEADER in arg for arg in everything)
    # Compose gives both servers the same setting from .env, nothing more asked by default.
    for name in ("triton", "triton-llm"):
        assert gpu["services"][name]["environment"]["TRITONSTACK_ADMIN_APIS"] == ""


def test_llm_command_flags_are_ones_the_real_tritonserver_knows(gpu: dict, tmp_path: Path) -> None:
    from tritonstack.serve.runtime import EmbeddedTriton, pytriton_root

    binary = pytriton_root() / "bin" / "tritonserver"
    env = EmbeddedTriton(REPOSITORY).environment()
    help_text = subprocess.run([str(binary), "--help"], env=env, capture_output=True, text=True,
                               timeout=60)  # fmt: skip
    known = {
        line.split()[0]
        for line in (help_text.stdout + help_text.stderr).splitlines()
        if line.startswith("  --")
    }
    assert "--grpc-restricted-protocol" in known, help_text.stdout[-2000:]
    argv = run_llm_command(gpu, tmp_path, TRITONSTACK_ADMIN_KEY="x" * 32)
    assert {arg.split("=", 1)[0] for arg in argv} - known == set()


# --- linters ----------------------------------------------------------------------------------


def test_hadolint_dockerfiles() -> None:
    standins = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/standins/*/Dockerfile"))
    assert len(standins) == 6
    result = run(tool("hadolint"), "Dockerfile.triton", "Dockerfile.locust", *standins)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_every_shell_script() -> None:
    scripts = [
        path
        for path in repo_files()
        if path.suffix == ".sh"
        or re.match(rb"#!\s*(/usr)?/bin/(env\s+)?(ba)?sh\b", path.read_bytes()[:40])
    ]
    names = {p.relative_to(ROOT).as_posix() for p in scripts}
    assert {"scripts/secrets.sh", "tests/fakes/fake_trtexec", ".ci/run"} <= names
    result = run(tool("shellcheck"), *map(str, scripts))
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_every_yaml_file() -> None:
    listed = run(tool("yamllint"), "--list-files", ".")
    names = set(listed.stdout.split())
    assert {"./docker-compose.yml", "./compose.cpu.yml", "./prometheus/prometheus.yml"} <= names
    on_disk = {
        f"./{p.relative_to(ROOT).as_posix()}" for p in repo_files() if p.suffix in (".yml", ".yaml")
    }
    assert on_disk <= names | {"./.yamllint"}, on_disk - names
    result = run(tool("yamllint"), "-f", "parsable", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_model_repository_is_read_only_for_the_server(gpu: dict) -> None:
    """docs/security.md: the server user cannot change what it serves. The repository is copied
    as root before `USER triton-server` (no --chown), and the development mount is :ro."""
    dockerfile = (ROOT / "Dockerfile.triton").read_text()
    copy = re.search(r"^COPY .*model_repository.*$", dockerfile, re.MULTILINE).group(0)
    assert "--chown" not in copy
    assert dockerfile.index(copy) < dockerfile.index("USER triton-server")
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "./model_repository:/opt/tritonstack/model_repository:ro" in compose
    mounts = [str(v) for v in gpu["services"]["triton"].get("volumes", [])]
    assert all("model_repository" not in m or m.endswith(":ro") for m in mounts)
    # The LLM's repository, mounted into NVIDIA's image unchanged: read-only as well.
    llm = [str(v) for v in gpu["services"]["triton-llm"]["volumes"]]
    assert f"{LLM_REPOSITORY}:{LLM_TARGET}:ro" in llm


def test_gpu_bench_profile_is_the_one_the_benchmark_docs_describe(gpu: dict) -> None:
    """The `bench` profile's service equals python -m bench's COMPOSE_BENCH (which
    docs/benchmarks.md prints) and uses the SDK image of Dockerfile.triton's release."""
    from bench.report import COMPOSE_BENCH

    documented = yaml.safe_load(COMPOSE_BENCH)["perf-analyzer"]
    committed = yaml.safe_load(COMPOSE.read_text())["services"]["perf-analyzer"]
    assert committed == documented
    assert committed["profiles"] == ["bench"]
    release = re.search(r"tritonserver:(\S+)-py3", (ROOT / "Dockerfile.triton").read_text())[1]
    assert committed["image"] == f"nvcr.io/nvidia/tritonserver:{release}-py3-sdk"
    script = committed["command"][-1].replace("/bench/", "bench/")
    assert (ROOT / script).is_file()


def test_ci_installs_haproxy_and_lint_checks_the_config() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "need_apt+=(haproxy)" in ci
    makefile = (ROOT / "Makefile").read_text()
    assert "python -m tritonstack.serve.gateway --check" in makefile
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    for tool in ("ruff check", "hadolint", "shellcheck", "yamllint", "promtool check rules",
                 "tritonstack.serve.gateway --check",
                 "docker-compose -f docker-compose.yml config"):  # fmt: skip
        assert tool in lint, f"`make lint` does not run {tool}"
