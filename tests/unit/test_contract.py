"""Everything that cannot import tritonstack/contract.py agrees with it.

The Triton image (scripts/), the Locust image (loadtest/), the compose file, the gateway's
haproxy.cfg and the model configurations spell out ports and the model contract because they
run where the package is not installed; these tests are what keeps them one fact.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tritonclient.grpc import model_config_pb2

from tests.support import REPOSITORY, ROOT
from tritonstack import contract
from tritonstack.repository import iter_models


def module_constants(path: Path) -> dict[str, object]:
    """The module-level `NAME = <literal>` assignments of a Python file, without running it."""
    constants = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return constants


#: file -> {its constant: the contract's name for it}, for the files that run without tritonstack.
WRITTEN_OUT = {
    "loadtest/users.py": {
        "INPUT_NAME": "INPUT_NAME",
        "INPUT_DATATYPE": "INPUT_DATATYPE",
        "FEATURES": "FEATURES",
        "MAX_ROWS": "MAX_BATCH_SIZE",
        "MODEL_OUTPUTS": "MODEL_OUTPUTS",
        "GRPC_PORT": "GRPC_PORT",
    },
    "loadtest/exporter.py": {"DEFAULT_PORT": "LOCUST_METRICS_PORT", "DEFAULT_ADDR": "LOOPBACK"},
    "loadtest/generation.py": {
        "LLM_MODEL": "LLM_MODEL",
        "DEFAULT_MAX_TOKENS": "LLM_DEFAULT_MAX_TOKENS",
        "MAX_TOKENS": "LLM_MAX_TOKENS",
    },
    "scripts/healthcheck.py": {
        "INPUT_NAME": "INPUT_NAME",
        "INPUT_DATATYPE": "INPUT_DATATYPE",
        "FEATURES": "FEATURES",
        "HTTP_PORT": "HTTP_PORT",
        "LOOPBACK": "LOOPBACK",
    },
}


@pytest.mark.parametrize("path", sorted(WRITTEN_OUT))
def test_files_outside_the_package_write_out_the_contract(path):
    constants = module_constants(ROOT / path)
    names = WRITTEN_OUT[path]
    assert {own: constants.get(own) for own in names} == {
        own: getattr(contract, theirs) for own, theirs in names.items()
    }


def test_container_healthcheck_reads_the_contracts_labels():
    text = (ROOT / "scripts" / "healthcheck.py").read_text()
    assert f'Path("/opt/tritonstack/model_repository/{contract.LABELS_FILE}")' in text


def test_entrypoint_defaults_are_the_contracts():
    text = (ROOT / "scripts" / "entrypoint.sh").read_text()
    defaults = dict(re.findall(r"^(\w+)=\$\{TRITON_\w+_PORT:-(\d+)\}$", text, re.M))
    assert defaults == {
        "HTTP_PORT": str(contract.HTTP_PORT),
        "GRPC_PORT": str(contract.GRPC_PORT),
        "METRICS_PORT": str(contract.METRICS_PORT),
    }
    assert f'RESTRICTED_APIS="{contract.RESTRICTED_APIS}"' in text.splitlines()
    assert f"ADMIN_HEADER={contract.ADMIN_HEADER}" in text.splitlines()


def test_model_configs_declare_the_contract():
    configs = {m.name: m.config for m in iter_models(REPOSITORY)}
    for name, outputs in contract.MODEL_OUTPUTS.items():
        config = configs[name]
        assert config.max_batch_size == contract.MAX_BATCH_SIZE, name
        [tensor] = config.input
        assert tensor.name == contract.INPUT_NAME, name
        assert (
            model_config_pb2.DataType.Name(tensor.data_type) == f"TYPE_{contract.INPUT_DATATYPE}"
        ), name
        assert list(tensor.dims) == [contract.FEATURES], name
        assert set(outputs) <= {output.name for output in config.output}, name
    assert (REPOSITORY / contract.LABELS_FILE).is_file()


def test_both_python_models_run_postprocesss_labels_reader():
    """Triton's stub puts only a model's own directory and version directory on sys.path, so
    classify imports postprocess's labels_file.py through a symlink; a relative one keeps
    resolving after a COPY, a bind mount or in the embedded runtime's repository view."""
    owner = REPOSITORY / "postprocess" / "1" / "labels_file.py"
    link = REPOSITORY / "classify" / "1" / "labels_file.py"
    assert owner.is_file() and not owner.is_symlink()
    assert link.is_symlink()
    assert not os.readlink(link).startswith("/"), os.readlink(link)
    assert link.resolve() == owner.resolve()
    for name in ("postprocess", "classify"):
        tree = ast.parse((REPOSITORY / name / "1" / "model.py").read_text())
        assert "read_labels" not in {getattr(n, "name", None) for n in tree.body}, name
        imported = [
            alias.name
            for n in tree.body
            if isinstance(n, ast.ImportFrom) and n.module == "labels_file"
            for alias in n.names
        ]
        assert imported == ["read_labels"], name
    configs = {m.name: m.config for m in iter_models(REPOSITORY)}
    files = {
        (REPOSITORY / name / configs[name].parameters["labels_file"].string_value).resolve()
        for name in ("postprocess", "classify")
    }
    assert files == {(REPOSITORY / contract.LABELS_FILE).resolve()}


