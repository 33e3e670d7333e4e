"""Client-side metrics for Prometheus, served by every Locust process.

Triton reports how long a request spent *inside* the server, as cumulative sums: no percentiles,
and nothing about the network, the HTTP/gRPC frontends' queues or the client. This exporter adds
the client's view as a histogram, so p50/p95/p99 come from Prometheus across all processes:

    histogram_quantile(0.99, sum by (le, model) (
        rate(tritonstack_client_request_duration_seconds_bucket[1m])))

Metrics (labels `user_type`: http_json | http_binary | grpc | llm_stream, `model`: classifier |
pipeline | classify | llm):

- `tritonstack_client_request_duration_seconds` histogram, buckets 0.5 ms to 500 ms (the
  classifier's requests);
- `tritonstack_client_requests_total` counter, every request, failed or not (as Locust counts);
- `tritonstack_client_failures_total` counter, failed requests, including answers that failed
  content validation;
- the LLM user's: `tritonstack_client_llm_request_duration_seconds` (a whole streamed answer,
  buckets 0.1 s to 60 s), `tritonstack_client_llm_time_to_first_token_seconds` and
  `tritonstack_client_llm_inter_token_latency_seconds` (buckets as the `vllm:*` histograms of
  Triton's vLLM backend, the ITL's from 1 ms), `tritonstack_client_llm_output_tokens_total`.

Recorded from Locust's `request` event, which every user type fires (FastHttpUser itself, the gRPC
user by hand), so all types count alike. The event fires in the process that ran the request: in
a distributed run each worker counts its own requests and the master, which only receives
aggregated statistics, counts nothing; Prometheus sums the workers.

Served on LOCUST_METRICS_ADDR:LOCUST_METRICS_PORT (default 127.0.0.1:9646; the Locust image sets
0.0.0.0, what compose and Kubernetes scrape; port 0 serves nothing). `--metrics-snapshot FILE`
also writes the final exposition text when the process quits, because a headless run's endpoint
is gone once Locust exits.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import gates
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
)

DEFAULT_PORT = 9646
#: Loopback unless told otherwise: the Locust image sets LOCUST_METRICS_ADDR=0.0.0.0 so that
#: Prometheus on the compose network or in the cluster can scrape it.
DEFAULT_ADDR = "127.0.0.1"
LABELS = ("user_type", "model")
BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5,
)  # fmt: skip

#: The LLM's: time to first token as vllm:time_to_first_token_seconds, inter-token latency as
#: vllm:time_per_output_token_seconds below 10 ms too (a small model on a GPU is that fast), a
#: whole answer as vllm:e2e_request_latency_seconds below 1 s too.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5,
)  # fmt: skip
LLM_REQUEST_BUCKETS = (
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
)  # fmt: skip

disable_created_metrics()  # no `_created` series: dashboards and rules never use them
REGISTRY = CollectorRegistry()
DURATION = Histogram(
    "tritonstack_client_request_duration_seconds",
    "Request latency seen by the Locust client, from sending to the last byte of the answer.",
    LABELS,
    buckets=BUCKETS,
    registry=REGISTRY,
)
REQUESTS = Counter(
    "tritonstack_client_requests",
    "Requests completed by Locust users, failed ones included.",
    LABELS,
    registry=REGISTRY,
)
FAILURES = Counter(
    "tritonstack_client_failures",
    "Requests that failed: transport error, non-200 status, or an answer that failed validation.",
    LABELS,
    registry=REGISTRY,
)

LLM_DURATION = Histogram(
    "tritonstack_client_llm_request_duration_seconds",
    "Streamed LLM answer seen by the Locust client, from sending to the last event.",
    LABELS,
    buckets=LLM_REQUEST_BUCKETS,
    registry=REGISTRY,
)
LLM_TTFT = Histogram(
    "tritonstack_client_llm_time_to_first_token_seconds",
    "Time from sending a generate_stream request to the first event carrying a token.",
    LABELS,
    buckets=TTFT_BUCKETS,
    registry=REGISTRY,
)
LLM_ITL = Histogram(
    "tritonstack_client_llm_inter_token_latency_seconds",
    "Time between consecutive token-carrying events of a streamed answer.",
    LABELS,
    buckets=ITL_BUCKETS,
    registry=REGISTRY,
)
LLM_TOKENS = Counter(
    "tritonstack_client_llm_output_tokens",
    "Output tokens received in streamed LLM answers, failed answers included.",
    LABELS,
    registry=REGISTRY,
)
#: Request types that are timings within a request (gates.py), not requests.
TIMINGS = {gates.TTFT: LLM_TTFT, gates.ITL: LLM_ITL}

logger = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--metrics-snapshot",
        default="",
        env_var="LOCUST_METRICS_SNAPSHOT",
        include_in_web_ui=False,
        help="when Locust quits, write the exporter's metrics (Prometheus text) to this file",
    )


def on_request(response_time, request_type="", exception=None, context=None, **_kwargs) -> None:
    context = context or {}
    labels = (context.get("user_type", "unknown"), context.get("model", "unknown"))
    if request_type in TIMINGS:
        TIMINGS[request_type].labels(*labels).observe(response_time / 1000.0)
        return
    tokens = context.get("output_tokens")  # set by the LLM user only
    if tokens is None:
        DURATION.labels(*labels).observe(response_time / 1000.0)
    else:
        LLM_DURATION.labels(*labels).observe(response_time / 1000.0)
        LLM_TOKENS.labels(*labels).inc(tokens)
    REQUESTS.labels(*labels).inc()
    failures = FAILURES.labels(*labels)  # exists at 0 from the first request: rate() sees it start
    if exception is not None:
        failures.inc()


def serve(environment) -> None:
    """Start the /metrics server in this process (gevent's WSGI server: Locust runs on gevent)."""
    from gevent.pywsgi import WSGIServer

    port = int(os.environ.get("LOCUST_METRICS_PORT") or DEFAULT_PORT)
    addr = os.environ.get("LOCUST_METRICS_ADDR") or DEFAULT_ADDR
    if port == 0:
        return
    server = WSGIServer((addr, port), make_wsgi_app(REGISTRY), log=None)
    try:
        server.start()
    except OSError as exc:
        # e.g. `locust --processes N` on one host: the first process serves, the others warn.
        logger.warning("metrics exporter not started on %s:%d: %s", addr, port, exc.strerror)
        return
    logger.info("metrics exporter on http://%s:%d/metrics", addr, port)
    environment.events.quit.add_listener(lambda **_: server.stop(timeout=1))


def write_snapshot(environment, **_kwargs) -> None:
    path = environment.parsed_options and environment.parsed_options.metrics_snapshot
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(generate_latest(REGISTRY))


def register(events) -> None:
    """Hook the exporter into Locust's events (called once, from locustfile.py)."""
    events.init_command_line_parser.add_listener(add_arguments)
    events.request.add_listener(on_request)
    events.init.add_listener(lambda environment, **_: serve(environment))
    events.quitting.add_listener(write_snapshot)
