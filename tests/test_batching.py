"""Dynamic batching really merges concurrent requests (the point of serving with Triton).

The load comes from wrk (C, the bench's HTTP load generator), not from Python threads: on a
2-core machine 32 tritonclient threads share one GIL and cannot send faster than two model
instances answer batch-1 requests, so a thread-based test measured the client, not the batcher
(CI saw 1.8 rows per execution with threads; wrk drives 10+).
"""

from __future__ import annotations

import pytest

from tests.conftest import require_tool
from tritonstack.benchmarks.loadgen import Generator, Target
from tritonstack.metrics import model_value, scrape

pytestmark = pytest.mark.integration

CONNECTIONS = 32
SECONDS = 3


def counters(triton) -> tuple[float, float]:
    samples = scrape(triton.metrics_url)
    return (
        model_value(samples, "nv_inference_count", "classifier"),
        model_value(samples, "nv_inference_exec_count", "classifier"),
    )


def test_concurrent_requests_are_batched(triton, tmp_path):
    require_tool("wrk")
    url = f"http://{triton.http_url}/v2/models/classifier/infer"
    target = Target("http-json", url, "classifier")
    inferences_before, executions_before = counters(triton)
    result = Generator(tmp_path).run(target, CONNECTIONS, SECONDS)
    inferences_after, executions_after = counters(triton)

    assert result.errors == 0 and result.requests > 1000, result
    inferences = inferences_after - inferences_before
    executions = executions_after - executions_before
    # wrk stops with requests in flight: Triton may have run a few more than wrk counted.
    assert result.requests <= inferences <= result.requests + CONNECTIONS
    # Below half: on average more than two requests share every execution of the model.
    assert executions < inferences / 2, f"{executions} executions for {inferences} inferences"