def test_locust_defaults_to_the_repositorys_labels(tmp_path):
    """Run from a checkout (`tritonstack loadtest`, `locust -f loadtest/locustfile.py`), Locust
    checks answers against the labels file the models serve, wherever it is started from.
    users.py is imported in a child process: Locust monkey-patches the standard library."""
    code = "import users; print(users.DEFAULT_LABELS_FILE)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "loadtest")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == (REPOSITORY / contract.LABELS_FILE).resolve()


def test_compose_and_images_use_the_contracts_ports():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    triton_ports = {contract.HTTP_PORT, contract.GRPC_PORT, contract.METRICS_PORT}
    assert {int(p.split()[0]) for p in services["triton"]["expose"]} == triton_ports
    gateway_env = services["gateway"]["environment"]
    assert gateway_env["TRITON_HTTP_PORT"] == str(contract.HTTP_PORT)
    assert gateway_env["TRITON_GRPC_PORT"] == str(contract.GRPC_PORT)
    assert gateway_env["GATEWAY_MAX_ROWS"] == str(contract.MAX_BATCH_SIZE)
    assert gateway_env["GATEWAY_FEATURES"] == str(contract.FEATURES)
    assert gateway_env["GATEWAY_MODELS"].split("|") == sorted(contract.PUBLIC_MODELS)
    published = {p.rsplit(":", 1)[1] for p in services["gateway"]["ports"]}
    assert published == {str(contract.HTTP_PORT), str(contract.GRPC_PORT)}
    assert [str(p) for p in services["gateway"]["expose"]] == [str(contract.GATEWAY_METRICS_PORT)]
    master = services["locust-master"]
    assert master["environment"]["LOCUST_METRICS_PORT"] == str(contract.LOCUST_METRICS_PORT)
    web = f"{contract.LOOPBACK}:{contract.LOCUST_WEB_PORT}:{contract.LOCUST_WEB_PORT}"
    assert web in master["ports"]
    expose = re.search(r"^EXPOSE (.+)$", (ROOT / "Dockerfile.triton").read_text(), re.M)
    assert {int(p) for p in expose.group(1).split()} == triton_ports
    locust_image = (ROOT / "Dockerfile.locust").read_text()
    env = f"ENV LOCUST_METRICS_PORT={contract.LOCUST_METRICS_PORT} LOCUST_METRICS_ADDR=0.0.0.0"
    assert env in locust_image  # scraped from the compose network; natively loopback (below)
    expose = re.search(r"^EXPOSE (.+)$", locust_image, re.M)
    assert {contract.LOCUST_WEB_PORT, contract.LOCUST_METRICS_PORT} <= {
        int(p) for p in expose.group(1).split()
    }


def test_gateway_config_defaults_are_the_contracts():
    text = (ROOT / "gateway" / "haproxy.cfg").read_text()
    defaults = dict(re.findall(r"\$\{(\w+_PORT)-(\d+)\}", text))
    assert defaults == {
        "GATEWAY_METRICS_PORT": str(contract.GATEWAY_METRICS_PORT),
        "GATEWAY_HTTP_PORT": str(contract.HTTP_PORT),
        "GATEWAY_GRPC_PORT": str(contract.GRPC_PORT),
        "TRITON_HTTP_PORT": str(contract.HTTP_PORT),
        "TRITON_GRPC_PORT": str(contract.GRPC_PORT),
        "LLM_HTTP_PORT": str(contract.HTTP_PORT),
        "LLM_GRPC_PORT": str(contract.GRPC_PORT),
    }


def test_gateway_config_llm_defaults_are_the_contracts():
    text = (ROOT / "gateway" / "haproxy.cfg").read_text()
    defaults = dict(re.findall(r"\$\{(GATEWAY_LLM_\w+)-([^}\"]+)\}", text))
    assert defaults["GATEWAY_LLM_MODEL"] == contract.LLM_MODEL
    assert defaults["GATEWAY_LLM_MAX_PROMPT"] == str(contract.LLM_MAX_PROMPT_BYTES)
    assert defaults["GATEWAY_LLM_MAX_TOKENS"] == str(contract.LLM_MAX_TOKENS)
    assert defaults["GATEWAY_LLM_STREAMS"] == str(contract.LLM_STREAMS_PER_REPLICA)
