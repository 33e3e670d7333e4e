"""What the launcher reads from a model's config.pbtxt, with the standard library only.

The image has no protobuf package of ours, so these read the text format as tritonstack writes
it (one field a line, `#` comments) and as Triton's examples do; the package's own reader
(tritonstack.core.config_text, protobuf) is held to the same answers by tests/unit/test_launcher.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: The configuration tritonserver loads with --model-config-name=gpu (where a model has one).
GPU_VARIANT = Path("configs") / "gpu.pbtxt"


def _text(path: Path) -> str:
    return "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())


@dataclass(frozen=True)
class ModelConfig:
    """One model directory's config.pbtxt (and its GPU variant, where it has one)."""

    directory: Path

    @property
    def name(self) -> str:
        return self.directory.name

    @property
    def text(self) -> str:
        return _text(self.directory / "config.pbtxt")

    @property
    def gpu_text(self) -> str:
        variant = self.directory / GPU_VARIANT
        return _text(variant) if variant.is_file() else self.text

    @property
    def is_tensorrt_plan(self) -> bool:
        return re.search(r'platform:\s*"tensorrt_plan"', self.text) is not None

    @property
    def needs_gpu(self) -> bool:
        """A TensorRT plan or a KIND_GPU instance: not servable on a CPU host."""
        return self.is_tensorrt_plan or "KIND_GPU" in self.text

    @property
    def max_batch_size(self) -> int:
        return max_batch_size(self.text)

    @property
    def is_onnx(self) -> bool:
        """Served by Triton's onnxruntime backend (its platform, or the backend named)."""
        return (
            re.search(r'platform:\s*"onnxruntime_onnx"', self.text) is not None
            or re.search(r'^\s*backend:\s*"onnxruntime"', self.text, re.MULTILINE) is not None
        )

    def parameter(self, key: str) -> str:
        """A config parameter's string value as tritonstack add-model writes it (`key: "..."`,
        then `string_value: "..."`); empty when the config has none."""
        found = re.search(
            rf'key:\s*"{re.escape(key)}"[^}}]*?string_value:\s*"((?:[^"\\]|\\.)*)"',
            self.text,
            re.DOTALL,
        )
        if not found:
            return ""
        # The text format's escapes, as protobuf writes them (a JSON value's quotes: \").
        return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m[1], m[1]), found[1])

    def inputs(self) -> list[tuple[str, list[str]]]:
        """(name, dims) of each entry of the top-level `input [ ... ]` block."""
        return tensors(self.text, "input")

    def outputs(self) -> list[tuple[str, list[str]]]:
        """(name, dims) of each entry of the top-level `output [ ... ]` block."""
        return tensors(self.text, "output")

    def onnxruntime_engine_cache(self) -> str:
        """The directory ONNX Runtime's TensorRT provider caches engines in, under the GPU
        configuration; empty when the model does not use it."""
        found = re.search(r'key:\s*"trt_engine_cache_path"\s*value:\s*"([^"]*)"', self.gpu_text)
        return found[1] if found else ""


def max_batch_size(text: str) -> int:
    found = re.search(r"^\s*max_batch_size:\s*(\d+)", text, re.MULTILINE)
    return int(found[1]) if found else 0


def model_filename(text: str) -> str:
    """The file in each version directory an ONNX model's config names (Triton's default)."""
    found = re.search(r'default_model_filename:\s*"([^"]*)"', text)
    return found[1] if found else "model.onnx"


def tensors(text: str, block_name: str) -> list[tuple[str, list[str]]]:
    """(name, dims) of each entry of a config's top-level `input` or `output` block."""
    block = re.search(rf"^{block_name}\s*\[(.*?)^\]", text, re.MULTILINE | re.DOTALL)
    if not block:
        return []
    found = []
    for entry in re.split(r"\n\s*\},?\s*\n", block[1]):
        name = re.search(r'name:\s*"([^"]*)"', entry)
        dims = re.search(r"dims:\s*\[([^\]]*)\]", entry)
        if name and dims:
            found.append((name[1], [d for d in re.split(r"[\s,]+", dims[1]) if d]))
    return found


def models(repository: Path) -> list[ModelConfig]:
    """The model directories of a repository (those with a config.pbtxt), by name."""
    return [
        ModelConfig(directory)
        for directory in sorted(repository.iterdir())
        if (directory / "config.pbtxt").is_file()
    ]
