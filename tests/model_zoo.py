"""ONNX models of every class users bring, as exporters and converters write them by default.

Each builder writes one model and returns how the tests call it: `add-model`'s extra options,
and a reference answer (onnxruntime in-process, or numpy). The graphs are tiny and built here
(onnx.helper for what PyTorch, Paddle and hand-made exports write; skl2onnx, onnxmltools with
XGBoost and LightGBM for the converters' classifiers), so no download is needed:

- `image`: NCHW with a variable height and width (a global-pooling classifier head);
- `sequence`: token ids and their attention mask (INT64), of any length, naming the same dim
  as a text encoder's export does (an embedding and a masked mean);
- `fixed_export`: a PyTorch-style export with the example's batch fixed at 1 and tensors named
  `input.1`, `13`: no batch axis, max_batch_size 0;
- `scalar_and_rows`: a rank-0 scale beside a batch of rows (no batching: full shapes);
- `vector_output`: a [batch] output (dims [1] with an empty reshape);
- `minus_one_batch`: the batch written as dim_value -1, as older exporters do;
- `every_type`: BOOL, INT8/16/32/64, UINT8/16/32/64, FP16, FP32, FP64 inputs, one output each;
- `text`: STRING in and out;
- `stateful`: a recurrent step whose state [2, 1, 8] carries the batch on axis 1 (silero VAD's
  layout): served unbatched, the client sending stateN back as state;
- `recurrent`: a batched recurrent step, state [batch, 8], added with `--server-state`: kept
  by Triton's sequence batcher, clients sending sequence IDs;
- `sklearn_logistic`, `sklearn_forest`: skl2onnx with ZipMap off (label [batch] INT64 and
  probabilities);
- `xgboost`, `lightgbm`: onnxmltools (LightGBM's label declared [1] although it follows the
  batch; its ZipMap turned off).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
#: onnxmltools converts to at most this opset (1.16: "the converter support (15)").
CONVERTER_OPSET = 15
V = helper.make_tensor_value_info


@dataclass(frozen=True)
class ZooModel:
    name: str
    path: Path
    #: add-model's options besides the file and --name
    options: tuple[str, ...] = ()
    #: what the tests expect add-model to decide
    max_batch_size: int = 64
    state: dict[str, str] = field(default_factory=dict)
    #: whether JSON can carry every tensor (FP16 and BF16 travel only as binary)
    json: bool = True
    tensorrt: bool = True

    @property
    def server_state(self) -> bool:
        """Whether its state is kept in the server (the sequence batcher's)."""
        return "--server-state" in self.options


def _save(nodes, inputs, outputs, path: Path, initializers=(), opset=OPSET) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _weights(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def image(folder: Path) -> ZooModel:
    w = numpy_helper.from_array(_weights(11, (3, 4)), "w")
    nodes = [
        helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["scores"], axis=1),
    ]
    path = _save(
        nodes,
        [V("images", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [V("scores", TensorProto.FLOAT, ["N", 4])],
        folder / "image.onnx",
        [w],
    )
    return ZooModel(
        "image", path, ("--shape", "images=1x3x8x8:2x3x16x24:4x3x32x32"), max_batch_size=4
    )


def sequence(folder: Path) -> ZooModel:
    table = numpy_helper.from_array(_weights(12, (100, 6)), "table")
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    axis = [numpy_helper.from_array(np.array([a], np.int64), f"axis{a}") for a in (1, 2)]
    nodes = [  # a mean over the tokens the mask keeps, as a text encoder's pooling does
        helper.make_node("Gather", ["table", "ids"], ["embedded"]),
        helper.make_node("Cast", ["attention_mask"], ["kept"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["kept", "axis2"], ["kept3"]),
        helper.make_node("Mul", ["embedded", "kept3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["total"], keepdims=0),
        helper.make_node("ReduceSum", ["kept3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Add", ["count", "one"], ["count1"]),
        helper.make_node("Div", ["total", "count1"], ["mean"]),
    ]
    path = _save(
        nodes,
        [
            V("ids", TensorProto.INT64, ["batch", "tokens"]),
            V("attention_mask", TensorProto.INT64, ["batch", "tokens"]),
        ],
        [V("mean", TensorProto.FLOAT, ["batch", 6])],
        folder / "sequence.onnx",
        [table, one, *axis],
        opset=13,
    )
    # --shape bounds ids alone: the mask names the same dim, so it takes the same bounds.
    return ZooModel("sequence", path, ("--shape", "ids=1x1:4x12:16x64"), max_batch_size=16)


def fixed_export(folder: Path) -> ZooModel:
    w = numpy_helper.from_array(_weights(13, (48, 5)), "fc.weight")
    nodes = [
        helper.make_node("Flatten", ["input.1"], ["11"]),
        helper.make_node("MatMul", ["11", "fc.weight"], ["13"]),
    ]
    path = _save(
        nodes,
        [V("input.1", TensorProto.FLOAT, [1, 3, 4, 4])],
        [V("13", TensorProto.FLOAT, [1, 5])],
        folder / "fixed_export.onnx",
        [w],
    )
    return ZooModel("fixed_export", path, max_batch_size=0)


def scalar_and_rows(folder: Path) -> ZooModel:
    nodes = [helper.make_node("Mul", ["rows", "scale"], ["scaled"])]
    path = _save(
        nodes,
        [V("scale", TensorProto.FLOAT, []), V("rows", TensorProto.FLOAT, ["n", 3])],
        [V("scaled", TensorProto.FLOAT, ["n", 3])],
        folder / "scalar_and_rows.onnx",
    )
    return ZooModel("scalar_and_rows", path, ("--shape", "rows=1x3:4x3:8x3"), max_batch_size=0)


def vector_output(folder: Path) -> ZooModel:
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=0)]
    path = _save(
        nodes,
        [V("x", TensorProto.FLOAT, ["n", 4])],
        [V("total", TensorProto.FLOAT, ["n"])],
        folder / "vector_output.onnx",
        [axes],
    )
    return ZooModel("vector_output", path)


def minus_one_batch(folder: Path) -> ZooModel:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    path = _save(
        nodes,
        [V("x", TensorProto.FLOAT, [-1, 4])],
        [V("y", TensorProto.FLOAT, [-1, 4])],
        folder / "minus_one_batch.onnx",
    )
    return ZooModel("minus_one_batch", path)


#: every_type's inputs: name and ONNX element type.
TYPES = {
    "b": TensorProto.BOOL,
    "i8": TensorProto.INT8,
    "i16": TensorProto.INT16,
    "i32": TensorProto.INT32,
    "i64": TensorProto.INT64,
    "u8": TensorProto.UINT8,
    "u16": TensorProto.UINT16,
    "u32": TensorProto.UINT32,
    "u64": TensorProto.UINT64,
    "f16": TensorProto.FLOAT16,
    "f32": TensorProto.FLOAT,
    "f64": TensorProto.DOUBLE,
}


def every_type(folder: Path) -> ZooModel:
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"]) for name in TYPES]
    path = _save(
        nodes,
        [V(n, t, ["n", 2]) for n, t in TYPES.items()],
        [V(f"{n}_out", t, ["n", 2]) for n, t in TYPES.items()],
        folder / "every_type.onnx",
    )
    return ZooModel(
        "every_type", path, ("--max-batch-size", "8"), max_batch_size=8, json=False, tensorrt=False
    )


def text(folder: Path) -> ZooModel:
    nodes = [helper.make_node("Identity", ["text"], ["echo"])]
    path = _save(
        nodes,
        [V("text", TensorProto.STRING, ["n", 2])],
        [V("echo", TensorProto.STRING, ["n", 2])],
        folder / "text.onnx",
    )
    return ZooModel("text", path, ("--max-string-bytes", "64"), tensorrt=False)


def stateful(folder: Path) -> ZooModel:
    w = numpy_helper.from_array(_weights(14, (8, 8)), "w")
    nodes = [
        helper.make_node("MatMul", ["state", "w"], ["mixed"]),
        helper.make_node("Add", ["mixed", "chunk"], ["summed"]),
        helper.make_node("Tanh", ["summed"], ["stateN"]),  # bounded, as a recurrent cell's
        helper.make_node("ReduceMean", ["stateN"], ["score"], axes=[0, 2], keepdims=0),
    ]
    path = _save(
        nodes,
        [V("chunk", TensorProto.FLOAT, [1, 8]), V("state", TensorProto.FLOAT, [2, 1, 8])],
        [V("score", TensorProto.FLOAT, [1]), V("stateN", TensorProto.FLOAT, [2, 1, 8])],
        folder / "stateful.onnx",
        [w],
        opset=13,
    )
    return ZooModel("stateful", path, max_batch_size=0, state={"state": "stateN"})


def recurrent(folder: Path) -> ZooModel:
    w = numpy_helper.from_array(_weights(15, (8, 8)), "w")
    nodes = [
        helper.make_node("MatMul", ["state", "w"], ["mixed"]),
        helper.make_node("Add", ["mixed", "chunk"], ["summed"]),
        helper.make_node("Tanh", ["summed"], ["stateN"]),
        helper.make_node("ReduceMean", ["stateN"], ["score"], axes=[1], keepdims=1),
    ]
    path = _save(
        nodes,
        [V("chunk", TensorProto.FLOAT, ["N", 8]), V("state", TensorProto.FLOAT, ["N", 8])],
        [V("score", TensorProto.FLOAT, ["N", 1]), V("stateN", TensorProto.FLOAT, ["N", 8])],
        folder / "recurrent.onnx",
        [w],
        opset=13,
    )
    return ZooModel("recurrent", path, ("--server-state",), state={"state": "stateN"},
                    tensorrt=False)  # fmt: skip


def _training_data(classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(21)
    x = rng.standard_normal((120, 4)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)


def _sklearn(model, folder: Path, name: str) -> Path:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    x, y = _training_data()
    model.fit(x, y)
    onx = convert_sklearn(
        model,
        initial_types=[("features", FloatTensorType([None, 4]))],
        options={id(model): {"zipmap": False}},
        target_opset={"": OPSET, "ai.onnx.ml": 3},
    )
    path = folder / f"{name}.onnx"
    onnx.save(onx, str(path))
    return path


def sklearn_logistic(folder: Path) -> ZooModel:
    from sklearn.linear_model import LogisticRegression

    path = _sklearn(LogisticRegression(max_iter=200), folder, "sklearn_logistic")
    return ZooModel("sklearn_logistic", path, tensorrt=False)


def sklearn_forest(folder: Path) -> ZooModel:
    from sklearn.ensemble import RandomForestClassifier

    path = _sklearn(
        RandomForestClassifier(n_estimators=5, max_depth=3, random_state=0),
        folder,
        "sklearn_forest",
    )
    return ZooModel("sklearn_forest", path, tensorrt=False)


def xgboost(folder: Path) -> ZooModel:
    import xgboost as xgb
    from onnxmltools import convert_xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType

    x, y = _training_data()
    model = xgb.XGBClassifier(n_estimators=5, max_depth=2).fit(x, y)
    onx = convert_xgboost(
        model,
        initial_types=[("features", FloatTensorType([None, 4]))],
        target_opset=CONVERTER_OPSET,
    )
    path = folder / "xgboost.onnx"
    onnx.save(onx, str(path))
    return ZooModel("xgboost", path, tensorrt=False)


def lightgbm(folder: Path) -> ZooModel:
    import lightgbm as lgb
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    x, y = _training_data()
    model = lgb.LGBMClassifier(n_estimators=5, num_leaves=4, verbose=-1).fit(x, y)
    onx = convert_lightgbm(
        model,
        initial_types=[("features", FloatTensorType([None, 4]))],
        zipmap=False,
        target_opset=CONVERTER_OPSET,
    )
    path = folder / "lightgbm.onnx"
    onnx.save(onx, str(path))
    return ZooModel("lightgbm", path, tensorrt=False)


BUILDERS: dict[str, Callable[[Path], ZooModel]] = {
    build.__name__: build
    for build in (
        image,
        sequence,
        fixed_export,
        scalar_and_rows,
        vector_output,
        minus_one_batch,
        every_type,
        text,
        stateful,
        recurrent,
        sklearn_logistic,
        sklearn_forest,
        xgboost,
        lightgbm,
    )
}


def reference(model: ZooModel, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnxruntime in-process on the graph's own inputs (strings as str)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    decoded = {
        k: np.array(
            [v.decode() if isinstance(v, bytes) else v for v in a.reshape(-1)], dtype=object
        ).reshape(a.shape)
        if a.dtype == object
        else a
        for k, a in feeds.items()
    }
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, decoded), strict=True))
