"""Business Logic Scripting: one classifier call per execute(), routed by what is loaded.

Why BLS here rather than the `pipeline` ensemble: the choice between the TensorRT engine and the
ONNX model depends on what the server has loaded, which an ensemble's static graph cannot express.
All requests of an execute() are concatenated into a single `async_exec`, because one sub-request
per request serialises them and loses the batching (see docs/benchmarks.md).
"""

import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

ROUTE_RECHECK_SECONDS = 5.0


def read_labels(model_dir: Path, config: dict) -> np.ndarray:
    relative = config["parameters"]["labels_file"]["string_value"]
    lines = (model_dir / relative).read_text(encoding="utf-8").splitlines()
    return np.array([line.strip().encode() for line in lines if line.strip()], dtype=object)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.labels = read_labels(Path(args["model_repository"]), config)
        parameters = config["parameters"]
        self.preferred = parameters["preferred_model"]["string_value"]
        self.fallback = parameters["fallback_model"]["string_value"]
        self.logger = pb_utils.Logger
        self.route = None
        self.route_checked_at = float("-inf")

    def target_model(self) -> str:
        """The preferred model when it is ready, else the fallback; re-checked every few seconds.

        Models load concurrently, so `classifier_trt` may become ready after this model did.
        """
        now = time.monotonic()
        if now - self.route_checked_at >= ROUTE_RECHECK_SECONDS:
            try:
                ready = pb_utils.is_model_ready(model_name=self.preferred)
            except Exception:  # not in the repository at all: same as not ready
                ready = False
            route = self.preferred if ready else self.fallback
            if route != self.route:
                self.logger.log_info(f"classify: routing to {route}")
            self.route, self.route_checked_at = route, now
        return self.route

    async def execute(self, requests):
        features = [pb_utils.get_input_tensor_by_name(r, "features").as_numpy() for r in requests]
        model = self.target_model()
        sub_request = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=["class"],
            inputs=[pb_utils.Tensor("features", np.concatenate(features))],
        )
        sub_response = await sub_request.async_exec()
        if sub_response.has_error():
            error = pb_utils.TritonError(
                f"classify: sub-request to {model} failed: {sub_response.error().message()}"
            )
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        scores = pb_utils.get_output_tensor_by_name(sub_response, "class").as_numpy()
        winners = np.argmax(scores, axis=1)
        labels = self.labels[winners].reshape(-1, 1)
        top = scores[np.arange(len(winners)), winners].astype(np.float32).reshape(-1, 1)
        bounds = np.cumsum([len(f) for f in features])[:-1]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("label", label), pb_utils.Tensor("score", score)]
            )
            for label, score in zip(np.split(labels, bounds), np.split(top, bounds), strict=False)
        ]
