"""The GPU check's stand-in for Triton's C++ onnxruntime backend: `model.onnx` run on the GPU.

The nvidia-pytriton wheel's tritonserver has only the Python backend, and onnxruntime-gpu is too
large to carry to a machine that reaches no package registry. So this Python-based backend named
`onnxruntime` serves the unchanged `classifier` (its `configs/gpu.pbtxt`: one KIND_GPU instance)
by interpreting the ONNX graph's nodes with torch on the instance's GPU, and answers the way the
C++ backend's GPU instances do: the outputs stay in GPU memory, handed to Triton through DLPack.
That is what `classify` (BLS) and `pipeline` (ensemble into a Python model) must cope with.

On a KIND_CPU instance (how `tests/gpu/run.sh --device cpu` exercises the check in `make test`)
the same nodes run in numpy and the outputs are CPU tensors. The weights are read with the onnx
package; only the operators a 128-64-2 MLP export uses are implemented, and any other operator
stops the model from loading with its name.
"""

import json
from pathlib import Path

import numpy as np
import onnx
import triton_python_backend_utils as pb_utils
from onnx import numpy_helper

ONNX_DTYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64}


class Graph:
    """The graph's nodes in order, evaluated with `xp` (numpy, or torch on a device)."""

    def __init__(self, model: onnx.ModelProto, to_array):
        self.nodes = list(model.graph.node)
        self.values = {i.name: to_array(numpy_helper.to_array(i)) for i in model.graph.initializer}
        known = {"Cast", "MatMul", "Gemm", "Add", "Sub", "Mul", "Relu", "Sigmoid", "Concat"}
        unknown = sorted({n.op_type for n in self.nodes} - known)
        if unknown:
            raise pb_utils.TritonModelException(
                f"the GPU check's onnxruntime stand-in has no {unknown}; it implements {known}"
            )

    def run(self, feeds: dict, outputs: list[str], ops) -> list:
        values = {**self.values, **feeds}
        for node in self.nodes:
            args = [values[name] for name in node.input]
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            values[node.output[0]] = ops(node.op_type, args, attributes)
        return [values[name] for name in outputs]


def arithmetic(op: str, args: list, attributes: dict, library: dict):
    """One node: the arithmetic numpy and torch spell alike, the rest from `library`."""
    a = args[0]
    if op == "MatMul":
        return a @ args[1]
    if op == "Gemm":
        b = args[1].T if attributes.get("transB") else args[1]
        return a @ b + (args[2] if len(args) > 2 else 0)
    if op == "Add":
        return a + args[1]
    if op == "Sub":
        return a - args[1]
    if op == "Mul":
        return a * args[1]
    return library[op](args, attributes)


NUMPY = {
    "Cast": lambda args, attributes: args[0].astype(ONNX_DTYPES[attributes["to"]]),
    "Relu": lambda args, _: np.maximum(args[0], 0),
    "Sigmoid": lambda args, _: 1 / (1 + np.exp(-args[0])),
    "Concat": lambda args, attributes: np.concatenate(args, axis=attributes["axis"]),
}


def numpy_ops(op: str, args: list, attributes: dict):
    return arithmetic(op, args, attributes, NUMPY)


def to_torch(array: np.ndarray, device):
    """A torch copy of `array` on `device`, by the buffer protocol: torch's numpy bridge needs
    the numpy torch was built against, and the stub needs numpy 1 (tests/gpu/prepare.py)."""
    import torch

    dtypes = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
    if array.ndim == 0 or array.size == 0:
        return torch.tensor(array.tolist(), dtype=dtypes[array.dtype], device=device)
    flat = torch.frombuffer(bytearray(array.tobytes()), dtype=dtypes[array.dtype])
    return flat.reshape(array.shape).to(device)


def torch_ops(op: str, args: list, attributes: dict):
    import torch

    dtypes = {np.float32: torch.float32, np.float64: torch.float64}
    library = {
        "Cast": lambda args, attributes: args[0].to(dtypes[ONNX_DTYPES[attributes["to"]]]),
        "Relu": lambda args, _: torch.relu(args[0]),
        "Sigmoid": lambda args, _: torch.sigmoid(args[0]),
        "Concat": lambda args, attributes: torch.cat(args, dim=attributes["axis"]),
    }
    return arithmetic(op, args, attributes, library)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        model = onnx.load(str(path))
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        self.gpu = args["model_instance_kind"] == "GPU"
        if self.gpu:
            import torch

            # FP32 as the ONNX file says: no TF32 shortcut in the matrix products.
            torch.backends.cuda.matmul.allow_tf32 = False
            self.device = torch.device("cuda", int(args["model_instance_device_id"]))
            self.graph = Graph(model, lambda array: to_torch(array, self.device))
        else:
            self.graph = Graph(model, lambda array: array)

    def execute(self, requests):
        features = [
            {n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.input_names}
            for r in requests
        ]
        merged = {n: np.concatenate([f[n] for f in features]) for n in self.input_names}
        sizes = [len(f[self.input_names[0]]) for f in features]
        if self.gpu:
            import torch
            from torch.utils.dlpack import to_dlpack

            feeds = {n: to_torch(v, self.device) for n, v in merged.items()}
            outputs = self.graph.run(feeds, self.output_names, torch_ops)
            parts = [torch.split(o.contiguous(), sizes) for o in outputs]
            # Each response's outputs stay in GPU memory, as the C++ backend's GPU instances leave
            # them: DLPack hands Triton the device pointer, nothing is copied to the host.
            return [
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor.from_dlpack(name, to_dlpack(part[i].contiguous()))
                        for name, part in zip(self.output_names, parts, strict=True)
                    ]
                )
                for i in range(len(requests))
            ]
        outputs = self.graph.run(merged, self.output_names, numpy_ops)
        bounds = np.cumsum(sizes)[:-1]
        parts = [np.split(o, bounds) for o in outputs]
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor(name, np.ascontiguousarray(part[i]))
                    for name, part in zip(self.output_names, parts, strict=True)
                ]
            )
            for i in range(len(requests))
        ]
