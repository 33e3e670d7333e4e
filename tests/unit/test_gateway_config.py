"""gateway/haproxy.cfg against the values the code and the deployments hold for it.

The config is one file for every runtime; its defaults (written `${VAR-default}`), the native
gateway's environment (tritonstack/gateway.py), compose and Kubernetes must agree, and the stop
bounds must nest: idle connections close before the soft stop's bound, which ends before the
orchestrator's SIGKILL.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.support import ROOT
from tritonstack import gateway

CONFIG = (ROOT / "gateway" / "haproxy.cfg").read_text()


def seconds(text: str) -> float:
    value, unit = re.fullmatch(r"(\d+)(ms|s)?", text).groups()
    return int(value) / (1000 if unit == "ms" else 1)


def setting(name: str) -> str:
    return re.search(rf"^\s+{re.escape(name)}\s+(\S+)\s*$", CONFIG, re.MULTILINE).group(1)


def test_the_configs_defaults_are_the_repositorys_limits() -> None:
    for variable, value in gateway.limits().environment().items():
        if variable == "GATEWAY_MODELS":
            continue  # the default lists them in the regex's own order
        default = re.search(rf'\$\{{{variable}-([^}}"]+)\}}', CONFIG)
        assert default is not None, f"{variable} has no default in haproxy.cfg"
        assert default.group(1) == value, variable


@pytest.mark.parametrize("highest", [1, 7, 9, 10, 64, 99, 100, 128, 1000, 4096])
def test_rows_pattern_matches_exactly_1_to_max_rows(highest: int) -> None:
    pattern = re.compile(f"(?:{gateway.number_range_pattern(highest)})")
    matched = [n for n in range(highest + 300) if pattern.fullmatch(str(n))]
    assert matched == list(range(1, highest + 1))
    assert not pattern.fullmatch("01") and not pattern.fullmatch("-1")


def test_stop_bounds_nest_natively_in_compose_and_in_kubernetes() -> None:
    keep_alive = seconds(setting("timeout http-keep-alive"))
    soft_stop = seconds(setting("hard-stop-after"))
    assert soft_stop == gateway.SOFT_STOP_SECONDS
    assert keep_alive < soft_stop  # idle clients go before the bound
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["gateway"]
    assert seconds(compose["stop_grace_period"]) > soft_stop
    manifests = yaml.safe_load_all((ROOT / "deploy/kubernetes/base/gateway.yaml").read_text())
    deployment = next(m for m in manifests if m["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"][-1]
    drain, waited = (int(n) for n in re.fullmatch(r"sleep (\d+); kill -USR1 1; sleep (\d+)",
                                                  pre_stop).groups())  # fmt: skip
    assert waited >= soft_stop  # the hook outlives HAProxy's own bound: no SIGTERM cuts it
    assert pod["terminationGracePeriodSeconds"] > drain + waited
    assert container["args"][3:4] == list(gateway.HAPROXY_FLAGS)


def test_llm_admission_defaults_are_the_native_gateways() -> None:
    def default(variable: str) -> str:
        return re.search(rf'\$\{{{variable}-([^}}"]+)\}}', CONFIG).group(1)

    assert int(default("GATEWAY_LLM_QUEUE_PER_REPLICA")) == gateway.LLM_QUEUE_PER_REPLICA
    assert seconds(default("GATEWAY_LLM_QUEUE_TIMEOUT")) == gateway.LLM_QUEUE_TIMEOUT_MS / 1000
    lim = gateway.limits()
    assert lim.llm_max_body == lim.llm_max_prompt + gateway.LLM_PARAMETER_BYTES
    assert lim.bufsize > lim.llm_max_body  # a whole generate body fits the buffer it is read in


def test_grpc_name_prefix_is_protobuf_field_one() -> None:
    from tritonclient.grpc import service_pb2

    for name in ("llm", "a" * 127):
        message = service_pb2.ModelReadyRequest(name=name, version="1").SerializeToString()
        assert message.hex().upper().startswith(gateway.grpc_name_prefix(name))
    assert not bytes.fromhex(gateway.grpc_name_prefix("llm2")).startswith(
        bytes.fromhex(gateway.grpc_name_prefix("llm"))
    )


def test_the_docs_state_the_stop_bound_the_gateway_has() -> None:
    stated = [
        (path.name, int(number))
        for path in sorted((ROOT / "docs").glob("*.md"))
        for number in re.findall(r"`hard-stop-after`,? \(?(\d+) s", path.read_text())
    ]
    assert stated, "no doc states hard-stop-after"
    assert all(number == gateway.SOFT_STOP_SECONDS for _, number in stated), stated
