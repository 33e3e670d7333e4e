"""Pass/fail gates at the end of a run, the Locust way: a `quitting` listener sets the exit code.

Why here and not in the wrapper that reads the CSV afterwards: the listener sees Locust's own
statistics at the moment the run ends, the same numbers whatever started Locust -- `tritonstack
loadtest`, a plain `locust --headless --max-p99-ms 50` in any CI, or a distributed master, whose
statistics aggregate every worker's. The stats CSV is rewritten only once a second, so its last
version can miss the final second of requests; the verdict file written here cannot.

Options: `--max-p99-ms` (Locust's p99 over all requests; Locust keeps response times below 100 ms
to the millisecond), `--max-fail-ratio` (failed / all requests, content validation failures
included), `--max-ttft-p99-ms` and `--max-itl-p99-ms` (the LLM user's time to first token and
inter-token latency), and `--verdict-file` (JSON with the measured values and the failed gates,
which `tritonstack loadtest` reads). With a gate set, a run that completed no request fails too,
so an unreachable server cannot pass; a passing run exits 0 even with tolerated failures.

The LLM user reports each answer's time to first token and each gap between its tokens as
entries of their own request types (TTFT, ITL), beside the request itself: Locust's tables, charts
and distributed statistics then show them like any request. They are timings within a request,
not requests, so the totals gated here leave them out.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

GATE_FAILED_EXIT_CODE = 3  # Locust itself uses 1 (request failures) and 2 (unhandled error)
#: Locust request types of the LLM user's timings (time to first token, inter-token latency).
TTFT = "TTFT"
ITL = "ITL"
TIMINGS = {TTFT: "--max-ttft-p99-ms", ITL: "--max-itl-p99-ms"}

logger = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--max-p99-ms",
        type=float,
        default=None,
        env_var="LOCUST_MAX_P99_MS",
        include_in_web_ui=False,
        help="fail (exit code 3) when the p99 response time exceeds this many ms",
    )
    parser.add_argument(
        "--max-fail-ratio",
        type=float,
        default=None,
        env_var="LOCUST_MAX_FAIL_RATIO",
        include_in_web_ui=False,
        help="fail (exit code 3) when failed/all requests exceeds this ratio (0-1)",
    )
    parser.add_argument(
        "--max-ttft-p99-ms",
        type=float,
        default=None,
        env_var="LOCUST_MAX_TTFT_P99_MS",
        include_in_web_ui=False,
        help="fail (exit code 3) when the LLM's p99 time to first token exceeds this many ms",
    )
    parser.add_argument(
        "--max-itl-p99-ms",
        type=float,
        default=None,
        env_var="LOCUST_MAX_ITL_P99_MS",
        include_in_web_ui=False,
        help="fail (exit code 3) when the LLM's p99 inter-token latency exceeds this many ms",
    )
    parser.add_argument(
        "--verdict-file",
        default="",
        env_var="LOCUST_VERDICT_FILE",
        include_in_web_ui=False,
        help="write the final numbers and failed gates as JSON to this file",
    )


def _merged(stats, entries, name: str):
    """One StatsEntry holding all of `entries` (Locust's own way of adding entries up)."""
    from locust.stats import StatsEntry

    merged = StatsEntry(stats, name, "")
    for entry in entries:
        merged.extend(entry)
    return merged


def _percentiles(entry) -> dict:
    def percentile(q: float) -> float | None:
        return entry.get_response_time_percentile(q) if entry.num_requests else None

    return {"p50_ms": percentile(0.50), "p95_ms": percentile(0.95), "p99_ms": percentile(0.99)}


def measure(stats) -> dict:
    """Locust's totals: request counts, percentiles (ms), throughput; and, when the LLM user
    ran, its timings (`ttft`, `itl`: count and percentiles), kept out of the totals."""
    timings = {kind: [] for kind in TIMINGS}
    requests = []
    for (_name, method), entry in stats.entries.items():
        timings.get(method, requests).append(entry)
    has_timings = any(entries for entries in timings.values())
    total = _merged(stats, requests, "Requests") if has_timings else stats.total
    measured = {
        "requests": total.num_requests,
        "failures": total.num_failures,
        "fail_ratio": total.fail_ratio,
        **_percentiles(total),
        "rps": total.total_rps,
    }
    for kind, entries in timings.items():
        merged = _merged(stats, entries, kind) if entries else None
        measured[kind.lower()] = (
            {"count": merged.num_requests, **_percentiles(merged)} if merged else None
        )
    return measured


def evaluate(
    measured: dict,
    max_p99_ms: float | None,
    max_fail_ratio: float | None,
    max_ttft_p99_ms: float | None = None,
    max_itl_p99_ms: float | None = None,
) -> list[str]:
    """One line per failed gate, naming the gate and the measured value."""
    limits = {TTFT: max_ttft_p99_ms, ITL: max_itl_p99_ms}
    if max_p99_ms is None and max_fail_ratio is None and set(limits.values()) == {None}:
        return []
    if not measured["requests"]:
        return ["no request completed"]
    failed = []
    if max_p99_ms is not None and measured["p99_ms"] > max_p99_ms:
        failed.append(f"p99 {measured['p99_ms']:g} ms > --max-p99-ms {max_p99_ms:g}")
    if max_fail_ratio is not None and measured["fail_ratio"] > max_fail_ratio:
        failed.append(
            f"fail ratio {measured['fail_ratio']:.4f} > --max-fail-ratio {max_fail_ratio:g}"
        )
    for kind, limit in limits.items():
        timing = measured.get(kind.lower())
        if limit is None:
            continue
        if not timing or not timing["count"]:
            failed.append(f"no {kind} measured for {TIMINGS[kind]} (only the LLM user reports it)")
        elif timing["p99_ms"] > limit:
            failed.append(f"{kind} p99 {timing['p99_ms']:g} ms > {TIMINGS[kind]} {limit:g}")
    return failed


def on_quitting(environment, **_kwargs) -> None:
    from locust.log import unhandled_greenlet_exception
    from locust.runners import WorkerRunner

    options = environment.parsed_options
    if options is None or isinstance(environment.runner, WorkerRunner):
        return  # a worker's statistics are partial; its master judges the run
    measured = measure(environment.stats)
    limits = {
        "max_p99_ms": options.max_p99_ms,
        "max_fail_ratio": options.max_fail_ratio,
        "max_ttft_p99_ms": options.max_ttft_p99_ms,
        "max_itl_p99_ms": options.max_itl_p99_ms,
    }
    gates_set = set(limits.values()) != {None}
    failed = evaluate(measured, **limits)
    for line in failed:
        logger.error("gate failed: %s", line)
    if failed:
        environment.process_exit_code = GATE_FAILED_EXIT_CODE
    elif gates_set and not unhandled_greenlet_exception:  # a crash in a user still fails
        environment.process_exit_code = 0  # failures within --max-fail-ratio are tolerated
    if options.verdict_file:
        verdict = {**measured, "gates": limits, "failed": failed}
        Path(options.verdict_file).parent.mkdir(parents=True, exist_ok=True)
        Path(options.verdict_file).write_text(json.dumps(verdict, indent=2) + "\n")


def register(events) -> None:
    """Hook the gates into Locust's events (called once, from locustfile.py)."""
    events.init_command_line_parser.add_listener(add_arguments)
    events.quitting.add_listener(on_quitting)
