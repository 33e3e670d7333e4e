"""`tritonstack top`: a live per-model view of Triton's metrics, for hosts without Grafana.

Every value is a rate over two scrapes of Triton's cumulative counters, computed the way the
Prometheus recording rules compute them: average batch size is inferences / executions (not
requests / executions), and queue and compute times are per successful request.

Triton adds a request to `nv_inference_request_success` and its rows to `nv_inference_count` one
after the other (core's InferenceStatsAggregator::UpdateSuccess), and its executions to
`nv_inference_exec_count` later still (the backend reports the batch after its requests); a
scrape reads one family after the other. A request that completes while a scrape is being
written is in one counter and not yet in the next, so over a window the rates can disagree by a
request or two: 528.0 inferences/s against 528.7 requests/s was seen under load (one request in a
1.5 s window). Every successful request adds at least one inference (core counts max(1, batch
size)) and every execution at least one, so fewer inferences than requests, or a batch below 1,
is that skew and never the server's doing: `rates` shows the bound there (see _at_least).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from tritonstack.core.contract import LOOPBACK, METRICS_PORT, TRITON_HTTP_PORT
from tritonstack.core.errors import UserError

SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
INFERENCES = "nv_inference_count"
EXECUTIONS = "nv_inference_exec_count"
QUEUE_US = "nv_inference_queue_duration_us"
COMPUTE_US = "nv_inference_compute_infer_duration_us"
COUNTERS = (SUCCESS, FAILURE, INFERENCES, EXECUTIONS, QUEUE_US, COMPUTE_US)

CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen

#: {(sample name, frozenset of label items): value}, as tritonstack.clients.metrics.scrape returns.
Samples = Mapping[tuple[str, frozenset], float]


@dataclass(frozen=True)
class ModelRates:
    """One model's activity between two scrapes (all versions summed)."""

    model: str
    requests_per_s: float
    inferences_per_s: float
    #: inferences per execution; None when the model executed nothing in the window
    batch_size: float | None
    #: queue / compute-infer microseconds per successful request; None without requests
    queue_us: float | None
    compute_us: float | None
    #: failures/s by Triton's `reason` label, only reasons that occurred
    failures_per_s: dict[str, float] = field(default_factory=dict)


def _increase(before: float | None, after: float) -> float:
    """A counter's increase; a smaller value means the server restarted (counted from 0)."""
    if before is None or after < before:
        return after
    return after - before


def _increases(before: Samples, after: Samples) -> dict[tuple[str, str, str], float]:
    """{(model, counter, failure reason or ''): increase}, per series first, then summed.

    Resets are detected per series (model version), as Prometheus' rate() does, before the
    versions of a model are added up.
    """
    totals: dict[tuple[str, str, str], float] = {}
    for (name, items), value in after.items():
        if name not in COUNTERS:
            continue
        labels = dict(items)
        if "model" not in labels:
            continue
        key = (labels["model"], name, labels.get("reason", "") if name == FAILURE else "")
        increase = _increase(before.get((name, items)), value)
        totals[key] = totals.get(key, 0.0) + increase
    return totals


def _at_least(value: float, bound: float) -> float:
    """`value`, or `bound` where a counter read a request earlier than the other (module doc)."""
    return max(value, bound)


