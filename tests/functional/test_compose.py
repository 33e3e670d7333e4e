"""What compose runs, run here: the container healthcheck against the real Triton of the
embedded runtime (serving, broken, a killed stub, a slow model), and HAProxy 2.6 on the gateway
config with the environment compose gives it (stack.env and the limits derived from
model_repository/, keys when published)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support import REPOSITORY, ROOT, compose_seconds
from tests.unit.test_compose import COMPOSE, assert_listens, compose_config, secrets_run
from tests.unit.test_health import healthcheck
from tritonstack.core import health
from tritonstack.core.errors import UserError
from tritonstack.core.settings import load
from tritonstack.serve.gateway import check_config


def test_healthcheck_passes_on_a_serving_triton(triton) -> None:
    """The public models (stack.env's, as the image's copy or $PUBLIC_MODELS gives them), each
    called with a row of zeros shaped from its metadata."""
    public = load().public_models
    env = {"PUBLIC_MODELS": " ".join(public)}
    result = healthcheck("--url", triton.http_url, env=env)
    assert result.returncode == 0, result.stderr
    assert [line.split(":")[:2] for line in result.stdout.splitlines()] == [
        ["healthy", f" {model}"] for model in public
    ]


def test_healthcheck_fails_on_a_broken_model_or_server(triton) -> None:
    missing = healthcheck("--url", triton.http_url, "--model", "pipeline", "--model", "nope")
    assert missing.returncode == 1
    assert "healthy: pipeline" in missing.stdout
    assert "unhealthy: nope: HTTP 404 for /v2/models/nope" in missing.stderr
    from tritonstack.core.ports import free_ports

    (closed,) = free_ports(1)
    down = healthcheck("--url", f"127.0.0.1:{closed}", "--timeout", "2", "--model", "pipeline")
    assert down.returncode == 1 and "unhealthy: pipeline: no answer from" in down.stderr


def test_healthcheck_fails_when_a_stub_is_killed_while_2_51_stays_ready(tmp_path: Path) -> None:
    """On the real Triton 2.51: kill -9 of postprocess's stubs, and the probe says unhealthy with
    Triton's own message while /v2/health/ready still answers 200 (what 2.51 does)."""
    import urllib.request

    import psutil

    from tritonstack.core.ports import free_ports
    from tritonstack.serve.runtime import EmbeddedTriton

    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(REPOSITORY, http, grpc, metrics, log_path=tmp_path / "triton.log")
    server.start()
    try:
        assert healthcheck("--url", server.http_url, "--model", "pipeline").returncode == 0
        stubs = [
            child
            for child in psutil.Process(server.process.pid).children(recursive=True)
            if child.name() == "triton_python_backend_stub"
            and "/postprocess/" in " ".join(child.cmdline())
        ]
        assert stubs
        for stub in stubs:
            stub.kill()
        psutil.wait_procs(stubs, timeout=10)
        result = healthcheck("--url", server.http_url, "--timeout", "10", "--model", "pipeline")
        ready = urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=5)
    finally:
        # A server whose stubs were killed waits out its exit timeout for them to unload:
        # what is tested is the probe, not that shutdown, so it is not waited for.
        server.stop(grace=1)
    assert result.returncode == 1, result.stdout
    assert "unhealthy: pipeline: HTTP " in result.stderr
    assert "is not healthy" in result.stderr
    assert ready.status == 200  # pins the Triton 2.51 behaviour the deep probe exists for


SLOW_MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({seconds})  # a server busy with work it cannot finish sooner
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]))
        return responses
