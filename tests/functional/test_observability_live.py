"""Every dashboard query and every recording rule, run against a real Prometheus.

The stack of the compose file, on loopback: the embedded tritonserver behind the gateway
(Debian's HAProxy running gateway/haproxy.cfg, tritonstack.serve.gateway), Debian's `prometheus`
with the project's prometheus.yml rendered for the test's ports (same jobs, intervals and rule
files), a spike of wrk connections past the gateway's capacity (so its refusals have something to
count), then Locust driving `pipeline` through the gateway with
tritonstack.load.loadtest.run_headless (its exporter is the `locust` job) and a few tritonclient
threads driving `classify`, all where a user's client would send them. Then Prometheus' HTTP API is
asked every panel's query and every recording rule, and each must return at least one series with a
plausible value. The rules' series are read back from Prometheus' storage, so they also prove that
Prometheus itself evaluates the rule files.

GPU-only panels are exempt on this CPU runtime and listed in the test output; nothing else is.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import tritonclient.http as httpclient
import yaml

from bench.loadgen import Generator, Target
from bench.runner import model_signatures
from tests.support import REPOSITORY, embeddings, end_locust_runs, require_tool
from tritonstack.clients.metrics import scrape
from tritonstack.core.ports import free_ports
from tritonstack.core.settings import load
from tritonstack.render import dashboards
from tritonstack.render.promconfig import PROMETHEUS_DIR, render, render_blackbox
from tritonstack.serve import processes
from tritonstack.serve.gateway import Gateway
from tritonstack.serve.runtime import EmbeddedTriton

LOAD_SECONDS = 30  # Locust's run; Prometheus is polled while it runs
DEADLINE_SECONDS = 40  # from the start of the load until every query must have answered
SERVED = {"classifier", "classify", "pipeline", "postprocess"}
#: The spike: far more connections than the gateway admits (maxconn + its queue per replica).
SPIKE_CONNECTIONS = 512
SPIKE_SECONDS = 2

Check = Callable[[dict[frozenset, float]], str | None]


def prometheus_query(base: str, expr: str) -> dict[frozenset, float]:
    """Instant query; {frozenset(labels): value}. Raises on a query Prometheus rejects."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", f"{expr}: {body}"
    return {
        frozenset(item["metric"].items()): float(item["value"][1])
        for item in body["data"]["result"]
    }


def api(base: str, path: str) -> dict:
    with urllib.request.urlopen(f"{base}{path}", timeout=10) as response:
        return json.load(response)["data"]


# --- what "plausible" means, per query ----------------------------------------------------


def finite(series: dict[frozenset, float]) -> dict[frozenset, float]:
    return {labels: v for labels, v in series.items() if math.isfinite(v)}


def some_positive(series):
    values = finite(series).values()
    return None if any(v > 0 for v in values) else f"no series > 0 in {sorted(values)}"


def all_zero(series):
    values = list(series.values())
    if not values:
        return "no series"
    return None if all(v == 0 for v in values) else f"not all 0 for good traffic: {values}"


def between(low: float, high: float) -> Check:
    def check(series):
        values = list(finite(series).values())
        if not values:
            return "no finite series"
        bad = [v for v in values if not low <= v <= high]
        return f"outside [{low}, {high}]: {bad}" if bad else None

    return check


def positive_between(low: float, high: float) -> Check:
    def check(series):
        return between(low, high)(series) or some_positive(series)

    return check


def batch_size(series):
    classifier = [v for labels, v in series.items() if ("model", "classifier") in labels]
    if not classifier:
        return "no series for classifier"
    return None if classifier[0] > 1 else f"classifier's average batch size {classifier[0]} <= 1"


def label_values(series, label, expected) -> str | None:
    seen = {dict(labels).get(label) for labels in series}
    return None if expected <= seen else f"{label} values {seen}, expected {expected}"


def count_between(low: float, high: float) -> Check:
    """Gauges sampled at one instant: every series in range (a count may be 0 at that instant)."""
    return between(low, high)


MICROSECONDS = positive_between(0, 10_000_000)  # up to 10 s per request; an ensemble queues <1 µs
SECONDS = positive_between(0.0001, 0.5)  # histogram_quantile's range: 0.5 ms-bucket to 0.5 s

