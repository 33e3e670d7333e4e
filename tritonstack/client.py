"""The client: one `InferenceServerClient`, batched inputs, HTTP or gRPC.

`infer` returns plain rows so the CLI, the tests and the examples print the same thing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from tritonstack.contract import FEATURES, INPUT_DATATYPE, INPUT_NAME, MODEL_OUTPUTS
from tritonstack.errors import UserError


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float


def client_module(protocol: str):
    """tritonclient.http or tritonclient.grpc: the same API, imported on demand."""
    if protocol == "http":
        import tritonclient.http as module
    elif protocol == "grpc":
        import tritonclient.grpc as module
    else:
        raise UserError(f"protocol {protocol!r} is not supported; use http or grpc")
    return module


def infer(
    url: str,
    model: str,
    features: np.ndarray,
    protocol: str = "http",
    timeout: float = 10.0,
    outputs: tuple[str, ...] | None = None,
    api_key: str | None = None,
) -> dict[str, np.ndarray]:
    """Send one batched request and return the requested outputs (default: all) by name.

    `api_key` is sent as `Authorization: Bearer <key>` (gRPC: metadata), what the gateway checks.

    Triton wants the batch dimension first: `features` is [rows, FEATURES], never [FEATURES].
    """
    from tritonclient.utils import InferenceServerException

    if features.ndim != 2 or features.shape[1] != FEATURES:
        raise UserError(f"features must have shape [rows, {FEATURES}], got {list(features.shape)}")
    if model not in MODEL_OUTPUTS:
        raise UserError(f"model {model!r} is not one of {sorted(MODEL_OUTPUTS)}")
    outputs = outputs or MODEL_OUTPUTS[model]
    module = client_module(protocol)
    features = np.ascontiguousarray(features, dtype=np.float32)
    try:
        if protocol == "http":
            client = module.InferenceServerClient(
                url=url, connection_timeout=timeout, network_timeout=timeout
            )
        else:
            client = module.InferenceServerClient(url=url)
    except Exception as exc:
        raise UserError(f"cannot create a {protocol} client for {url}: {exc}") from None
    try:
        tensor = module.InferInput(INPUT_NAME, list(features.shape), INPUT_DATATYPE)
        tensor.set_data_from_numpy(features)
        requested = [module.InferRequestedOutput(name) for name in outputs]
        kwargs = {"client_timeout": timeout} if protocol == "grpc" else {}
        if api_key:
            kwargs["headers"] = {"authorization": f"Bearer {api_key}"}
        result = client.infer(model_name=model, inputs=[tensor], outputs=requested, **kwargs)
        return {name: result.as_numpy(name) for name in outputs}
    except InferenceServerException as exc:
        if exc.status() == "StatusCode.UNAVAILABLE" and "connect" in (exc.message() or ""):
            raise UserError(
                f"cannot reach Triton at {url} over grpc; "
                "start it with `tritonstack serve` or `docker compose up`"
            ) from None
        raise UserError(f"Triton at {url} ({protocol}) answered: {exc.message()}") from None
    except (ConnectionError, OSError) as exc:
        raise UserError(
            f"cannot reach Triton at {url} over {protocol} ({exc}); "
            "start it with `tritonstack serve` or `docker compose up`"
        ) from None
    except Exception as exc:  # e.g. geventhttpclient's HTTPConnectionClosed mid-response
        raise UserError(f"request to Triton at {url} ({protocol}) failed: {exc!r}") from None
    finally:
        client.close()


def predictions(model: str, outputs: dict[str, np.ndarray], labels: list[str]) -> list[Prediction]:
    """Rows of (label, score) whatever the model; `labels` maps class indices for `classifier`."""
    scores = outputs["score"][:, 0] if "score" in outputs else outputs["class"].max(axis=1)
    if "label" in outputs:
        names = [value.decode() for value in outputs["label"][:, 0]]
    else:
        names = [labels[i] for i in outputs["class"].argmax(axis=1)]
    return [Prediction(name, float(score)) for name, score in zip(names, scores, strict=False)]


class ClosedLoop(threading.Thread):
    """One client on one persistent HTTP connection sending `rows`-row requests back to back,
    recording (time sent, latency in seconds or None for a failure) per request in `outcomes`
    until `drain` takes them (a long run drains, so that the list does not grow without bound).

    A failed request is followed by a short pause, so a server that is down is not spun on.
    """

    def __init__(self, url: str, model: str, timeout: float = 30.0, rows: int = 1, seed: int = 0):
        super().__init__(daemon=True)
        self.url, self.model, self.timeout = url, model, timeout
        self.features = np.random.default_rng(seed).standard_normal((rows, FEATURES))
        self.halt = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: list[tuple[float, float | None]] = []
        self._drained = (0, 0)  # (succeeded, failed) already taken by drain()

    def run(self) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.url, network_timeout=self.timeout)
        tensor = httpclient.InferInput(INPUT_NAME, list(self.features.shape), INPUT_DATATYPE)
        tensor.set_data_from_numpy(self.features.astype(np.float32))
        while not self.halt.is_set():
            sent_at = time.monotonic()
            started = time.perf_counter()
            try:
                client.infer(self.model, [tensor])
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
