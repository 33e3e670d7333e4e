"""docs/benchmarks.md and its plots, rendered from a run's results (also kept as results.json).

`render_markdown` is pure (results dict in, Markdown out) so it is unit-tested; `write` adds the
PNG plots (matplotlib, Agg backend) and the JSON next to the Markdown.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import explain, llm_report, own_report
from bench.scenarios import DELAY_SERVERS, FAMILIES, OPT_IN_FAMILIES, SERVERS, TRITON, point_key
from bench.stats import Target, ratio_target
from tritonstack.core.errors import UserError

PLOTS = {
    "throughput": "throughput vs concurrency (HTTP/JSON, batch-1 requests)",
    "latency": "p99 latency vs throughput (each marker one concurrency)",
}

#: The GPU bench profile for docker-compose.yml.
COMPOSE_BENCH = """\
  perf-analyzer:
    profiles: ["bench"]
    image: nvcr.io/nvidia/tritonserver:26.08-py3-sdk  # same release as the server (2.72)
    # Triton itself, not the gateway: it measures the server, and reads its statistics API with
    # the admin key (the gateway routes neither); a one-shot an operator runs by hand.
    networks: [serving]
    depends_on:
      triton:
        condition: service_healthy
    environment:
      TRITON_HOST: triton
      CONCURRENCIES: ${BENCH_CONCURRENCIES:-1 4 8 16 32 64}
      ADMIN_KEY_FILE: /run/secrets/tritonstack/admin-key  # for the statistics API
    volumes:
      - ./bench:/bench:ro
      - ./results:/results
      - secrets:/run/secrets/tritonstack:ro
    command: ["bash", "/bench/perf_analyzer.sh"]
"""


#: The project's throughput targets (CPU, 2 cores, side by side in one run).
TARGET_NAMES = (
    "pipeline ≥ 3x FastAPI throughput at 16 clients, p99 no worse",
    "pipeline ≥ 80% of direct classifier throughput (16 clients)",
    "classify ≥ 80% of direct classifier throughput (16 clients)",
    "dynamic batching ≥ 2x vs off at 32 clients (classifier)",
    "through the gateway ≥ 0.9x direct throughput: classifier, 16 clients (JSON)",
    "through the gateway ≥ 0.9x direct throughput: pipeline, 16 clients (JSON)",
)


def _own_section(results: dict, family: str) -> list[str]:
    """The section of a family measured by its own module (bench/llm.py, bench/own.py)."""
    if family == "llm":
        return llm_report.section(results.get("llm"))
    if family == "own":
        return own_report.section(results.get("own"))
    return []


def _get(results: dict, server: str, model: str, protocol: str, c: int) -> dict | None:
    for point in results["points"]:
        if point["key"] == point_key(server, model, protocol, c):
            return point
    return None


def _rps(point: dict | None) -> float | None:
    return point["summary"]["rps"]["median"] if point else None


def _p99(point: dict | None) -> float | None:
    return point["summary"]["p99_ms"]["median"] if point else None


def _cpu_us(point: dict | None) -> float | None:
    """Server CPU time per request (µs): what throughput costs when the CPU is the limit."""
    if not point or not point["summary"]["rps"]["median"]:
        return None
    return point["summary"]["server_cores"] / point["summary"]["rps"]["median"] * 1e6


def _with_cost(target: Target, point: dict | None, reference: dict | None) -> Target:
    a, b = _cpu_us(point), _cpu_us(reference)
    if target.passed is None or a is None or b is None:
        return target
    return Target(
        target.name, target.passed, f"{target.detail}; server CPU {a:.0f} vs {b:.0f} µs/request"
    )


def targets(results: dict) -> list[Target]:
    """The project's throughput targets, evaluated on this run's medians."""
    json_ = "http-json"
    pipeline16 = _get(results, TRITON, "pipeline", json_, 16)
    classify16 = _get(results, TRITON, "classify", json_, 16)
    classifier16 = _get(results, TRITON, "classifier", json_, 16)
    fastapi16 = _get(results, "fastapi", "classifier", json_, 16)
    on32 = _get(results, TRITON, "classifier", json_, 32)
    off32 = _get(results, "triton:batching-off", "classifier", json_, 32)

    vs_fastapi = ratio_target(
        TARGET_NAMES[0],
        _rps(pipeline16),
        _rps(fastapi16),
        3.0,
    )
    if vs_fastapi.passed is not None:
        p99_ok = _p99(pipeline16) <= _p99(fastapi16)
        vs_fastapi = Target(
            vs_fastapi.name,
            vs_fastapi.passed and p99_ok,
            f"{vs_fastapi.detail}; p99 {_p99(pipeline16):.1f} vs {_p99(fastapi16):.1f} ms"
            f" ({'no worse' if p99_ok else 'worse'})",
        )
    return [
        _with_cost(vs_fastapi, pipeline16, fastapi16),
        _with_cost(
            ratio_target(
                TARGET_NAMES[1],
                _rps(pipeline16),
                _rps(classifier16),
                0.8,
            ),
            pipeline16,
            classifier16,
        ),
        _with_cost(
            ratio_target(
                TARGET_NAMES[2],
                _rps(classify16),
                _rps(classifier16),
                0.8,
            ),
            classify16,
            classifier16,
        ),
        _with_cost(
            ratio_target(
                TARGET_NAMES[3],
                _rps(on32),
                _rps(off32),
                2.0,
            ),
            on32,
            off32,
        ),
        *(
            gateway_target(results, name, model)
            for name, model in zip(TARGET_NAMES[4:], ("classifier", "pipeline"), strict=True)
        ),
    ]


def gateway_target(results: dict, name: str, model: str) -> Target:
    """Gateway vs direct at 16 clients in one run (each server started once, its points in a
    row), with the CPU each costs per request and the bare relay's ratio beside it."""
    from bench.scenarios import GATEWAY_SERVER, RELAY_SERVER

    gateway = _get(results, GATEWAY_SERVER, model, "http-json", 16)
    direct = _get(results, TRITON, model, "http-json", 16)
    target = _with_cost(ratio_target(name, _rps(gateway), _rps(direct), 0.9), gateway, direct)
    relay = _get(results, RELAY_SERVER, model, "http-json", 16)
    if target.passed is None or not _rps(relay):
        return target
    floor = _rps(relay) / _rps(direct)
    return Target(target.name, target.passed, f"{target.detail}; a bare TCP relay: {floor:.2f}x")