#: Checks by query text (recording-rule name or raw metric); the first match wins.
CHECKS: list[tuple[str, Check]] = [
    # The gateway (HAProxy's exporter): the spike's refusals and 5xx are in the windows.
    ("haproxy_gateway_refusals:rate1m", some_positive),
    ("haproxy_gateway_refusals:ratio", positive_between(0, 1)),
    ("_5xx:ratio", positive_between(0, 1)),
    ("haproxy_server_limit_sessions", positive_between(1, 10_000)),
    ("haproxy_server_current_sessions", count_between(0, 10_000)),
    ("haproxy_backend_current_queue", count_between(0, 10_000)),
    ("haproxy_backend_queue_time_average", between(0, 10)),  # 0 once Locust's requests fit
    ("_time_average_seconds", positive_between(0, 10)),
    # triton_http/grpc see the replica; llm_http/grpc have no server (no LLM behind this one)
    ("haproxy_backend_active_servers", between(0, 100)),
    ("per_exec_rate1m", batch_size),
    ("nv_inference_request_failure:ratio", all_zero),
    ("nv_inference_request_failure:rate1m", all_zero),
    ("tritonstack_client_failures:ratio", all_zero),
    ("_duration_us:per_request", MICROSECONDS),
    ("_duration_seconds:p", SECONDS),
    ("nv_inference_pending_request_count", between(0, 10_000)),
    ("nv_cpu_utilization", between(0, 1)),
    ("_bytes", positive_between(1, 1e15)),
    (":rate1m", some_positive),
]


def check_for(expr: str) -> Check:
    return next((check for key, check in CHECKS if key in expr), some_positive)


def expand(expr: str) -> str:
    """A panel query as Grafana sends it with the `model` variable set to All."""
    return expr.replace("$model", ".+")


def recording_rules(files: str = "*.yml") -> list[str]:
    return [
        rule["record"]
        for path in sorted((PROMETHEUS_DIR / "rules").glob(files))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]


# --- the stack ------------------------------------------------------------------------------


