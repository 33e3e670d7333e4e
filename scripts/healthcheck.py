#!/usr/bin/env python3
"""Container healthcheck for Triton: is the server dead? One real inference per named model.

`/v2/health/ready` stayed 200 while a Python backend stub was dead (Triton before r26.04), so
this sends one row of features to each model (`pipeline` exercises classifier and postprocess,
`classify` the BLS model and whichever classifier it routes to) and requires a label that is in
labels.txt. Each model is called --repeat times (default 4): the models run two instances, and
with one instance's stub dead only every other request fails, so a single call can pass by luck.

Only a dead server fails the check (exit 1, one line per model): no connection (refused, reset),
an error answer other than load shedding (for example "Stub process ... is not healthy", an
unknown model), or an answer without a known label. A busy server passes (exit 0, a `busy:`
line): 503 (UNAVAILABLE: a server that is shutting down, or a queue policy, if someone adds
one, turning requests away) or no answer within --timeout. Restarting a server because it is
loaded would turn load into an outage; Docker's healthcheck and the entrypoint's watchdog both
run this script.

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

# The model contract and Triton's HTTP port, spelled out because the image has no tritonstack
# package; tests/unit/test_contract.py fails when they differ from tritonstack/contract.py.
INPUT_NAME = "features"
INPUT_DATATYPE = "FP32"
FEATURES = 128
HTTP_PORT = 8000
LOOPBACK = "127.0.0.1"
DEFAULT_LABELS = Path("/opt/tritonstack/model_repository/postprocess/labels.txt")
# Triton's UNAVAILABLE: shutting down, or a queue policy's full queue or timeout (the committed
# models have none; a user may add one).
BUSY_STATUSES = {503}
# An UNAVAILABLE answer that means a dead stub, not load.
DEAD_STUB = "is not healthy"


class Dead(Exception):
    """The server or model cannot answer, whatever the load."""


class Busy(Exception):
    """The server is alive but shedding load or slower than the timeout."""


def infer_label(url: str, model: str, timeout: float) -> str:
    """The `label` of one all-zero row sent to `model` over Triton's HTTP/JSON protocol."""
    body = {
        "inputs": [
            {
                "name": INPUT_NAME,
                "shape": [1, FEATURES],
                "datatype": INPUT_DATATYPE,
                "data": [0.0] * FEATURES,
            }
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
        if exc.code in BUSY_STATUSES and DEAD_STUB not in detail:
            raise Busy(f"HTTP {exc.code}: {detail}") from None
        raise Dead(f"HTTP {exc.code}: {detail}") from None
    except TimeoutError as exc:
        raise Busy(f"no answer within {timeout:g} s from {url}: {exc}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise Busy(f"no answer within {timeout:g} s from {url}") from None
        raise Dead(f"no answer from {url}: {exc.reason}") from None
    except OSError as exc:  # reset or closed mid-answer
        raise Dead(f"no answer from {url}: {exc}") from None
    except ValueError as exc:
        raise Dead(f"an answer that is not JSON: {exc}") from None
    for output in answer.get("outputs", []):
        if output.get("name") == "label" and output.get("data"):
            return str(output["data"][0])
    raise Dead(f"no label in the answer: {json.dumps(answer)[:200]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    port = os.environ.get("TRITON_HTTP_PORT", str(HTTP_PORT))
    parser.add_argument("--url", default=f"{LOOPBACK}:{port}", help="Triton HTTP host:port")
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
                if labels is not None and label not in labels:
                    raise Dead(f"label {label!r} is not one of {labels}")
        except Busy as exc:
            print(f"busy: {model}: {exc}")
            continue
        except Dead as exc:
            failures.append(f"unhealthy: {model}: {exc}")
            continue
        print(f"healthy: {model} -> {label}")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
