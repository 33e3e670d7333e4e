"""The client: one `InferenceServerClient`, HTTP or gRPC, requests built from the model's metadata.

`infer` asks the server what the model takes (tritonstack.core.signature), sends the given arrays
(or one array, for a model with one input) and returns every output by name; `table` turns an
answer into the rows `tritonstack infer` prints: labels where the model has them (Triton's
classification extension), else the outputs' values.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Mapping

import numpy as np

from tritonstack.core.errors import UserError
from tritonstack.core.signature import Signature, parse_classification


def client_module(protocol: str):
    """tritonclient.http or tritonclient.grpc: the same API, imported on demand."""
    if protocol == "http":
        import tritonclient.http as module
    elif protocol == "grpc":
        import tritonclient.grpc as module
    else:
        raise UserError(f"protocol {protocol!r} is not supported; use http or grpc")
    return module


def _connect(url: str, protocol: str, timeout: float):
    module = client_module(protocol)
    try:
        if protocol == "http":
            return module.InferenceServerClient(
                url=url, connection_timeout=timeout, network_timeout=timeout
            )
        return module.InferenceServerClient(url=url)
    except Exception as exc:
        raise UserError(f"cannot create a {protocol} client for {url}: {exc}") from None


def _headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def _unreachable(url: str, protocol: str, detail) -> UserError:
    return UserError(
        f"cannot reach Triton at {url} over {protocol} ({detail}); "
        "start it with `tritonstack serve` or `docker compose up`"
    )


def fetch_signature(
    url: str, model: str, protocol: str = "http", api_key: str | None = None, timeout: float = 10
) -> Signature:
    """`model`'s signature from the server at `url`, over `protocol`."""
    if protocol == "http":
        from tritonstack.core.signature import fetch

        return fetch(url, model, _headers(api_key), timeout)
    from tritonclient.utils import InferenceServerException

    client = _connect(url, protocol, timeout)
    try:
        headers = _headers(api_key)
        metadata = client.get_model_metadata(model, headers=headers, as_json=True)
        config = client.get_model_config(model, headers=headers, as_json=True)["config"]
    except InferenceServerException as exc:
        if "connect" in (exc.message() or "") or exc.status() == "StatusCode.UNAVAILABLE":
            raise _unreachable(url, protocol, exc.message()) from None
        raise UserError(f"{url} ({protocol}): {model}'s metadata: {exc.message()}") from None
    finally:
        client.close()
    return Signature.from_server(metadata, config)


def as_arrays(signature: Signature, inputs) -> dict[str, np.ndarray]:
    """`inputs` by input name: arrays by name, or one array for a model with one input."""
    if isinstance(inputs, Mapping):
        arrays = dict(inputs)
    elif len(signature.inputs) == 1:
        arrays = {signature.inputs[0].name: inputs}
    else:
        names = [t.name for t in signature.inputs]
        raise UserError(f"{signature.model} takes {len(names)} inputs {names}: pass them by name")
    return signature.inputs_from_arrays(arrays, "the inputs")


def infer(
    url: str,
    model: str,
    inputs,
    protocol: str = "http",
    timeout: float = 10.0,
    outputs: tuple[str, ...] | None = None,
    api_key: str | None = None,
    classification: int = 0,
    signature: Signature | None = None,
    sequence: tuple[int, bool, bool] | None = None,
) -> dict[str, np.ndarray]:
    """Send one request and return the requested outputs (default: all) by name.

    `inputs`: arrays by input name, or one array for a model with one input; batched models
    take the batch dimension first. `api_key` is sent as `Authorization: Bearer <key>` (gRPC:
    metadata), what the gateway checks. `classification` N asks outputs that have labels for
    their top N classes as "score:index:label" strings (Triton's classification extension).
    `sequence` (ID, start, end): the request's place in a sequence, for a model that keeps
    state in the server; without it such a model gets a sequence of this one request.
    """
    from tritonclient.utils import InferenceServerException

    signature = signature or fetch_signature(url, model, protocol, api_key, timeout)
    arrays = as_arrays(signature, inputs)
    labelled = {t.name for t in signature.labelled_outputs}
    outputs = outputs or tuple(t.name for t in signature.outputs)
    module = client_module(protocol)
    client = _connect(url, protocol, timeout)
    try:
        tensors = []
        for tensor in signature.inputs:
            array = arrays[tensor.name]
            tensors.append(module.InferInput(tensor.name, list(array.shape), tensor.datatype))
            tensors[-1].set_data_from_numpy(array)
        requested = [
            module.InferRequestedOutput(name, class_count=classification if name in labelled else 0)
            for name in outputs
        ]
        kwargs = {"client_timeout": timeout} if protocol == "grpc" else {}
        if signature.sequence:
            sequence_id, start, end = sequence or (new_sequence_id(), True, True)
            kwargs.update(sequence_id=sequence_id, sequence_start=start, sequence_end=end)
        if api_key:
            kwargs["headers"] = _headers(api_key)
        result = client.infer(model_name=model, inputs=tensors, outputs=requested, **kwargs)
        return {name: result.as_numpy(name) for name in outputs}
    except InferenceServerException as exc:
        if exc.status() == "StatusCode.UNAVAILABLE" and "connect" in (exc.message() or ""):
            raise _unreachable(url, protocol, exc.message()) from None
        raise UserError(f"Triton at {url} ({protocol}) answered: {exc.message()}") from None
    except (ConnectionError, OSError) as exc:
        raise _unreachable(url, protocol, exc) from None
    except Exception as exc:  # e.g. geventhttpclient's HTTPConnectionClosed mid-response
        raise UserError(f"request to Triton at {url} ({protocol}) failed: {exc!r}") from None
    finally:
        client.close()


