"""A Python-based Triton backend named `onnxruntime`, for the embedded CPU runtime.

The tritonserver shipped in the nvidia-pytriton wheel has only the Python backend. Triton serves
every model whose configuration says `platform: "onnxruntime_onnx"` with the backend directory
`onnxruntime/`; when that directory holds a `model.py` instead of `libtriton_onnxruntime.so`, the
Python backend runs it. So the unchanged `classifier` configuration is served here by the
onnxruntime package, while the dynamic batcher, ensembles, BLS and metrics stay Triton's own.

It does what Triton's C++ onnxruntime backend (the GPU container's) does with a config and a
graph, so that a model works in both or in neither: `onnxruntime_rules.py` (tritonstack's, copied
beside this file) refuses what that backend refuses, with its words; a rank-0 graph input (its
config says `dims: [1]`) is fed as a 0-d array and a rank-0 output returned as [1], as that backend
does; strings go in and out as Triton's bytes. Reshapes (`dims: [1]` with `reshape: { shape: [] }`)
are Triton core's, before and after this backend.

Requests the dynamic batcher hands over together run in one `InferenceSession.run` when their
shapes agree (which is what makes batching pay off); requests with other variable dims run in
groups of their own, and a request onnxruntime refuses fails alone, not the others beside it.
"""

import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnxruntime_rules as rules  # beside this file: found through the line above


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
        graph = rules.graph_from_session(self.session)
        errors = rules.load_errors(config, graph)
        if errors:
            raise pb_utils.TritonModelException(
                f"{errors[0]} (Triton's onnxruntime backend refuses it the same way; "
                "`tritonstack check` lists every problem)"
            )
        ranks = {t.name: len(t.dims) for t in (*graph.inputs, *graph.initializers, *graph.outputs)}
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        self.scalar_inputs = {n for n in self.input_names if ranks[n] == 0}
        self.scalar_outputs = {n for n in self.output_names if ranks[n] == 0}
        self.batched = rules.max_batch_size(config) > 0

    def execute(self, requests):
        responses = [None] * len(requests)
        groups = {}
        for index, request in enumerate(requests):
            try:
                feeds = self._feeds(request)
            except Exception as exc:  # an input this backend cannot read: that request fails
                responses[index] = self._error(exc)
                continue
            if not self.batched:
                responses[index] = self._answer([feeds])[0]
                continue
            shapes = tuple((name, feeds[name].shape[1:]) for name in self.input_names)
            groups.setdefault(shapes, []).append((index, feeds))
        for members in groups.values():
            answers = self._answer([feeds for _, feeds in members])
            for (index, _), answer in zip(members, answers, strict=True):
                responses[index] = answer
        return responses

    def _answer(self, feeds_list):
        """Responses for requests whose inputs can be stacked: one run, split by rows; when the
        run fails, each request alone, so only those onnxruntime refuses fail."""
        if len(feeds_list) > 1:
            sizes = [len(next(iter(f.values()))) for f in feeds_list]
            merged = {n: np.concatenate([f[n] for f in feeds_list]) for n in self.input_names}
            try:
                outputs = self._run(merged)
            except Exception:
                return [self._answer([feeds])[0] for feeds in feeds_list]
            bounds = np.cumsum(sizes)[:-1]
            parts = [np.split(output, bounds) for output in outputs]
            return [self._respond([part[i] for part in parts]) for i in range(len(feeds_list))]
        try:
            return [self._respond(self._run(feeds_list[0]))]
        except Exception as exc:
            return [self._error(exc)]

    def _feeds(self, request):
        feeds = {}
        for name in self.input_names:
            value = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            if value.dtype == np.object_:  # Triton's bytes; onnxruntime takes str
                value = np.array(
                    [item.decode("utf-8", "surrogateescape") for item in value.reshape(-1)],
                    dtype=np.object_,
                ).reshape(value.shape)
            if name in self.scalar_inputs:
                value = value.reshape(())
            feeds[name] = value
        return feeds

    def _run(self, feeds):
        return self.session.run(self.output_names, feeds)

    def _respond(self, outputs):
        tensors = []
        for name, value in zip(self.output_names, outputs, strict=True):
            value = np.asarray(value)
            if name in self.scalar_outputs:
                value = value.reshape(1)
            if value.dtype == np.object_:
                value = np.array(
                    [str(item).encode("utf-8", "surrogateescape") for item in value.reshape(-1)],
                    dtype=np.object_,
                ).reshape(value.shape)
            tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(value)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    @staticmethod
    def _error(exc):
        message = " ".join(str(exc).split()) or type(exc).__name__
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
