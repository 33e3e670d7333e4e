"""A TensorRT model and its ONNX twin: `X_trt`'s plan is built from `X`'s ONNX model at container
start, so its config must describe the same network as X's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from tritonstack.check.messages import Say, format_dims
from tritonstack.check.model_config import DEFAULT_FILENAMES, say_python_in_disguise
from tritonstack.core.repository import Model

DataType = model_config_pb2.DataType


def check_tensorrt_files(model: Model, versions: Sequence[Path], say: Say) -> None:
    """A missing model.plan is normal (built at container start); a model.py is not."""
    filename = model.config.default_model_filename or DEFAULT_FILENAMES["tensorrt"]
    for version in versions:
        if not (version / filename).exists() and (version / "model.py").is_file():
            say_python_in_disguise(model, version, say)


def check_tensorrt_twin(
    model: Model, models: dict[str, Model], suspect: set[str], say: Say
) -> None:
    """X_trt is built from X's ONNX model, so its config must describe the same tensors."""
    if not model.name.endswith("_trt"):
        return
    source = models.get(model.name.removesuffix("_trt"))
    if source is None or source.name in suspect:
        return
    same = (
        f"{model.name} is the same network as {source.name} (its plan is built from "
        f"{source.name}'s ONNX model), so inputs, outputs and max_batch_size must be equal"
    )
    if model.config.max_batch_size != source.config.max_batch_size:
        say(
            "max_batch_size",
            f"is {model.config.max_batch_size} but {source.name} has "
            f"{source.config.max_batch_size}",
            f"{same}: set max_batch_size: {source.config.max_batch_size}",
        )
    for section in ("input", "output"):
        mine = {io.name: (i, io) for i, io in enumerate(getattr(model.config, section))}
        theirs = {io.name: io for io in getattr(source.config, section)}
        for name, (index, io) in mine.items():
            field = f'{section}[{index}] "{name}"'
            other = theirs.get(name)
            if other is None:
                say(field, f"is not an {section} of {source.name}", f"{same}: remove or rename it")
                continue
            if io.data_type != other.data_type:
                say(
                    f"{field}.data_type",
                    f"is {DataType.Name(io.data_type)} but {source.name} has "
                    f"{DataType.Name(other.data_type)}",
                    f"{same}: set data_type: {DataType.Name(other.data_type)}",
                )
            if list(io.dims) != list(other.dims):
                say(
                    f"{field}.dims",
                    f"is {format_dims(io.dims)} but {source.name} has {format_dims(other.dims)}",
                    f"{same}: set dims: {format_dims(other.dims)}",
                )
        for name in theirs.keys() - mine.keys():
            say(
                section,
                f'does not declare "{name}", an {section} of {source.name}',
                f"{same}: add it with the same data_type and dims",
            )
