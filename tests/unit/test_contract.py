"""Everything that cannot import tritonstack/core/contract.py agrees with it: the stack's own ports
and names, which the entrypoint, the compose file, the images and haproxy.cfg's defaults spell
out because they run where the package is not. (No model's contract is written anywhere but the
model repository: clients ask the server.)
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest
import yaml

from tests.support import REPOSITORY, ROOT
from tritonstack.core import contract
from tritonstack.core.repository import iter_models


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
    "loadtest/exporter.py": {"DEFAULT_PORT": "LOCUST_METRICS_PORT", "DEFAULT_ADDR": "LOOPBACK"},
    "tritonstack/core/health.py": {"HTTP_PORT": "HTTP_PORT", "LOOPBACK": "LOOPBACK"},
}


@pytest.mark.parametrize("path", sorted(WRITTEN_OUT))
def test_files_outside_the_package_write_out_the_contract(path):
    constants = module_constants(ROOT / path)
    names = WRITTEN_OUT[path]
    assert {own: constants.get(own) for own in names} == {
        own: getattr(contract, theirs) for own, theirs in names.items()
    }


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
    assert files == {(REPOSITORY / "postprocess" / "labels.txt").resolve()}


def test_compose_and_images_use_the_contracts_ports():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    triton_ports = {contract.HTTP_PORT, contract.GRPC_PORT, contract.METRICS_PORT}
    assert {int(p.split()[0]) for p in services["triton"]["expose"]} == triton_ports
    gateway_env = services["gateway"]["environment"]
    assert gateway_env["TRITON_HTTP_PORT"] == str(contract.HTTP_PORT)
    assert gateway_env["TRITON_GRPC_PORT"] == str(contract.GRPC_PORT)
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


def test_the_runtime_opens_the_admin_apis_and_shuts_the_rest(monkeypatch):
    """The embedded runtime's restricted-API flags: the admin APIs behind the admin key, the
    others behind a key drawn at each call; TRITONSTACK_ADMIN_APIS asks for more."""
    from tritonstack.core.errors import UserError
    from tritonstack.launcher.flags import restricted_flags

    monkeypatch.delenv(contract.ADMIN_APIS_ENV, raising=False)
    first, second = restricted_flags("k"), restricted_flags("k")
    admin = f"{contract.ADMIN_APIS}:{contract.ADMIN_HEADER}=k"
    assert first[:2] == [f"--http-restricted-api={admin}", f"--grpc-restricted-protocol={admin}"]
    assert first[2].startswith("--http-restricted-api=shared-memory,trace,logging:")
    assert first[2].rsplit("=", 1)[1] == first[3].rsplit("=", 1)[1] != second[2].rsplit("=", 1)[1]
    monkeypatch.setenv(contract.ADMIN_APIS_ENV, "shared-memory,trace,logging")
    everything = f"{contract.RESTRICTED_APIS}:{contract.ADMIN_HEADER}=k"
    assert restricted_flags("k") == [  # asked for all: none shut
        f"--http-restricted-api={everything}", f"--grpc-restricted-protocol={everything}"
    ]  # fmt: skip
    trace = restricted_flags("k", "trace")  # asked for one: the stack's own stay open
    opened = f"model-repository,statistics,trace:{contract.ADMIN_HEADER}=k"
    assert trace[0] == f"--http-restricted-api={opened}"
    assert trace[2].startswith("--http-restricted-api=shared-memory,logging:")
    with pytest.raises(UserError, match="tracing is not an API Triton restricts"):
        restricted_flags("k", "statistics,tracing")
