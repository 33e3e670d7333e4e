"""Class probabilities -> string labels, vectorised over everything the batcher hands over.

Labels come from the file named by the `labels_file` parameter (one per line, class-index order),
so renaming a class is a data change, not a code change. The scores are also returned unchanged
as `probabilities`, for the reason given in config.pbtxt. STRING outputs are numpy object arrays
of bytes shaped [rows, 1]: the layout Triton serialises without a copy per element.

The labels' reader is labels_file.py beside this file, so that classify runs the same one:
Triton's stub puts only a model's own directory and version directory on sys.path, so classify
imports it through a relative symlink (which COPY, the embedded runtime's repository view and a
bind mount all keep pointing here).

Business metric: `tritonstack_predictions_total{model, label}` counts rows by predicted label on
Triton's metrics port (pb_utils.MetricFamily), so a shift in the label distribution is visible in
Prometheus. One series per label is created at start, so every label is exported from 0 on.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from labels_file import read_labels


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.labels = read_labels(Path(args["model_repository"]), config)
        classes = int(config["input"][0]["dims"][0])
        if len(self.labels) != classes:
            raise pb_utils.TritonModelException(
                f"postprocess: labels file has {len(self.labels)} labels but input `class` has "
                f"{classes} scores; write one label per class, in class order"
            )
        # The family must outlive its metrics (Triton deletes them with it): keep both on self.
        self.predictions_family = pb_utils.MetricFamily(
            name="tritonstack_predictions_total",
            description="Rows classified, by predicted label",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.predictions = [
            self.predictions_family.Metric(
                labels={"model": args["model_name"], "label": label.decode()}
            )
            for label in self.labels
        ]

    def execute(self, requests):
        scores = [pb_utils.get_input_tensor_by_name(r, "class").as_numpy() for r in requests]
        # NaN rows: argmax returns the first NaN's index, so the label is deterministic.
        winners = np.argmax(np.concatenate(scores), axis=1)
        labels = self.labels[winners].reshape(-1, 1)
        # One increment per label present in this batch, not per row: each is a message to Triton.
        for metric, rows in zip(self.predictions, np.bincount(winners), strict=False):
            if rows:
                metric.increment(float(rows))
        bounds = np.cumsum([len(s) for s in scores])[:-1]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("label", part),
                    pb_utils.Tensor("probabilities", score),
                ]
            )
            for part, score in zip(np.split(labels, bounds), scores, strict=False)
        ]
