"""gateway/haproxy.cfg against the values the code and the deployments hold for it.

The config is one file for every runtime: the values stack.env and tritonstack.limits give it
have no second copy in it, the native gateway's environment parses with it, and the stop bounds
must nest: idle connections close before the soft stop's bound, which ends before the
orchestrator's SIGKILL.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.support import ROOT
from tritonstack import gateway, limits, settings

CONFIG = (ROOT / "gateway" / "haproxy.cfg").read_text()


def seconds(text: str) -> float:
    value, unit = re.fullmatch(r"(\d+)(ms|s)?", text).groups()
    return int(value) / (1000 if unit == "ms" else 1)


def setting(name: str) -> str:
    return re.search(rf"^\s+{re.escape(name)}\s+(\S+)\s*$", CONFIG, re.MULTILINE).group(1)


def test_what_stack_env_and_the_limits_say_has_no_default_in_the_config() -> None:
    """One source per fact: a default here would be a second copy of stack.env or limits.env."""
    derived = limits.limits().environment()
    for variable in [*settings.load().environment(), *derived]:
        assert not re.search(rf"\$\{{{variable}-", CONFIG), f"{variable} has a default"
    used = set(re.findall(r"\$\{(GATEWAY_\w+)\}", CONFIG))
    assert set(derived) <= used  # every derived value is read
    assert "GATEWAY_MAXCONN" in used and "GATEWAY_LLM_STREAMS" in used


@pytest.mark.parametrize("highest", [1, 7, 9, 10, 64, 99, 100, 128, 1000, 4096])
def test_number_range_pattern_matches_exactly_1_to_highest(highest: int) -> None:
    pattern = re.compile(f"(?:{limits.number_range_pattern(highest)})")
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


def test_an_llm_body_fits_the_buffer_it_is_read_in() -> None:
    lim = limits.limits()
    assert lim.llm_max_body == lim.settings.GATEWAY_LLM_MAX_PROMPT + limits.LLM_PARAMETER_BYTES
    assert lim.bufsize > max(lim.llm_max_body, lim.max_body, lim.max_binary_body)


def test_grpc_name_prefix_is_protobuf_field_one() -> None:
    from tritonclient.grpc import service_pb2

    for name in ("llm", "a" * 127):
        message = service_pb2.ModelReadyRequest(name=name, version="1").SerializeToString()
        assert message.hex().upper().startswith(limits.grpc_name_prefix(name))
    assert not bytes.fromhex(limits.grpc_name_prefix("llm2")).startswith(
        bytes.fromhex(limits.grpc_name_prefix("llm"))
    )


def test_the_docs_state_the_stop_bound_the_gateway_has() -> None:
    stated = [
        (path.name, int(number))
        for path in sorted((ROOT / "docs").glob("*.md"))
        for number in re.findall(r"`hard-stop-after`,? \(?(\d+) s", path.read_text())
    ]
    assert stated, "no doc states hard-stop-after"
    assert all(number == gateway.SOFT_STOP_SECONDS for _, number in stated), stated
