"""Process groups: what every server tritonstack starts relies on to leave nothing behind."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from tritonstack.core.errors import UserError
from tritonstack.serve import processes

#: A leader that starts a child which ignores SIGTERM, prints the child's pid, then waits.
#: `trap '' TERM` makes the leader ignore SIGTERM as well unless `leader` resets it; the pid is
#: written after `leader` ran, so a test that signals once it reads the pid meets the new trap.
FAMILY = """
trap '' TERM
sleep 300 &
{leader}
echo $! > {pidfile}
wait
"""


def family(tmp_path, leader: str = "") -> tuple:
    pidfile = tmp_path / "child.pid"
    script = FAMILY.format(pidfile=pidfile, leader=leader)
    process = processes.spawn(["bash", "-c", script], tmp_path / "family.log")
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.02)
    return process, psutil.Process(int(pidfile.read_text()))


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_spawn_puts_the_child_in_its_own_group(tmp_path):
    process, child = family(tmp_path)
    try:
        assert os.getpgid(process.pid) == process.pid != os.getpgid(0)
        assert os.getpgid(child.pid) == process.pid
    finally:
        processes.stop(process, 0)


def test_stop_kills_a_group_that_ignores_sigterm_after_the_grace(tmp_path):
    process, child = family(tmp_path)
    started = time.monotonic()
    code = processes.stop(process, grace=0.5)
    assert code == -signal.SIGKILL
    assert time.monotonic() - started >= 0.5
    deadline = time.monotonic() + 5
    while not gone(child):
        assert time.monotonic() < deadline, "the group's other member survived"
        time.sleep(0.05)


def test_stop_leader_only_lets_the_leader_exit_then_reaps_the_group(tmp_path):
    # The leader exits on SIGTERM (as tritonserver drains and exits); its child ignores SIGTERM
    # and would outlive it: the group is SIGKILLed after the leader's exit.
    process, child = family(tmp_path, leader="trap 'exit 3' TERM")
    assert processes.stop(process, grace=10, whole_group=False) == 3
    deadline = time.monotonic() + 5
    while not gone(child):
        assert time.monotonic() < deadline, "the stray group member survived"
        time.sleep(0.05)


def test_wait_ready_names_a_process_that_exits(tmp_path):
    process = processes.spawn([sys.executable, "-c", "raise SystemExit(7)"])
    with pytest.raises(UserError, match=r"^demo exited with code 7 while starting: see log$"):
        processes.wait_ready(
            process, lambda: False, 10, "demo", lambda: "x", details=lambda: ": see log"
        )


def test_wait_ready_gives_up_after_the_timeout(tmp_path):
    process, _child = family(tmp_path)
    try:
        with pytest.raises(UserError, match=r"^demo: port 1 not ready after 0 s$"):
            processes.wait_ready(process, lambda: False, 0.2, "demo", lambda: "port 1")
        calls = iter([False, False, True])
        processes.wait_ready(process, lambda: next(calls), 10, "demo", str, interval=0.01)
    finally:
        processes.stop(process, 0)


def test_tree_memory_counts_the_children(tmp_path):
    process, child = family(tmp_path)
    try:
        members = processes.tree(process.pid)
        assert {process.pid, child.pid} <= {p.pid for p in members}
        assert processes.rss_bytes(members) > processes.rss_bytes([psutil.Process(process.pid)])
    finally:
        processes.stop(process, 0)
    assert processes.tree(process.pid) == []


def test_http_ok_is_false_for_a_closed_port():
    from tritonstack.core.ports import free_ports

    (port,) = free_ports(1)
    assert processes.http_ok(f"http://127.0.0.1:{port}/", timeout=1) is False
