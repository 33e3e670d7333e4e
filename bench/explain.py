"""Why a throughput target is met or missed, from where each request's CPU went.

On a CPU-bound machine throughput is the cores the server gets divided by the CPU one request
costs, so a ratio target between two points is a ratio of costs. The bench measures that cost
per process (tritonserver and each model's stub) and samples the stubs with py-spy; this module
turns both into the report's tables and into bounds: the best ratio reachable even if a model's
own Python cost nothing. Pure functions of the results dict, so they are unit-tested.
"""

from __future__ import annotations

from bench.scenarios import SERVERS, TRITON, point_key

JSON = "http-json"
#: Below this many µs per request a process only idled (a stub the request never reached).
IDLE_US = 0.5
STUBS = ("classifier", "postprocess", "classify")
#: (label, server, model, concurrency) of the rows in the CPU table: the targets' points.
CPU_ROWS = (
    ("`classifier` direct, c=16", TRITON, "classifier", 16),
    ("`pipeline` (ensemble), c=16", TRITON, "pipeline", 16),
    ("`classify` (BLS), c=16", TRITON, "classify", 16),
    ("`classifier` batching off, c=32", "triton:batching-off", "classifier", 32),
    ("`classifier` batching on, c=32", TRITON, "classifier", 32),
    ("FastAPI + onnxruntime, c=16", "fastapi", "classifier", 16),
    ("FastAPI + onnxruntime, 2 workers, c=16", "fastapi-x2", "classifier", 16),
)


def _point(results: dict, server: str, model: str, c: int) -> dict | None:
    wanted = point_key(server, model, JSON, c)
    return next((p for p in results["points"] if p["key"] == wanted), None)


def _costs(point: dict | None) -> dict[str, float]:
    return dict(point.get("cpu_by_process_us") or {}) if point else {}


def _total(point: dict | None) -> float | None:
    costs = _costs(point)
    return sum(costs.values()) if costs else None


def _busy(point: dict, cores: int) -> float:
    """Share of the machine the server and the load generator used together."""
    summary = point["summary"]
    return (summary["server_cores"] + summary["generator_cores"]) / cores


