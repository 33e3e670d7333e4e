"""The docs' commands that need a server, run as shown against the session's real Triton
and gateway (tests/unit/test_docs.py classifies every command and runs the others)."""

from __future__ import annotations

import pytest

from tests.unit.test_docs import (
    RUN_HERE,
    SHOWN,
    check_output,
    run_shell,
)

GATEWAY_COMMANDS = sorted(c for c, how in RUN_HERE.items() if how == "gateway")


@pytest.mark.parametrize("command", GATEWAY_COMMANDS)
def test_command_runs_as_shown_against_a_server(command, gateway):
    ports = {
        "127.0.0.1:8000": f"127.0.0.1:{gateway.http_port}",
        "127.0.0.1:8001": f"127.0.0.1:{gateway.grpc_port}",
    }
    rewritten = command
    for default, actual in ports.items():
        rewritten = rewritten.replace(default, actual)
    if rewritten.startswith("tritonstack infer") and "--url" not in rewritten:
        grpc = "--protocol grpc" in rewritten
        rewritten += f" --url {ports['127.0.0.1:8001' if grpc else '127.0.0.1:8000']}"
    check_output([s for s in SHOWN if s.command == command], run_shell(rewritten))
