"""Load testing with Locust: every user type, the exporter, the gates and the step shape.

Locust runs as a subprocess (it monkey-patches the interpreter with gevent); this test process
only imports the pure modules of loadtest/ (shapes, gates), never users.py or the locustfile.
Each headless run lasts a few seconds against the session's real tritonserver; assertions compare
counts, never absolute latencies.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_loadtest import gates, run_cli
from tritonstack.clients.metrics import model_value, scrape
from tritonstack.core.ports import free_ports
from tritonstack.load.loadtest import locust_command, run_headless

BUCKETS = {
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, float("inf"),
}  # fmt: skip


def exposition(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name as Prometheus stores it, labels): value}."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def client_value(samples: dict, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, items), v in samples.items() if n == name and wanted <= items)


def batching_counters(triton) -> tuple[float, float]:
    samples = scrape(triton.metrics_url)
    return (
        model_value(samples, "nv_inference_count", "classifier"),
        model_value(samples, "nv_inference_exec_count", "classifier"),
    )


# --- headless runs against the real server -------------------------------------------------------

#: Each user type drives a different model, so the three models are loaded too; one row per
#: request, so that classifier's inferences per execution measure batching across requests.
USER_TYPES = [("http_json", "pipeline"), ("http_binary", "classify"), ("grpc", "classifier")]


@pytest.mark.parametrize(("user_type", "model"), USER_TYPES)
def test_user_type_runs_clean_batches_and_feeds_the_exporter(triton, tmp_path, user_type, model):
    (port,) = free_ports(1)
    inferences_before, executions_before = batching_counters(triton)
    live: list[dict] = []
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(
            run_headless,
            http_url=triton.http_url,
            grpc_url=triton.grpc_url,
            model=model,
            user_type=user_type,
            users=16,
            spawn_rate=16,
            duration_s=6,
            rows="1",
            metrics_port=port,
            results_dir=tmp_path,
            max_fail_ratio=0,
        )
        while not future.done():  # the exporter serves while Locust runs
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    samples = exposition(r.read().decode())
                if client_value(samples, "tritonstack_client_requests_total") > 0:
                    live.append(samples)
            except OSError:
                pass  # not listening yet, or already gone
            time.sleep(0.5)
        result = future.result()
    inferences_after, executions_after = batching_counters(triton)

    # Every answer passed content validation, and the fail-ratio gate of 0 passed.
    assert result.exit_code == 0, (tmp_path / "locust.log").read_text()[-3000:]
    assert result.failures == 0 and result.gate_failures == []
    assert result.requests > 50
    assert result.p50_ms <= result.p95_ms <= result.p99_ms
    for name in ("locust_stats.csv", "locust_failures.csv", "locust_stats_history.csv"):
        assert (tmp_path / name).is_file()
    assert "<html" in (tmp_path / "report.html").read_text()[:2000].lower()

    # Triton merged concurrent requests: more inferences than executions of the classifier.
    inferences = inferences_after - inferences_before
    executions = executions_after - executions_before
    assert inferences >= result.requests  # plus requests killed in flight at the end
    assert inferences / executions > 1, f"{inferences} inferences in {executions} executions"

    # The exporter served the client's view while running ...
    labels = {"user_type": user_type, "model": model}
    assert live, "the exporter never answered during the run"
    seen = client_value(live[-1], "tritonstack_client_requests_total", **labels)
    assert 0 < seen <= result.requests
    # ... and its final state, written at quit, counts exactly what Locust counted.
    final = exposition((tmp_path / "exporter.prom").read_text())
    assert client_value(final, "tritonstack_client_requests_total", **labels) == result.requests
    assert client_value(final, "tritonstack_client_failures_total", **labels) == 0
    count = client_value(final, "tritonstack_client_request_duration_seconds_count", **labels)
    assert count == result.requests
    buckets = {
        float(dict(items)["le"]): value
        for (name, items), value in final.items()
        if name == "tritonstack_client_request_duration_seconds_bucket"
    }
    assert set(buckets) == BUCKETS
    assert buckets[float("inf")] == count
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative


@pytest.mark.parametrize("user_type", ["http_json", "http_binary", "grpc"])
def test_wrong_answers_fail_and_fail_the_gate(triton, tmp_path, user_type):
    """Validation is real: rows of NaN (from --input-file) make the classifier answer NaN
    probabilities, which no answer the metadata promises may hold: every request fails."""
    rows = tmp_path / "nan.npy"
    np.save(rows, np.full((8, 128), np.nan, np.float32))
    command = locust_command(
        http_url=triton.http_url,
        grpc_url=triton.grpc_url,
        model="pipeline",
        user_type=user_type,
        users=4,
        spawn_rate=4,
        duration_s=2,
        rows="mix",
        results_dir=tmp_path,
        shape=None,
        max_p99_ms=None,
        max_fail_ratio=0.01,
        input_file=rows,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCUST_")}
    env["LOCUST_METRICS_PORT"] = "0"
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert result.returncode == gates.GATE_FAILED_EXIT_CODE, result.stderr[-3000:]
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["requests"] > 0 and verdict["failures"] == verdict["requests"]
    assert verdict["failed"] == ["fail ratio 1.0000 > --max-fail-ratio 0.01"]
    assert "gate failed: fail ratio 1.0000 > --max-fail-ratio 0.01" in result.stderr
    with open(tmp_path / "locust_failures.csv") as f:
        errors = [row["Error"] for row in csv.DictReader(f)]
    unexpected = [e for e in errors if "output class holds values that are not finite" not in e]
    assert errors and not unexpected, unexpected


def test_cli_gate_fails_with_one_line_naming_the_gate(triton, tmp_path):
    result = run_cli(
        "--host", triton.http_url, "--grpc-host", triton.grpc_url,
        "--users", "4", "--duration", "3s", "--max-p99-ms", "0.5", "--max-fail-ratio", "0",
        "--results", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == gates.GATE_FAILED_EXIT_CODE, result.stderr
    # p99 is at least 1: Locust rounds response times to whole milliseconds
    assert re.fullmatch(r"gate failed: p99 \d+ ms > --max-p99-ms 0\.5\n", result.stderr)
    summary = result.stdout.strip().splitlines()[-1]
    assert re.match(r"\d+ requests, 0 failed \(0\.00%\), [\d.]+ req/s, p50 \d+ ms", summary)
    assert (tmp_path / "verdict.json").is_file() and (tmp_path / "report.html").is_file()


def test_step_shape_really_ramps_users(triton, tmp_path):
    result = run_headless(
        http_url=triton.http_url,
        grpc_url=triton.grpc_url,
        users=8,
        spawn_rate=8,
        duration_s=8,
        results_dir=tmp_path,
        shape="step",
    )
    assert result.exit_code == 0 and result.failures == 0
    with open(tmp_path / "locust_stats_history.csv") as f:
        counts = [int(row["User Count"]) for row in csv.DictReader(f)]
    ramp = [c for c in counts if c > 0]
    assert ramp == sorted(ramp), counts  # never back down while stepping
    assert len(set(ramp)) >= 3 and max(ramp) == 8, counts  # 2, 4, 6, 8 users
