"""A Python-based Triton backend named `onnxruntime`, for the embedded CPU runtime.

The tritonserver shipped in the nvidia-pytriton wheel has only the Python backend. Triton serves
every model whose configuration says `platform: "onnxruntime_onnx"` with the backend directory
`onnxruntime/`; when that directory holds a `model.py` instead of `libtriton_onnxruntime.so`, the
Python backend runs it. So the unchanged `classifier` configuration is served here by the
onnxruntime package, while the dynamic batcher, ensembles, BLS and metrics stay Triton's own.

One `InferenceSession.run` per execute(): all requests the dynamic batcher hands over are
concatenated, which is what makes batching pay off.
"""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        model_dir = Path(args["model_repository"])
        filename = config.get("default_model_filename") or "model.onnx"
        path = model_dir / args["model_version"] / filename
        if not path.is_file():
            raise pb_utils.TritonModelException(
                f"{path}: ONNX file not found; run `tritonstack export` or copy your model there"
            )
        parameters = config.get("parameters", {})
        options = ort.SessionOptions()
        threads = int(parameters.get("intra_op_thread_count", {}).get("string_value", "0"))
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        onnx_inputs = {i.name for i in self.session.get_inputs()}
        onnx_outputs = {o.name for o in self.session.get_outputs()}
        missing = set(self.input_names) - onnx_inputs | set(self.output_names) - onnx_outputs
        if missing:
            raise pb_utils.TritonModelException(
                f"{path}: config.pbtxt names {sorted(missing)} but the ONNX graph has inputs "
                f"{sorted(onnx_inputs)} and outputs {sorted(onnx_outputs)}; "
                "make the names in config.pbtxt match the graph (`tritonstack check` shows all)"
            )
        self.batched = config.get("max_batch_size", 0) > 0

    def execute(self, requests):
        if not self.batched:
            return [
                self._respond(self._run(request_feeds))
                for request_feeds in map(self._feeds, requests)
            ]
        feeds = [self._feeds(request) for request in requests]
        sizes = [len(next(iter(f.values()))) for f in feeds]
        merged = {
            name: np.concatenate([f[name] for f in feeds]) if len(feeds) > 1 else feeds[0][name]
            for name in self.input_names
        }
        outputs = self._run(merged)
        bounds = np.cumsum(sizes)[:-1]
        parts = [np.split(output, bounds) for output in outputs]
        return [self._respond([part[i] for part in parts]) for i in range(len(requests))]

    def _feeds(self, request):
        return {
            name: pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            for name in self.input_names
        }

    def _run(self, feeds):
        return self.session.run(self.output_names, feeds)

    def _respond(self, outputs):
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor(name, np.ascontiguousarray(value))
                for name, value in zip(self.output_names, outputs, strict=False)
            ]
        )