"""
SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def test_healthcheck_calls_a_slow_server_busy_within_its_deadline(tmp_path: Path) -> None:
    """A live server slower than the check's deadline: exit 0 (busy), and the check ends before
    its deadline plus Python's start, so Docker's timeout (above the deadline) never cuts it."""
    from tritonstack.core.ports import free_ports
    from tritonstack.serve.runtime import EmbeddedTriton

    repository = tmp_path / "repository"
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "config.pbtxt").write_text(textwrap.dedent(SLOW_CONFIG))
    (repository / "slow" / "1" / "model.py").write_text(SLOW_MODEL.format(seconds=6))
    http, grpc, metrics = free_ports(3)
    with EmbeddedTriton(repository, http, grpc, metrics, log_path=tmp_path / "triton.log") as s:
        started = time.monotonic()
        result = healthcheck("--url", s.http_url, "--model", "slow", "--deadline", "3")
        took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("busy: slow: no answer within"), result.stdout
    # Python's start included, on a machine busy with the rest of the suite: the room Docker's
    # timeout leaves past the deadline in the product (10 - 8 s).
    assert took < 3 + 2.0, f"the check took {took:.1f} s past its 3 s deadline"


def test_the_healthcheck_deadline_ends_before_docker_s_timeout(gpu: dict) -> None:
    """Docker counts a healthcheck running past its timeout as a failure: the script's own
    deadline, plus the interpreter's start, must end first, in compose and in the image."""
    check = gpu["services"]["triton"]["healthcheck"]
    dockerfile = (ROOT / "Dockerfile.triton").read_text()
    image_timeout = re.search(r"HEALTHCHECK .*--timeout=(\S+)", dockerfile).group(1)
    for timeout in (compose_seconds(check["timeout"]), compose_seconds(image_timeout)):
        assert timeout >= health.DEADLINE_S + 1.5, (health.DEADLINE_S, timeout)
    # The request timeout is cut to what is left of the deadline, never past it.
    assert health.REQUEST_TIMEOUT_S < health.DEADLINE_S


# --- the gateway -------------------------------------------------------------------------------


def haproxy_check(env: dict[str, str | None]) -> tuple[bool, str]:
    """`haproxy -c -dW` (Debian's 2.6, the native runtime) on the one config: the native
    gateway's environment with `env` over it."""
    try:
        return True, check_config(**env)
    except UserError as exc:
        return False, str(exc)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory) -> dict:
    """docker-compose.yml as docker-compose v1 resolves it from a fresh clone (no .env)."""
    env_file = tmp_path_factory.mktemp("compose") / "empty.env"
    env_file.write_text("")
    return compose_config(env_file, COMPOSE)


def test_gateway_runs_the_one_config_with_limits_from_the_repository(gpu: dict) -> None:
    from tritonstack.serve.gateway import HAPROXY_FLAGS, SOFT_STOP_SECONDS, limits

    gateway = gpu["services"]["gateway"]
    assert re.fullmatch(r"haproxy:3\.\d+\.\d+-alpine", gateway["image"]), gateway["image"]
    assert "./gateway:/usr/local/etc/haproxy:ro" in COMPOSE.read_text()
    assert gateway["volumes"][0].split(":")[0] == str(ROOT / "gateway")
    env = gateway["environment"]
    expected = limits(REPOSITORY).environment()
    assert {key: str(env[key]) for key in expected} == expected
    # Replicas by DNS, on the ports Triton exposes on the compose network.
    assert env["TRITON_DNS_NAME"] == "triton"
    triton = gpu["services"]["triton"]
    assert_listens(gpu, "triton", int(env["TRITON_HTTP_PORT"]), "gateway")
    assert_listens(gpu, "triton", int(env["TRITON_GRPC_PORT"]), "gateway")
    assert "ports" not in triton
    # Soft stop drains in-flight requests; Triton stops after the gateway (it depends on Triton).
    assert gateway["stop_signal"] == "SIGUSR1"
    assert gateway["depends_on"]["triton"]["condition"] == "service_healthy"
    assert compose_seconds(gateway["stop_grace_period"]) > SOFT_STOP_SECONDS  # hard-stop-after
    assert gateway["command"][:2] == ["haproxy", *HAPROXY_FLAGS]
    # HAProxy 2.6 parses the config with the environment compose gives the container (its
    # models map: the generated one beside haproxy.cfg, compose's mount).
    ok, output = haproxy_check({k: str(v) for k, v in env.items()} | {"GATEWAY_MODELS_MAP": None})
    assert ok, output


