"""The autoscaling query, run by a real Prometheus scraping the real embedded Triton under load.

deploy/kubernetes/prometheus-adapter/values.yaml holds the query prometheus-adapter serves to the
HPA (the default), deploy/kubernetes/components/keda/scaledobject.yaml the one KEDA polls (the
alternative). Here Prometheus scrapes Triton with the labels a PodMonitor adds (`namespace`,
`pod`, `container`), the adapter's template is filled the way the adapter fills it for the HPA
(`<<.LabelMatchers>>` = the namespace and the pods, `<<.GroupBy>>` = `pod`), and both queries
must answer: 0 for an idle pod (the zero guard, not NaN or nothing), a positive number of
microseconds per request for the pod under Locust's load, one series per pod.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from pathlib import Path

import yaml

from tests.functional.test_observability_live import prometheus_query, running_prometheus
from tests.support import REPOSITORY, end_locust_runs
from tests.unit.test_autoscaling_query import (
    POD_LABELS,
    adapter_query,
    keda_query,
)
from tritonstack.core.ports import free_ports
from tritonstack.render.promconfig import render
from tritonstack.serve.runtime import EmbeddedTriton

LOAD_SECONDS = 30


@contextlib.contextmanager
def prometheus_scraping(tmp: Path, triton_metrics: str):
    """Debian's prometheus scraping Triton as a PodMonitor would: 5 s, with pod labels."""
    config = yaml.safe_load(render(triton_metrics))
    for job in config["scrape_configs"]:
        if job["job_name"] == "triton":
            job["static_configs"][0]["labels"] = dict(POD_LABELS)
    with running_prometheus(tmp, yaml.safe_dump(config)) as base:
        yield base


def poll(base: str, query: str, accept, seconds: float) -> dict[frozenset, float]:
    """Ask `query` until `accept(result)` or time runs out; the last result."""
    deadline = time.monotonic() + seconds
    while True:
        result = prometheus_query(base, query)
        if accept(result) or time.monotonic() > deadline:
            return result
        time.sleep(1)


def test_queries_return_a_per_pod_queue_time_idle_and_under_load(tmp_path: Path) -> None:
    from tritonstack.load.loadtest import run_headless

    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(REPOSITORY, http, grpc, metrics, log_path=tmp_path / "triton.log")
    matchers = f'namespace="{POD_LABELS["namespace"]}",pod=~"{POD_LABELS["pod"]}"'  # as the adapter
    hpa_query = adapter_query(matchers, "pod")
    pod = frozenset({("pod", POD_LABELS["pod"])})
    with server, prometheus_scraping(tmp_path, f"127.0.0.1:{metrics}") as base:
        # Idle: two scrapes make a rate; the guard turns 0/0 into 0.
        idle = poll(base, hpa_query, lambda r: bool(r), seconds=30)
        assert idle == {pod: 0.0}, f"idle pod: {idle}"
        assert poll(base, keda_query(), lambda r: bool(r), seconds=10) == {frozenset(): 0.0}

        result: dict = {}

        def locust() -> None:
            try:
                result["load"] = run_headless(
                    http_url=server.http_url,
                    grpc_url=server.grpc_url,
                    model="pipeline",
                    users=16,
                    spawn_rate=16,
                    duration_s=LOAD_SECONDS,
                    results_dir=tmp_path / "locust",
                )
            except BaseException as exc:  # reported below, not lost in the thread
                result["error"] = exc

        load = threading.Thread(target=locust, daemon=True)
        load.start()
        try:
            busy = poll(base, hpa_query, lambda r: all(v > 0 for v in r.values()), LOAD_SECONDS)
            keda = prometheus_query(base, keda_query())
        finally:
            end_locust_runs()  # the queries answered: the rest of the run's duration is not needed
            load.join(LOAD_SECONDS + 60)
    assert "error" not in result, repr(result.get("error"))
    assert result["load"].requests > 0
    # One series, for the pod, in microseconds per request: above 0 and far below a second
    # (the benchmark's per-request queue time is hundreds of microseconds on 2 cores).
    assert set(busy) == {pod}, busy
    value = busy[pod]
    assert math.isfinite(value) and 0 < value < 1_000_000, value
    (keda_value,) = keda.values()
    assert math.isfinite(keda_value) and keda_value > 0
    print(f"per-pod queue time per request: {value:.0f} us (adapter), {keda_value:.0f} us (KEDA)")
