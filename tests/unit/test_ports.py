"""Ports for our servers: never ones the kernel hands out, never one another process was given."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tritonstack.core import contract, ports
from tritonstack.core.errors import UserError
from tritonstack.serve import gateway


def test_the_ephemeral_range_read_is_the_one_the_kernel_uses():
    first, last = ports.ephemeral_range()
    sockets = [socket.socket() for _ in range(50)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        assigned = [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
    assert all(first <= port <= last for port in assigned), (first, last, assigned)


def test_ports_handed_out_are_outside_the_ephemeral_range_and_never_twice():
    first, last = ports.ephemeral_range()
    handed = ports.free_ports(40) + ports.free_ports(40)
    assert len(set(handed)) == 80
    assert all(ports.LOWEST <= p < 65536 and not first <= p <= last for p in handed), handed
    for port in handed[:5]:  # and a server can bind them
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
            server.listen()


def test_another_process_is_never_given_a_port_this_one_holds():
    ours = ports.free_ports(5)
    spare = next(p for p in ports.candidates() if p not in ours and ports._bindable(p))
    script = (
        "import json, sys\n"
        "from tritonstack.core import ports\n"
        "ours, spare = json.loads(sys.argv[1])\n"
        "refused = [ports.reserve(p) for p in ours]\n"
        "ports.candidates = lambda: ours + [spare]\n"
        "print(json.dumps([refused, ports.free_ports(1)]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps([ours, spare])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    refused, given = json.loads(result.stdout)
    assert refused == [False] * 5
    assert given == [spare]


def test_the_stacks_default_ports_are_never_handed_out():
    defaults = [value for name, value in vars(contract).items() if name.endswith("_PORT")]
    defaults += [gateway.TRITON_HTTP_PORT, gateway.TRITON_GRPC_PORT]
    assert len(defaults) >= 8 and max(defaults) < ports.LOWEST, defaults


def test_running_out_of_ports_is_one_readable_line(monkeypatch):
    taken = ports.free_ports(2)
    monkeypatch.setattr(ports, "candidates", lambda: taken)
    with pytest.raises(UserError, match=r"only 0 of 1 free loopback ports .* left running"):
        ports.free_ports(1)
