"""Keep the embedded Triton serving: watch the stubs, probe deeply, restart what is dead.

Why not `/v2/health/ready`: when a Python stub dies (OOM killer, a segfault in a native library,
kill -9), Triton 2.51 keeps reporting the server *and the model* ready while every request that
reaches that instance fails with "Stub process '<instance>' is not healthy", and since r24.06 the
stub is not restarted. With two instances per model the other instance keeps answering, so a
probe that happens to reach only the live one passes: a probe alone detects a dead stub by luck.

So each check, every `interval` seconds, looks in order at:
1. tritonserver itself: exited means dead;
2. the stubs recorded when the server became ready (`EmbeddedTriton.dead_stubs`): one that
   exited is dead, whichever instance requests happen to reach;
3. real inferences of every public model it serves, built from each model's metadata
   (tritonstack.core.health, the container's healthcheck), and a one-token generation from `llm`
   when it is served (its engine runs in processes of its own), for what processes cannot show:
   wrong or missing answers, a hung server. A failure's reason is classified (`classify_failure`):
   Triton's "Stub process ... is not healthy" is dead; a 503 (a queue policy's full queue or
   timeout, if a user adds one; the committed models have none) or a slow answer means the
   server is alive and shedding load, which a restart would only make worse, so it is not a
   failure; anything else counts, and `failures_to_restart` consecutive ones restart the server.
Dead restarts the server at once, which restarts every stub.
"""

from __future__ import annotations

import enum
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from tritonstack.core import health
from tritonstack.core.contract import LLM_MODEL
from tritonstack.core.errors import UserError
from tritonstack.serve.runtime import EmbeddedTriton


class Failure(enum.Enum):
    """What a failed check means for the server."""

    DEAD = "dead"  # certain: the server or one of its stubs is gone; restart now
    BUSY = "busy"  # the server answered 503: alive and shedding load; not a failure
    BROKEN = "broken"  # a wrong answer, an error or no answer; restart if it persists


#: Triton's words for a request handed to an instance whose stub has exited (Python backend).
DEAD_STUB = re.compile(r"Stub process '[^']*' is not healthy")
#: Triton's answers when a model's queue is full or a request waited out its queue timeout.
BUSY_ANSWERS = ("[503]", "Exceeds maximum queue size", "Request timeout expired")


def classify_failure(reason: str) -> Failure:
    """What a deep probe's failure reason says about the server."""
    if DEAD_STUB.search(reason):
        return Failure.DEAD
    if any(answer in reason for answer in BUSY_ANSWERS):
        return Failure.BUSY
    return Failure.BROKEN


def llm_probe(http_url: str, timeout: float = 10.0) -> str | None:
    """A one-token greedy generation from `llm`; None when it answered text, else the reason.

    The engine runs in vLLM's own processes, under the model's stub: when they die the stub
    lives on and answers every request with an error, which only a real request shows.
    """
    import http.client
    import json

    host, port = http_url.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    body = {"text_input": "ok", "max_tokens": 1, "temperature": 0}
    try:
        connection.request("POST", f"/v2/models/{LLM_MODEL}/generate", json.dumps(body))
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200:
            return (
                f"{LLM_MODEL} answered [{response.status}] {answer[:300].decode(errors='replace')}"
            )
        if "text_output" not in json.loads(answer):
            return f"{LLM_MODEL} answered without text_output"
        return None
    except (OSError, ValueError) as exc:
        return f"{LLM_MODEL}: {exc}"
    finally:
        connection.close()


def probed_models(served: list[str]) -> tuple[str, ...]:
    """The public models (stack.env) a server serves; a repository with none of them (`serve
    --model-repository`) has every model it serves probed, the LLM aside (probed on its own)."""
    from tritonstack.core.settings import load

    public = [m for m in load().public_models if m in served]
    return tuple(public or [m for m in served if m != LLM_MODEL])


@dataclass
class Streak:
    """Consecutive failed checks, and whether they call for a restart."""

    needed: int
    count: int = 0
    started: float = 0.0

    def record(self, kind: Failure | None) -> bool:
        """Count one check (None: healthy); True when the server must be restarted now."""
        if kind is None or kind is Failure.BUSY:
            self.count = 0  # an answer, even a 503, shows the server is alive
            return False
        self.count += 1
        if self.count == 1:
            self.started = time.monotonic()
        return kind is Failure.DEAD or self.count >= self.needed


@dataclass
class Restart:
    """One recovery, with the numbers the reliability docs report."""

    reason: str
    first_failure: float
    detected: float
    recovered: float

    @property
    def detect_seconds(self) -> float:
        return self.detected - self.first_failure

    @property
    def recover_seconds(self) -> float:
        return self.recovered - self.detected