def test_gateway_refuses_a_public_address_without_keys(tmp_path: Path) -> None:
    env = {"GATEWAY_PUBLISH_ADDRESS": "0.0.0.0"}
    ok, output = haproxy_check(env)
    assert not ok
    assert "refusing to publish the gateway on 0.0.0.0 without API keys" in output
    keys = tmp_path / "api-keys"
    keys.write_text("k" * 32 + " client\n")
    assert haproxy_check({**env, "GATEWAY_API_KEYS": str(keys)})[0]
    assert haproxy_check({"GATEWAY_PUBLISH_ADDRESS": "127.0.0.1"})[0]
    # compose's generated key stands in for a keys file beyond loopback
    generated = {**env, "GATEWAY_GENERATED_API_KEYS": str(keys)}
    assert haproxy_check(generated)[0]


# --- the llm profile ----------------------------------------------------------------------------


def llm_healthcheck(gpu: dict, http_url: str) -> subprocess.CompletedProcess:
    """triton-llm's healthcheck command (the health check the container mounts), run here
    against `http_url` instead of its serving address."""
    test = gpu["services"]["triton-llm"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python3", "/opt/tritonstack/healthcheck.py"]
    script = str(ROOT / "tritonstack" / "core" / "health.py")
    command = [sys.executable, script, *test[3:], "--url", http_url]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def test_llm_healthcheck_passes_once_llm_is_ready_and_not_before(gpu, llm_triton, triton) -> None:
    """Against the real Triton: ready where `llm` is served (the embedded vLLM backend, the
    same endpoint as the container's), failing where the server is up but `llm` is not."""
    assert llm_healthcheck(gpu, llm_triton.http_url).returncode == 0
    missing = llm_healthcheck(gpu, triton.http_url)
    # Triton answers an unknown model's readiness with 400 (no `llm` here): an error status.
    assert missing.returncode == 1 and "not ready: llm: HTTP 400" in missing.stderr


def test_the_llm_s_hub_client_sends_your_token_from_its_file_and_none_without(
    tmp_path: Path, gpu: dict
) -> None:
    """triton-llm's Hugging Face token, end to end but for the Hub: the secrets service's script
    copies secrets/hf-token where triton-llm's HF_TOKEN_PATH points (paths as compose gives
    them, moved under tmp_path), and the Hub's own client (huggingface_hub, as the LLM runtime
    pins it), with no HF_TOKEN variable, sends it as the bearer; once the file is taken back it
    sends none (a made-up token is refused by the Hub even for a public model)."""
    spec = gpu["services"]["secrets"]["environment"]["TRITONSTACK_OPTIONAL_SECRETS"]
    path = gpu["services"]["triton-llm"]["environment"]["HF_TOKEN_PATH"]
    here = {
        "/run/secrets/": f"{tmp_path}/volumes/",
        "/run/tritonstack-overrides/": f"{tmp_path}/mine/",
    }
    for container, host in here.items():
        spec, path = spec.replace(container, host), path.replace(container, host)
    mine = tmp_path / "mine"
    mine.mkdir()
    hub = "from huggingface_hub.utils import build_hf_headers as h; print(h().get('authorization'))"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    environment |= {"HF_TOKEN_PATH": path, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}

    def bearer() -> str:
        assert (
            secrets_run("", "generate", env={"TRITONSTACK_OPTIONAL_SECRETS": spec}).returncode == 0
        )
        sent = subprocess.run([sys.executable, "-c", hub], env=environment, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        return sent.stdout.strip()

    (mine / "hf-token").write_text("hf_my_own_token\n")
    assert bearer() == "Bearer hf_my_own_token"
    (mine / "hf-token").unlink()
    assert bearer() == "None"