def rates(before: Samples, after: Samples, seconds: float) -> list[ModelRates]:
    """Per-model rates between two scrapes `seconds` apart, sorted by model name.

    Models present only in `after` (loaded in between) count from zero, as Prometheus does.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    delta = _increases(before, after)
    models = sorted({model for model, name, _ in delta if name == SUCCESS})
    result = []
    for model in models:

        def get(name: str, model: str = model) -> float:
            return delta.get((model, name, ""), 0.0)

        requests = get(SUCCESS)
        executions = get(EXECUTIONS)
        inferences = _at_least(get(INFERENCES), requests)
        failures = {
            reason: value / seconds
            for (m, name, reason), value in sorted(delta.items())
            if m == model and name == FAILURE and value > 0
        }
        result.append(
            ModelRates(
                model=model,
                requests_per_s=requests / seconds,
                inferences_per_s=inferences / seconds,
                batch_size=_at_least(inferences / executions, 1.0) if executions else None,
                queue_us=get(QUEUE_US) / requests if requests else None,
                compute_us=get(COMPUTE_US) / requests if requests else None,
                failures_per_s=failures,
            )
        )
    return result


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


HEADER = (
    f"{'model':<16} {'req/s':>9} {'infer/s':>9} {'batch':>6} "
    f"{'queue µs':>9} {'compute µs':>10}  failures/s"
)


def table(rows: list[ModelRates]) -> str:
    """The rows as aligned plain text, one line per model under a header."""
    lines = [HEADER]
    for row in rows:
        failures = ", ".join(f"{name} {value:.1f}" for name, value in row.failures_per_s.items())
        lines.append(
            f"{row.model:<16} {row.requests_per_s:>9.1f} {row.inferences_per_s:>9.1f} "
            f"{_number(row.batch_size, 2):>6} {_number(row.queue_us):>9} "
            f"{_number(row.compute_us):>10}  {failures or '-'}"
        )
    return "\n".join(lines)


def _scrape(url: str) -> Samples:
    """One scrape, with any network or parse problem turned into a one-line UserError."""
    from tritonstack.clients.metrics import scrape

    try:
        samples = scrape(url, timeout=5.0)
    except Exception as exc:  # URLError, timeouts, connection resets, a non-metrics page
        reason = getattr(exc, "reason", None) or exc
        raise UserError(
            f"cannot read Triton's metrics at {url} ({reason}); is Triton running "
            "(`tritonstack serve` or `tritonstack up`)? --url sets the address"
        ) from None
    if not any(name == SUCCESS for name, _ in samples):
        raise UserError(f"{url} has no {SUCCESS}: is this Triton's metrics port ({METRICS_PORT})?")
    return samples


def sample(url: str, interval: float) -> tuple[list[ModelRates], float]:
    """Two scrapes `interval` seconds apart: (rates, measured seconds between them)."""
    before = _scrape(url)
    start = time.monotonic()
    time.sleep(interval)
    after = _scrape(url)
    seconds = time.monotonic() - start
    return rates(before, after, seconds), seconds


def not_loaded(server: str | None, timeout: float = 2.0) -> dict[str, str]:
    """{model: Triton's reason} for the models that failed to load, from the repository index
    of Triton at `server` (host:port of its own HTTP port; a restricted API, so this machine's
    admin key is sent); empty when it cannot be asked."""
    if not server:
        return {}
    import json
    import urllib.request

    from tritonstack.core.contract import ADMIN_HEADER
    from tritonstack.launcher.flags import local_admin_key

    try:
        request = urllib.request.Request(
            f"http://{server}/v2/repository/index",
            data=b"{}",
            headers={ADMIN_HEADER: local_admin_key()},
        )
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            index = json.load(answer)
    except Exception:  # another server, another key, a gateway in front: nothing to say
        return {}
    return {
        m["name"]: " ".join(m.get("reason", "").split()) or m.get("state", "")
        for m in index
        if m.get("state") not in ("READY", None)
    }


def unloaded_lines(server: str | None) -> str:
    return "".join(f"\nnot loaded: {name}: {why}" for name, why in not_loaded(server).items())


def _title(url: str, seconds: float) -> str:
    return f"Triton {url}  over {seconds:.1f} s  at {time.strftime('%H:%M:%S')}"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=f"http://{LOOPBACK}:{METRICS_PORT}/metrics",
        help="Triton's metrics URL (default: %(default)s)",
    )
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (default: 1)"
    )
    parser.add_argument(
        "--server",
        default=f"{LOOPBACK}:{TRITON_HTTP_PORT}",
        help="Triton's own HTTP host:port, asked which models failed to load and why "
        "(default: %(default)s, where `tritonstack serve` puts it; '' to skip)",
    )
    parser.add_argument(
        "--once", action="store_true", help="print one table (two scrapes --interval apart), exit"
    )


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UserError(f"--interval must be positive, got {args.interval}")
    if args.once:
        rows, seconds = sample(args.url, args.interval)
        print(_title(args.url, seconds))
        print(table(rows) + unloaded_lines(args.server), flush=True)
        return 0
    before = _scrape(args.url)  # an unreachable URL at start is an error, later a status line
    start = time.monotonic()
    try:
        while True:
            time.sleep(args.interval)
            try:
                after = _scrape(args.url)
            except UserError as exc:
                sys.stdout.write(f"{CLEAR}{exc}\nretrying every {args.interval:g} s\n")
                sys.stdout.flush()
                continue
            now = time.monotonic()
            rows = rates(before, after, now - start)
            shown = table(rows) + unloaded_lines(args.server)
            sys.stdout.write(f"{CLEAR}{_title(args.url, now - start)}\n{shown}\n\nCtrl-C quits\n")
            sys.stdout.flush()
            before, start = after, now
    except KeyboardInterrupt:
        print()
        return 0
