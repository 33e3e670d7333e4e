#!/usr/bin/env python3
"""Replay Locust's `step` and `spike` shapes against the HPA of deploy/kubernetes, on paper.

An investigation tool for docs/scaling.md, not part of the installed package. It builds a model
of one Triton replica from the benchmark's measured concurrency sweep (docs/benchmarks/
results.json: `pipeline` over HTTP/JSON at 1-64 requests in flight), puts the gateway's
admission control (tritonstack/serve/gateway.py's limits, which the Kubernetes gateway gets) in
front of N such replicas, and runs the HorizontalPodAutoscaler algorithm as the Kubernetes
documentation and the controller's replica calculator describe it: the ratio of the pods'
average metric to the target, a 0.1 tolerance, pods without a metric yet counted as 0 when
scaling up, the stabilisation windows and the scale policies of deploy/kubernetes/base/hpa.yaml
(read from that file). The metric is the one the HPA is given: queue time per request, as
Prometheus' 1-minute rate of Triton's counters.

    python deploy/kubernetes/simulate.py            # rewrites docs/scaling/ and prints tables
    python deploy/kubernetes/simulate.py --out DIR  # writes elsewhere (the test compares)

Assumptions, each a parameter below and each listed in docs/scaling.md as something to measure
on a real cluster: closed-loop users (Locust's, no think time) spread evenly over ready pods by
leastconn; a new pod serves after STARTUP_SECONDS; a refused client waits the gateway's
Retry-After (REJECT_SECONDS) before it tries again; the HPA sees the metric METRIC_DELAY_SECONDS
late. After each shape ends, TAIL_SECONDS without load show the scale-down.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import deque
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "loadtest"))
from shapes import spike, step  # noqa: E402

RESULTS = ROOT / "docs" / "benchmarks" / "results.json"
HPA = ROOT / "deploy" / "kubernetes" / "base" / "hpa.yaml"
OUT = ROOT / "docs" / "scaling"

SWEEP_KEY = "triton:default|pipeline|http-json|c{}"
TOLERANCE = 0.1  # the controller's default (--horizontal-pod-autoscaler-tolerance)
SYNC_SECONDS = 15  # the controller's default sync period
RATE_WINDOW_SECONDS = 60  # the adapter query's rate(...[1m])
METRIC_DELAY_SECONDS = 10  # scrape interval (5 s) + the adapter's and Prometheus' lag, assumed
STARTUP_SECONDS = 60  # scheduling, image on the node, model load (a GPU pod's plan build: more)
REJECT_SECONDS = 1.0  # a refused client honours the gateway's Retry-After: 1 before retrying
PEAK_USERS = 192
STEP_SECONDS = 1200.0  # four steps of 5 minutes
SPIKE_SECONDS = 600.0  # 2 minutes of spike in the middle
TAIL_SECONDS = 600.0  # no load after the shape: the scale-down
#: Behaviours compared in docs/scaling.md: (scale-up stabilisation window s, target us).
SENSITIVITY = ((0, 250), (0, 300), (30, 300), (60, 300))
LOADS = (5_000, 10_000, 20_000, 50_000, 100_000)


@dataclass(frozen=True)
class Point:
    concurrency: int
    rps: float
    queue_us: float  # the HPA metric: queue time over every model / requests over every model
    p99_ms: float


def replica_curve(results: Path = RESULTS) -> list[Point]:
    """The measured pipeline sweep: one Triton replica on 2 cores, wrk on the same machine."""
    points = {p["key"]: p for p in json.loads(results.read_text())["points"]}
    curve = []
    for c in (1, 4, 16, 32, 64):
        point = points[SWEEP_KEY.format(c)]
        counters = point["counters"].values()
        queue = sum(m["queue_us"] for m in counters) / sum(m["requests"] for m in counters)
        summary = point["summary"]
        curve.append(Point(c, summary["rps"]["median"], queue, summary["p99_ms"]["median"]))
    return curve


def interpolate(curve: list[Point], concurrency: float, attribute: str) -> float:
    """Linear between measured concurrencies; 0 at 0 in flight; flat past the last point."""
    if concurrency <= 0:
        return 0.0
    xs = [p.concurrency for p in curve]
    ys = [getattr(p, attribute) for p in curve]
    if concurrency <= xs[0]:
        return ys[0] * (concurrency / xs[0] if attribute == "rps" else 1.0)
    for (x0, y0), (x1, y1) in pairwise(zip(xs, ys, strict=True)):
        if concurrency <= x1:
            return y0 + (y1 - y0) * (concurrency - x0) / (x1 - x0)
    return ys[-1]


def concurrency_at(curve: list[Point], queue_us: float) -> float:
    """The in-flight requests per replica at which the metric reaches `queue_us` (rising part)."""
    rising = curve[1:]  # c=1's queue time is its batcher delay alone, not load
    for a, b in pairwise(rising):
        if a.queue_us <= queue_us <= b.queue_us:
            return a.concurrency + (b.concurrency - a.concurrency) * (queue_us - a.queue_us) / (
                b.queue_us - a.queue_us
            )
    raise ValueError(
        f"target {queue_us} us is outside the measured {rising[0].queue_us}-"
        f"{rising[-1].queue_us} us"
    )


@dataclass
class HpaSpec:
    min_replicas: int
    max_replicas: int
    target: float
    up_window: int
    down_window: int
    up_policies: list[dict]
    down_policies: list[dict]
    up_select: str
    down_select: str

    @classmethod
    def read(cls, path: Path = HPA) -> HpaSpec:
        spec = yaml.safe_load(path.read_text())["spec"]
        behavior = spec["behavior"]
        return cls(
            min_replicas=spec["minReplicas"],
            max_replicas=spec["maxReplicas"],
            target=float(spec["metrics"][0]["pods"]["target"]["averageValue"]),
            up_window=behavior["scaleUp"]["stabilizationWindowSeconds"],
            down_window=behavior["scaleDown"]["stabilizationWindowSeconds"],
            up_policies=behavior["scaleUp"]["policies"],
            down_policies=behavior["scaleDown"]["policies"],
            up_select=behavior["scaleUp"].get("selectPolicy", "Max"),
            down_select=behavior["scaleDown"].get("selectPolicy", "Max"),
        )


def gateway_limits() -> tuple[int, int]:
    """(requests in flight per pod, waiting requests per pod): the gateway's admission settings
    (stack.env, which deploy/kubernetes/base/generated/gateway.env copies)."""
    from tritonstack.core.settings import load

    settings = load()
    return settings.GATEWAY_MAXCONN, settings.GATEWAY_QUEUE_PER_REPLICA


@dataclass
class Hpa:
    """The controller's decision, after pkg/controller/podautoscaler (replica calculator and
    normalizeDesiredReplicasWithBehaviors), for one Pods metric."""

    spec: HpaSpec
    recommendations: deque = field(default_factory=deque)  # (time, replicas)
    events: deque = field(default_factory=deque)  # (time, change in replicas)

    def calculate(self, current: int, metrics: list[float], missing: int) -> int:
        """Replica calculator for a plain (non-CPU) Pods metric."""
        if not metrics:
            return current
        ratio = sum(metrics) / len(metrics) / self.spec.target
        if missing == 0:
            if abs(1 - ratio) <= TOLERANCE:
                return current
            return math.ceil(ratio * len(metrics))
        # Pods without a metric yet: 0 when scaling up, the target when scaling down.
        filled = metrics + [0.0 if ratio > 1 else self.spec.target] * missing
        new_ratio = sum(filled) / len(filled) / self.spec.target
        if abs(1 - new_ratio) <= TOLERANCE or (ratio < 1 < new_ratio) or (new_ratio < 1 < ratio):
            return current
        replicas = math.ceil(new_ratio * len(filled))
        if (new_ratio < 1 and replicas > current) or (new_ratio > 1 and replicas < current):
            return current
        return replicas

    def _limit(self, now: float, current: int, policies: list[dict], select: str, up: bool) -> int:
        limits = []
        for policy in policies:
            # Replicas at the start of the policy's period: scale-ups (or downs) since then undone.
            recent = [d for t, d in self.events if t > now - policy["periodSeconds"]]
            start = current - sum(d for d in recent if (d > 0) == up)
            if policy["type"] == "Pods":
                limits.append(start + policy["value"] if up else start - policy["value"])
            elif up:
                limits.append(math.ceil(start * (1 + policy["value"] / 100)))
            else:
                limits.append(int(start * (1 - policy["value"] / 100)))
        if select == "Disabled":
            return current
        pick = max if (select == "Max") == up else min
        return pick(limits)

    def decide(self, now: float, current: int, metrics: list[float], missing: int) -> int:
        desired = self.calculate(current, metrics, missing)
        self.recommendations.append((now, desired))
        keep = max(self.spec.up_window, self.spec.down_window)
        while self.recommendations and self.recommendations[0][0] < now - keep:
            self.recommendations.popleft()
        # Stabilisation: scale up to the lowest, down to the highest recommendation in the window.
        up_floor = min(r for t, r in self.recommendations if t >= now - self.spec.up_window)
        down_ceiling = max(r for t, r in self.recommendations if t >= now - self.spec.down_window)
        if desired > current:
            desired = max(current, min(desired, up_floor))
            desired = min(
                desired, self._limit(now, current, self.spec.up_policies, self.spec.up_select, True)
            )
        elif desired < current:
            desired = min(current, max(desired, down_ceiling))
            desired = max(
                desired,
                self._limit(now, current, self.spec.down_policies, self.spec.down_select, False),
            )
        desired = max(self.spec.min_replicas, min(self.spec.max_replicas, desired))
        if desired != current:
            self.events.append((now, desired - current))
        while self.events and self.events[0][0] < now - 1800:
            self.events.popleft()
        return desired


@dataclass
class Sample:
    t: float
    users: int
    desired: int
    ready: int
    queue_us: float  # per-replica metric as served now
    served_rps: float
    rejected_rps: float
    latency_ms: float


def simulate(
    shape, run_time: float, curve: list[Point], spec: HpaSpec, maxconn: int, queue_per_pod: int
) -> list[Sample]:
    """One-second steps: users from the shape, pods start, the HPA decides every SYNC_SECONDS."""
    hpa = Hpa(spec)
    desired = spec.min_replicas
    starting: list[float] = []  # times at which starting pods become ready
    ready = spec.min_replicas
    history: deque = deque()  # (t, queue_us, served) for the rate window
    samples = []
    t = 0.0
    while True:
        stage = shape(t, PEAK_USERS, PEAK_USERS, run_time)
        if stage is None and t >= run_time + TAIL_SECONDS:
            break
        users = stage[0] if stage else 0
        ready += sum(1 for s in starting if s <= t)
        starting = [s for s in starting if s > t]
        # The gateway: maxconn in flight per pod, then a short queue, then refusals.
        in_triton = min(users, ready * maxconn)
        waiting = min(users - in_triton, ready * queue_per_pod)
        refused_users = users - in_triton - waiting
        per_pod = in_triton / ready
        served = ready * interpolate(curve, per_pod, "rps")
        queue_us = interpolate(curve, per_pod, "queue_us")
        latency_ms = (in_triton + waiting) / served * 1000 if served else 0.0
        rejected = refused_users / REJECT_SECONDS
        history.append((t, queue_us, served))
        while history and history[0][0] <= t - RATE_WINDOW_SECONDS - METRIC_DELAY_SECONDS:
            history.popleft()
        if t > 0 and t % SYNC_SECONDS == 0:
            # What the adapter returns: a request-weighted 1-minute average, METRIC_DELAY late.
            window = [(q, s) for (u, q, s) in history if u <= t - METRIC_DELAY_SECONDS]
            weight = sum(s for _, s in window)
            metric = sum(q * s for q, s in window) / weight if weight else 0.0
            current = ready + len(starting)
            new = hpa.decide(t, current, [metric] * ready, missing=len(starting))
            if new > current:
                starting += [t + STARTUP_SECONDS] * (new - current)
            elif new < current:
                drop = current - new
                cancelled = min(drop, len(starting))  # the newest pods go first
                starting = starting[: len(starting) - cancelled]
                ready -= drop - cancelled
            desired = new
        samples.append(Sample(t, users, desired, ready, queue_us, served, rejected, latency_ms))
        t += 1.0
    return samples


def capacity_table(curve: list[Point], spec: HpaSpec) -> str:
    at_target = concurrency_at(curve, spec.target)
    per_replica = interpolate(curve, at_target, "rps")
    rows = [
        f"| load (req/s) | replicas at the HPA target ({spec.target:.0f} µs queue, "
        f"{at_target:.0f} in flight, {per_replica:,.0f} req/s per replica) | "
        f"requests in flight (Locust users) |",
        "|---:|---:|---:|",
    ]
    for load in LOADS:
        replicas = math.ceil(load / per_replica)
        rows.append(f"| {load:,} | {replicas} | {math.ceil(at_target * replicas)} |")
    return "\n".join(rows)


def curve_table(curve: list[Point]) -> str:
    rows = [
        "| in flight per replica | req/s | queue µs per request (the HPA metric) | p99 ms |",
        "|---:|---:|---:|---:|",
    ]
    rows += [
        f"| {p.concurrency} | {p.rps:,.0f} | {p.queue_us:.0f} | {p.p99_ms:.1f} |" for p in curve
    ]
    return "\n".join(rows)


SUMMARY_HEADER = (
    "| shape | behaviour | most replicas | first scale-up (s) | seconds above target + tolerance "
    "| share of requests refused | replicas when the load ends | back at minReplicas (s after) |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|"
)


def run_summary(name: str, samples: list[Sample], spec: HpaSpec, run_time: float) -> str:
    loaded = [s for s in samples if s.t < run_time]
    peak = max(s.desired for s in samples)
    first_up = next((f"{s.t:.0f}" for s in samples if s.desired > spec.min_replicas), "never")
    rejected = sum(s.rejected_rps for s in loaded)
    served = sum(s.served_rps for s in loaded)
    above = sum(1 for s in loaded if s.queue_us > spec.target * (1 + TOLERANCE))
    at_end = loaded[-1].desired
    back = next(
        (
            f"{s.t - run_time:.0f}"
            for s in samples
            if s.t >= run_time and s.ready == spec.min_replicas
        ),
        f"> {TAIL_SECONDS:.0f}",
    )
    behaviour = f"up window {spec.up_window} s, target {spec.target:.0f} µs"
    return (
        f"| {name} | {behaviour} | {peak} | {first_up} | {above} | "
        f"{rejected / (rejected + served):.2%} | {at_end} | {back} |"
    )


def plot(
    runs: dict[str, list[Sample]], run_times: dict[str, float], spec: HpaSpec, path: Path
) -> None:
    figure, axes = plt.subplots(4, len(runs), figsize=(12, 10), sharex="col")
    for column, (name, samples) in enumerate(runs.items()):
        t = [s.t / 60 for s in samples]
        top = axes[0][column]
        top.set_title(f"Locust `{name}`, peak {PEAK_USERS} users")
        top.plot(t, [s.users for s in samples], color="black")
        top.set_ylabel("users (in flight)")
        axes[1][column].step(t, [s.desired for s in samples], where="post", label="desired")
        axes[1][column].step(t, [s.ready for s in samples], where="post", label="ready")
        axes[1][column].set_ylabel("Triton replicas")
        axes[1][column].legend(loc="upper left")
        axes[2][column].plot(t, [s.queue_us for s in samples])
        axes[2][column].axhline(spec.target, color="grey", linestyle="--", label="HPA target")
        axes[2][column].set_ylabel("queue µs / request")
        axes[2][column].legend(loc="upper left")
        axes[3][column].plot(t, [s.served_rps for s in samples], label="served")
        axes[3][column].set_ylabel("served requests/s")
        axes[3][column].set_xlabel("minutes (load ends at the dotted line)")
        refused = axes[3][column].twinx()
        refused.plot(t, [s.rejected_rps for s in samples], color="tab:red")
        refused.set_ylabel("503 from the gateway /s", color="tab:red")
        for row in axes:
            row[column].axvline(run_times[name] / 60, color="grey", linestyle=":")
    figure.tight_layout()
    figure.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where to write (docs/scaling)")
    args = parser.parse_args(argv)
    curve = replica_curve()
    spec = HpaSpec.read()
    maxconn, queue_per_pod = gateway_limits()
    shapes = {"step": (step, STEP_SECONDS), "spike": (spike, SPIKE_SECONDS)}
    runs = {
        name: simulate(shape, run_time, curve, spec, maxconn, queue_per_pod)
        for name, (shape, run_time) in shapes.items()
    }
    run_times = {name: run_time for name, (_, run_time) in shapes.items()}
    summary = "\n".join(
        [SUMMARY_HEADER] + [run_summary(name, runs[name], spec, run_times[name]) for name in runs]
    )
    rows = [SUMMARY_HEADER]
    for up_window, target in SENSITIVITY:
        variant = replace(spec, up_window=up_window, target=float(target))
        for name, (shape, run_time) in shapes.items():
            samples = simulate(shape, run_time, curve, variant, maxconn, queue_per_pod)
            rows.append(run_summary(name, samples, variant, run_time))
    sensitivity = "\n".join(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    tables = (
        f"<!-- curve -->\n{curve_table(curve)}\n\n<!-- capacity -->\n{capacity_table(curve, spec)}"
        f"\n\n<!-- simulation -->\n{summary}\n\n<!-- sensitivity -->\n{sensitivity}\n"
    )
    (args.out / "tables.md").write_text(tables)
    plot(runs, run_times, spec, args.out / "simulation.png")
    print(tables, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
