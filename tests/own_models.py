"""Models of the tests' own making, nothing like the demo: what a user brings to `add-model`.

- `two_inputs`: a ranker over an FP32 `query` [batch, 24] and an INT64 `bucket` [batch, 2]
  (small indices), returning `probs` FP32 [batch, 3] (a softmax; labels: LABELS) and `logits`.
- `one_input`: an FP32 `x` [batch, 5] returning `y` FP32 [batch, 1], no labels.
- `large_input`: an FP32 `pixels` [batch, 262144] (1 MiB a row, an image model's size)
  returning their `mean` [batch, 1]: a request larger than the gateway's buffer.

Built with onnx.helper from fixed weights, so the reference answer is numpy's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LABELS = ("low", "medium", "high")
OPSET = 17
WIDTH = 24
BUCKETS = 2


def _weights(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _save(graph, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8  # what onnxruntime and Triton's ORT backend both read
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def two_inputs(path: Path) -> Path:
    """logits = concat(query, float(bucket)) @ W + b; probs = softmax(logits)."""
    w = _weights(1, (WIDTH + BUCKETS, len(LABELS)))
    b = _weights(2, (len(LABELS),))
    nodes = [
        helper.make_node("Cast", ["bucket"], ["bucket_f"], to=TensorProto.FLOAT),
        helper.make_node("Concat", ["query", "bucket_f"], ["joined"], axis=1),
        helper.make_node("MatMul", ["joined", "W"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "ranker",
        [
            helper.make_tensor_value_info("query", TensorProto.FLOAT, ["batch", WIDTH]),
            helper.make_tensor_value_info("bucket", TensorProto.INT64, ["batch", BUCKETS]),
        ],
        [
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", len(LABELS)]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(LABELS)]),
        ],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    return _save(graph, path)


def two_inputs_reference(query: np.ndarray, bucket: np.ndarray) -> dict[str, np.ndarray]:
    w = _weights(1, (WIDTH + BUCKETS, len(LABELS)))
    b = _weights(2, (len(LABELS),))
    logits = np.concatenate([query, bucket.astype(np.float32)], axis=1) @ w + b
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return {"logits": logits, "probs": exp / exp.sum(axis=1, keepdims=True)}


def one_input(path: Path) -> Path:
    """y = x @ w."""
    w = _weights(3, (5, 1))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])],
        initializer=[numpy_helper.from_array(w, "w")],
    )
    return _save(graph, path)


def labels_file(path: Path) -> Path:
    path.write_text("\n".join(LABELS) + "\n")
    return path


#: large_input's row: 1 MiB of FP32, four times the gateway's buffer.
LARGE_WIDTH = 262144


def large_input(path: Path) -> Path:
    """mean = ReduceMean(pixels, axis 1)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["pixels"], ["mean"], axes=[1], keepdims=1)],
        "large",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", LARGE_WIDTH])],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["batch", 1])],
    )
    return _save(graph, path)
