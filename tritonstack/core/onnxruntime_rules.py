"""What Triton's C++ onnxruntime backend does with a model's config and its ONNX graph.

The GPU container serves ONNX models with that backend; the embedded runtime with a Python one
(backends/onnxruntime/model.py). A model the two judged differently would work in the tests and
fail in production, so both, and `tritonstack check` and `add-model`, apply the rules here, read
at the source of the release the container runs (onnxruntime_backend r26.06, unchanged on main;
each rule names its function, and tests/unit/test_onnxruntime_rules.py tests each one):

- `InputOutputInitializerInfos` (onnxruntime_utils.cc): every graph input and output is a
  tensor; a sequence or map anywhere (scikit-learn's ZipMap) fails the load. The backend reads
  dims from ONNX Runtime, which reports a symbolic or unknown dim as -1 and a tensor of unknown
  rank as rank 0.
- `AutoCompleteMaxBatch`: a model can batch only if every graph input and output has rank >= 1
  and a dynamic first dim.
- `AutoCompleteIO`: dims are the graph's without the batch dim; a tensor with none left is
  `dims: [1]`, with `reshape: { shape: [] }` when batching.
- `ValidateInputs`: as many config inputs (optional ones aside, sequence controls and states
  added) as graph inputs; each named input exists, has the graph's type, and its dims (the
  reshape's when there is one) match `CompareDimsSupported` loosely: a dynamic graph dim takes any
  config value, a fixed one only its own; a rank-0 graph input takes only dims of 1 and no
  batching. `optional` inputs never with batching.
- `ValidateOutputs`: each named output exists, has the graph's type, and its dims match exactly,
  -1 where the graph has -1; rank 0 as for inputs. Graph outputs the config leaves out are fine.

What it loads and then serves wrongly (`serving_errors`): a rank-0 graph tensor in a model with
max_batch_size > 0, whose reshape `[]` leaves no dims for the rank-0 check to compare. The
embedded backend and `tritonstack check` refuse it, and the container's launcher leaves it out.

The config is taken as the JSON Triton hands a backend (what `json_format.MessageToDict` makes of
a config.pbtxt, with `preserving_proto_field_name`): this module imports nothing but the
standard library, since the embedded backend's copy runs inside Triton's Python stub, where the
stand-in image has only numpy and onnxruntime.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

#: ONNX TensorProto element types and the Triton types the backend maps them to
#: (ModelConfigDataTypeToOnnxDataType); any other element type has none.
ONNX_TO_TRITON = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}
#: The backend's names for ONNX element types in its messages (OnnxDataTypeName).
ONNX_TYPE_NAMES = {
    1: "FLOAT",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "STRING",
    9: "BOOL",
    10: "FLOAT16",
    11: "DOUBLE",
    12: "UINT32",
    13: "UINT64",
    16: "BFLOAT16",
}
WILDCARD = -1
#: The backend's names for what a graph input or output is (OnnxTypeName); optional types and
#: anything else it calls unknown.
ONNX_TYPE_NAMES_BY_KIND = {
    "tensor": "ONNX_TYPE_TENSOR",
    "sequence": "ONNX_TYPE_SEQUENCE",
    "map": "ONNX_TYPE_MAP",
    "sparse_tensor": "ONNX_TYPE_SPARSETENSOR",
}
#: onnxruntime's Python type prefixes, as the kinds above.
_SESSION_KINDS = {"seq": "sequence"}


@dataclass(frozen=True)
class GraphTensor:
    """One graph input or output as the backend sees it through ONNX Runtime."""

    name: str
    #: "tensor", or what else it is ("sequence", "map", "optional", "sparse_tensor")
    kind: str
    #: ONNX TensorProto element type (0 when not a tensor)
    elem_type: int = 0
    #: -1 for a dynamic dim; () for rank 0, which is also what an unknown rank reads as
    dims: tuple[int, ...] = ()

    @property
    def triton_type(self) -> str | None:
        return ONNX_TO_TRITON.get(self.elem_type)

    @property
    def type_name(self) -> str:
        return ONNX_TYPE_NAMES.get(self.elem_type, f"element type {self.elem_type}")


@dataclass(frozen=True)
class Graph:
    """A session's inputs (initializers aside), outputs, and overridable initializers."""

    inputs: tuple[GraphTensor, ...]
    outputs: tuple[GraphTensor, ...]
    initializers: tuple[GraphTensor, ...] = ()