def single_instance(results: dict) -> list[str]:
    """The targets' numbers again with single instances (variants classifier-x1, all-x1)."""
    json_ = "http-json"
    found = []
    for variant, what in (
        ("triton:classifier-x1", "a single `classifier` instance"),
        ("triton:all-x1", "one instance of every model"),
    ):
        comparisons = {
            ("classifier", 32): [
                (TRITON, "classifier", 32, "the committed config"),
                ("triton:batching-off", "classifier", 32, "batching off"),
            ],
            ("pipeline", 16): [
                ("fastapi", "classifier", 16, "FastAPI"),
                (variant, "classifier", 16, "its direct classifier"),
            ],
            ("classify", 16): [(variant, "classifier", 16, "its direct classifier")],
        }
        parts = []
        for (model, c), references in comparisons.items():
            point = _get(results, variant, model, json_, c)
            if not point:
                continue
            ratios = []
            for ref_server, ref_model, ref_c, ref_name in references:
                reference = _get(results, ref_server, ref_model, json_, ref_c)
                if reference and _rps(reference):
                    ratios.append(f"{_rps(point) / _rps(reference):.2f}x {ref_name}")
            parts.append(
                f"`{model}` at {c} clients {_rps(point):,.0f} req/s, p99 {_p99(point):.1f} ms"
                + (f" ({', '.join(ratios)})" if ratios else "")
            )
        if parts:
            found.append(
                f"With {what} (variant `{SERVERS[variant].variant}`, everything else as "
                "committed): " + "; ".join(parts) + "."
            )
    classification = _get(results, "triton:classification", "classifier", "http-classification", 16)
    if classification:
        parts = []
        for server, model, name in (
            (TRITON, "classifier", "the direct classifier (no labels)"),
            (TRITON, "pipeline", "`pipeline`"),
            ("fastapi", "classifier", "FastAPI"),
        ):
            reference = _get(results, server, model, json_, 16)
            if reference and _rps(reference):
                parts.append(f"{_rps(classification) / _rps(reference):.2f}x {name}")
        found.append(
            "Labels without Python: `classifier` with `label_filename` and the request asking for "
            f"`classification` (Triton's extension) gives {_rps(classification):,.0f} req/s at 16 "
            f"clients, p99 {_p99(classification):.1f} ms"
            + (": " + ", ".join(parts) if parts else "")
            + ". Its answer is one `score:index:label` string per row instead of `label` and "
            "`class` tensors."
        )
    return found


