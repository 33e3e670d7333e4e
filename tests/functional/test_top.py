"""`tritonstack top --once` against the real server under load."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from tests.support import embeddings
from tritonstack.cli import main
from tritonstack.clients.client import infer

SERVED = ("classifier", "classify", "pipeline", "postprocess")


def parse(output: str) -> dict[str, list[str]]:
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("model "))
    return {line.split()[0]: line.split()[1:] for line in lines[header + 1 :] if line.strip()}


def test_top_once_under_load(triton, capsys):
    stop = threading.Event()

    def load(seed: int) -> int:
        sent = 0
        while not stop.is_set():
            infer(triton.http_url, "classifier", embeddings(1, seed + sent))
            sent += 1
        return sent

    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(load, seed) for seed in range(6)]
        try:
            code = main(["top", "--url", triton.metrics_url, "--once", "--interval", "1.5"])
        finally:
            stop.set()
        assert all(f.result() > 0 for f in futures)

    output = capsys.readouterr().out
    assert code == 0, output
    rows = parse(output)
    assert set(SERVED) <= set(rows), output
    requests, inferences, batch, queue, compute, failures = rows["classifier"][:6]
    assert float(requests) > 0, output
    # Holds in every window although Triton's counters are read apart (tritonstack/clients/top.py).
    assert float(inferences) >= float(requests), output
    assert float(batch) >= 1.0, output
    assert float(queue) >= 0 and float(compute) > 0, output
    assert failures == "-", output
    assert rows["pipeline"][0] == "0.0"  # only classifier was loaded
