#!/usr/bin/env python3
"""Container healthcheck for Triton: one real inference per named model, not only readiness.

`/v2/health/ready` stayed 200 while a Python backend stub was dead (Triton before r26.04), so
this sends one row of features to each model (`pipeline` exercises classifier and postprocess,
`classify` the BLS model and whichever classifier it routes to) and requires a label that is in
labels.txt. Each model is called --repeat times (default 4): the models run two instances, and
with one instance's stub dead only every other request fails, so a single call can pass by luck.
Exit 0 when all answer; exit 1 with one line per failure otherwise.

Standard library only: it runs with the tritonserver image's python3 (Dockerfile.triton
HEALTHCHECK, docker-compose.yml healthcheck) and is tested against the embedded runtime.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_LABELS = Path("/opt/tritonstack/model_repository/postprocess/labels.txt")


def infer_label(url: str, model: str, timeout: float) -> str:
    """The `label` of one all-zero row sent to `model` over Triton's HTTP/JSON protocol."""
    body = {
        "inputs": [
            {"name": "features", "shape": [1, 128], "datatype": "FP32", "data": [0.0] * 128}
        ],
        "outputs": [{"name": "label"}],
    }
    request = urllib.request.Request(
        f"http://{url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        raise RuntimeError(f"HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RuntimeError(f"no answer from {url}: {getattr(exc, 'reason', exc)}") from None
    for output in answer.get("outputs", []):
        if output.get("name") == "label" and output.get("data"):
            return str(output["data"][0])
    raise RuntimeError(f"no label in the answer: {json.dumps(answer)[:200]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    port = os.environ.get("TRITON_HTTP_PORT", "8000")
    parser.add_argument("--url", default=f"127.0.0.1:{port}", help="Triton HTTP host:port")
    parser.add_argument(
        "--model", action="append", dest="models", help="model to call (repeatable)"
    )
    parser.add_argument("--labels", type=Path, default=DEFAULT_LABELS, help="labels.txt")
    parser.add_argument("--timeout", type=float, default=4.0, help="seconds per request")
    parser.add_argument("--repeat", type=int, default=4, help="requests per model (>= 1)")
    args = parser.parse_args(argv)
    models = args.models or ["pipeline"]
    labels = None
    if args.labels.is_file():
        labels = [line.strip() for line in args.labels.read_text().splitlines() if line.strip()]
    failures = []
    for model in models:
        try:
            for _ in range(max(args.repeat, 1)):
                label = infer_label(args.url, model, args.timeout)
        except RuntimeError as exc:
            failures.append(f"unhealthy: {model}: {exc}")
            continue
        if labels is not None and label not in labels:
            failures.append(f"unhealthy: {model}: label {label!r} is not one of {labels}")
        else:
            print(f"healthy: {model} -> {label}")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
