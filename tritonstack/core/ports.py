"""Loopback ports for servers that this process starts on ports of its choosing.

A port the kernel hands out (bind to port 0) is free only until the next program asks it for
one. That is too short here: Triton binds its HTTP, gRPC and metrics ports only after loading its
models, and a restart releases them for that whole time, while vLLM's engine, loading in the same
window, binds a dozen ports of its own the same way. Ports are therefore taken from outside the
kernel's ephemeral range, where neither bind(0) nor connect() ever puts anything, and reserved in a
lock file shared by every process of this user, so that two processes (two test runs, a benchmark
beside the tests) never choose the same one. A reservation lasts as long as the process that made
it; none is handed out twice within a process.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

from tritonstack.core.contract import LOOPBACK
from tritonstack.core.errors import UserError

#: Ports below this are left to services with well-known ports, the stack's own defaults among
#: them (a test keeps those below it).
LOWEST = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default ephemeral range, used where the kernel does not say.
DEFAULT_EPHEMERAL = (32768, 60999)

_handed_out: set[int] = set()
_lock_fd: int | None = None


def ephemeral_range() -> tuple[int, int]:
    """The ports (first, last) the kernel picks from for bind(0) and connect()."""
    try:
        first, last = (int(word) for word in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return first, last


def candidates() -> list[int]:
    """Every port free_ports may choose: from LOWEST up, minus the ephemeral range."""
    first, last = ephemeral_range()
    return [port for port in range(LOWEST, 65536) if not first <= port <= last]


def lock_file() -> Path:
    return Path(tempfile.gettempdir()) / f"tritonstack-ports-{os.getuid()}.lock"


def reserve(port: int) -> bool:
    """Claim `port` for this process unless another process of this user holds it.

    The claim is a POSIX lock on the lock file's byte number `port`: the kernel drops it when the
    process ends, however it ends, so a crashed run leaves nothing to clean up.
    """
    global _lock_fd
    if _lock_fd is None:
        # Kept open for the process's life: closing any descriptor of a file drops every POSIX
        # lock the process holds on it.
        _lock_fd = os.open(lock_file(), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.lockf(_lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
    except OSError:
        return False
    return True


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` loopback ports that nothing listens on, that the kernel will not hand to another
    program, and that no other process of this user has been given."""
    pool = candidates()
    ports: list[int] = []
    for port in random.sample(pool, len(pool)):
        if len(ports) == count:
            break
        if port in _handed_out or not _bindable(port) or not reserve(port):
            continue
        _handed_out.add(port)
        ports.append(port)
    if len(ports) < count:
        raise UserError(
            f"only {len(ports)} of {count} free loopback ports found from {LOWEST} up outside the "
            "kernel's ephemeral range; stop the servers left running on them"
        )
    return ports
