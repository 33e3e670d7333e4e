"""Keep the embedded Triton serving: a deep health probe, and a restart when it fails.

Why not `/v2/health/ready`: when a Python stub dies (OOM killer, a segfault in a native library,
kill -9), Triton 2.51 keeps reporting the server *and the model* ready while every request
through that model fails with "Stub process ... is not healthy", and since r24.06 the stub is
not restarted. Only a real inference through the whole `pipeline` (classifier + postprocess)
notices. After `failures_to_restart` consecutive failed probes, or as soon as tritonserver
itself exits, the supervisor restarts the server, which restarts every stub.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tritonstack.errors import UserError
from tritonstack.runtime import EmbeddedTriton

PROBE_MODEL = "pipeline"


def deep_probe(
    http_url: str, timeout: float = 2.0, model: str = PROBE_MODEL, repeat: int = 4
) -> str | None:
    """Run `repeat` real 1-row inferences; None when all answered a label, else the reason.

    Several requests, because the models run two instances each: with one instance's stub dead,
    Triton hands requests to the instances in turn and only every other one fails.
    """
    import tritonclient.http as httpclient

    try:
        client = httpclient.InferenceServerClient(
            http_url, connection_timeout=timeout, network_timeout=timeout
        )
    except Exception as exc:
        return f"cannot connect: {exc}"
    try:
        tensor = httpclient.InferInput("features", [1, 128], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 128), np.float32))
        for _ in range(repeat):
            result = client.infer(
                model, [tensor], outputs=[httpclient.InferRequestedOutput("label")]
            )
            label = result.as_numpy("label")
            if label is None or label.shape != (1, 1):
                return f"{model} answered without a [1, 1] label"
        return None
    except Exception as exc:
        return " ".join(str(exc).split())[:300]
    finally:
        client.close()


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
    interval: float = 1.0
    failures_to_restart: int = 2
    probe_timeout: float = 2.0
    start_timeout: float = 180.0
    stop_grace: float = 3.0
    log: Callable[[str], None] = print
    restarts: list[Restart] = field(default_factory=list)
    failed: str | None = None

    def watch(self, stop: threading.Event) -> None:
        """Probe every `interval` seconds until `stop` is set; restart on failure."""
        failures = 0
        first_failure = 0.0
        while not stop.wait(self.interval):
            exited = self.server.process is not None and self.server.process.poll() is not None
            if exited:
                reason = f"tritonserver exited with code {self.server.process.returncode}"
            else:
                reason = deep_probe(self.server.http_url, self.probe_timeout)
            if reason is None:
                failures = 0
                continue
            failures += 1
            if failures == 1:
                first_failure = time.monotonic()
            self.log(f"deep probe failed ({failures}/{self.failures_to_restart}): {reason}")
            if exited or failures >= self.failures_to_restart:
                if stop.is_set():
                    return
                try:
                    self._restart(reason, first_failure)
                except UserError as exc:
                    self.failed = f"restart failed: {exc}"
                    self.log(self.failed)
                    stop.set()
                    return
                failures = 0

    def _restart(self, reason: str, first_failure: float) -> None:
        detected = time.monotonic()
        self.log("restarting Triton")
        self.server.stop(grace=self.stop_grace)
        self.server.start(timeout=self.start_timeout)
        restart = Restart(reason, first_failure, detected, time.monotonic())
        self.restarts.append(restart)
        self.log(
            f"recovered: detected in {restart.detect_seconds:.1f} s, "
            f"serving again {restart.recover_seconds:.1f} s later"
        )