def cpu_table(results: dict) -> str:
    """µs of CPU per answered request, by process, for the targets' points."""
    lines = [
        "| request | tritonserver | `classifier` stub | `postprocess` stub | `classify` stub "
        "| total µs/request | server + generator (share of the machine) | req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cores = results["meta"]["cores"]
    for label, server, model, c in CPU_ROWS:
        point = _point(results, server, model, c)
        costs = _costs(point)
        if not costs:
            continue
        # a stub the request never reached still burns a little CPU idling: shown blank
        cells = [
            f"{costs[k]:.0f}" if costs.get(k, 0) >= IDLE_US else ""
            for k in ("tritonserver", *STUBS)
        ]
        if SERVERS[server].kind == "fastapi":
            cells = ["", "", "", ""]  # one uvicorn process: only the total is meaningful
        lines.append(
            f"| {label} | " + " | ".join(cells) + f" | {sum(costs.values()):.0f} | "
            f"{_busy(point, cores):.0%} | {point['summary']['rps']['median']:,.0f} |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def profile_table(results: dict) -> str:
    """py-spy's view of each stub: how much of its busy time is the model's own Python."""
    profiles = results.get("profiles") or {}
    lines = [
        "| request sent to | stub | busy samples | in the model's own code | its top lines "
        "(share of the stub's busy samples) |",
        "|---|---|---:|---:|---|",
    ]
    for sent, found in profiles.items():
        if "error" in found:
            lines.append(f"| `{sent}` | | | | not profiled: {found['error']} |")
            continue
        for stub, p in found.items():
            if not p["samples"]:
                continue
            top = "; ".join(
                f"`{where}` `{source}` {n / p['samples']:.0%}"
                for where, source, n in p["top_lines"][:3]
            )
            lines.append(
                f"| `{sent}` | `{stub}` | {p['samples']:,} | "
                f"{p['in_model_code'] / p['samples']:.0%} | {top.replace('|', '/')} |"
            )
    return "\n".join(lines) if len(lines) > 2 else ""


def model_code_share(results: dict, sent: str, stub: str) -> float | None:
    found = (results.get("profiles") or {}).get(sent) or {}
    profile = found.get(stub) if "error" not in found else None
    if not profile or not profile["samples"]:
        return None
    return profile["in_model_code"] / profile["samples"]


def _ratio_bound(results: dict, sent: str, own_stub: str, floor: float) -> str | None:
    """Why `sent` reaches only so much of the direct classifier's throughput (16 clients)."""
    direct = _point(results, TRITON, "classifier", 16)
    point = _point(results, TRITON, sent, 16)
    if not _costs(direct) or not _costs(point):
        return None
    c_direct, c_sent = _total(direct), _total(point)
    costs = _costs(point)
    budget = c_direct / floor
    server = costs.get("tritonserver", 0.0)
    stub = costs.get(own_stub, 0.0)
    share = model_code_share(results, sent, own_stub)
    if _rps(point) >= floor * _rps(direct):
        return (
            f"**`{sent}` ≥ {floor:g}x the direct classifier: met**, at {c_sent:.0f} µs per "
            f"request against {c_direct:.0f} µs direct."
        )
    text = (
        f"**`{sent}` ≥ {floor:g}x the direct classifier.** At 16 clients the machine is "
        f"{_busy(point, results['meta']['cores']):.0%} busy, so throughput follows CPU per "
        f"request: `{sent}` costs {c_sent:.0f} µs against {c_direct:.0f} µs direct "
        f"(cost ratio {c_direct / c_sent:.2f}x; measured {_rps(point) / _rps(direct):.2f}x). "
        f"{floor:g}x needs at most {budget:.0f} µs per request. tritonserver spends "
        f"{server:.0f} µs on a `{sent}` request (vs {_costs(direct).get('tritonserver', 0):.0f} "
        "direct: the extra model step and its second backend round trip)"
        + (
            ", more than the whole budget before any Python runs."
            if server >= budget
            else f", leaving {budget - server:.0f} µs for the stubs; they take "
            f"{c_sent - server:.0f}."
        )
    )
    if share is not None:
        own = stub * share
        text += (
            f" py-spy puts {share:.0%} of the `{own_stub}` stub's busy time in its own code "
            f"(≈ {own:.0f} µs per request); were that free, `{sent}` would still cost "
            f"{c_sent - own:.0f} µs: at most {c_direct / (c_sent - own):.2f}x."
        )
    text += (
        f" Even with the `{own_stub}` stub costing nothing it would be "
        f"{c_direct / (c_sent - stub):.2f}x at best. The Python backend's per-hop cost, not "
        "the model code, sets this limit on this runtime (see Method for why the CPU runtime's "
        "classifier is itself a stub)."
    )
    return text


def _rps(point: dict) -> float:
    return point["summary"]["rps"]["median"]


def _fastapi_bound(results: dict, floor: float = 3.0) -> str | None:
    pipeline = _point(results, TRITON, "pipeline", 16)
    fastapi = _point(results, "fastapi", "classifier", 16)
    if not _costs(pipeline) or not fastapi:
        return None
    cores = results["meta"]["cores"]
    need = floor * _rps(fastapi)
    cost = _total(pipeline)
    usable = cores - pipeline["summary"]["generator_cores"]
    two_workers = _point(results, "fastapi-x2", "classifier", 16)
    context = (
        f" For context, FastAPI with two uvicorn workers (one per core, not the target's "
        f"reference) serves {_rps(two_workers):,.0f} req/s at 16 clients: `pipeline` is "
        f"{_rps(pipeline) / _rps(two_workers):.2f}x of that. On this CPU runtime, where even "
        "the classifier is a Python stub, Triton's edge over a tuned single-model web app is "
        "the direct and no-Python paths (the classifier, the classification extension), not "
        "a two-stub pipeline."
        if two_workers
        else ""
    )
    if _rps(pipeline) >= need:
        return f"**`pipeline` ≥ {floor:g}x FastAPI: met**, at {cost:.0f} µs per request.{context}"
    return (
        f"**`pipeline` ≥ {floor:g}x FastAPI.** {floor:g}x FastAPI's {_rps(fastapi):,.0f} req/s "
        f"is {need:,.0f} req/s; at `pipeline`'s {cost:.0f} µs per request that takes "
        f"{need * cost / 1e6:.2f} cores, and the server has {usable:.2f} (the machine minus the "
        f"load generator): at most {usable / (cost / 1e6) / _rps(fastapi):.2f}x. The direct "
        f"classifier, at {_total(_point(results, TRITON, 'classifier', 16)) or 0:.0f} µs, "
        "clears the bar; the two Python hops of the pipeline do not (next item)." + context
    )


def _batching_bound(results: dict, floor: float = 2.0) -> str | None:
    on = _point(results, TRITON, "classifier", 32)
    off = _point(results, "triton:batching-off", "classifier", 32)
    if not _costs(on) or not _costs(off):
        return None
    cores = results["meta"]["cores"]
    cost_on, cost_off = _total(on), _total(off)
    p50 = on["summary"]["p50_ms"]
    server_on, server_off = _costs(on).get("tritonserver", 0), _costs(off).get("tritonserver", 0)
    if _rps(on) >= floor * _rps(off):
        return (
            f"**Batching ≥ {floor:g}x at 32 clients: met**; a request costs {cost_on:.0f} µs "
            f"batched against {cost_off:.0f} µs unbatched."
        )
    return (
        f"**Batching ≥ {floor:g}x at 32 clients.** Batching cuts a request's CPU from "
        f"{cost_off:.0f} to {cost_on:.0f} µs ({cost_off / cost_on:.2f}x): the stub's cost is "
        f"shared by the batch, but tritonserver's HTTP and scheduling work per request "
        f"({server_off:.0f} µs off, {server_on:.0f} µs on) is not. With batching on the machine "
        f"was {_busy(on, cores):.0%} busy at 32 clients: throughput there is set by 32 requests "
        f"in flight over a {p50:.2f} ms median round trip (queue delay included), not by CPU; "
        f"batching off was {_busy(off, cores):.0%} busy. The CPU-bound ceiling of the ratio is "
        f"{cost_off / cost_on:.2f}x; more clients (the concurrency sweep's 64) get closer to it."
    )


def explanations(results: dict) -> list[str]:
    """One paragraph per target, each bounded by this run's per-process CPU and profiles."""
    found = [
        _fastapi_bound(results),
        _ratio_bound(results, "pipeline", "postprocess", 0.8),
        _ratio_bound(results, "classify", "classify", 0.8),
        _batching_bound(results),
    ]
    return [f"- {text}" for text in found if text]