def new_sequence_id() -> int:
    """A sequence ID no other client picks (Triton's IDs are per model, any nonzero uint64;
    random 63 bits, so that both protocols and every client library carry it)."""
    return secrets.randbits(63) or 1


def _cell(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        if value.size == 1:
            return _cell(value.reshape(-1)[0])
        return (
            "["
            + ", ".join(_cell(v) for v in value.reshape(-1)[:8])
            + (", ...]" if value.size > 8 else "]")
        )
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.4f}"
    return str(value)


def table(signature: Signature, outputs: Mapping[str, np.ndarray], classified: bool) -> list[str]:
    """The lines `tritonstack infer` prints: a header, then one line per row; an output with
    labels asked through the classification extension shows its top label (and its score)."""
    columns: list[tuple[str, list[str]]] = []
    for name, value in outputs.items():
        if classified and name in {t.name for t in signature.labelled_outputs}:
            columns.append(
                (name, [f"{label} ({score:.4f})" for label, score in parse_classification(value)])
            )
        else:
            rows = value if signature.batched else value[np.newaxis]
            columns.append((name, [_cell(row) for row in rows]))
    widths = [max(len(title), *(len(c) for c in cells)) for title, cells in columns]
    header = "  ".join(f"{title:<{w}}" for (title, _), w in zip(columns, widths, strict=True))
    lines = [f"{'row':>4}  {header}".rstrip()]
    count = len(columns[0][1]) if columns else 0
    for row in range(count):
        cells = "  ".join(f"{c[row]:<{w}}" for (_, c), w in zip(columns, widths, strict=True))
        lines.append(f"{row:>4}  {cells}".rstrip())
    return lines


class ClosedLoop(threading.Thread):
    """One client on one persistent HTTP connection sending `rows`-row requests back to back,
    recording (time sent, latency in seconds or None for a failure) per request in `outcomes`
    until `drain` takes them (a long run drains, so that the list does not grow without bound).

    The request is built once from the model's metadata (random values, tritonstack.core.signature).
    A failed request is followed by a short pause, so a server that is down is not spun on.
    """

    def __init__(self, url: str, model: str, timeout: float = 30.0, rows: int = 1, seed: int = 0):
        super().__init__(daemon=True)
        self.url, self.model, self.timeout, self.rows = url, model, timeout, rows
        self.signature = fetch_signature(url, model)
        self.arrays = self.signature.random_inputs(rows, np.random.default_rng(seed))
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: list[tuple[float, float | None]] = []
        self._drained = (0, 0)  # (succeeded, failed) already taken by drain()

    def run(self) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.url, network_timeout=self.timeout)
        tensors = []
        for tensor in self.signature.inputs:
            array = self.arrays[tensor.name]
            tensors.append(httpclient.InferInput(tensor.name, list(array.shape), tensor.datatype))
            tensors[-1].set_data_from_numpy(array)
        while not self.halt.is_set():
            sent_at = time.monotonic()
            started = time.perf_counter()
            try:
                client.infer(self.model, tensors)
                latency = time.perf_counter() - started
            except Exception:
                latency = None
            with self.lock:
                self.outcomes.append((sent_at, latency))
            if latency is None:
                time.sleep(0.05)
        client.close()

    def drain(self) -> tuple[list[float], int]:
        """Latencies and failures since the last drain."""
        with self.lock:
            window, self.outcomes = self.outcomes, []
            latencies = [latency for _, latency in window if latency is not None]
            failed = len(window) - len(latencies)
            self._drained = (self._drained[0] + len(latencies), self._drained[1] + failed)
        return latencies, failed

    def stop(self, timeout: float = 30.0) -> tuple[int, int]:
        """Stop after the request in flight; (succeeded, failed) over the whole run."""
        self.halt.set()
        self.join(timeout)
        with self.lock:
            failed = sum(latency is None for _, latency in self.outcomes)
            succeeded = len(self.outcomes) - failed
            return self._drained[0] + succeeded, self._drained[1] + failed
