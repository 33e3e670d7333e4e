"""An ONNX model's file against its config: the graph's inputs and outputs, their data types and
dims, as Triton's onnxruntime backend validates them when it loads the model.

The detailed checks below name the field and the fix; whatever they let through is then judged by
the backend's own rules (tritonstack.core.onnxruntime_rules, which the embedded runtime's backend
applies too), so `check` passes exactly what that backend loads."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from tritonclient.grpc import model_config_pb2

from tritonstack.check.messages import Say, did_you_mean, format_dims
from tritonstack.check.model_config import DEFAULT_FILENAMES, say_python_in_disguise
from tritonstack.core import onnxruntime_rules as rules
from tritonstack.core.repository import Model, ModelConfig

DataType = model_config_pb2.DataType

# ONNX TensorProto element types -> Triton data types: the backend's mapping, as enum values.
ONNX_TO_TRITON = {
    onnx_type: DataType.Value(name) for onnx_type, name in rules.ONNX_TO_TRITON.items()
}

# One ONNX dimension: a fixed size, a named dynamic size (dim_param), or None (unknown/dynamic).
OnnxDim = int | str | None


def check_onnx(model: Model, versions: Sequence[Path], say: Say) -> None:
    """Each version's ONNX file exists, loads, and matches the config's inputs and outputs."""
    filename = model.config.default_model_filename or DEFAULT_FILENAMES["onnxruntime"]
    for version in versions:
        path = version / filename
        if not path.is_file():
            if (version / "model.py").is_file():
                say_python_in_disguise(model, version, say)
            else:
                say(
                    f'platform "{model.config.platform or "onnxruntime_onnx"}"',
                    f"loads {version.name}/{filename} and {path} is missing",
                    "export the ONNX model there (for the demo classifier: `tritonstack "
                    "export`) or set default_model_filename",
                )
            continue
        try:
            graph = onnx.load(str(path)).graph
        except Exception as exc:  # any decode failure means onnxruntime cannot load it either
            reason = " ".join(str(exc).split()) or type(exc).__name__
            say(
                f"{version.name}/{filename}",
                f"cannot be loaded by onnx ({reason})",
                "re-export the model (for the demo classifier: `tritonstack export`)",
            )
            continue
        shown = f"{version.name}/{filename}"
        said = _Counted(say)
        _cross_check_onnx(model, shown, graph, said)
        if said.count:
            continue
        from google.protobuf import json_format

        config = json_format.MessageToDict(model.config, preserving_proto_field_name=True)
        config["name"] = model.name
        try:
            seen = rules.graph_from_model(onnx.load(str(path)))
        except Exception as exc:  # onnxruntime cannot load it: neither can Triton's backend
            reason = " ".join(str(exc).split())[:300]
            say(shown, f"cannot be loaded by onnxruntime ({reason})", "re-export the model")
            continue
        for message in rules.load_errors(config, seen):
            say(shown, f"would not load in Triton's onnxruntime backend: {message}", _fix(message))


class _Counted:
    """A Say that counts what it said."""

    def __init__(self, say: Say):
        self.say, self.count = say, 0

    def __call__(self, field: str, problem: str, fix: str) -> None:
        self.count += 1
        self.say(field, problem, fix)


@dataclass(frozen=True)
class _OnnxTensor:
    name: str
    elem_type: int | None  # None: not a tensor (sequence, map, ...)
    shape: list[OnnxDim] | None  # None: rank unknown


def _onnx_tensors(values: Iterable[onnx.ValueInfoProto]) -> dict[str, _OnnxTensor]:
    tensors = {}
    for value in values:
        if value.type.WhichOneof("value") != "tensor_type":
            tensors[value.name] = _OnnxTensor(value.name, None, None)
            continue
        tensor_type = value.type.tensor_type
        shape = None
        if tensor_type.HasField("shape"):
            shape = [
                d.dim_value
                if d.HasField("dim_value") and d.dim_value >= 0
                else (d.dim_param or None)  # dim_value -1 (older exporters): dynamic
                for d in tensor_type.shape.dim
            ]
        tensors[value.name] = _OnnxTensor(value.name, tensor_type.elem_type, shape)
    return tensors


def _cross_check_onnx(model: Model, shown: str, graph: onnx.GraphProto, say: Say) -> None:
    """Config inputs/outputs against the graph: what Triton's onnxruntime backend validates."""
    config = model.config
    initializers = {init.name for init in graph.initializer}  # listed as inputs before IR 4
    graph_io = {
        "input": _onnx_tensors(i for i in graph.input if i.name not in initializers),
        "output": _onnx_tensors(graph.output),
    }
    for section, declared, other in (
        ("input", config.input, "output"),
        ("output", config.output, "input"),
    ):
        available = graph_io[section]
        for index, io in enumerate(declared):
            field = f'{section}[{index}] "{io.name}"'
            tensor = available.get(io.name)
            if tensor is None:
                names = ", ".join(f'"{n}"' for n in available) or "none"
                if io.name in graph_io[other]:
                    say(
                        field,
                        f"is an {other} of {shown}, not an {section} (its {section}s: {names})",
                        f"move it from {section} to {other}",
                    )
                else:
                    say(
                        field,
                        f"is not an {section} of {shown} (its {section}s: {names})",
                        "rename it to the graph's name" + did_you_mean(io.name, available),
                    )
                continue
            _compare_onnx_tensor(config, field, io, tensor, shown, say, exact=section == "output")
    # The sequence batcher feeds its control inputs and implicit states itself.
    sequence = config.sequence_batching
    declared_inputs = {
        *(io.name for io in config.input),
        *(state.input_name for state in sequence.state),
        *(control.name for control in sequence.control_input),
    }
    for tensor in graph_io["input"].values():
        if tensor.name not in declared_inputs:
            say(
                "input",
                f'does not declare "{tensor.name}", an input of {shown}, so Triton cannot feed it',
                "add " + _suggest_io(config, tensor),
            )


