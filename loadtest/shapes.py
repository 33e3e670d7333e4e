"""Load shapes by name: how many users run at each moment of a test.

Each shape is a pure function of the elapsed time, the peak user count (`--users`), the spawn rate
(`--spawn-rate`) and the test length (`--run-time`, or the shape's own default when unset), and
returns the users and spawn rate to run now, or None when the test is over. locustfile.py's
`SelectedShape` calls the one named by `--shape`; with no shape, a test is Locust's usual constant
load (`constant`).

- `step`: the users in STEPS equal steps, each held for a quarter of the test: average batch size
  and latency grow with concurrency, and the step where latency bends is the capacity.
- `spike`: a quarter of the users, then all of them at once (spawned within a second) for the
  middle fifth of the test, then back: more requests arrive than Triton drains, which is what
  the gateway's admission control (a bounded wait, then 503 with Retry-After) is for.
- `soak`: all users, held for long (30 minutes unless `--run-time` says otherwise): memory growth,
  slow leaks, and latency drift show up only over time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

Stage = tuple[int, float]
Shape = Callable[[float, int, float, float | None], Stage | None]

STEPS = 4
STEP_SECONDS = 60.0  # per step when no --run-time is given
SPIKE_DEFAULT_SECONDS = 150.0
SOAK_DEFAULT_SECONDS = 30 * 60.0


def constant(elapsed: float, users: int, spawn_rate: float, run_time: float | None) -> Stage | None:
    """All users from the start, until --run-time (forever without it)."""
    if run_time and elapsed >= run_time:
        return None
    return users, spawn_rate


def step(elapsed: float, users: int, spawn_rate: float, run_time: float | None) -> Stage | None:
    """users/STEPS more users every run_time/STEPS seconds."""
    length = (run_time / STEPS) if run_time else STEP_SECONDS
    index = int(elapsed // length)
    if index >= STEPS:
        return None
    return max(1, math.ceil(users * (index + 1) / STEPS)), spawn_rate


def spike(elapsed: float, users: int, spawn_rate: float, run_time: float | None) -> Stage | None:
    """Baseline of users/4, a burst to all users over [0.4, 0.6) of the test, baseline again."""
    length = run_time or SPIKE_DEFAULT_SECONDS
    if elapsed >= length:
        return None
    baseline = max(1, users // 4)
    if 0.4 * length <= elapsed < 0.6 * length:
        return users, float(max(users, spawn_rate))  # the whole burst within a second
    return baseline, float(max(users, spawn_rate))  # and gone as fast


def soak(elapsed: float, users: int, spawn_rate: float, run_time: float | None) -> Stage | None:
    """All users, ramped at the spawn rate, held for --run-time or 30 minutes."""
    return constant(elapsed, users, spawn_rate, run_time or SOAK_DEFAULT_SECONDS)


#: `--shape` values; "" is Locust's usual behaviour.
SHAPES: dict[str, Shape] = {"": constant, "step": step, "spike": spike, "soak": soak}
