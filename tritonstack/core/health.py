#!/usr/bin/env python3
"""Is Triton dead? One real inference per model, built from the model's own metadata.

`/v2/health/ready` stayed 200 while a Python backend stub was dead (Triton before r26.04), so
this sends each model one row of zeros, shaped and typed as the model's metadata says
(`GET /v2/models/<model>`, `/config`), asks for every output (outputs with a labels file through
the classification extension), and requires every output in the answer, of the shape and size
the metadata promises. Each model is called --repeat times (default 4): the models run two
instances, and with one instance's stub dead only every other request fails, so a single call
can pass by luck. Models: --model (repeatable), else $PUBLIC_MODELS, else PUBLIC_MODELS of the
stack.env beside this file (the image's copy).

Only a dead server fails the check (exit 1, one line per model): no connection (refused, reset), an
error answer other than load shedding (for example "Stub process ... is not healthy"), or an answer
without what the metadata promises. A model that failed to load when the server started ("has no
available versions") gets a `not loaded:` line and fails the check only when no model answers at
all: restarting the server cannot load it and would stop the others. A busy server passes (exit 0,
a `busy:` line): 503 (a server shutting down, or a queue policy, if someone adds one, turning
requests away), or no answer before the deadline. Restarting a server because it is loaded would
turn load into an outage. The whole check ends within --deadline (default 8 s): Docker counts a
healthcheck running past its timeout (compose: 10 s) as a failure, so a slow server must be called
busy before that, not cut off.

--ready asks only `/v2/models/<model>/ready` (the LLM's check: a generation would count in the
metrics its dashboards show). --address-of NAME prints the address this container serves on (see
serving_address).

Standard library only: the Triton image runs this file as /opt/tritonstack/healthcheck.py (its
Dockerfile HEALTHCHECK, compose's healthcheck, the entrypoint's watchdog, Kubernetes' probes);
`tritonstack serve`'s supervisor imports it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

HTTP_PORT = 8000
LOOPBACK = "127.0.0.1"
#: In compose: the network alias under which this container's Triton serves inference. Triton's
#: HTTP and gRPC ports bind only to this container's address on that network (the gateway's), so
#: a container on its other network (Prometheus, for the metrics port) finds them closed.
SERVING_NAME = "TRITONSTACK_SERVING_NAME"
#: Below compose's and the Dockerfile's healthcheck timeout (10 s), with room for Python's start.
DEADLINE_S = 8.0
REQUEST_TIMEOUT_S = 4.0
REPEAT = 4
#: Where the image keeps the stack's settings (PUBLIC_MODELS), beside this file.
STACK_ENV = Path(__file__).resolve().with_name("stack.env")
# Triton's UNAVAILABLE: shutting down, or a queue policy's full queue or timeout (the committed
# models have none; a user may add one).
BUSY_STATUSES = {503}
# An UNAVAILABLE answer that means a dead stub, not load.
DEAD_STUB = "is not healthy"
#: A row of zeros in each KServe datatype JSON carries (strings: empty).
ZEROS = {"BOOL": False, "FP32": 0.0, "FP64": 0.0, "BYTES": ""}
#: Datatypes JSON cannot carry (Triton: "use the binary data format"), with their bytes per value:
#: sent as binary tensors of zero bytes, their outputs asked for as binary.
BINARY_ONLY = {"FP16": 2, "BF16": 2}
#: Triton's answer for a model of the repository that failed to load (a restart cannot load it);
#: a name the repository lacks altogether is "... is not found", which stays a failure.
NOT_LOADED = ("has no available versions",)
#: Where tritonstack add-model writes the bounds of an input's variable dims (onnx_serving.py).
BOUNDS_PARAMETER = "tritonstack.input_bounds"
#: Where the container's launcher writes the models it left out and why ({model: reason}): a
#: TensorRT plan that could not be built, a GPU model on a CPU host.
LAUNCH_STATUS_ENV = "TRITONSTACK_LAUNCH_STATUS"
LAUNCH_STATUS = "/tmp/tritonstack-launch.json"
HEADER_LENGTH = "Inference-Header-Content-Length"


class Dead(Exception):
    """The server or model cannot answer, whatever the load."""


class Busy(Exception):
    """The server is alive but shedding load or slower than the deadline allows."""


class NotLoaded(Exception):
    """The model failed to load when the server started: the server serves the others, and
    restarting it would not load this one (its log says why)."""


class Deadline:
    """The time left of one check; each request waits at most that long."""

    def __init__(self, seconds: float, per_request: float):
        self.ends = time.monotonic() + seconds
        self.per_request = per_request

    def timeout(self) -> float:
        left = self.ends - time.monotonic()
        if left <= 0.05:
            raise Busy("the check's deadline passed with the server still answering")
        return min(self.per_request, left)


def call(
    url: str, path: str, deadline: Deadline, body: dict | None = None, headers=None,
    tail: bytes = b"",
) -> dict:  # fmt: skip
    """One request to Triton: a JSON body, followed by binary tensors (`tail`) if any. Its
    answer (binary outputs under "_binary": the bytes after the JSON), or Dead / Busy /
    NotLoaded saying why not."""
    data = None if body is None else json.dumps(body).encode()
    extra = {HEADER_LENGTH: str(len(data))} if tail else {}
    request = urllib.request.Request(
        f"http://{url}{path}",
        data=None if data is None else data + tail,
        headers={"Content-Type": "application/json", **extra, **(headers or {})},
    )
    timeout = deadline.timeout()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            length = response.headers.get(HEADER_LENGTH)
            if not raw:
                return {}  # readiness: a status, no body
            if length is None:
                return json.loads(raw)
            answer = json.loads(raw[: int(length)])
            answer["_binary"] = raw[int(length) :]
            return answer
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        if exc.code in BUSY_STATUSES and DEAD_STUB not in detail:
            raise Busy(f"HTTP {exc.code}: {detail}") from None
        if exc.code in (400, 404) and any(words in detail for words in NOT_LOADED):
            raise NotLoaded(f"HTTP {exc.code}: {detail}") from None
        raise Dead(f"HTTP {exc.code} for {path}: {detail}") from None
    except TimeoutError:
        raise Busy(f"no answer within {timeout:.1f} s from {url}") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise Busy(f"no answer within {timeout:.1f} s from {url}") from None
        raise Dead(f"no answer from {url}: {exc.reason}") from None
    except OSError as exc:  # reset or closed mid-answer
        raise Dead(f"no answer from {url}: {exc}") from None
    except ValueError as exc:
        raise Dead(f"an answer that is not JSON: {exc}") from None


#: The probes' sequence ID (fixed, so the generated probe config is too): the largest 63-bit
#: number, far from the small IDs clients count up from; a random client ID meets it once in
#: 2^63.
PROBE_SEQUENCE_ID = 2**63 - 1


def probe_request(metadata: Mapping, config: Mapping) -> tuple[dict, dict[str, int], bytes]:
    """A one-row request of zeros for the model at each input's opt shape (the bounds
    add-model writes; 1 for a variable dim without them), each output's expected number of
    values, and the binary tensors that follow the JSON (FP16 and BF16 travel only so)."""
    batched = int(config.get("max_batch_size", 0) or 0) > 0
    described = config.get("parameters", {}).get(BOUNDS_PARAMETER, {}).get("string_value")
    bounds = json.loads(described) if described else {}
    inputs, tail = [], b""
    for tensor in metadata.get("inputs", []):
        shape = [max(int(d), 1) for d in tensor["shape"]]  # the batch dim (-1) and any -1 as 1
        opt = bounds.get(tensor["name"], {}).get("opt")
        if opt is not None:
            shape = [1, *opt] if batched else list(opt)
        elif batched:
            shape[0] = 1
        entry = {"name": tensor["name"], "shape": shape, "datatype": tensor["datatype"]}
        size = BINARY_ONLY.get(tensor["datatype"])
        if size is not None:
            entry["parameters"] = {"binary_data_size": size * math.prod(shape)}
            tail += bytes(size * math.prod(shape))
        else:
            entry["data"] = [ZEROS.get(tensor["datatype"], 0)] * math.prod(shape)
        inputs.append(entry)
    labelled = {o["name"] for o in config.get("output", []) if o.get("label_filename")}
    outputs, expected = [], {}
    for tensor in metadata.get("outputs", []):
        name = tensor["name"]
        if name in labelled:  # the top class's "score:index:label", one per row
            outputs.append({"name": name, "parameters": {"classification": 1}})
            expected[name] = 1
            continue
        dims = [int(d) for d in tensor["shape"]]
        count = -1 if any(d < 0 for d in dims[batched:]) else math.prod(dims[batched:])
        if tensor["datatype"] in BINARY_ONLY:
            outputs.append({"name": name, "parameters": {"binary_data": True}})
            count = count * BINARY_ONLY[tensor["datatype"]] if count >= 0 else -1
        else:
            outputs.append({"name": name})
        expected[name] = count
    body = {"inputs": inputs, "outputs": outputs}
    if "sequence_batching" in config:
        # A model keeping state in the server takes only requests of a sequence: the probe's is
        # a sequence of one request, from the initial state.
        body["parameters"] = {
            "sequence_id": PROBE_SEQUENCE_ID, "sequence_start": True, "sequence_end": True,
        }  # fmt: skip
    return body, expected, tail


def check_answer(answer: Mapping, expected: Mapping[str, int]) -> str:
    """A short summary of a good answer; Dead when an output is missing or of the wrong size
    (a binary output's size in bytes)."""
    found = {o.get("name"): o for o in answer.get("outputs", [])}
    for name, count in expected.items():
        output = found.get(name)
        binary = (output or {}).get("parameters", {}).get("binary_data_size")
        if output is None or (binary is None and not isinstance(output.get("data"), list)):
            raise Dead(f"no {name} in the answer: {json.dumps(answer, default=str)[:200]}")
        size = binary if binary is not None else len(output["data"])
        if count >= 0 and size != count:
            unit = "bytes" if binary is not None else "values"
            raise Dead(f"{name} holds {size} {unit}, the metadata says {count}")
    first = next(iter(expected))
    shown = found[first].get("data", found[first].get("parameters"))
    return f"{first}={str(shown[:2] if isinstance(shown, list) else shown)[:60]}"


def probe(
    url: str,
    model: str,
    deadline: Deadline,
    repeat: int = REPEAT,
    headers=None,
    requests: dict | None = None,
) -> str:
    """`repeat` inferences of `model`; a summary, or Dead / Busy. `requests`: a cache of the
    requests built from each model's metadata, kept by a caller that probes every second."""
    base = f"/v2/models/{model}"
    cached = None if requests is None else requests.get(model)
    if cached is None:
        metadata = call(url, base, deadline, headers=headers)
        config = call(url, f"{base}/config", deadline, headers=headers)
        cached = probe_request(metadata, config)
        if not cached[1]:
            raise Dead(f"{model}'s metadata lists no outputs")
    body, expected, tail = cached
    summary = ""
    try:
        for _ in range(max(repeat, 1)):
            answer = call(url, f"{base}/infer", deadline, body, headers, tail)
            summary = check_answer(answer, expected)
    except Dead:
        if requests is not None:
            requests.pop(model, None)  # a restarted server may serve another version
        raise
    if requests is not None:
        requests[model] = cached
    return summary


def probe_models(
    url: str,
    models: Sequence[str],
    deadline_s: float = DEADLINE_S,
    timeout_s: float = REQUEST_TIMEOUT_S,
    repeat: int = REPEAT,
    headers=None,
    requests: dict | None = None,
) -> tuple[list[str], list[str], list[str], list[str]]:
    """(healthy, busy, dead, not loaded) lines, one per model, within one deadline."""
    deadline = Deadline(deadline_s, timeout_s)
    healthy, busy, dead, unloaded = [], [], [], []
    for model in models:
        try:
            summary = probe(url, model, deadline, repeat, headers, requests)
            healthy.append(f"healthy: {model}: {summary}")
        except Busy as exc:
            busy.append(f"busy: {model}: {exc}")
        except NotLoaded as exc:
            unloaded.append(f"not loaded: {model}: {exc} (it failed to load at start; Triton's "
                            "log says why, and a restart would not load it)")  # fmt: skip
        except Dead as exc:
            dead.append(f"unhealthy: {model}: {exc}")
    return healthy, busy, dead, unloaded


def serving_address(name: str) -> str:
    """This container's IPv4 address among those `name` resolves to. The name is a network
    alias every replica of a service shares on one network, so it resolves to each replica's
    address there; the one this container can bind is its own."""
    try:
        found = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        raise LookupError(f"{name} does not resolve here ({exc}): {SERVING_NAME} must name a "
                          "network alias of this container") from None  # fmt: skip
    addresses = sorted({info[4][0] for info in found})
    for address in addresses:
        with socket.socket() as probe_socket:
            try:
                probe_socket.bind((address, 0))
            except OSError:
                continue
            return address
    raise LookupError(f"{name} resolves to {', '.join(addresses)}, none of them this container's")


def default_host(environ: Mapping[str, str] = os.environ) -> str:
    """Where this container's Triton answers HTTP: its address on the serving network when
    $TRITONSTACK_SERVING_NAME names it, else loopback."""
    name = environ.get(SERVING_NAME, "")
    return serving_address(name) if name else LOOPBACK


def ready(url: str, models: Sequence[str], timeout_s: float) -> list[str]:
    """What is not ready among `models` (Triton's answer for each), empty when all are."""
    deadline = Deadline(timeout_s, timeout_s)
    missing = []
    for model in models:
        try:
            call(url, f"/v2/models/{model}/ready", deadline)
        except (Dead, Busy, NotLoaded) as exc:
            missing.append(f"not ready: {model}: {exc}")
    return missing


def public_models(environ: Mapping[str, str] = os.environ, stack_env: Path = STACK_ENV) -> list:
    """$PUBLIC_MODELS, else the PUBLIC_MODELS line of stack.env beside this file."""
    value = environ.get("PUBLIC_MODELS", "")
    if not value and stack_env.is_file():
        for line in stack_env.read_text().splitlines():
            key, _, found = line.strip().partition("=")
            if key == "PUBLIC_MODELS":
                value = found
    return value.split()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    port = os.environ.get("TRITON_HTTP_PORT", str(HTTP_PORT))
    parser.add_argument(
        "--url", help=f"Triton HTTP host:port (default: loopback, or ${SERVING_NAME}'s address)"
    )
    parser.add_argument(
        "--model",
        action="append",
        dest="models",
        help="model to call (repeatable; default: the public models, $PUBLIC_MODELS or stack.env)",
    )
    parser.add_argument("--timeout", type=float, default=REQUEST_TIMEOUT_S, help="per request, s")
    parser.add_argument(
        "--deadline", type=float, default=DEADLINE_S, help="the whole check, s (busy past it)"
    )
    parser.add_argument("--repeat", type=int, default=REPEAT, help="requests per model (>= 1)")
    parser.add_argument("--ready", action="store_true", help="only ask each model's readiness")
    parser.add_argument("--address-of", metavar="NAME", help="print this container's address "
                        "among NAME's and exit")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if args.address_of:
            print(serving_address(args.address_of))
            return 0
        url = args.url or f"{default_host()}:{port}"
    except LookupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    models = args.models or public_models()
    if not models:
        print("error: no model to call: pass --model, or set PUBLIC_MODELS", file=sys.stderr)
        return 2
    if args.ready:
        missing = ready(url, models, args.timeout)
        for line in missing:
            print(line, file=sys.stderr)
        return 1 if missing else 0
    found = probe_models(url, models, args.deadline, args.timeout, args.repeat)
    healthy, busy, dead, unloaded = found
    for line in healthy + busy:
        print(line)
    for line in unloaded + dead + left_out():
        print(line, file=sys.stderr)
    # A model that failed to load is reported, not a reason to restart the server: that would
    # not load it, and would take every other model down meanwhile.
    return 1 if dead or (unloaded and not healthy and not busy) else 0


def left_out(environ: Mapping[str, str] = os.environ) -> list[str]:
    """`not served:` lines for the models the launcher left out (none outside its container)."""
    try:
        found = json.loads(Path(environ.get(LAUNCH_STATUS_ENV) or LAUNCH_STATUS).read_text())
    except (OSError, ValueError):
        return []
    return [f"not served: {model}: {why}" for model, why in sorted(found.items())]


if __name__ == "__main__":
    sys.exit(main())