def graph_from_model(model) -> Graph:
    """What the backend sees of an onnx.ModelProto: ONNX Runtime's own report of it, which
    includes the shapes its inference gives outputs the graph declares without one."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return graph_from_session(session)


def graph_from_onnx(model) -> Graph:
    """From an onnx.ModelProto as declared (ONNX Runtime's report may add inferred output
    shapes: graph_from_model): initializers listed among the graph's inputs (IR < 4) are
    overridable initializers, not inputs; unknown dims read -1."""
    graph = model.graph
    names = {i.name for i in graph.initializer}
    return Graph(
        tuple(_from_value_info(v) for v in graph.input if v.name not in names),
        tuple(_from_value_info(v) for v in graph.output),
        tuple(_from_value_info(v) for v in graph.input if v.name in names),
    )


def _from_value_info(value) -> GraphTensor:
    kind = value.type.WhichOneof("value") or "unknown"
    if kind != "tensor_type":
        return GraphTensor(value.name, kind.removesuffix("_type"))
    tensor = value.type.tensor_type
    dims = ()
    if tensor.HasField("shape"):
        dims = tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else WILDCARD
            for d in tensor.shape.dim
        )
    return GraphTensor(value.name, "tensor", tensor.elem_type, dims)


def graph_from_session(session) -> Graph:
    """From an onnxruntime.InferenceSession (what the embedded backend has)."""
    return Graph(
        tuple(_from_node_arg(a) for a in session.get_inputs()),
        tuple(_from_node_arg(a) for a in session.get_outputs()),
        tuple(_from_node_arg(a) for a in session.get_overridable_initializers()),
    )


#: onnxruntime's Python type strings for element types: "tensor(float)" and so on.
_SESSION_TYPES = {
    "float": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "string": 8,
    "bool": 9,
    "float16": 10,
    "double": 11,
    "uint32": 12,
    "uint64": 13,
    "bfloat16": 16,
}


def _from_node_arg(arg) -> GraphTensor:
    kind, _, rest = arg.type.partition("(")
    if kind != "tensor":
        return GraphTensor(arg.name, _SESSION_KINDS.get(kind, kind))
    dims = tuple(d if isinstance(d, int) and d >= 0 else WILDCARD for d in arg.shape or ())
    return GraphTensor(arg.name, "tensor", _SESSION_TYPES.get(rest.rstrip(")"), 0), dims)


def supports_batching(graph: Graph) -> bool:
    """AutoCompleteMaxBatch: every input and output has rank >= 1 and a dynamic first dim."""
    return all(t.dims and t.dims[0] == WILDCARD for t in (*graph.inputs, *graph.outputs))


def config_dims(tensor: GraphTensor, batching: bool) -> tuple[list[int], list[int] | None]:
    """AutoCompleteIO: (dims, reshape shape or None) that describe `tensor` in a config."""
    dims = list(tensor.dims[1:] if batching else tensor.dims)
    if dims:
        return dims, None
    return [1], ([] if batching else None)


def _shape(dims: Iterable[int]) -> str:
    """ShapeToString: [-1,3]."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def _compare_dims(
    model: str, tensor: str, graph_dims: Sequence[int], dims: Sequence[int], max_batch: int,
    exact: bool,
) -> str | None:  # fmt: skip
    """CompareDimsSupported (onnxruntime_utils.cc): the message, or None when they agree."""
    if max_batch > 0:
        if not graph_dims or graph_dims[0] != WILDCARD:
            return (
                f"model '{model}', tensor '{tensor}': for the model to support batching the shape "
                "should have at least 1 dimension and the first dimension must be -1; but shape "
                f"expected by the model is {_shape(graph_dims)}"
            )
        full = [WILDCARD, *dims]
        if len(graph_dims) != len(full) or any(
            (exact or g != WILDCARD) and g != c for g, c in zip(graph_dims, full, strict=True)
        ):
            return (
                f"model '{model}', tensor '{tensor}': the model expects {len(graph_dims)} "
                f"dimensions (shape {_shape(graph_dims)}) but the model configuration specifies "
                f"{len(full)} dimensions (an initial batch dimension because max_batch_size > 0 "
                f"followed by the explicit tensor shape, making complete shape {_shape(full)})"
            )
        return None
    if len(graph_dims) != len(dims) or any(
        (exact or g != WILDCARD) and g != c for g, c in zip(graph_dims, dims, strict=True)
    ):
        return (
            f"model '{model}', tensor '{tensor}': the model expects {len(graph_dims)} dimensions "
            f"(shape {_shape(graph_dims)}) but the model configuration specifies {len(dims)} "
            f"dimensions (shape {_shape(dims)})"
        )
    return None


