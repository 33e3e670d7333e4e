"""Pass/fail gates at the end of a run, the Locust way: a `quitting` listener sets the exit code.

Why here and not in the wrapper that reads the CSV afterwards: the listener sees Locust's own
statistics at the moment the run ends, the same numbers whatever started Locust -- `tritonstack
loadtest`, a plain `locust --headless --max-p99-ms 50` in any CI, or a distributed master, whose
statistics aggregate every worker's. The stats CSV is rewritten only once a second, so its last
version can miss the final second of requests; the verdict file written here cannot.

Options: `--max-p99-ms` (Locust's p99 over all requests; Locust keeps response times below 100 ms
to the millisecond), `--max-fail-ratio` (failed / all requests, content validation failures
included), and `--verdict-file` (JSON with the measured values and the failed gates, which
`tritonstack loadtest` reads). With a gate set, a run that completed no request fails too, so an
unreachable server cannot pass; a passing run exits 0 even with tolerated failures.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

GATE_FAILED_EXIT_CODE = 3  # Locust itself uses 1 (request failures) and 2 (unhandled error)

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
        "--verdict-file",
        default="",
        env_var="LOCUST_VERDICT_FILE",
        include_in_web_ui=False,
        help="write the final numbers and failed gates as JSON to this file",
    )


def measure(stats) -> dict:
    """Locust's totals: request counts, percentiles (ms), throughput."""
    total = stats.total
    return {
        "requests": total.num_requests,
        "failures": total.num_failures,
        "fail_ratio": total.fail_ratio,
        "p50_ms": total.get_response_time_percentile(0.50) if total.num_requests else None,
        "p95_ms": total.get_response_time_percentile(0.95) if total.num_requests else None,
        "p99_ms": total.get_response_time_percentile(0.99) if total.num_requests else None,
        "rps": total.total_rps,
    }


def evaluate(measured: dict, max_p99_ms: float | None, max_fail_ratio: float | None) -> list[str]:
    """One line per failed gate, naming the gate and the measured value."""
    if max_p99_ms is None and max_fail_ratio is None:
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
    return failed


def on_quitting(environment, **_kwargs) -> None:
    from locust.log import unhandled_greenlet_exception
    from locust.runners import WorkerRunner

    options = environment.parsed_options
    if options is None or isinstance(environment.runner, WorkerRunner):
        return  # a worker's statistics are partial; its master judges the run
    measured = measure(environment.stats)
    gates_set = (options.max_p99_ms, options.max_fail_ratio) != (None, None)
    failed = evaluate(measured, options.max_p99_ms, options.max_fail_ratio)
    for line in failed:
        logger.error("gate failed: %s", line)
    if failed:
        environment.process_exit_code = GATE_FAILED_EXIT_CODE
    elif gates_set and not unhandled_greenlet_exception:  # a crash in a user still fails
        environment.process_exit_code = 0  # failures within --max-fail-ratio are tolerated
    if options.verdict_file:
        verdict = {
            **measured,
            "gates": {"max_p99_ms": options.max_p99_ms, "max_fail_ratio": options.max_fail_ratio},
            "failed": failed,
        }
        Path(options.verdict_file).parent.mkdir(parents=True, exist_ok=True)
        Path(options.verdict_file).write_text(json.dumps(verdict, indent=2) + "\n")


def register(events) -> None:
    """Hook the gates into Locust's events (called once, from locustfile.py)."""
    events.init_command_line_parser.add_listener(add_arguments)
    events.quitting.add_listener(on_quitting)
