"""The client: one `InferenceServerClient`, batched inputs, HTTP or gRPC.

`infer` returns plain rows so the CLI, the tests and the examples print the same thing.
"""

from __future__ import annotations

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
