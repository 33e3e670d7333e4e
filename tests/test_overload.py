"""Overload: past the queue limit Triton answers 503 at once, and accepted requests stay bounded.

The committed queue limits (256 waiting requests, see the configs) are sized for real capacity;
overflowing them takes more clients than a 2-core test machine can drive without starving the
server. So this test serves a copy of the repository whose queue limits are 2: the same policy,
reached by a 24-client spike.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import REPOSITORY, free_ports
from tritonstack.metrics import model_value, scrape
from tritonstack.repository import parse_config
from tritonstack.runtime import EmbeddedTriton

pytestmark = pytest.mark.integration

CLIENTS = 24
REQUESTS_PER_CLIENT = 40


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("overload")
    repository = root / "model_repository"
    shutil.copytree(REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
    for model in ("classifier", "postprocess", "classify"):
        config = repository / model / "config.pbtxt"
        text, count = re.subn(r"max_queue_size: \d+", "max_queue_size: 2", config.read_text())
        assert count == 1, f"{model} has no queue policy"
        config.write_text(text)
    with EmbeddedTriton(repository, *free_ports(3), log_path=root / "triton.log") as server:
        yield server


def client_run(url: str, model: str) -> list[tuple[int, float]]:
    """(status, seconds) per request: 200, 503 for a rejection, other codes for anything else."""
    client = httpclient.InferenceServerClient(url, network_timeout=30)
    outcomes = []
    try:
        for _ in range(REQUESTS_PER_CLIENT):
            tensor = httpclient.InferInput("features", [1, 128], "FP32")
            tensor.set_data_from_numpy(np.zeros((1, 128), np.float32))
            started = time.perf_counter()
            try:
                client.infer(model, [tensor])
                status = 200
            except InferenceServerException as exc:
                status = int(exc.status()) if str(exc.status()).isdigit() else 0
                assert status == 503, exc
            outcomes.append((status, time.perf_counter() - started))
    finally:
        client.close()
    return outcomes


def spike(server, model: str):
    """Run the spike; return (accepted seconds, rejected seconds, metrics before, after)."""
    before = scrape(server.metrics_url)
    with ThreadPoolExecutor(CLIENTS) as pool:
        runs = pool.map(client_run, [server.http_url] * CLIENTS, [model] * CLIENTS)
        outcomes = [outcome for run in runs for outcome in run]
    time.sleep(2)  # failure counters are published with the metrics interval
    after = scrape(server.metrics_url)
    accepted = np.array([s for status, s in outcomes if status == 200])
    rejected = np.array([s for status, s in outcomes if status == 503])
    assert len(accepted) + len(rejected) == CLIENTS * REQUESTS_PER_CLIENT
    print(
        f"\n{model}: {len(accepted)} accepted (p99 {np.percentile(accepted, 99) * 1000:.1f} ms),"
        f" {len(rejected)} rejected (p99 {np.percentile(rejected, 99) * 1000:.1f} ms)"
    )
    return accepted, rejected, before, after


class QueueDepth(threading.Thread):
    """Polls a model's nv_inference_pending_request_count gauge while a spike runs."""

    def __init__(self, server, model: str):
        super().__init__(daemon=True)
        self.server, self.model = server, model
        self.halt = threading.Event()
        self.deepest = 0.0
        self.seen = False

    def run(self) -> None:
        while not self.halt.wait(0.05):
            samples = scrape(self.server.metrics_url)
            self.seen = self.seen or any(
                name == "nv_inference_pending_request_count" and ("model", self.model) in labels
                for name, labels in samples
            )
            pending = model_value(samples, "nv_inference_pending_request_count", self.model)
            self.deepest = max(self.deepest, pending)


def delta(before, after, name, model, **labels) -> float:
    return model_value(after, name, model, **labels) - model_value(before, name, model, **labels)


def test_spike_through_the_pipeline_is_rejected_fast_and_counted(small_queue_server):
    accepted, rejected, before, after = spike(small_queue_server, "pipeline")
    assert len(rejected) > 0, "the spike never overflowed a queue of 2"
    assert len(accepted) > 0
    assert np.percentile(rejected, 99) < 0.05, "rejections must be immediate"
    assert np.percentile(accepted, 99) < 2.0, "accepted requests must stay bounded"
    # Triton 2.51 counts an ensemble's failures with reason OTHER whatever the step's reason,
    # and counts each failed ensemble request twice (observed; pinned so a change is noticed).
    failures = delta(before, after, "nv_inference_request_failure", "pipeline", reason="OTHER")
    assert failures == 2 * len(rejected)
    client = httpclient.InferenceServerClient(small_queue_server.http_url)
    assert client.is_server_ready()
    client.close()


def test_queue_full_rejections_are_not_counted_by_triton_2_51(small_queue_server):
    """Upstream gap, pinned so an upgrade that fixes it is noticed: a request refused with
    "Exceeds maximum queue size" increments no nv_inference_request_failure counter at all
    (REJECTED stays 0) when it targets the model directly. Alerts therefore watch the queue
    depth (nv_inference_pending_request_count) and the clients' failures, see
    docs/operations.md."""
    depth = QueueDepth(small_queue_server, "classifier")
    depth.start()
    accepted, rejected, before, after = spike(small_queue_server, "classifier")
    depth.halt.set()
    depth.join()
    assert len(rejected) > 0 and len(accepted) > 0
    # What TritonQueueAtLimit watches instead: the model's pending-request gauge. Triton samples
    # it at the metrics interval (1 s), so a spike of a few seconds may or may not be caught at
    # its peak; the alert's arithmetic is tested by promtool, here only that the gauge is
    # exported for the model and never exceeds what the queue limit and instances allow.
    assert depth.seen, "nv_inference_pending_request_count missing for classifier"
    assert depth.deepest <= 2 + 2 * 64  # queue limit + two instances' batches in flight
    for reason in ("REJECTED", "OTHER", "BACKEND", "CANCELED"):
        assert (
            delta(before, after, "nv_inference_request_failure", "classifier", reason=reason) == 0
        )
    assert delta(before, after, "nv_inference_request_success", "classifier") == len(accepted)


def test_every_batched_configuration_has_a_queue_limit():
    """CPU and GPU configurations alike: no batched model may queue without bound."""
    configs = [
        path
        for path in sorted(REPOSITORY.glob("*/config.pbtxt"))
        + sorted(REPOSITORY.glob("*/configs/*.pbtxt"))
        if parse_config(path).HasField("dynamic_batching")
    ]
    assert len(configs) >= 5  # classifier (+ gpu), classifier_trt, postprocess, classify
    for path in configs:
        policy = parse_config(path).dynamic_batching.default_queue_policy
        assert policy.max_queue_size > 0, path
        assert policy.timeout_action == policy.REJECT, path
        assert not policy.allow_timeout_override, path
