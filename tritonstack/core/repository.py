"""Reading a Triton model repository with Triton's own configuration schema.

Both `tritonstack check` and the embedded runtime need to know what each model is (platform,
backend, devices); parsing `config.pbtxt` with `model_config_pb2` means a field Triton would
reject is rejected here too, with the same names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tritonstack.core.errors import UserError

ModelConfig = model_config_pb2.ModelConfig


@dataclass(frozen=True)
class Model:
    """One model directory and its parsed configuration."""

    directory: Path
    config: ModelConfig

    @property
    def name(self) -> str:
        return self.directory.name

    @property
    def kind(self) -> str:
        """Backend the model runs on, with Triton's platform-to-backend mapping applied."""
        platform_backends = {
            "onnxruntime_onnx": "onnxruntime",
            "tensorrt_plan": "tensorrt",
            "pytorch_libtorch": "pytorch",
            "tensorflow_savedmodel": "tensorflow",
            "tensorflow_graphdef": "tensorflow",
            "ensemble": "ensemble",
        }
        return self.config.backend or platform_backends.get(self.config.platform, "")

    @property
    def needs_gpu(self) -> bool:
        """TensorRT plans and KIND_GPU instances cannot be served by the CPU runtime."""
        gpu = model_config_pb2.ModelInstanceGroup.Kind.KIND_GPU
        return self.kind == "tensorrt" or any(g.kind == gpu for g in self.config.instance_group)

    def description(self) -> tuple[dict, dict]:
        """The model as Triton's metadata and /config answers describe it (JSON), from its
        config.pbtxt: what a client reading the repository instead of a server sees."""
        config = self.config
        batched = config.max_batch_size > 0

        def tensors(entries) -> list[dict]:
            return [
                {
                    "name": t.name,
                    "datatype": model_config_pb2.DataType.Name(t.data_type)
                    .removeprefix("TYPE_")
                    .replace("STRING", "BYTES"),
                    "shape": [-1, *t.dims] if batched else list(t.dims),
                }
                for t in entries
            ]

        metadata = {
            "name": self.name,
            "inputs": tensors(config.input),
            "outputs": tensors(config.output),
        }
        outputs = [{"name": o.name, "label_filename": o.label_filename} for o in config.output]
        parameters = {k: {"string_value": v.string_value} for k, v in config.parameters.items()}
        described = {
            "max_batch_size": config.max_batch_size,
            "output": outputs,
            "parameters": parameters,
        }
        if config.HasField("sequence_batching"):  # its requests carry a sequence ID
            described["sequence_batching"] = json_format.MessageToDict(
                config.sequence_batching, preserving_proto_field_name=True
            )
        return metadata, described

    def parameter(self, key: str) -> str | None:
        value = self.config.parameters.get(key)
        return value.string_value if value is not None else None


def parse_config(path: Path) -> ModelConfig:
    """Parse one config.pbtxt; a syntax or schema error names the file, line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"{path}: cannot read ({exc.strerror}); every model needs a config.pbtxt"
        ) from None
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as exc:
        raise UserError(
            f"{path}:{exc}: not valid Triton model configuration; "
            "fix the field at that line (schema: model_config.proto)"
        ) from None


def iter_models(repository: Path) -> Iterator[Model]:
    """Every model directory (one holding a config.pbtxt) in name order."""
    repository = Path(repository)
    if not repository.is_dir():
        raise UserError(f"{repository}: model repository not found; pass --model-repository DIR")
    for directory in sorted(p for p in repository.iterdir() if p.is_dir()):
        config_path = directory / "config.pbtxt"
        if config_path.exists():
            yield Model(directory, parse_config(config_path))
