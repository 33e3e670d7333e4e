"""Class probabilities -> string labels, vectorised over everything the batcher hands over.

Labels come from the file named by the `labels_file` parameter (one per line, class-index order),
so renaming a class is a data change, not a code change. The scores are also returned unchanged
as `probabilities`, for the reason given in config.pbtxt. STRING outputs are numpy object arrays
of bytes shaped [rows, 1]: the layout Triton serialises without a copy per element.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


def read_labels(model_dir: Path, config: dict) -> np.ndarray:
    relative = config["parameters"]["labels_file"]["string_value"]
    lines = (model_dir / relative).read_text(encoding="utf-8").splitlines()
    return np.array([line.strip().encode() for line in lines if line.strip()], dtype=object)


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

    def execute(self, requests):
        scores = [pb_utils.get_input_tensor_by_name(r, "class").as_numpy() for r in requests]
        # NaN rows: argmax returns the first NaN's index, so the label is deterministic.
        labels = self.labels[np.argmax(np.concatenate(scores), axis=1)].reshape(-1, 1)
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
