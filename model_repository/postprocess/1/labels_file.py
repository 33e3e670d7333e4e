"""The class labels' reader, beside postprocess's labels.txt: this model owns both.

Triton's Python stub puts only a model's directory and its version directory on sys.path, so one
model cannot import another's module; classify/1/labels_file.py is a relative symlink to this
file, which survives Dockerfile.triton's COPY, the embedded runtime's view of symlinked model
directories and a bind mount.
"""

from pathlib import Path

import numpy as np


def read_labels(model_dir: Path, config: dict) -> np.ndarray:
    """The labels of the `labels_file` parameter (relative to `model_dir`) as bytes, in order."""
    relative = config["parameters"]["labels_file"]["string_value"]
    lines = (model_dir / relative).read_text(encoding="utf-8").splitlines()
    return np.array([line.strip().encode() for line in lines if line.strip()], dtype=object)