#: A config as Triton hands it to a backend: JSON, int64 fields possibly as strings.
Config = Mapping


def _ints(values: Iterable) -> list[int]:
    return [int(v) for v in values]


def declared_dims(io: Mapping) -> list[int]:
    """The dims the backend compares with the graph: the reshape's when there is one. A rank-0
    output is answered with these (ValidateOutputs keeps them in scalar_outputs_)."""
    reshape = io.get("reshape")
    return _ints(reshape.get("shape", [])) if reshape is not None else _ints(io.get("dims", []))


def _scalar(model: str, io: Mapping, dims: Sequence[int]) -> str | None:
    if any(d != 1 for d in dims):
        return (
            f"unable to load model '{model}', scalar tensor '{io['name']}', should only provide 1 "
            "in the model configuration when the model doesn't support batching. Model "
            f"configuration provided: {_shape(dims)}."
        )
    return None


def max_batch_size(config: Config) -> int:
    return int(config.get("max_batch_size", 0) or 0)


def expected_input_count(config: Config) -> int:
    """ModelInstanceState's count: config inputs, less the optional ones, plus batch inputs,
    sequence controls and implicit states."""
    inputs = config.get("input", [])
    count = sum(1 for i in inputs if not i.get("optional")) + len(config.get("batch_input", []))
    sequence = config.get("sequence_batching")
    if sequence is not None:
        count += len(sequence.get("control_input", [])) + len(sequence.get("state", []))
    return count


def load_errors(config: Config, graph: Graph) -> list[str]:
    """Why the backend would refuse to load `config` with `graph`: its own messages, in the
    order it checks (it stops at the first; all are listed here). Empty: it loads."""
    model = config.get("name", "")
    errors = []
    for tensor in (*graph.inputs, *graph.outputs, *graph.initializers):
        if tensor.kind != "tensor":
            kind = ONNX_TYPE_NAMES_BY_KIND.get(tensor.kind, "ONNX_TYPE_UNKNOWN")
            errors.append(
                f"Unsupported ONNX Type '{kind}' for I/O '{tensor.name}', expected "
                "'ONNX_TYPE_TENSOR'."
            )
    if errors:
        return errors
    expected = expected_input_count(config)
    if len(graph.inputs) != expected:
        errors.append(
            f"unable to load model '{model}', configuration expects {expected} inputs, model "
            f"provides {len(graph.inputs)}"
        )
    inputs = {t.name: t for t in (*graph.inputs, *graph.initializers)}
    outputs = {t.name: t for t in graph.outputs}
    batch = max_batch_size(config)
    for io in config.get("input", []):
        if io.get("optional") and batch != 0:
            errors.append(
                f"unable to load model '{model}', optional input '{io['name']}' is not supported "
                "for models that support batching"
            )
            continue
        errors += _tensor_errors(model, "input", io, inputs, batch, exact=False)
    for io in config.get("output", []):
        errors += _tensor_errors(model, "output", io, outputs, batch, exact=True)
    return errors


