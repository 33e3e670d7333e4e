"""Dynamic batching really merges concurrent requests (the point of serving with Triton).

The load comes from wrk (C, the bench's HTTP load generator), not from Python threads: on a
2-core machine 32 tritonclient threads share one GIL and cannot send faster than two model
instances answer batch-1 requests, so a thread-based test measured the client, not the batcher
(1.8 rows per execution with threads on 2 cores; wrk drives 10+).
"""

from __future__ import annotations

import pytest

from bench.loadgen import Generator, Target
from bench.runner import model_signatures
from bench.servers import start_triton
from bench.variants import write_variant
from tests.support import require_tool
from tritonstack import DEFAULT_MODEL_REPOSITORY
from tritonstack.clients.metrics import model_value, scrape

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
    result = Generator(tmp_path, model_signatures()).run(target, CONNECTIONS, SECONDS)
    inferences_after, executions_after = counters(triton)

    assert result.errors == 0 and result.requests > 1000, result
    inferences = inferences_after - inferences_before
    executions = executions_after - executions_before
    # wrk stops with requests in flight: Triton may have run a few more than wrk counted.
    assert result.requests <= inferences <= result.requests + CONNECTIONS
    # Below half: on average more than two requests share every execution of the model.
    assert executions < inferences / 2, f"{executions} executions for {inferences} inferences"


#: A request slower than this waited out most of the batcher's 500 ms idle timeout: a stall.
STALL_MS = 400
#: A stall starts only when a request arrives in a short race window, so one 3 s window may show
#: none (measured on 2 shared cores: 3 of 4 windows showed one, and some runs' single window
#: none): the stalled variant gets up to this many windows to show one.
MAX_WINDOWS = 5


@pytest.mark.timeout(300)
def test_upstream_pin_a_queue_policy_stalls_the_batcher_500_ms(tmp_path):
    """Pins upstream behaviour (Triton 2.51; core at HEAD has the same code path): the reason no
    committed config has a queue policy.

    A queue policy turns off the dynamic batcher's payload prefetching, and on that path the
    batcher is not woken when its only instance frees up: requests that arrived meanwhile wait
    for its 500 ms idle timeout. The committed repository gets a queue policy in a temporary
    copy (variant `queue-policy-x1`, one instance per model); the same copy without the policy
    (`all-x1`) shows no stall in as many windows. When an upgrade fixes this upstream, this test
    fails, and a queue policy may come back as a second line of defence behind the gateway. The
    verdict is the stall's signature (a p99 near 500 ms), not throughput, which on a shared
    machine depends on everything else running.
    """
    require_tool("wrk")
    generator = Generator(tmp_path / "load", model_signatures())

    def windows(variant: str, most: int, until_stall: bool) -> list:
        repository = write_variant(DEFAULT_MODEL_REPOSITORY, tmp_path / variant, variant)
        server = start_triton(repository, tmp_path / f"{variant}.log", variant)
        results = []
        try:
            target = Target("http-json", server.url("http-json", "classifier"), "classifier")
            generator.run(target, 16, 1)  # warm-up
            while len(results) < most:
                results.append(generator.run(target, 16, SECONDS))
                if until_stall and results[-1].p99_ms >= STALL_MS:
                    break
        finally:
            server.stop()
        return results

    stalled = windows("queue-policy-x1", MAX_WINDOWS, until_stall=True)
    free = windows("all-x1", max(len(stalled), 2), until_stall=False)
    print(f"\np99 ms with the queue policy: {[round(r.p99_ms) for r in stalled]}, "
          f"without: {[round(r.p99_ms) for r in free]}")  # fmt: skip
    assert all(r.errors == 0 for r in stalled + free), (stalled, free)
    assert stalled[-1].p99_ms >= STALL_MS, stalled  # requests waited out the idle timeout
    assert has_stalls(stalled[-1]), stalled  # the no-stall verdict below sees it
    assert not any(has_stalls(r) for r in free), free


# --- no stall without a queue policy ------------------------------------------------------------

#: The committed repository, and a copy with one instance of every model (what a GPU host runs:
#: configs/gpu.pbtxt and classifier_trt have one instance).
STALL_FREE = {"committed": "default", "one-instance-each": "all-x1"}
STALL_MODELS = ("classifier", "pipeline", "classify")
STALL_CONNECTIONS = (16, 64)
#: The verdict: p99 <= 5 x p50 + 100 ms, in the best of up to 3 runs.
#: Without a stall, closed-loop latency is queueing behind at most `connections` requests, so p99
#: stays within a few times p50 (1.5-3x on a quiet machine). On 2 cores shared with other busy
#: processes, scheduler delays put p99 at up to 60-125 ms with p50 at 2-5 ms (measured while
#: writing this test; wrk's coordinated-omission correction spreads one delay over many samples):
#: that is what the 100 ms floor absorbs, and why a run may be repeated, since contention comes
#: and goes while the stall is structural and shows in every run. A 500 ms batcher stall puts p99
#: at ~500 ms, 50-100x a p50 of 5-10 ms. Stalls frequent enough to lift the median itself (one
#: run measured p50 125 ms, p95 and p99 503 ms) escape that ratio, so a p99 at STALL_MS or more
#: is a stall too, whatever p50 is: the upstream pin above checks this verdict catches it.
P99_OVER_P50 = 5
P99_FLOOR_MS = 100
STALL_RUNS = 3


def stall_bound_ms(p50_ms: float) -> float:
    return P99_OVER_P50 * p50_ms + P99_FLOOR_MS


def has_stalls(result) -> bool:
    """A run whose slowest requests waited out the batcher's idle timeout."""
    return result.p99_ms >= STALL_MS or result.p99_ms > stall_bound_ms(result.p50_ms)


@pytest.fixture(scope="module", params=list(STALL_FREE), ids=list(STALL_FREE))
def stall_free_server(request, tmp_path_factory):
    """One server per configuration, shared by its models' and connection counts' tests."""
    variant = STALL_FREE[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    repository = write_variant(DEFAULT_MODEL_REPOSITORY, tmp / "model_repository", variant)
    server = start_triton(repository, tmp / "tritonserver.log", request.param)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("connections", STALL_CONNECTIONS)
@pytest.mark.parametrize("model", STALL_MODELS)
def test_no_batcher_stall_under_closed_loop_load(stall_free_server, model, connections, tmp_path):
    require_tool("wrk")
    generator = Generator(tmp_path, model_signatures())
    target = Target("http-json", stall_free_server.url("http-json", model), model)
    generator.run(target, connections, 1)  # warm-up: first batches, stubs' imports paged in
    runs = []
    for _ in range(STALL_RUNS):
        result = generator.run(target, connections, SECONDS)
        assert result.errors == 0 and result.requests > 0, result
        runs.append(result)
        if not has_stalls(result):
            return
    best = min(runs, key=lambda r: r.p99_ms - stall_bound_ms(r.p50_ms))
    pytest.fail(
        f"{model} at {connections} connections: p99 {best.p99_ms:.1f} ms > "
        f"{min(stall_bound_ms(best.p50_ms), STALL_MS):.1f} ms (p50 {best.p50_ms:.1f} ms) in "
        f"each of {STALL_RUNS} runs: requests stalled; {runs}"
    )