def _compare_onnx_tensor(
    config: ModelConfig,
    field: str,
    io: model_config_pb2.ModelInput | model_config_pb2.ModelOutput,
    tensor: _OnnxTensor,
    shown: str,
    say: Say,
    exact: bool,
) -> None:
    if tensor.elem_type is None:
        say(
            field, f"is not a tensor in {shown}", "Triton's onnxruntime backend serves tensors only"
        )
        return
    expected_type = ONNX_TO_TRITON.get(tensor.elem_type)
    onnx_type = onnx.TensorProto.DataType.Name(tensor.elem_type)
    if expected_type is None:
        say(field, f"is ONNX {onnx_type} in {shown}, which Triton has no type for", "re-export it")
    elif io.data_type != expected_type:
        say(
            f"{field}.data_type",
            f"is {DataType.Name(io.data_type)} but {shown} has {onnx_type}",
            f"set data_type: {DataType.Name(expected_type)}",
        )
    if tensor.shape is None:
        return  # rank unknown to ONNX: the backend's rules (rank 0) judge it below
    if not tensor.shape and config.max_batch_size == 0:
        dims = list(io.reshape.shape if io.HasField("reshape") else io.dims)
        if any(d != 1 for d in dims):
            say(f"{field}.dims", f"is {format_dims(dims)} but {shown} has a scalar (rank 0)",
                "set dims: [ 1 ] (the backend feeds it as a scalar)")  # fmt: skip
        return
    has_reshape = io.HasField("reshape")
    dims = list(io.reshape.shape if has_reshape else io.dims)
    dims_field = f"{field}.{'reshape.shape' if has_reshape else 'dims'}"
    shape, batch = tensor.shape, config.max_batch_size
    onnx_text = f"{shown} has {_onnx_dims(shape)}"
    if batch > 0:
        if not shape or isinstance(shape[0], int):
            first = "no dimensions" if not shape else f"a fixed first dimension {shape[0]}"
            say(
                "max_batch_size",
                f"is {batch} but {field} in {shown} has {first}, so it cannot take a batch",
                "set max_batch_size: 0 and put the full shape in dims, or re-export the model "
                "with a dynamic batch dimension",
            )
            return
        rest = shape[1:]
        if _dims_match(dims, rest, exact):
            return
        fix = _set_dims(has_reshape, _config_dims(rest))
        if not rest:  # one value per row: core refuses empty dims; a reshape says it
            fix = "set dims: [ 1 ] with reshape: { shape: [ ] } (one value per row)"
        if len(dims) == len(shape) and _dims_match(dims[1:], rest, exact):
            say(
                dims_field,
                f"is {format_dims(dims)} but {onnx_text}: the first dimension is the batch, which "
                f"max_batch_size {batch} already adds",
                f"do not include the batch dimension in dims when max_batch_size > 0: {fix}",
            )
        else:
            say(
                dims_field,
                f"is {format_dims(dims)} but {onnx_text}, i.e. {_onnx_dims(rest)} after the batch "
                f"dimension that max_batch_size {batch} adds",
                fix,
            )
        return
    if _dims_match(dims, shape, exact):
        return
    fix = _set_dims(has_reshape, _config_dims(shape))
    if shape and not isinstance(shape[0], int) and _dims_match(dims, shape[1:], exact):
        fix = (
            f"the model's first dimension is a dynamic batch: set max_batch_size (e.g. 64) "
            f"to batch it, or {fix}"
        )
    say(dims_field, f"is {format_dims(dims)} but {onnx_text} (max_batch_size is 0)", fix)


def _fix(message: str) -> str:
    if "ONNX_TYPE_SEQUENCE" in message or "ONNX_TYPE_MAP" in message:
        from tritonstack.check.onnx_serving import ZIPMAP_FIX

        return f"serve tensors only; for a converter's classifier, {ZIPMAP_FIX}"
    return "`tritonstack add-model` writes a config the backend loads, from the graph"


def _set_dims(has_reshape: bool, dims: str) -> str:
    return f"set reshape: {{ shape: {dims} }}" if has_reshape else f"set dims: {dims}"


def _dims_match(config_dims: Sequence[int], onnx_dims: Sequence[OnnxDim], exact: bool) -> bool:
    """The backend's CompareDimsSupported: a fixed graph dim takes only its own size; a dynamic
    one takes any size for an input and only -1 for an output (`exact`)."""
    return len(config_dims) == len(onnx_dims) and all(
        (c == o if isinstance(o, int) else (c == -1 or not exact))
        for c, o in zip(config_dims, onnx_dims, strict=True)
    )


def _suggest_io(config: ModelConfig, tensor: _OnnxTensor) -> str:
    shape = tensor.shape or []
    if config.max_batch_size > 0 and shape:
        shape = shape[1:]
    data_type = ONNX_TO_TRITON.get(tensor.elem_type or 0)
    type_text = f" data_type: {DataType.Name(data_type)}" if data_type is not None else ""
    return f'input {{ name: "{tensor.name}"{type_text} dims: {_config_dims(shape)} }}'


def _config_dims(shape: Iterable[OnnxDim]) -> str:
    return format_dims(d if isinstance(d, int) else -1 for d in shape)


def _onnx_dims(shape: Iterable[OnnxDim]) -> str:
    values = ", ".join("?" if d is None else str(d) for d in shape)
    return f"[ {values} ]" if values else "[ ]"
