"""What `python -m bench` measures: scenario families, their points, the run settings.

A point is one (server, model, protocol, concurrency). Families share points (the `classifier`
at 32 clients on the default repository is both the batching-on row and the 100 us row of the
delay sweep); `plan` measures each point once and groups them by server, so every server is
started once, fresh, and stopped before the next starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

FAMILIES = {
    "models": "classifier direct vs pipeline (ensemble) vs classify (BLS) vs labels by Triton",
    "batching": "dynamic batching off vs on",
    "delay": "queue delay sweep (max_queue_delay_microseconds)",
    "instances": "instance count 1 vs 2 (the Python models, the classifier, all three)",
    "queue": "a queue policy (Triton's overload protection) vs none: the batcher stall it costs",
    "gateway": "through the gateway (HAProxy) vs Triton direct: what admission control costs",
    "protocols": "HTTP/JSON vs HTTP binary tensors vs gRPC",
    "concurrency": "concurrency sweep",
    "baselines": "FastAPI + onnxruntime, MLServer (adaptive batching) vs Triton",
    "memory": "server RSS after warm-up vs after many requests",
}

#: Families run only when named in --scenarios: they need more than the core install and take
#: their own servers (bench/llm.py), not this module's points.
OPT_IN_FAMILIES = {
    "llm": "Triton's vLLM path (direct, through the gateway) vs `vllm serve`: streaming tokens/s, "
    "TTFT, ITL (needs `make llm`)",
    "own": "models of one's own (a variable-size image model, a LightGBM classifier) as "
    "add-model serves them vs onnxruntime in-process and FastAPI + onnxruntime (needs the test "
    "extras: the models come from tests/model_zoo.py)",
}

ServerKind = Literal["triton", "gateway", "fastapi", "mlserver"]


@dataclass(frozen=True)
class ServerSpec:
    """One server the bench starts: what it runs, how the report names it, what a start costs."""

    key: str  # its id in results.json and in every point's key
    kind: ServerKind
    title: str
    variant: str = "default"  # the model-repository variant (bench/variants.py) Triton serves
    workers: int = 1  # uvicorn workers
    start_seconds: float = 6.0  # for the progress line's ETA
    #: a gateway's HAProxy configuration, relative to the checkout
    gateway_config: str = "gateway/haproxy.cfg"
    #: the memory family's server: a fresh Triton driven for many requests, RSS before and
    #: after, no points of its own
    memory_soak: bool = False

    @property
    def baseline(self) -> bool:
        """A server users would pick instead of Triton (started from the baselines' venv)."""
        return self.kind in ("fastapi", "mlserver")


def _triton(variant: str, title: str) -> ServerSpec:
    return ServerSpec(f"triton:{variant}", "triton", title, variant=variant)


#: Every server, in the order a run starts them.
SERVERS: dict[str, ServerSpec] = {
    spec.key: spec
    for spec in (
        _triton("default", "Triton"),
        _triton("classification", "Triton, classification extension"),
        _triton("batching-off", "Triton, batching off"),
        _triton("delay-0", "Triton, delay 0 us"),
        _triton("delay-500", "Triton, delay 500 us"),
        _triton("delay-2000", "Triton, delay 2000 us"),
        _triton("python-x1", "Triton, 1 instance of each Python model"),
        _triton("classifier-x1", "Triton, 1 classifier instance"),
        _triton("all-x1", "Triton, 1 instance of every model"),
        _triton("queue-policy", "Triton, queue policy"),
        _triton("queue-policy-x1", "Triton, queue policy, 1 instance of every model"),
        # the committed repository behind the gateway (gateway/haproxy.cfg, committed limits)
        ServerSpec("gateway:default", "gateway", "Triton behind the gateway (HAProxy)"),
        # the hop alone: a TCP relay with no checks, the floor under any gateway's cost
        ServerSpec(
            "gateway:tcp-relay",
            "gateway",
            "Triton behind a bare TCP relay (HAProxy, no checks)",
            gateway_config="bench/haproxy-tcp-relay.cfg",
        ),
        ServerSpec(
            "fastapi", "fastapi", "FastAPI + onnxruntime (1 uvicorn worker)", start_seconds=4.0
        ),
        ServerSpec(
            "fastapi-x2",
            "fastapi",
            "FastAPI + onnxruntime (2 uvicorn workers)",
            workers=2,
            start_seconds=5.0,
        ),
        ServerSpec("mlserver", "mlserver", "MLServer 1.7.1, adaptive batching", start_seconds=8.0),
        ServerSpec("memory", "triton", "Triton, memory soak", memory_soak=True),
    )
}
TRITON = "triton:default"
GATEWAY_SERVER = "gateway:default"
RELAY_SERVER = "gateway:tcp-relay"
#: max_queue_delay_microseconds -> the server measured with it (100 us is the committed value)
DELAY_SERVERS = {
    0: "triton:delay-0",
    100: TRITON,
    500: "triton:delay-500",
    2000: "triton:delay-2000",
}


@dataclass(frozen=True, order=True)
class Point:
    server: str
    model: str
    protocol: str
    concurrency: int

    @property
    def key(self) -> str:
        return f"{self.server}|{self.model}|{self.protocol}|c{self.concurrency}"

    @property
    def spec(self) -> ServerSpec:
        return SERVERS[self.server]


def point_key(server: str, model: str, protocol: str, concurrency: int) -> str:
    """The key of results.json's point for these, for looking one up by what it measured."""
    if server not in SERVERS:  # a misspelt key would otherwise read as "not run"
        raise KeyError(f"{server!r} is not a server of bench.scenarios.SERVERS")
    return Point(server, model, protocol, concurrency).key


@dataclass(frozen=True)
class Settings:
    quick: bool
    warmup_s: float
    seconds: float
    reps: int
    memory_requests: int
    concurrencies: tuple[int, ...]
    baseline_concurrencies: tuple[int, ...]
    sweep_models: tuple[str, ...]
    memory_chunk_s: float

    @property
    def label(self) -> str:
        return "quick (smoke numbers, not results)" if self.quick else "full"


FULL = Settings(
    quick=False,
    warmup_s=2,
    seconds=5,
    reps=3,
    memory_requests=100_000,
    concurrencies=(1, 4, 16, 32, 64),
    baseline_concurrencies=(1, 4, 16, 32, 64),
    sweep_models=("classifier", "pipeline", "classify"),
    memory_chunk_s=10,
)
#: A smoke run of every family (`make test` runs it): one repetition per point, since its
#: numbers are not results and each repetition costs a second per point.
QUICK = Settings(
    quick=True,
    warmup_s=1,
    seconds=1,
    reps=1,
    memory_requests=5_000,
    concurrencies=(1, 64),
    baseline_concurrencies=(16,),  # c=1 left to the full run: room for the gateway family
    sweep_models=("classifier", "pipeline"),
    memory_chunk_s=1,
)

JSON = "http-json"


def family_points(family: str, s: Settings) -> list[Point]:
    """The points one family's table shows, in table order."""
    if family == "models":
        return [Point(TRITON, m, JSON, 16) for m in ("classifier", "pipeline", "classify")] + [
            Point("triton:classification", "classifier", "http-classification", 16)
        ]
    if family == "batching":
        cases = [("classifier", 32)] if s.quick else [("classifier", 16), ("classifier", 32)]
        cases += [] if s.quick else [("pipeline", 32)]
        return [
            Point(server, model, JSON, c)
            for model, c in cases
            for server in ("triton:batching-off", TRITON)
        ]
    if family == "delay":
        cases = [("classifier", 32)] + ([] if s.quick else [("pipeline", 16)])
        # Quick: the committed delay and the longest, two servers of the sweep's four.
        delays = [100, 2000] if s.quick else sorted(DELAY_SERVERS)
        return [Point(DELAY_SERVERS[us], model, JSON, c) for model, c in cases for us in delays]
    if family == "instances":
        cases = [16] if s.quick else [16, 32]
        python = [
            Point(server, model, JSON, c)
            for c in cases
            for model in ("pipeline", "classify")
            for server in (TRITON, "triton:python-x1")
        ]
        x1 = "triton:classifier-x1"
        classifier = [("classifier", 32)] if s.quick else [("classifier", 16), ("classifier", 32)]
        classifier += [] if s.quick else [("pipeline", 16), ("classify", 16)]
        both = [("classifier", 32), ("pipeline", 16), ("classify", 16)]
        both += [] if s.quick else [("classifier", 16)]
        return (
            python
            + [Point(server, m, JSON, c) for m, c in classifier for server in (TRITON, x1)]
            + [Point("triton:all-x1", m, JSON, c) for m, c in both]
        )
    if family == "queue":
        two = [("classifier", 16), ("classifier", 32), ("pipeline", 16), ("classify", 16)]
        one = [("classifier", 16), ("pipeline", 16), ("classify", 16)]
        if s.quick:  # the single-instance pair shows the stall best; c=32 is shared with instances
            two, one = [], [("classifier", 32)]
        return [
            Point(server, m, JSON, c)
            for servers, cases in (
                (("triton:queue-policy", TRITON), two),
                (("triton:queue-policy-x1", "triton:all-x1"), one),
            )
            for m, c in cases
            for server in servers
        ]
    if family == "gateway":
        # Up to 32 clients: the gateway's committed in-flight cap per replica, so every request is
        # admitted and the two sides answer the same load (past it the gateway queues, then 503s).
        # JSON pays for the gateway's reading of the whole body; binary tensors only for their
        # JSON header (Inference-Header-Content-Length): both are reported.
        cases = [("classifier", JSON, 16)]
        if not s.quick:
            cases += [("classifier", JSON, 32), ("pipeline", JSON, 16), ("classify", JSON, 16)]
            cases += [("classifier", "http-binary", 16), ("pipeline", "http-binary", 16)]
        points = [
            Point(server, m, p, c) for m, p, c in cases for server in (TRITON, GATEWAY_SERVER)
        ]
        relay = [] if s.quick else [("classifier", JSON, 16), ("pipeline", JSON, 16)]
        return points + [Point(RELAY_SERVER, m, p, c) for m, p, c in relay]
    if family == "protocols":
        models = ("pipeline",) if s.quick else ("classifier", "pipeline")
        return [
            Point(TRITON, m, p, 16) for m in models for p in ("http-json", "http-binary", "grpc")
        ]
    if family == "concurrency":
        return [
            Point(TRITON, m, JSON, c)
            for m in s.sweep_models
            for c in sorted({*s.concurrencies, 16})
        ]
    if family == "baselines":
        # One uvicorn worker is the default FastAPI's docs deploy and the targets' reference;
        # two workers (one per core) is what a user tuning it would run: shown, not a target.
        two_workers = (
            [] if s.quick else [Point("fastapi-x2", "classifier", JSON, c) for c in (16, 64)]
        )
        return (
            [Point(TRITON, "pipeline", JSON, 16)]
            + [
                Point(server, "classifier", JSON, c)
                for server in ("fastapi", "mlserver")
                for c in sorted({*s.baseline_concurrencies, 16})
            ]
            + two_workers
        )
    if family == "memory":
        return []
    raise ValueError(f"unknown family {family!r}")


def plan(families: Iterable[str], s: Settings) -> list[tuple[str, list[Point]]]:
    """[(server key, its points in measuring order)] for the chosen families, each point once."""
    wanted: dict[str, list[Point]] = {}
    families = list(families)
    for family in families:
        for point in family_points(family, s):
            points = wanted.setdefault(point.server, [])
            if point not in points:
                points.append(point)
    if "memory" in families:
        for spec in SERVERS.values():
            if spec.memory_soak:
                wanted[spec.key] = []
    return [(server, sorted(wanted[server])) for server in SERVERS if server in wanted]


def estimate_seconds(server: str, points: list[Point], s: Settings) -> float:
    """Rough seconds a server's start and points take, for the ETA (refined from the real pace
    as the run goes)."""
    spec = SERVERS[server]
    per_point = s.warmup_s + s.reps * s.seconds + 0.5
    grpc = sum(1.5 * (s.reps + 1) for p in points if p.protocol == "grpc")
    memory = 2 * s.warmup_s + s.memory_requests / 3000 if spec.memory_soak else 0.0
    return spec.start_seconds + per_point * len(points) + grpc + memory
