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

State kept in the server (`sequence_batching { state [...] }`): Triton's C++ backend hands each
state output to core (TRITONBACKEND_StateUpdate), which feeds it back on the sequence's next
request; the Python backend has no such call, and core then feeds the initial state every time.
So this backend keeps each sequence's state itself, by correlation ID: the sequence batcher sends
every request of a sequence to the same model instance (both strategies), the START request takes
core's initial state, END forgets it, and a sequence idle past max_sequence_idle_microseconds
(which core has already ended) is forgotten at the next execution.
"""

import json
import sys
import time
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
        try:
            self.session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # worded as Triton's backend words onnxruntime's errors
            raise pb_utils.TritonModelException(rules.ort_message(str(exc))) from None
        graph = rules.graph_from_session(self.session)
        errors = rules.load_errors(config, graph)
        if errors:
            raise pb_utils.TritonModelException(
                f"{errors[0]} (Triton's onnxruntime backend refuses it the same way; "
                "`tritonstack check` lists every problem)"
            )
        unsafe = rules.serving_errors(config, graph)
        if unsafe:  # refused here, unlike Triton's backend, so that no server serves it
            raise pb_utils.TritonModelException(
                f"{unsafe[0]} (refused here; `tritonstack check` lists every problem)"
            )
        ranks = {t.name: len(t.dims) for t in (*graph.inputs, *graph.initializers, *graph.outputs)}
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        self.scalar_inputs = {n for n in self.input_names if ranks[n] == 0}
        #: rank-0 outputs, answered in the shape their config declares ([1], [1, 1], ...)
        self.scalar_outputs = {
            io["name"]: tuple(rules.declared_dims(io))
            for io in config["output"]
            if ranks[io["name"]] == 0
        }
        self.batched = rules.max_batch_size(config) > 0
        sequence = config.get("sequence_batching") or {}
        #: state input -> state output, for state kept in the server
        self.states = {s["input_name"]: s["output_name"] for s in sequence.get("state", [])}
        self.feed_names = [*self.input_names, *self.states]
        self.run_names = [*self.output_names, *self.states.values()]
        idle_us = int(sequence.get("max_sequence_idle_microseconds") or 1_000_000)
        self.idle_s = idle_us / 1e6
        #: correlation ID -> (monotonic time of its last request, state input -> value)
        self.kept = {}

    def execute(self, requests):
        if self.states:
            self._forget_idle(time.monotonic())
        results = [None] * len(requests)
        groups = {}
        for index, request in enumerate(requests):
            try:
                feeds = self._feeds(request)
            except Exception as exc:  # an input this backend cannot read: that request fails
                results[index] = exc
                continue
            if not self.batched:
                results[index] = self._answer([feeds])[0]
                continue
            shapes = tuple((name, feeds[name].shape[1:]) for name in self.feed_names)
            groups.setdefault(shapes, []).append((index, feeds))
        for members in groups.values():
            answers = self._answer([feeds for _, feeds in members])
            for (index, _), answer in zip(members, answers, strict=True):
                results[index] = answer
        responses = []
        for request, result in zip(requests, results, strict=True):
            if isinstance(result, Exception):
                responses.append(self._error(result))
                continue
            outputs = dict(zip(self.run_names, result, strict=True))
            if self.states:
                self._keep(request, outputs)
            responses.append(self._respond([outputs[name] for name in self.output_names]))
        return responses

    def _answer(self, feeds_list):
        """Each request's outputs (or the exception that failed it) for requests whose inputs
        can be stacked: one run, split by rows; when the run fails, each request alone, so only
        those onnxruntime refuses fail."""
        if len(feeds_list) > 1:
            sizes = [len(next(iter(f.values()))) for f in feeds_list]
            merged = {n: np.concatenate([f[n] for f in feeds_list]) for n in self.feed_names}
            try:
                outputs = self._run(merged)
            except Exception:
                return [self._answer([feeds])[0] for feeds in feeds_list]
            bounds = np.cumsum(sizes)[:-1]
            parts = [np.split(output, bounds) for output in outputs]
            return [[part[i] for part in parts] for i in range(len(feeds_list))]
        try:
            return [self._run(feeds_list[0])]
        except Exception as exc:
            return [exc]

    def _keep(self, request, outputs):
        """After a request of a sequence ran: its state outputs are the next request's state."""
        sequence = request.correlation_id()
        if not sequence:  # the direct strategy's filler for an empty batch slot
            return
        if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
            self.kept.pop(sequence, None)
            return
        values = {name: np.array(outputs[out]) for name, out in self.states.items()}
        self.kept[sequence] = (time.monotonic(), values)

    def _forget_idle(self, now):
        idle = [key for key, (last, _) in self.kept.items() if now - last > self.idle_s]
        for key in idle:
            del self.kept[key]

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
        if self.states:
            sequence = request.correlation_id()
            start = request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            kept = None if start else self.kept.get(sequence)
            for name in self.states:
                # The initial state (core's, as its config says) at a sequence's start.
                feeds[name] = (
                    kept[1][name]
                    if kept is not None
                    else pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                )
        return feeds

    def _run(self, feeds):
        return self.session.run(self.run_names, feeds)

    def _respond(self, outputs):
        tensors = []
        for name, value in zip(self.output_names, outputs, strict=True):
            value = np.asarray(value)
            if name in self.scalar_outputs:
                value = value.reshape(self.scalar_outputs[name])
            if value.dtype == np.object_:
                value = np.array(
                    [str(item).encode("utf-8", "surrogateescape") for item in value.reshape(-1)],
                    dtype=np.object_,
                ).reshape(value.shape)
            tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(value)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    @staticmethod
    def _error(exc):
        message = rules.ort_message(" ".join(str(exc).split())) or type(exc).__name__
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
