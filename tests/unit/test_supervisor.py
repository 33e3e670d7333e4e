"""The supervisor's decisions, without a server: what a failure means, when to restart, and how
a dead stub process is recognised. test_reliability.py runs them against the real server."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tests.support import REPOSITORY
from tritonstack.serve.runtime import EmbeddedTriton
from tritonstack.serve.supervisor import Failure, Streak, classify_failure

# Failure reasons as deep_probe reports them: tritonclient's "[status] message", or its own text.
REASONS = [
    # Triton 2.51, a request handed to an instance whose stub was killed
    ("[500] in ensemble 'pipeline', Stub process 'postprocess_0_1' is not healthy.", Failure.DEAD),
    ("[500] Stub process 'classifier_0_0' is not healthy.", Failure.DEAD),
    # a full queue and a queue timeout: the server answered, so it is alive
    ("[503] in ensemble 'pipeline', Exceeds maximum queue size", Failure.BUSY),
    ("[503] Request timeout expired", Failure.BUSY),
    # no answer, a wrong answer, an error: worth a restart only when it persists
    ("timed out", Failure.BROKEN),
    ("cannot connect: [Errno 111] Connection refused", Failure.BROKEN),
    ("pipeline answered without a [1, 1] label", Failure.BROKEN),
    ("[400] in ensemble 'pipeline', unexpected shape for input 'features'", Failure.BROKEN),
    ("[500] in ensemble 'pipeline', Failed to process the request(s) for model", Failure.BROKEN),
]


@pytest.mark.parametrize(("reason", "kind"), REASONS, ids=[k.value for _, k in REASONS])
def test_failure_reasons_are_classified(reason, kind):
    assert classify_failure(reason) is kind


def run(streak: Streak, kinds: list[Failure | None]) -> list[bool]:
    return [streak.record(kind) for kind in kinds]


def test_dead_restarts_at_the_first_check():
    assert run(Streak(needed=2), [Failure.DEAD]) == [True]
    assert run(Streak(needed=5), [None, Failure.DEAD]) == [False, True]


def test_broken_restarts_only_when_consecutive():
    assert run(Streak(needed=2), [Failure.BROKEN, Failure.BROKEN]) == [False, True]
    # a healthy answer, or a 503 (alive, shedding load), in between starts the count again
    kinds = [Failure.BROKEN, None, Failure.BROKEN, Failure.BUSY, Failure.BROKEN, Failure.BROKEN]
    assert run(Streak(needed=2), kinds) == [False, False, False, False, False, True]


def test_busy_never_restarts():
    assert not any(run(Streak(needed=2), [Failure.BUSY] * 20))


def test_detection_is_timed_from_the_first_failure_of_a_streak():
    streak = Streak(needed=3)
    streak.record(Failure.BROKEN)
    first = streak.started
    streak.record(Failure.BROKEN)
    assert streak.started == first and streak.count == 2


def test_exited_and_zombie_stubs_are_dead(monkeypatch):
    """Real child processes stand in for stubs: a stub killed under tritonserver stays a zombie
    until the server reaps it, so a zombie counts as dead, as does one already reaped."""
    monkeypatch.setenv("TRITONSTACK_ADMIN_KEY", "unit-test")
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)
    ]
    try:
        server = EmbeddedTriton(REPOSITORY)
        server.stubs = {f"postprocess_0_{i}": psutil.Process(p.pid) for i, p in enumerate(sleepers)}
        assert server.dead_stubs() == []
        sleepers[1].kill()  # not waited for: a zombie, as under tritonserver
        deadline = time.monotonic() + 10
        while server.stubs["postprocess_0_1"].status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the killed process never became a zombie"
            time.sleep(0.05)
        assert server.dead_stubs() == ["postprocess_0_1"]
        sleepers[2].kill()
        sleepers[2].wait(10)  # reaped: the process is gone altogether
        assert server.dead_stubs() == ["postprocess_0_1", "postprocess_0_2"]
    finally:
        for process in sleepers:
            process.kill()
            process.wait(10)


def test_a_stop_leaves_a_stuck_check_behind_and_says_where_it_was():
    """A signal always stops `serve`: a check that outlives check_seconds is left behind (named,
    with its stack), while a restart under way is waited for."""
    import threading

    from tritonstack.serve.supervisor import Supervisor

    lines: list[str] = []
    supervisor = Supervisor(server=None, log=lines.append, check_seconds=0.2)
    release = threading.Event()

    def stuck_in_a_check() -> None:
        release.wait(30)

    watcher = threading.Thread(target=stuck_in_a_check, daemon=True)
    watcher.start()
    started = time.monotonic()
    supervisor.join(watcher)
    assert time.monotonic() - started < 5
    assert lines[0].startswith("supervisor: its check did not end within 0.2 s of the stop")
    assert "stuck_in_a_check" in lines[0] and "release.wait(30)" in lines[0]
    release.set()
    watcher.join(5)

    supervisor.restarting = True  # a restart under way: waited for, however long
    lines.clear()
    done = threading.Event()
    restart = threading.Thread(target=lambda: done.wait(30), daemon=True)
    restart.start()
    threading.Timer(1.0, lambda: (setattr(supervisor, "restarting", False), done.set())).start()
    started = time.monotonic()
    supervisor.join(restart)
    assert time.monotonic() - started >= 0.9 and not restart.is_alive() and lines == []
