"""Pure arithmetic of the bench: repetitions to medians and spread, saturation, targets."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

#: The machine has this many cores; CPU figures are in cores (1.0 = one core busy).
#: A load generator using more than this share of the machine competes with the server.
GENERATOR_SATURATION_SHARE = 0.45


@dataclass(frozen=True)
class Rep:
    """One measured repetition of one point (after warm-up)."""

    requests: int  # successful responses
    errors: int
    seconds: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    server_cores: float
    generator_cores: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float

    def text(self, digits: int = 0) -> str:
        if self.low == self.high:
            return f"{self.median:,.{digits}f}"
        return f"{self.median:,.{digits}f} ({self.low:,.{digits}f}-{self.high:,.{digits}f})"


def spread(values: Sequence[float]) -> Spread:
    """Median and min-max of repetitions (with 3 repetitions, IQR would be the range anyway)."""
    if not values:
        raise ValueError("no values")
    return Spread(statistics.median(values), min(values), max(values))


@dataclass
class Summary:
    """A point's repetitions reduced to what the report prints."""

    reps: int
    rps: Spread
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: Spread
    server_cores: float
    generator_cores: float
    errors: int
    rows_per_request: int = 1
    avg_batch: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def inferences_per_s(self) -> float:
        return self.rps.median * self.rows_per_request


def summarize(reps: Sequence[Rep], rows_per_request: int = 1) -> Summary:
    """Medians over repetitions; throughput and p99 also keep their min-max."""
    if not reps:
        raise ValueError("a point needs at least one repetition")
    return Summary(
        reps=len(reps),
        rps=spread([r.rps for r in reps]),
        mean_ms=statistics.median(r.mean_ms for r in reps),
        p50_ms=statistics.median(r.p50_ms for r in reps),
        p95_ms=statistics.median(r.p95_ms for r in reps),
        p99_ms=spread([r.p99_ms for r in reps]),
        server_cores=statistics.median(r.server_cores for r in reps),
        generator_cores=statistics.median(r.generator_cores for r in reps),
        errors=sum(r.errors for r in reps),
        rows_per_request=rows_per_request,
    )


def saturation_notes(summary: Summary, cores: int, concurrency: int) -> list[str]:
    """Why a point's numbers may say more about the load generator than about the server."""
    notes = []
    share = summary.generator_cores / cores if cores else 0.0
    if share > GENERATOR_SATURATION_SHARE:
        notes.append(
            f"load generator used {share:.0%} of the machine (> {GENERATOR_SATURATION_SHARE:.0%}):"
            " it competes with the server for CPU"
        )
    # Closed loop: with N clients, throughput x mean latency ~ N (Little's law). Far below means
    # the generator did not keep N requests in flight.
    if summary.rps.median > 0 and summary.mean_ms > 0:
        in_flight = summary.rps.median * summary.mean_ms / 1000.0
        if concurrency >= 4 and in_flight < 0.5 * concurrency:
            notes.append(
                f"only ~{in_flight:.1f} of {concurrency} requests in flight (throughput x mean "
                "latency): the generator could not keep the target concurrency"
            )
    if summary.errors:
        notes.append(f"{summary.errors} failed requests")
    return notes


def correct_coordinated_omission(latencies_us: np.ndarray, expected_us: float) -> np.ndarray:
    """Add the samples wrk 4.x adds before computing percentiles (its `stats_correct`).

    For every latency L of at least twice the expected interval e between a connection's
    requests, the samples L-e, L-2e, ... down to just above e are added: the latencies requests
    sent at the steady rate would have seen while that one was stalled. Applied to the gRPC
    workers' samples so both protocols' percentiles mean the same thing.
    """
    latencies = np.asarray(latencies_us, dtype=np.float64)
    if expected_us <= 0 or latencies.size == 0:
        return latencies
    expected = float(int(expected_us))
    long = latencies[latencies >= 2 * expected]
    if long.size == 0:
        return latencies
    # synthetic samples per long latency L: L - j*e for j = 1.. while L - j*e > e
    counts = (np.ceil((long - expected) / expected) - 1).astype(np.int64)
    starts = np.repeat(long, counts)
    steps = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + 1
    return np.concatenate([latencies, starts - steps * expected])


def queue_stall_note(
    counters: dict,
    server_cores: float,
    cores: int,
    limit_us: float = 5000,
) -> str:
    """A note when requests waited long in a model's queue while the server was mostly idle.

    Waiting while the CPU is busy is ordinary queueing; waiting far longer than any configured
    delay while the server uses under 40% of the machine is a scheduling stall. The model whose
    requests waited longest is named.
    """
    waits = {
        model: (c["queue_us"] / c["requests"], c["compute_us"] / c["requests"])
        for model, c in counters.items()
        if c.get("requests") and "queue_us" in c
    }
    if not waits:
        return ""
    model, (queue, compute) = max(waits.items(), key=lambda item: item[1][0])
    if queue <= limit_us or server_cores >= 0.4 * cores:
        return ""
    return (
        f"requests waited {queue / 1000:.1f} ms on average in `{model}`'s queue (compute "
        f"{compute / 1000:.2f} ms, configured delay at most 2 ms) while the server used "
        f"{server_cores:.2f} cores: the dynamic batcher stalled (see Method: Stalls)"
    )


def average_batch(before: dict[str, float], after: dict[str, float]) -> float | None:
    """Inferences per execution from two readings of (inference count, execution count)."""
    executions = after["executions"] - before["executions"]
    if executions <= 0:
        return None
    return (after["inferences"] - before["inferences"]) / executions


@dataclass(frozen=True)
class Target:
    name: str
    passed: bool | None  # None: not measured in this run
    detail: str

    @property
    def verdict(self) -> str:
        return {True: "**met**", False: "**missed**", None: "not measured"}[self.passed]


def ratio_target(name: str, value: float | None, reference: float | None, floor: float) -> Target:
    """value / reference >= floor."""
    if not value or not reference:
        return Target(name, None, "a point it needs was not part of this run")
    ratio = value / reference
    return Target(
        name, ratio >= floor, f"{value:,.0f} vs {reference:,.0f} req/s = {ratio:.2f}x (≥ {floor}x)"
    )
