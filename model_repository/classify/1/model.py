"""Business Logic Scripting: one classifier call per execute(), routed by what is loaded.

Why BLS here rather than the `pipeline` ensemble: the choice between the TensorRT engine and the
ONNX model depends on what the server has loaded, which an ensemble's static graph cannot express.
All requests of an execute() are concatenated into a single `async_exec`, because one sub-request
per request serialises them and loses the batching (see docs/benchmarks.md).

Metrics on Triton's metrics port (pb_utils.MetricFamily; HISTOGRAM is supported by the Python
backend of Triton 2.51, whose stub checks and sends `buckets`):
All carry `model` (this model's name) and `target` (the sub-request's model):
- `tritonstack_classify_routed_rows_total{model, target, runtime}`: rows sent to `classifier_trt`
  (runtime="tensorrt") or `classifier` (runtime="onnx"): which engine really serves traffic.
- `tritonstack_classify_subrequest_failures_total{target}`: sub-requests that came back with an
  error.
- `tritonstack_classify_subrequest_duration_seconds{target}`: latency of the one BLS sub-request
  per execute(), a histogram, so Prometheus can compute its percentiles (Triton's own metrics
  have no latency histogram).
- `tritonstack_predictions_total{model="classify", label}`: rows by predicted label, as in
  postprocess.
Every series is created in initialize() so it is exported from 0 before the first request.

Labels are read as postprocess reads them: labels_file.py here is a relative symlink to
postprocess/1/labels_file.py, because Triton's stub puts only this model's directory and version
directory on sys.path (the link survives COPY, the embedded runtime's view and a bind mount).
"""

import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from labels_file import read_labels

ROUTE_RECHECK_SECONDS = 5.0
#: Sub-request latency buckets in seconds, 0.5 ms to 500 ms: the client-side histogram's range.
SUBREQUEST_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5]


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
        # Where the sub-request's outputs must be: a BLS response keeps them on the device the
        # called model produced them on, and TensorRT and GPU ONNX Runtime instances produce
        # them in GPU memory, where `.as_numpy()` raises "Tensor is stored in GPU and cannot be
        # converted to NumPy". CPU memory makes Triton copy them out once per batch. Built here,
        # not at import: the stub adds PreferredMemory to pb_utils after importing model.py.
        self.output_memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
        self.create_metrics(args["model_name"])

    def create_metrics(self, model_name: str) -> None:
        family = pb_utils.MetricFamily
        # A family must outlive its metrics (Triton deletes them with it): all kept on self.
        self.families = routed, failures, duration, predictions = (
            family(
                name="tritonstack_classify_routed_rows_total",
                description="Rows classify sent to each classifier (runtime tensorrt or onnx)",
                kind=family.COUNTER,
            ),
            family(
                name="tritonstack_classify_subrequest_failures_total",
                description="classify's BLS sub-requests that returned an error",
                kind=family.COUNTER,
            ),
            family(
                name="tritonstack_classify_subrequest_duration_seconds",
                description="Latency of classify's BLS sub-request (one per execute), seconds",
                kind=family.HISTOGRAM,
            ),
            family(
                name="tritonstack_predictions_total",
                description="Rows classified, by predicted label",
                kind=family.COUNTER,
            ),
        )
        self.routed, self.failures, self.duration = {}, {}, {}
        for target, runtime in ((self.preferred, "tensorrt"), (self.fallback, "onnx")):
            labels = {"model": model_name, "target": target}
            self.routed[target] = routed.Metric(labels={**labels, "runtime": runtime})
            self.failures[target] = failures.Metric(labels=labels)
            self.duration[target] = duration.Metric(labels=labels, buckets=SUBREQUEST_BUCKETS)
        self.predictions = [
            predictions.Metric(labels={"model": model_name, "label": label.decode()})
            for label in self.labels
        ]

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
        rows = np.concatenate(features)
        sub_request = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=["class"],
            inputs=[pb_utils.Tensor("features", rows)],
            preferred_memory=self.output_memory,
        )
        started = time.perf_counter()
        sub_response = await sub_request.async_exec()
        self.duration[model].observe(time.perf_counter() - started)
        self.routed[model].increment(float(len(rows)))
        if sub_response.has_error():
            self.failures[model].increment(1.0)
            error = pb_utils.TritonError(
                f"classify: sub-request to {model} failed: {sub_response.error().message()}"
            )
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        output = pb_utils.get_output_tensor_by_name(sub_response, "class")
        if not output.is_cpu():
            error = pb_utils.TritonError(
                f"classify: {model} returned `class` in GPU memory although the sub-request "
                "asked for CPU memory (preferred_memory); this Python backend cannot copy it"
            )
            return [pb_utils.InferenceResponse(error=error) for _ in requests]
        scores = output.as_numpy()
        winners = np.argmax(scores, axis=1)
        labels = self.labels[winners].reshape(-1, 1)
        for metric, count in zip(self.predictions, np.bincount(winners), strict=False):
            if count:
                metric.increment(float(count))
        top = scores[np.arange(len(winners)), winners].astype(np.float32).reshape(-1, 1)
        bounds = np.cumsum([len(f) for f in features])[:-1]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("label", label), pb_utils.Tensor("score", score)]
            )
            for label, score in zip(np.split(labels, bounds), np.split(top, bounds), strict=False)
        ]
