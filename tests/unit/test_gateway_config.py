"""gateway/haproxy.cfg against the values the code and the deployments hold for it.

The config is one file for every runtime: the values stack.env and tritonstack.core.limits give it
have no second copy in it, the native gateway's environment parses with it, and the stop bounds
must nest: idle connections close before the soft stop's bound, which ends before the
orchestrator's SIGKILL.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import yaml

from tests.support import ROOT
from tritonstack.core import limits, settings
from tritonstack.core.errors import UserError
from tritonstack.serve import gateway

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
    # The committed models' full batches, as JSON and as binary tensors, are checked whole.
    largest = max(m.grpc_body for m in lim.models)
    assert lim.bufsize > max(lim.llm_max_body, largest, lim.max_binary_body)


def test_a_model_with_large_inputs_changes_neither_the_buffer_nor_the_connections() -> None:
    """3 MB requests no longer raise every connection's buffer: the buffer and the connections
    the budget allows stay the committed models' own; the large model takes JSON up to what the
    buffer holds (binary tensors beyond, streamed) and binary tensors up to its full batch."""
    committed = limits.limits()
    large = limits.ModelLimits("images", max_values=4 * 3 * 224 * 224, max_bytes=4 * 602112,
                               inputs=1)  # fmt: skip
    grown = limits.Limits((*committed.models, large), committed.settings)
    assert grown.bufsize == committed.bufsize == limits.BUFSIZE
    assert grown.http_connections == committed.http_connections
    assert grown.grpc_connections == committed.grpc_connections
    _, json_body, binary_body = large.map_line().split()[1].split(":")[:3]
    assert int(json_body) == limits.BUFFERED_BODY < large.json_body
    assert int(binary_body) == large.binary_body > limits.BUFFERED_BODY


def test_dims_inputs_share_reach_the_gateway_as_hex_names_and_lua_axes() -> None:
    """The map entry's 7th field: the dims a request's inputs must agree in, each
    `<name in hex>.<axis>` counted from 1 as Lua indexes the request's shape."""
    encoder = limits.ModelLimits(
        "encoder", max_values=256, max_bytes=2048, inputs=2,
        max_shapes=(("ids", (4, 64)), ("attention_mask", (4, 64))),
        shared=((("ids", 1), ("attention_mask", 1)),),
    )  # fmt: skip
    fields = encoder.map_line().split()[1].split(":")
    assert fields[3] == "696473=4x64;617474656E74696F6E5F6D61736B=4x64"
    assert fields[6] == "696473.2,617474656E74696F6E5F6D61736B.2"
    assert limits.ModelLimits("plain", 1, 4, 1).map_line().endswith(":")


@pytest.mark.parametrize("budget_mb", [64, 1024, 4096])
def test_every_connection_busy_at_once_fits_the_memory_budget(budget_mb: int) -> None:
    """What the budget allows: all the connections the listeners accept, each at its worst
    (HTTP/1: two buffers; HTTP/2: two per stream and the multiplexer's), within the budget, and
    not far under it (the figure the docs state is this one)."""
    committed = limits.limits()
    budget = budget_mb * 2**20
    chosen = limits.Limits(
        committed.models, dataclasses.replace(committed.settings, GATEWAY_MEMORY_MB=budget_mb)
    )
    assert chosen.worst_case_bytes <= budget
    http_each = 2 * chosen.bufsize + limits.CONNECTION_OVERHEAD
    grpc_each = (2 * limits.H2_STREAMS + 2) * chosen.bufsize + limits.CONNECTION_OVERHEAD
    assert budget - chosen.worst_case_bytes < http_each + grpc_each
    environment = chosen.environment()
    assert int(environment["GATEWAY_MAX_CONNECTIONS"]) == (
        chosen.http_connections + chosen.grpc_connections + limits.METRICS_CONNECTIONS
    )
    for name in ("GATEWAY_HTTP_CONNECTIONS", "GATEWAY_GRPC_CONNECTIONS", "GATEWAY_H2_STREAMS",
                 "GATEWAY_MAX_CONNECTIONS", "GATEWAY_BUFFERED_BODY"):  # fmt: skip
        assert f'"${{{name}}}"' in CONFIG, name


def test_a_budget_too_small_for_one_connection_is_refused_with_the_fix() -> None:
    committed = limits.limits()
    tiny = limits.Limits(
        committed.models, dataclasses.replace(committed.settings, GATEWAY_MEMORY_MB=1)
    )
    with pytest.raises(UserError, match="GATEWAY_MEMORY_MB=1 leaves no connection"):
        tiny.environment()


def test_the_docs_state_the_stop_bound_the_gateway_has() -> None:
    stated = [
        (path.name, int(number))
        for path in sorted((ROOT / "docs").glob("*.md"))
        for number in re.findall(r"`hard-stop-after`,? \(?(\d+) s", path.read_text())
    ]
    assert stated, "no doc states hard-stop-after"
    assert all(number == gateway.SOFT_STOP_SECONDS for _, number in stated), stated


def test_the_docs_state_the_committed_connections_and_worst_case() -> None:
    lim = limits.limits()
    text = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    stated = (
        f"that is {lim.http_connections} HTTP and {lim.grpc_connections} gRPC connections"
        f" (`gateway/limits.env`, generated), {lim.worst_case_bytes / 2**20:,.0f} MiB at worst"
    )
    assert stated in text
    assert f"`GATEWAY_MEMORY_MB` in `stack.env` ({lim.settings.GATEWAY_MEMORY_MB})" in text