def queue_findings(results: dict) -> list[str]:
    """The queue family read side by side: what the overload protection costs in stalls."""
    found = []
    for with_policy, without, what in (
        ("triton:queue-policy", TRITON, "two instances (committed)"),
        ("triton:queue-policy-x1", "triton:all-x1", "one instance of every model"),
    ):
        parts = []
        for point in results["points"]:
            if point["server"] != with_policy or point["protocol"] != "http-json":
                continue
            other = _get(results, without, point["model"], "http-json", point["concurrency"])
            if other is None:
                continue
            a, b = point["summary"], other["summary"]
            parts.append(
                f"`{point['model']}` c={point['concurrency']}: {_rps(point):,.0f} req/s, worst "
                f"p99 {a['p99_ms']['high']:.1f} ms with the policy; {_rps(other):,.0f} req/s, "
                f"worst p99 {b['p99_ms']['high']:.1f} ms without"
            )
        if parts:
            found.append(f"With {what}: " + "; ".join(parts) + ".")
    if found:
        found.append(
            "A queue policy (`max_queue_size`, or a default timeout) turns off the dynamic "
            "batcher's payload prefetching; on that path Triton 2.51's batcher is not woken when a "
            "busy instance frees up, so a request that arrived meanwhile waits for the batcher's "
            "500 ms idle timeout. The worst p99 over the repetitions shows those stalls. The "
            "committed configs have no queue policy: the gateway refuses overload before Triton "
            "(gateway/haproxy.cfg), and one instance per model is then as stall-free as two."
        )
    return found


PROTOCOL_NAMES = {"http-json": "JSON", "http-binary": "binary", "grpc": "gRPC"}


def _versus_direct(results: dict, point: dict) -> str | None:
    """`model` protocol c=N: throughput ratio to direct Triton, latency and CPU side by side."""
    direct = _get(results, TRITON, point["model"], point["protocol"], point["concurrency"])
    if not direct or not _rps(direct) or not _rps(point):
        return None
    a, b = point["summary"], direct["summary"]
    cpu_a, cpu_b = _cpu_us(point), _cpu_us(direct)
    haproxy = point.get("cpu_by_process_us", {}).get("haproxy")
    cpu = ""
    if cpu_a is not None and cpu_b is not None:
        cpu = f", CPU {cpu_a:.0f} vs {cpu_b:.0f} µs per request"
        cpu += f" (haproxy {haproxy:.0f})" if haproxy is not None else ""
    protocol = PROTOCOL_NAMES.get(point["protocol"], point["protocol"])
    return (
        f"`{point['model']}` {protocol} c={point['concurrency']}: "
        f"{_rps(point) / _rps(direct):.2f}x the direct throughput, p50 {a['p50_ms']:.1f} vs "
        f"{b['p50_ms']:.1f} ms, p99 {a['p99_ms']['median']:.1f} vs {b['p99_ms']['median']:.1f} "
        f"ms{cpu}"
    )


def gateway_findings(results: dict) -> list[str]:
    """The gateway family read side by side: throughput, latency and CPU per request, and the
    bare relay beside it (the cost of the hop before any check)."""
    from bench.scenarios import GATEWAY_SERVER, RELAY_SERVER

    found = []
    for server, lead in (
        (GATEWAY_SERVER, "Through the gateway vs direct (gateway first): "),
        (RELAY_SERVER, "Through a bare TCP relay vs direct (relay first): "),
    ):
        parts = [_versus_direct(results, p) for p in results["points"] if p["server"] == server]
        if any(parts):
            found.append(lead + "; ".join(p for p in parts if p) + ".")
    if not found:
        return []
    found.append(
        "The gateway (HAProxy, gateway/haproxy.cfg, one thread natively) reads every request's "
        "body once (one regular expression over a JSON body, or over a binary body's JSON "
        "header, then a Lua action, gateway/check_tensors.lua, that adds up the values the "
        "shapes declare and counts each input's data) and relays it to Triton over a "
        "kept-alive connection. Measured alone, alternating on one Triton with wrk (c=16, "
        "classifier JSON): HAProxy spends about 97 µs per request with the Lua action and 67 "
        "without (the Lua call itself about 14, the shapes 6, counting the data 13), so "
        "checking any model's tensors costs about 30 µs of a core per request over checking "
        "one fixed contract with the regular expression alone. The relay "
        "(bench/haproxy-tcp-relay.cfg) checks nothing and parses no HTTP: what it costs is the "
        "hop itself, two more loopback sockets per request, whose kernel work and HAProxy's "
        "comes out of the same 2 cores Triton is saturating. The gap between the relay and the "
        "gateway is what the checks cost; the gap between the relay and direct is what any "
        "process in front of Triton costs on this machine. On a host with cores to spare the "
        "hop costs latency (the p50 above), not throughput. What the gateway buys: overload "
        "answered with fast 503s and counted, bad requests refused before Triton, admin APIs "
        "unreachable, API keys, TLS and balancing over replicas (docs/operations.md)."
    )
    return found