def wait_until_ok(url: str, process: subprocess.Popen, log: Path, seconds: float) -> None:
    """Until `url` answers 200; fails with the process's log if it exits or time runs out."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                return
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"{url} not answering after {seconds:.0f} s"
        time.sleep(0.2)


@contextlib.contextmanager
def running_prometheus(tmp: Path, config: str):
    """Debian's prometheus with `config` (YAML text) on a free loopback port; yields its URL."""
    binary = require_tool("prometheus")
    (port,) = free_ports(1)
    (tmp / "prometheus.yml").write_text(config)
    log = tmp / "prometheus.log"
    command = [
        binary,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    process = processes.spawn(command, log)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ok(f"{base}/-/ready", process, log, seconds=30)
        yield base
    finally:
        processes.stop(process, 15)


@contextlib.contextmanager
def prometheus(
    tmp: Path,
    triton_metrics: str,
    locust_exporter: str,
    blackbox: str,
    client_http: str,
    gateway_metrics: str,
):
    config = render(
        triton_metrics,
        [locust_exporter],
        blackbox=blackbox,
        triton_http=client_http,
        gateway_metrics=gateway_metrics,
        probed_models=load().public_models,
    )
    with running_prometheus(tmp, config) as base:
        yield base


@contextlib.contextmanager
def blackbox_exporter(tmp: Path, api_key_file: Path | None = None, source: Path | None = None):
    """Debian's blackbox_exporter with the project's prometheus/blackbox.yml (or `source`), the
    probe's key read from `api_key_file` (None: no key); yields host:port."""
    binary = require_tool("prometheus-blackbox-exporter")
    (port,) = free_ports(1)
    config = tmp / "blackbox.yml"
    config.write_text(render_blackbox(api_key_file, *([source] if source else [])))
    log = open(tmp / "blackbox.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until_ok(f"http://127.0.0.1:{port}/-/healthy", process, tmp / "blackbox.log", 20)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(15)
        log.close()


def classify_load(url: str, stop: threading.Event, threads: int = 3) -> list[threading.Thread]:
    """A few closed-loop clients on `classify`, so its routing and sub-request metrics move."""

    def user() -> None:
        client = httpclient.InferenceServerClient(url)  # one per thread: not thread-safe
        tensor = httpclient.InferInput("features", [2, 128], "FP32")
        tensor.set_data_from_numpy(embeddings(2, seed=3))
        while not stop.is_set():
            client.infer("classify", [tensor])
            stop.wait(0.02)
        client.close()

    workers = [threading.Thread(target=user, daemon=True) for _ in range(threads)]
    for worker in workers:
        worker.start()
    return workers


def spike(infer_url: str, gateway_metrics: str, workdir: Path) -> dict:
    """SPIKE_CONNECTIONS closed-loop wrk connections for SPIKE_SECONDS against the gateway, and
    what its exporter counted meanwhile (the frontend's 5xx, the Triton server's 5xx)."""

    def counts() -> tuple[float, float]:
        samples = scrape(gateway_metrics)
        return (
            sum(
                v
                for (name, labels), v in samples.items()
                if name.removesuffix("_total") == "haproxy_frontend_http_responses"
                and {("proxy", "http"), ("code", "5xx")} <= labels
            ),
            sum(
                v
                for (name, labels), v in samples.items()
                if name.removesuffix("_total") == "haproxy_server_http_responses"
                and {("proxy", "triton_http"), ("code", "5xx")} <= labels
            ),
        )

    before = counts()
    target = Target("http-json", infer_url, "classifier")
    result = Generator(workdir, model_signatures()).run(target, SPIKE_CONNECTIONS, SPIKE_SECONDS)
    time.sleep(0.5)  # requests still queued when wrk closed are answered or dropped by now
    after = counts()
    return {
        "wrk": result,
        "frontend_5xx": after[0] - before[0],
        "triton_5xx": after[1] - before[1],
    }


def wait_for_first_scrape(base: str, job: str, seconds: float = 20) -> None:
    """Until Prometheus holds one sample of `job`: a counter's first sample must come before
    the traffic it should count, or rate() over it is 0."""
    deadline = time.monotonic() + seconds
    while not prometheus_query(base, f'up{{job="{job}"}} == 1'):
        assert time.monotonic() < deadline, f"Prometheus did not scrape job {job}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from tritonstack.load.loadtest import run_headless

    tmp = tmp_path_factory.mktemp("observability")
    http, grpc, metrics, locust_metrics = free_ports(4)
    gateway_http, gateway_grpc, gateway_metrics = free_ports(3)
    server = EmbeddedTriton(REPOSITORY, http, grpc, metrics, log_path=tmp / "triton.log")
    with server:
        gateway = Gateway.for_triton(
            server,
            http_port=gateway_http,
            grpc_port=gateway_grpc,
            metrics_port=gateway_metrics,
            log_path=tmp / "haproxy.log",
        )
        with (
            gateway,
            blackbox_exporter(tmp) as blackbox,
            prometheus(
                tmp,
                f"127.0.0.1:{metrics}",
                f"127.0.0.1:{locust_metrics}",
                blackbox,
                gateway.http_url,
                f"127.0.0.1:{gateway_metrics}",
            ) as base,
        ):
            require_tool("wrk")
            wait_for_first_scrape(base, "gateway")
            spiked = spike(
                f"http://{gateway.http_url}/v2/models/classifier/infer",
                gateway.metrics_url,
                tmp / "spike",
            )
            stop = threading.Event()
            workers = classify_load(gateway.http_url, stop)
            result: dict = {}

            def locust() -> None:
                try:
                    result["load"] = run_headless(
                        http_url=gateway.http_url,
                        grpc_url=gateway.grpc_url,
                        model="pipeline",
                        user_type="http_json",
                        users=16,
                        spawn_rate=16,
                        duration_s=LOAD_SECONDS,
                        metrics_port=locust_metrics,
                        results_dir=tmp / "locust",
                    )
                except BaseException as exc:  # reported by the test, not lost in the thread
                    result["error"] = exc

            load = threading.Thread(target=locust, daemon=True)
            load.start()
            try:
                yield {
                    "base": base,
                    "started": time.monotonic(),
                    "result": result,
                    "tmp": tmp,
                    "blackbox": blackbox,
                    "client_http": gateway.http_url,
                    "spike": spiked,
                }
            finally:
                stop.set()
                end_locust_runs()  # every test has read what it needs: no full duration
                load.join(LOAD_SECONDS + 60)
                for worker in workers:
                    worker.join(10)


def poll_until_plausible(base: str, queries: dict[str, Check], deadline: float) -> dict:
    """Ask every query until each is plausible or the deadline passes; the last problems."""
    problems = {expr: "not asked yet" for expr in queries}
    while problems:
        for expr in list(problems):
            try:
                problem = queries[expr](prometheus_query(base, expand(expr)))
            except Exception as exc:  # a query Prometheus rejects is a failure too
                problem = f"query failed: {exc}"
            if problem is None:
                del problems[expr]
            else:
                problems[expr] = problem
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(2)
    return problems


def test_every_panel_query_and_recording_rule_returns_plausible_data(stack):
    base = stack["base"]
    queries: dict[str, Check] = {}
    exempt = []
    for spec, panel in dashboards.panels():
        if panel.needs_llm:  # this server has no LLM: tests/functional/test_observability_llm.py
            continue
        for query in panel.queries:
            if panel.exempt_on_cpu:
                exempt.append(f"{spec.uid} / {panel.title} / {query.expr}: {panel.exempt_on_cpu}")
            else:
                queries[query.expr] = check_for(query.expr)
    llm_rules = set(recording_rules("llm.yml"))  # the LLM's server proves these
    for record in (r for r in recording_rules() if r not in llm_rules):
        queries.setdefault(record, check_for(record))
    problems = poll_until_plausible(base, queries, stack["started"] + DEADLINE_SECONDS)
    print("exempt on the CPU runtime:\n  " + "\n  ".join(exempt))
    assert "error" not in stack["result"], f"load generator failed: {stack['result']['error']!r}"
    assert not problems, "implausible or empty:\n" + "\n".join(
        f"  {expr}\n    -> {problem}" for expr, problem in problems.items()
    )
    assert exempt and all("GPU" in line for line in exempt)


def test_model_variable_lists_every_served_model(stack):
    query = dashboards.MODEL_VARIABLE_QUERY
    metric = query.removeprefix("label_values(").split(",")[0]
    values = api(stack["base"], f"/api/v1/label/model/values?match[]={metric}")
    assert set(values) >= SERVED


def test_business_metrics_reach_prometheus_with_their_labels(stack):
    base = stack["base"]
    deadline = stack["started"] + DEADLINE_SECONDS
    checks = {
        "model_label:tritonstack_predictions:rate1m": lambda s: (
            label_values(s, "label", {"relevant", "not relevant"})
            or label_values(s, "model", {"postprocess", "classify"})
        ),
        'model_target_runtime:tritonstack_classify_routed_rows:rate1m{runtime="onnx"}': (
            some_positive
        ),
        # On CPU classifier_trt is not served: its series exists and stays at 0.
        'model_target_runtime:tritonstack_classify_routed_rows:rate1m{runtime="tensorrt"}': (
            all_zero
        ),
    }
    assert not poll_until_plausible(base, checks, deadline)


def test_prometheus_evaluates_every_rule_and_the_watchdog_fires(stack):
    base = stack["base"]
    groups = api(base, "/api/v1/rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    loaded = {rule["name"] for rule in rules if rule["type"] == "recording"}
    assert loaded == set(recording_rules())
    assert "Watchdog" in {rule["name"] for rule in rules if rule["type"] == "alerting"}
    unhealthy = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not unhealthy, unhealthy
    deadline = time.monotonic() + 20
    while True:
        alerts = api(base, "/api/v1/alerts")["alerts"]
        firing = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
        if "Watchdog" in firing or time.monotonic() > deadline:
            break
        time.sleep(1)
    # Good traffic on a healthy server: the heartbeat and nothing else.
    assert firing == {"Watchdog"}, alerts
    targets = api(base, "/api/v1/targets")["activeTargets"]
    assert {t["labels"]["job"] for t in targets if t["health"] == "up"} >= {"triton", "gateway"}


def test_deep_probe_passes_on_a_healthy_server_and_fails_on_a_broken_target(stack):
    """blackbox_exporter with prometheus/blackbox.yml: a real inference of each public model is
    probe_success 1 (Prometheus scrapes one series per model as job deep_probe); a model that
    does not answer, or answers without every output, is 0."""
    base = stack["base"]
    deadline = stack["started"] + DEADLINE_SECONDS

    def all_one(series):
        return None if series and all(v == 1 for v in series.values()) else f"got {series}"

    assert not poll_until_plausible(base, {'probe_success{job="deep_probe"}': all_one}, deadline)
    series = api(base, "/api/v1/query?query=probe_success%7Bjob%3D%22deep_probe%22%7D")["result"]
    probed = {found["metric"]["model"] for found in series}
    assert probed == set(load().public_models)

    def probe(model: str, module: str) -> str:
        target = f"http://{stack['client_http']}/v2/models/{model}/infer"
        url = f"http://{stack['blackbox']}/probe?module={module}&target={target}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode()

    assert "\nprobe_success 1\n" in probe("pipeline", "infer_pipeline")
    assert "\nprobe_success 0\n" in probe("nope", "infer_pipeline")  # 404 from the gateway
    # 200, but not every output pipeline's module asks for (classifier has no label)
    assert "\nprobe_success 0\n" in probe("classifier", "infer_pipeline")


def test_the_gateway_counts_every_refusal_triton_never_saw(stack):
    """Each 503 the spike got was answered by the gateway (counted as a frontend 5xx that no
    Triton server answered): the refusals Triton itself never counted now have a number."""
    spiked = stack["spike"]
    # Answers that were not 2xx only: a socket error of 512 connections on a slow machine (a
    # connect or read error) is not a refusal the gateway counted.
    refused_by_wrk = spiked["wrk"].status_errors
    refusals = spiked["frontend_5xx"] - spiked["triton_5xx"]
    assert spiked["wrk"].requests > 0 and refused_by_wrk > 0, spiked  # past capacity, still served
    assert spiked["triton_5xx"] == 0, spiked
    # wrk stops with requests in flight: the gateway may answer up to one per connection more.
    assert refused_by_wrk <= refusals <= refused_by_wrk + SPIKE_CONNECTIONS, spiked
