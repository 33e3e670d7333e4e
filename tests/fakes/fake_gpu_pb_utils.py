"""FAKE `triton_python_backend_utils` with a GPU's BLS semantics, for test_classify_gpu.py.

This machine has no GPU, and on the embedded runtime every tensor is in CPU memory, so the
documented GPU behaviour of a BLS call is reproduced here, and nothing else:

- a sub-request's output tensors stay on the device the called model produced them on, unless
  the request's `preferred_memory` asks for CPU memory (python_backend README, "Business Logic
  Scripting": outputs "allocated on the same device where the output tensors were received from
  the model"; TensorRT and GPU ONNX Runtime instances produce GPU outputs);
- `.as_numpy()` on a GPU tensor raises "Tensor is stored in GPU and cannot be converted to
  NumPy." (python_backend `src/pb_tensor.cc`);
- the stub adds `PreferredMemory` and the memory-type constants to this module only after it has
  imported the model's file (seen on the real 2.51 stub): `import_model` hides them meanwhile.

The called model is a Python function the test supplies (`FakeServer.models`), so its answer can
be compared with onnxruntime on the real `model.onnx`. Metrics and the logger only record calls.
`tests/gpu/run.sh` checks the same path on a real GPU with the real Python backend.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_CPU_PINNED = 1
TRITONSERVER_MEMORY_GPU = 2


class TritonModelException(Exception):
    pass


@dataclass(frozen=True)
class PreferredMemory:
    preferred_memory_type: int
    preferred_device_id: int = 0


class Tensor:
    def __init__(self, name: str, array: np.ndarray, *, on_gpu: bool = False) -> None:
        self._name, self._array, self._on_gpu = name, np.asarray(array), on_gpu

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return not self._on_gpu

    def as_numpy(self) -> np.ndarray:
        if self._on_gpu:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._array


class TritonError:
    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors=(), error: TritonError | None = None) -> None:
        self._outputs, self._error = list(output_tensors), error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs


@dataclass
class FakeServer:
    """What the fake BLS calls reach: models by name, and whether each produces GPU outputs."""

    models: dict = field(default_factory=dict)  # name -> f(inputs: dict) -> dict of outputs
    gpu_models: set = field(default_factory=set)
    ready: set = field(default_factory=set)
    ignores_preferred_memory: bool = False  # a backend that leaves outputs on the GPU anyway
    calls: list = field(default_factory=list)


SERVER = FakeServer()


class InferenceRequest:
    def __init__(
        self,
        model_name: str,
        inputs,
        requested_output_names,
        preferred_memory: PreferredMemory | None = None,
        **_: object,
    ) -> None:
        self.model_name, self.inputs = model_name, list(inputs)
        self.requested_output_names = list(requested_output_names)
        self.preferred_memory = preferred_memory

    def _run(self) -> InferenceResponse:
        SERVER.calls.append(self)
        outputs = SERVER.models[self.model_name]({t.name(): t.as_numpy() for t in self.inputs})
        wants_cpu = (
            self.preferred_memory is not None
            and self.preferred_memory.preferred_memory_type != TRITONSERVER_MEMORY_GPU
            and not SERVER.ignores_preferred_memory
        )
        on_gpu = self.model_name in SERVER.gpu_models and not wants_cpu
        return InferenceResponse(
            [Tensor(n, outputs[n], on_gpu=on_gpu) for n in self.requested_output_names]
        )

    def exec(self) -> InferenceResponse:
        return self._run()

    async def async_exec(self) -> InferenceResponse:
        return self._run()


def get_input_tensor_by_name(request, name: str) -> Tensor | None:
    return next((t for t in request.inputs if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors() if t.name() == name), None)


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return model_name in SERVER.ready


class _Metric:
    def __init__(self, labels: dict, buckets=None) -> None:
        self.labels, self.buckets, self.value = labels, buckets, 0.0

    def increment(self, value: float) -> None:
        self.value += value

    def observe(self, value: float) -> None:
        self.value += value


class MetricFamily:
    COUNTER, GAUGE, HISTOGRAM = 0, 1, 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        self.name, self.kind = name, kind

    def Metric(self, labels: dict, buckets=None) -> _Metric:
        return _Metric(labels, buckets)


class Logger:
    @staticmethod
    def log_info(message: str) -> None:
        pass

    @staticmethod
    def log_warn(message: str) -> None:
        pass

    @staticmethod
    def log_error(message: str) -> None:
        pass


#: What the real stub sets on this module after the model's file is imported, not before.
ADDED_AFTER_IMPORT = ("PreferredMemory", "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU")


def import_model(path: Path, name: str):
    """Import a model.py as the stub does: without the names the stub adds only afterwards."""
    this = sys.modules[__name__]
    hidden = {n: getattr(this, n) for n in ADDED_AFTER_IMPORT}
    for n in hidden:
        delattr(this, n)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for n, value in hidden.items():
            setattr(this, n, value)
    return module