def _num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _spread(s: dict, digits: int = 0) -> str:
    if s["low"] == s["high"]:
        return _num(s["median"], digits)
    return f"{_num(s['median'], digits)} ({_num(s['low'], digits)}-{_num(s['high'], digits)})"


TABLE_HEAD = (
    "| scenario | req/s (min-max) | inferences/s | p50 ms | p95 ms | p99 ms (min-max) "
    "| avg batch | server CPU (cores) | generator CPU (cores) |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _row(label: str, point: dict | None) -> str:
    if point is None:
        return f"| {label} | not run | | | | | | | |"
    s = point["summary"]
    inferences = s["rps"]["median"] * s["rows_per_request"]
    flag = " ⚠" if s["notes"] else ""
    return (
        f"| {label}{flag} | {_spread(s['rps'])} | {_num(inferences)} | {s['p50_ms']:.2f} | "
        f"{s['p95_ms']:.2f} | {_spread(s['p99_ms'], 1)} | {_num(s['avg_batch'], 1)} | "
        f"{s['server_cores']:.2f} | {s['generator_cores']:.2f} |"
    )


def _label(point: dict, family: str) -> str:
    server = SERVERS[point["server"]].title
    model = point["model"]
    if family == "baselines" and SERVERS[point["server"]].baseline:
        return f"{server}, c={point['concurrency']}"
    if family == "delay":
        us = next(u for u, srv in DELAY_SERVERS.items() if srv == point["server"])
        return f"`{model}` delay {us} us, c={point['concurrency']}"
    if family == "protocols":
        return f"`{model}` {point['protocol']}"
    if family == "gateway" and point["protocol"] != "http-json":
        protocol = PROTOCOL_NAMES.get(point["protocol"], point["protocol"])
        return f"`{model}` {protocol} {server}, c={point['concurrency']}"
    if point["protocol"] == "http-classification":
        return f"`{model}` + labels by Triton's classification extension, c={point['concurrency']}"
    return f"`{model}` {server}, c={point['concurrency']}"


def family_table(results: dict, family: str) -> str:
    from bench.scenarios import FULL, QUICK, family_points

    settings = QUICK if results["meta"]["quick"] else FULL
    rows = [TABLE_HEAD]
    for point in family_points(family, settings):
        found = _get(results, point.server, point.model, point.protocol, point.concurrency)
        rows.append(_row(_label(found or {**point.__dict__}, family), found))
    return "\n".join(rows)


def _notes(results: dict) -> list[str]:
    lines = []
    for point in results["points"]:
        for note in point["summary"]["notes"]:
            lines.append(
                f"- {SERVERS[point['server']].title} `{point['model']}` "
                f"{point['protocol']} c={point['concurrency']}: {note}"
            )
    return lines


def _breakdown(results: dict) -> str:
    """Where a request's time goes inside Triton (its metrics), per model, at 16 clients."""
    lines = [
        "| request sent to | model | executions | avg batch | queue us/request "
        "| compute us/request |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for sent in ("classifier", "pipeline", "classify"):
        point = _get(results, TRITON, sent, "http-json", 16)
        if point is None:
            continue
        for model, c in point["counters"].items():
            if not c.get("requests"):
                continue
            lines.append(
                f"| `{sent}` | `{model}` | {c['executions']:,.0f} | "
                f"{c['inferences'] / c['executions']:.1f} | "
                f"{c['queue_us'] / c['requests']:.0f} | {c['compute_us'] / c['requests']:.0f} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def _why_section(results: dict) -> list[str]:
    """The targets explained: CPU per request by process, py-spy on the stubs, the bounds."""
    cpu, profiles = explain.cpu_table(results), explain.profile_table(results)
    if not cpu:
        return []
    out = [
        "## Where each request's CPU goes",
        "",
        "CPU time per answered request (µs), by process, summed over the repetitions: "
        "tritonserver (HTTP, scheduling, ensemble steps, the Python backend's side of each model "
        "call) and each model's stub processes (both instances).",
        "",
        cpu,
        "",
    ]
    if profiles:
        out += [
            "py-spy (`--native`, 250 Hz) on the stubs while the same requests ran at 16 clients: "
            "a busy sample with a frame in the model's file is the model's own Python (its "
            "`execute`, numpy, onnxruntime, metric calls); the rest is the Python backend's C++ "
            "around it (reading requests from shared memory, wrapping tensors, sending "
            "responses, waiting on tritonserver), which model code cannot make cheaper.",
            "",
            profiles,
            "",
        ]
    out += [*explain.explanations(results), ""]
    return out


def render_markdown(results: dict, gpu_check: dict | None = None) -> str:
    meta = results["meta"]
    quick = meta["quick"]
    out = ["# Benchmarks", ""]
    if quick:
        out += [
            "> **QUICK MODE: smoke numbers, not results.** Short runs, few points, "
            f"{meta['settings']['memory_requests']:,} requests for the memory check. "
            "Run `python -m bench` on a quiet machine for numbers worth quoting.",
            "",
        ]
    if meta["load_before"][0] > 0.5 * meta["cores"]:
        out += [
            f"> **Warning: the machine was busy** (load average {meta['load_before'][0]} on "
            f"{meta['cores']} cores when the run started): other processes shared the CPU, so "
            "these numbers understate every server and their spread is wide.",
            "",
        ]
    versions = ", ".join(f"{k} {v}" for k, v in sorted(meta["versions"].items()))
    s = meta["settings"]
    out += [
        f"Measured by `{meta['command']}` on {meta['started']} in {meta['duration_s'] // 60} min "
        f"{meta['duration_s'] % 60} s: {meta['cpu']}, {meta['cores']} cores, "
        f"{meta['memory_gib']} GiB, Python {meta['python']}, no GPU. Load average before / after: "
        f"{meta['load_before'][0]} / {meta['load_after'][0]} (anything well above 0 before the "
        "run means other work shared the CPU).",
        "",
    ]
    for merged in meta.get("merged", []):
        elsewhere = ""
        if merged.get("cpu") and merged["cpu"] != meta["cpu"]:
            elsewhere = (
                f" On another machine ({merged['cpu']}): compare these families' numbers with "
                "each other, not with the run above."
            )
        out += [
            f"Measured again later and merged in: {', '.join(merged['families'])}, by "
            f"`{merged['command']}` on {merged['started']} in {merged['duration_s'] // 60} min "
            f"{merged['duration_s'] % 60} s (load average before: {merged['load_before'][0]})."
            + elsewhere,
            "",
        ]
    if not results["points"]:  # only families with sections of their own (llm, own)
        for family in meta["families"]:
            out += _own_section(results, family)
        return "\n".join(out)
    out += [
        f"Versions: {versions}; load generator {meta['wrk']}.",
        "",
        f"Each point: a check request, {s['warmup_s']} s warm-up, {s['reps']} repetitions of "
        f"{s['seconds']} s; tables give the median and, in brackets, min-max over repetitions. "
        "Every request is one row of 128 FP32 features (KServe v2 JSON unless the protocol says "
        "otherwise). CPU is in cores (2.0 = the whole machine), summed over the server's process "
        "tree and over the load generator's processes. ⚠ marks a point with a note below.",
        "",
        "## Targets",
        "",
        "| target | verdict | numbers |",
        "|---|---|---|",
    ]
    out += [f"| {t.name} | {t.verdict} | {t.detail} |" for t in targets(results)]
    out.append("")
    flagged = [
        f"`{p['model']}` on {SERVERS[p['server']].title} c={p['concurrency']}"
        for p in (
            _get(results, *key_)
            for key_ in (
                (TRITON, "pipeline", "http-json", 16),
                (TRITON, "classify", "http-json", 16),
                (TRITON, "classifier", "http-json", 16),
                ("fastapi", "classifier", "http-json", 16),
                (TRITON, "classifier", "http-json", 32),
                ("triton:batching-off", "classifier", "http-json", 32),
            )
        )
        if p and p["summary"]["notes"]
    ]
    if flagged:
        out += [
            "⚠ Verdicts above rest on flagged points (" + ", ".join(flagged) + "): read their "
            "notes below before reading the verdict.",
            "",
        ]
    for finding in single_instance(results):
        out += [finding, ""]
    out += _why_section(results)
    if "concurrency" in meta["families"] or "baselines" in meta["families"]:
        out += ["## Plots", ""]
        out += [f"![{title}](benchmarks/{name}.png)" for name, title in PLOTS.items()]
        out.append("")
    for family in meta["families"]:
        if family == "memory":
            continue
        if family in OPT_IN_FAMILIES:
            out += _own_section(results, family)
            continue
        out += [f"## {FAMILIES[family][0].upper()}{FAMILIES[family][1:]}", ""]
        out += [family_table(results, family), ""]
        if family == "gateway":
            for finding in gateway_findings(results):
                out += [finding, ""]
        if family == "queue":
            for finding in queue_findings(results):
                out += [finding, ""]
        if family == "models":
            breakdown = _breakdown(results)
            if breakdown:
                out += [
                    "Inside Triton (its metrics, deltas over the repetitions at 16 clients): "
                    "executions and batch size per model, and the average time a request spent "
                    "queued and computing in each.",
                    "",
                    breakdown,
                    "",
                ]
    memory = results.get("memory")
    if memory:
        label = "" if not quick else " (quick mode: far fewer requests than the full run's 100k)"
        verdict = "within" if abs(memory["growth"]) <= 0.10 else "**not within**"
        out += [
            "## Memory",
            "",
            f"Fresh Triton (default repository), `pipeline` and `classify` alternating at 16 "
            f"clients{label}: RSS of tritonserver and its {memory['processes'] - 1} stub "
            f"processes {memory['rss_warm_bytes'] / 2**20:.0f} MiB after warm-up, "
            f"{memory['rss_after_bytes'] / 2**20:.0f} MiB after {memory['requests']:,} requests "
            f"({memory['growth']:+.1%}; {verdict} the 10% target; {memory['errors']} errors). "
            "RSS is summed per process, so pages the stubs share are counted more than once.",
            "",
        ]
    notes = _notes(results)
    out += ["## Load generator and saturation notes", ""]
    out += notes or ["- none: no point's generator used more than 45% of the machine."]
    out += ["", *gpu_check_section(gpu_check), *method_sections()]
    return "\n".join(out)


def method_sections() -> list[str]:
    """How the numbers are made and reproduced, and the GPU profile: in every report."""
    out = [
        "## Method",
        "",
        "- Same machine, same model file (`model_repository/classifier/1/model.onnx`, onnxruntime "
        "CPU provider, one intra-op thread everywhere), same request, same load generator. Each "
        "server is started fresh for its scenarios and stopped before the next one starts.",
        "- Triton is the real tritonserver 2.51 of the embedded runtime (`tritonstack serve`). On "
        "this CPU runtime `classifier` runs in a Python-based backend (onnxruntime in a Python "
        "stub, one `run` per batch), not Triton's C++ onnxruntime backend: the GPU container's "
        "direct classifier path is cheaper than measured here.",
        "- FastAPI + onnxruntime: `bench/fastapi_app.py`, written as FastAPI's docs suggest "
        "(pydantic request model, model loaded in `lifespan`, a plain `def` endpoint run in the "
        "thread pool), served by uvicorn with one worker (its default; the targets' reference) "
        "and, for context, two workers (one per core). It returns labels and probabilities, the "
        "work `pipeline` does.",
        "- MLServer 1.7.1: the custom runtime `bench/mlserver_runtime.py` (MLServer ships no ONNX "
        "runtime) with adaptive batching, `max_batch_size` 64 and `max_batch_time` 100 µs like "
        "Triton's dynamic batcher, default `parallel_workers` (one inference process); average "
        "batch size from a histogram the runtime exports.",
        '- Labels by Triton: the `classification` variant adds `label_filename: "labels.txt"` '
        "to `classifier`'s output and the request asks for `classification: 1` on `class`: "
        "Triton's classification extension returns `score:index:label`, no Python model "
        "involved.",
        "- HTTP load: wrk (C, one thread, keep-alive connections = concurrency, closed loop), "
        "replaying one fixed body; its CPU comes from the kernel's accounting of the process. "
        "gRPC load: Python processes (2) replaying a pre-serialised ModelInferRequest on "
        "grpc.aio channels; they cost far more CPU per request than wrk, so gRPC rows compare "
        "load generators as much as protocols: read the generator CPU column. perf_analyzer "
        "(the right tool) is not installable without the SDK image; see the GPU section.",
        "- Latency percentiles are wrk's, which corrects for coordinated omission: for a "
        "request that took L, longer than twice a connection's mean interval e, it adds the "
        "samples L-e, L-2e, ... that requests sent at the steady rate would have seen. One stall "
        "therefore moves p95 and p99 far more than its own count would; the same correction is "
        "applied to the gRPC samples.",
        "- Stalls: a point is flagged when its requests waited on average more than 5 ms in "
        "a model's queue (Triton's `nv_inference_queue_duration_us`; the configured delay "
        "is at most 2 ms) while the server used under 40% of the machine. Cause, found by "
        "elimination (the queue policy family): a queue policy (`max_queue_size` or a default "
        "timeout) turns off the dynamic batcher's payload prefetching (core's "
        "`PriorityQueue::SupportPrefetching`); the batcher then hands work only to an idle "
        "instance, and Triton 2.51 does not wake it when a busy instance becomes idle. The Python "
        "backend sends a response before its `execute` returns, so a fast client's next request "
        "arrives while the only instance still counts as busy, and it waits for the batcher's "
        "500 ms idle timeout (`default_wait_microseconds` in dynamic_batch_scheduler.cc). "
        "Without the policy no stall was seen, with one instance or two. The committed configs "
        "therefore have no queue policy (the gateway refuses overload instead); the "
        "`queue-policy*` variants keep the stall measurable.",
        "- CPU by process: user + system time of tritonserver and of each model's stub "
        "processes over a point's repetitions, divided by the requests answered. Stub profiles: "
        "py-spy 0.4 (`record --native`, 250 Hz) on every stub of the models a request passes "
        "through, 16 clients, one repetition's length; py-spy needs to ptrace the stubs (root, "
        "or the same user with `kernel.yama.ptrace_scope` at most 1; containers need "
        "`CAP_SYS_PTRACE`), and the report says `not profiled` with the reason otherwise.",
        "- Average batch size: deltas of Triton's `nv_inference_count` / "
        "`nv_inference_exec_count` for `classifier` over the repetitions.",
        "- Server CPU: user + system time of the server's process tree (tritonserver and its "
        "stubs; uvicorn; MLServer and its worker) over each repetition. On 2 cores, server plus "
        "generator near 2.0 means the CPU is the limit, and throughput is then set by the CPU "
        "cost per request (given in the targets table).",
        "- Saturation: a point is flagged when the generator used more than 45% of the machine, "
        "or when throughput x mean latency shows far fewer requests in flight than clients.",
        "",
    ]
    out += [
        "## How to reproduce",
        "",
        "```bash",
        "apt-get install wrk                 # the HTTP load generator",
        "pip install -e '.[bench]'           # from a checkout: py-spy for the stub profiles",
        "python -m bench                     # full run: this file and docs/benchmarks/*.png",
        "python -m bench --quick --out /tmp/bench   # smoke run, < 3 min, every scenario family",
        "python -m bench --scenarios llm --merge    # the LLM family alone (make llm), merged in",
        "python -m bench --scenarios own --merge    # your own models alone, merged in",
        "```",
        "",
        "The baselines install once into `~/.cache/tritonstack/bench-venv-<hash>` from "
        "`bench/requirements-baselines.txt` (FastAPI app: `bench/fastapi_app.py`; MLServer "
        "runtime: `bench/mlserver_runtime.py`). Triton variants are copies of `model_repository/` "
        "with one field changed (`bench/variants.py`).",
        "",
        "## On a GPU host: perf_analyzer under compose",
        "",
        "The compose profile `bench` runs perf_analyzer from the Triton SDK image (same release as "
        "the server) against the running stack, for the same models and both protocols, and "
        "writes CSVs to `results/`:",
        "",
        "```bash",
        "docker compose --profile bench run --rm perf-analyzer",
        "```",
        "",
        "Service definition:",
        "",
        "```yaml",
        COMPOSE_BENCH.rstrip(),
        "```",
        "",
    ]
    return out


#: The GPU check's report (tests/gpu/run.sh --report), next to results.json.
GPU_CHECK = "gpu-check.json"


def gpu_check_section(report: dict | None) -> list[str]:
    """The GPU check's report from a GPU machine, or what to run where none has been."""
    out = ["## On a GPU: the GPU check", ""]
    if report is None:
        return [
            *out,
            "Not run yet: no session has had a GPU machine since `tests/gpu/run.sh` was "
            "written. On one: `python -m tests.gpu.prepare` where PyPI is reachable, then "
            f"`tests/gpu/run.sh --report docs/benchmarks/{GPU_CHECK}` on the GPU machine, then "
            "`python -m bench --render` to put its report here "
            "([testing.md](testing.md#the-gpu-check-testsgpu) says what it checks).",
            "",
        ]
    lines = report["markdown"].rstrip().splitlines()
    heading = lines[0].removeprefix("# ")
    return [*out, f"Run by `tests/gpu/run.sh`: {heading}.", "", *lines[1:], ""]


def render_pending() -> str:
    """docs/benchmarks.md before the first full run on a quiet machine."""
    return "\n".join(
        [
            "# Benchmarks",
            "",
            "**No full run recorded yet.** `python -m bench` replaces this file with a full "
            "run's tables and plots (about 15 minutes on a quiet 2-core machine). It measures: "
            + "; ".join(FAMILIES.values())
            + ". Targets it evaluates: "
            + "; ".join(TARGET_NAMES)
            + ".",
            "",
            *method_sections(),
        ]
    )


def series(results: dict) -> dict[str, list[tuple[int, float, float]]]:
    """{series label: [(concurrency, req/s, p99 ms)]} for HTTP/JSON points, 2+ points each."""
    found: dict[str, list[tuple[int, float, float]]] = {}
    for point in results["points"]:
        if point["protocol"] != "http-json":
            continue
        spec = SERVERS[point["server"]]
        label = spec.title if spec.baseline else f"{spec.title}: {point['model']}"
        s = point["summary"]
        found.setdefault(label, []).append(
            (point["concurrency"], s["rps"]["median"], s["p99_ms"]["median"])
        )
    return {k: sorted(v) for k, v in found.items() if len(v) >= 2}


def plot(results: dict, directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    data = series(results)
    suffix = " [QUICK: smoke numbers]" if results["meta"]["quick"] else ""
    written = []
    for name, title in PLOTS.items():
        figure, axes = plt.subplots(figsize=(8, 5), dpi=100)
        for label, points in data.items():
            c, rps, p99 = zip(*points, strict=True)
            if name == "throughput":
                axes.plot(c, rps, marker="o", label=label)
            else:
                axes.plot(rps, p99, marker="o", label=label)
        if name == "throughput":
            axes.set_xscale("log", base=2)
            ticks = sorted({c for points in data.values() for c, _, _ in points})
            axes.set_xticks(ticks, [str(c) for c in ticks])
            axes.set_xlabel("concurrent clients")
            axes.set_ylabel("requests/s")
        else:
            axes.set_yscale("log")
            axes.set_xlabel("requests/s")
            axes.set_ylabel("p99 latency (ms)")
        axes.set_title(title + suffix, fontsize=10)
        axes.grid(True, alpha=0.3)
        if data:
            axes.legend(fontsize=8)
        figure.tight_layout()
        path = directory / f"{name}.png"
        figure.savefig(path, metadata={"Software": None})
        plt.close(figure)
        written.append(path)
    return written


def read_gpu_check(out: Path) -> dict | None:
    path = Path(out) / "benchmarks" / GPU_CHECK
    return json.loads(path.read_text()) if path.is_file() else None


def read_results(out: Path) -> dict:
    """The results.json a run wrote into `out` (what --merge adds to)."""
    path = Path(out) / "benchmarks" / "results.json"
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"--merge: cannot read {path} ({exc.strerror}): no run to add to") from None


def write(results: dict, out: Path, plots: bool = True) -> list[Path]:
    """results.json, the page rendered from it, and (with `plots`: the run measured the
    plotted families) the plots."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = plot(results, out / "benchmarks") if plots else []
    data = out / "benchmarks" / "results.json"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return [rerender(out), data, *written]


def rerender(out: Path) -> Path:
    """benchmarks.md again from the committed results.json (and the GPU check's report)."""
    out = Path(out)
    results = json.loads((out / "benchmarks" / "results.json").read_text())
    markdown = out / "benchmarks.md"
    markdown.write_text(render_markdown(results, read_gpu_check(out)))
    return markdown
