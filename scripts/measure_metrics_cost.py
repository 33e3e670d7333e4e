"""What Triton's latency-metric settings cost in throughput, measured on the embedded runtime.

Starts one embedded tritonserver per configuration (all at once, so they share the machine's
state), then drives each in turn with the same fixed-concurrency closed loop (N threads, one
tritonclient HTTP client each, `pipeline`, one row per request) for a few seconds, for several
interleaved rounds, and prints requests/s per round and the median. Interleaving spreads the
noise of a shared machine over every configuration alike.

    python scripts/measure_metrics_cost.py --rounds 4 --seconds 6 --concurrency 8

The numbers in docs/operations.md come from this script.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import free_ports  # noqa: E402
from tritonstack.runtime import EmbeddedTriton  # noqa: E402

CONFIGS = {
    "default (counters only)": [],
    "summary_latencies=true": ["--metrics-config=summary_latencies=true"],
    "histogram_latencies=true": ["--metrics-config=histogram_latencies=true"],
}


def closed_loop(url: str, model: str, concurrency: int, seconds: float) -> float:
    """Requests/s completed by `concurrency` threads sending back-to-back requests."""
    features = np.random.default_rng(0).standard_normal((1, 128)).astype(np.float32)
    done = [0] * concurrency
    stop = time.monotonic() + seconds

    def user(index: int) -> None:
        client = httpclient.InferenceServerClient(url)  # not thread-safe: one per thread
        tensor = httpclient.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features)
        while time.monotonic() < stop:
            client.infer(model, [tensor])
            done[index] += 1
        client.close()

    threads = [threading.Thread(target=user, args=(i,)) for i in range(concurrency)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--model", default="pipeline")
    args = parser.parse_args()
    servers = {}
    try:
        for name, extra in CONFIGS.items():
            server = EmbeddedTriton(ROOT / "model_repository", *free_ports(3), extra_args=extra)
            servers[name] = server.start()
        for server in servers.values():  # warm up every model once
            closed_loop(server.http_url, args.model, args.concurrency, 1.0)
        results: dict[str, list[float]] = {name: [] for name in servers}
        for round_ in range(args.rounds):
            order = list(servers) if round_ % 2 == 0 else list(reversed(servers))
            for name in order:
                url = servers[name].http_url
                rate = closed_loop(url, args.model, args.concurrency, args.seconds)
                results[name].append(rate)
                print(f"round {round_ + 1}  {name:<26} {rate:7.1f} req/s", flush=True)
        baseline = statistics.median(results[next(iter(results))])
        print(f"\n{args.model}, concurrency {args.concurrency}, {args.rounds} x {args.seconds:g} s")
        for name, rates in results.items():
            median = statistics.median(rates)
            print(
                f"{name:<26} median {median:7.1f} req/s  ({100 * (median / baseline - 1):+5.1f}%)"
                f"  rounds: {', '.join(f'{r:.0f}' for r in rates)}"
            )
    finally:
        for server in servers.values():
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