@dataclass
class Supervisor:
    server: EmbeddedTriton
    #: The models the deep probe calls; default: the public ones the server loaded (one that
    #: failed to load is reported at start, and restarting would not load it).
    models: tuple[str, ...] = ()
    interval: float = 1.0
    failures_to_restart: int = 2
    probe_timeout: float = 2.0
    #: A one-token generation waits for vLLM's next step, which a CPU engine under load takes
    #: seconds to reach; a hung engine still fails it.
    llm_probe_timeout: float = 10.0
    start_timeout: float = 180.0
    stop_grace: float = 3.0
    log: Callable[[str], None] = print
    restarts: list[Restart] = field(default_factory=list)
    failed: str | None = None
    #: The probe's requests, built once from each model's metadata.
    requests: dict = field(default_factory=dict, init=False)
    #: Whether a restart is under way (it finishes before a stop: see join).
    restarting: bool = field(default=False, init=False)
    #: How long a stop waits for a check under way: its probes' deadline and the LLM's, with
    #: margin. A check that outlives it is left behind (said, with where it was), so a signal
    #: always stops the server.
    check_seconds: float = 20.0

    def check(self) -> tuple[Failure, str] | None:
        """One look at the server: None when healthy, else what failed and why."""
        process = self.server.process
        if process is not None and process.poll() is not None:
            return Failure.DEAD, f"tritonserver exited with code {process.returncode}"
        dead = self.server.dead_stubs()
        if dead:
            return Failure.DEAD, f"Python stub exited: {', '.join(dead)}"
        _, busy, dead, _ = health.probe_models(
            self.server.http_url,
            self.models or probed_models(self.server.loaded),
            deadline_s=self.probe_timeout * 2,
            timeout_s=self.probe_timeout,
            requests=self.requests,
        )
        if dead:
            return classify_failure(dead[0]), dead[0]
        if busy:
            return Failure.BUSY, busy[0]
        reason = None
        if LLM_MODEL in self.server.loaded:
            reason = llm_probe(self.server.http_url, self.llm_probe_timeout)
        return None if reason is None else (classify_failure(reason), reason)

    def watch(self, stop: threading.Event) -> None:
        """Check every `interval` seconds until `stop` is set; restart what is dead or broken."""
        streak = Streak(self.failures_to_restart)
        busy = False
        while not stop.wait(self.interval):
            found = self.check()
            kind, reason = found if found is not None else (None, "")
            restart = streak.record(kind)
            if kind is Failure.BUSY and not busy:  # once per busy spell, not every second
                self.log(f"deep probe: busy, not counted as a failure: {reason}")
            busy = kind is Failure.BUSY
            if kind is Failure.DEAD:
                self.log(f"dead: {reason}")
            elif kind is Failure.BROKEN:
                self.log(f"deep probe failed ({streak.count}/{streak.needed}): {reason}")
            if not restart:
                continue
            if stop.is_set():
                return
            try:
                self._restart(reason, streak.started, streak.count)
            except UserError as exc:
                self.failed = f"restart failed: {exc}"
                self.log(self.failed)
                stop.set()
                return
            streak.count = 0

    def join(self, watcher: threading.Thread) -> None:
        """After `stop` is set: wait for the watch thread, for a restart under way as long as it
        takes, for a check at most check_seconds."""
        watcher.join(self.check_seconds)
        while watcher.is_alive() and self.restarting:
            watcher.join(1.0)
        if watcher.is_alive():
            frame = sys._current_frames().get(watcher.ident)
            where = "".join(traceback.format_stack(frame)[-3:]) if frame else "unknown\n"
            self.log(
                f"supervisor: its check did not end within {self.check_seconds:g} s of the "
                f"stop; stopping without it. It was at:\n{where.rstrip()}"
            )

    def _restart(self, reason: str, first_failure: float, failed_checks: int = 1) -> None:
        self.restarting = True
        try:
            self._stop_and_start(reason, first_failure, failed_checks)
        finally:
            self.restarting = False

    def _stop_and_start(self, reason: str, first_failure: float, failed_checks: int) -> None:
        detected = time.monotonic()
        self.log("restarting Triton")
        self.server.stop(grace=self.stop_grace)
        self.server.start(timeout=self.start_timeout)
        restart = Restart(reason, first_failure, detected, time.monotonic())
        self.restarts.append(restart)
        # A dead server or stub is found by the first check that looks at it; only a streak of
        # failed checks has a detection time worth reporting.
        streak = (
            f"{failed_checks} failed checks over {restart.detect_seconds:.1f} s, "
            if failed_checks > 1
            else ""
        )
        self.log(f"recovered: {streak}serving again {restart.recover_seconds:.1f} s later")
