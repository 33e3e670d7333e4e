"""Dynamic batching really merges concurrent requests (the point of serving with Triton)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import tritonclient.http as httpclient

from tests.conftest import embeddings
from tritonstack.metrics import model_value, scrape

pytestmark = pytest.mark.integration

CLIENTS = 32
REQUESTS_PER_CLIENT = 60


def one_client(url: str, seed: int) -> int:
    """A client of its own (tritonclient's HTTP client is not thread-safe), batch-1 requests."""
    client = httpclient.InferenceServerClient(url)
    try:
        for i in range(REQUESTS_PER_CLIENT):
            tensor = httpclient.InferInput("features", [1, 128], "FP32")
            tensor.set_data_from_numpy(embeddings(1, seed=seed * 1000 + i))
            result = client.infer("classifier", [tensor])
            assert result.as_numpy("class").shape == (1, 2)
        return REQUESTS_PER_CLIENT
    finally:
        client.close()


def counters(triton) -> tuple[float, float]:
    samples = scrape(triton.metrics_url)
    return (
        model_value(samples, "nv_inference_count", "classifier"),
        model_value(samples, "nv_inference_exec_count", "classifier"),
    )


def test_concurrent_requests_are_batched(triton):
    inferences_before, executions_before = counters(triton)
    with ThreadPoolExecutor(CLIENTS) as pool:
        sent = sum(pool.map(one_client, [triton.http_url] * CLIENTS, range(CLIENTS)))
    inferences_after, executions_after = counters(triton)

    inferences = inferences_after - inferences_before
    executions = executions_after - executions_before
    assert inferences == sent == CLIENTS * REQUESTS_PER_CLIENT
    # Below half: on average more than two requests share every execution of the model.
    assert executions < inferences / 2, f"{executions} executions for {inferences} inferences"