def _tensor_errors(
    model: str, role: str, io: Mapping, graph: dict[str, GraphTensor], batch: int, exact: bool
) -> list[str]:
    name = io["name"]
    tensor = graph.get(name)
    if tensor is None:
        allowed = ", ".join(sorted(graph))
        return [f"unexpected inference {role} '{name}', allowed {role}s are: {allowed}"]
    config_type = io.get("data_type", "TYPE_INVALID")
    if config_type != tensor.triton_type:
        # "TYPE_" + TRITONSERVER_DataTypeString(ConvertFromOnnxDataType(...)): the server's
        # name for a string tensor is BYTES, and a type it has none for is INVALID.
        provides = {"TYPE_STRING": "TYPE_BYTES", None: "TYPE_INVALID"}.get(
            tensor.triton_type, tensor.triton_type
        )
        return [
            f"unable to load model '{model}', configuration expects datatype {config_type} for "
            f"{role} '{name}', model provides {provides}"
        ]
    dims = declared_dims(io)
    if not tensor.dims:
        found = _scalar(model, io, dims)
    else:
        found = _compare_dims(model, name, tensor.dims, dims, batch, exact)
    return [found] if found else []


def ort_message(text: str) -> str:
    """onnxruntime's error ("[ONNXRuntimeError] : 1 : FAIL : ...", as Python raises it) in the
    backend's words (RETURN_IF_ORT_ERROR, onnxruntime_utils.h): "onnx runtime error 1: ..."."""
    found = _ORT_ERROR.search(text)
    return f"onnx runtime error {found[1]}: {found[2]}" if found else text


_ORT_ERROR = re.compile(r"\[ONNXRuntimeError\] : (\d+) : \w+ : (.*)", re.DOTALL)


def serving_errors(config: Config, graph: Graph) -> list[str]:
    """What the backend loads and then serves wrongly: a rank-0 graph tensor in a batching model.

    ValidateInputs/ValidateOutputs compare a rank-0 tensor's dims (its reshape's, `[]`) only
    against 1s, so nothing stops batching. Then SetInputTensors hands ONNX Runtime the whole
    batch's buffer as one scalar: every row of a batch, other requests' rows included, gets the
    first row's value. And ValidateOutputs keeps `[]` as the output's shape (scalar_outputs_),
    which the response code indexes for the batch dim: tritonserver dies of SIGSEGV at the first
    request, every other model with it (seen with r24.10; the code is unchanged in r26.06).
    """
    if max_batch_size(config) <= 0:
        return []
    batch = max_batch_size(config)
    fix = "set max_batch_size: 0 (a graph with a rank-0 tensor does not batch)"
    errors = []
    scalar_inputs = {t.name for t in graph.inputs if t.kind == "tensor" and not t.dims}
    for name in sorted(scalar_inputs):
        errors.append(
            f"input '{name}' has rank 0 in the graph but max_batch_size is {batch}: Triton's "
            "onnxruntime backend loads it, then gives every row of a batch (other requests' "
            f"too) the first row's value; {fix}"
        )
    scalar_outputs = {t.name for t in graph.outputs if t.kind == "tensor" and not t.dims}
    for io in config.get("output", []):
        if io.get("name") in scalar_outputs:
            errors.append(
                f"output '{io['name']}' has rank 0 in the graph but max_batch_size is {batch}: "
                "Triton's onnxruntime backend loads it, then tritonserver crashes (SIGSEGV) at "
                f"the first request; {fix}"
            )
    return errors
