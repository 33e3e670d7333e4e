"""The launcher as the image runs it: the standard library only, and reading configs as protobuf
does. Its decisions with fakes are in tests/unit/test_entrypoint.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import model_zoo
from tests.support import REPOSITORY, ROOT
from tritonstack.check import onnx_serving
from tritonstack.launcher.model_config import ModelConfig, models
from tritonstack.launcher.tensorrt import ENGINE_LINKS
from tritonstack.models import add_model


def test_the_launcher_imports_nothing_beyond_the_standard_library() -> None:
    """`python -S` has no site-packages: what imports there runs in the Triton image, which
    installs no dependency of the package."""
    code = (
        "import sys, tritonstack.launcher.start\n"
        "third = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)"
        " - {'tritonstack', '__main__'})\n"
        "print(third)"
    )
    found = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "[]"
    usage = subprocess.run(
        [sys.executable, "-S", "-m", "tritonstack.launcher", "restart"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert usage.returncode == 1
    assert usage.stderr.strip().startswith("[entrypoint] ERROR: unknown command 'restart'")


def zoo_plan(zoo: model_zoo.ZooModel) -> onnx_serving.Plan:
    shapes = [zoo.options[i + 1] for i, o in enumerate(zoo.options) if o == "--shape"]
    return onnx_serving.plan(zoo.path, shapes=onnx_serving.parse_shapes(shapes))


def _configs(tmp_path: Path) -> list[Path]:
    """The repository's configs and what add-model writes for graphs of several classes."""
    written = [p for m in models(REPOSITORY) for p in (m.directory / "config.pbtxt",)]
    for make in (model_zoo.image, model_zoo.text, model_zoo.minus_one_batch):
        zoo = make(tmp_path / make.__name__)
        plan = zoo_plan(zoo)
        for kind, render in (("cpu", add_model.cpu_config), ("gpu", add_model.gpu_config)):
            folder = tmp_path / f"{make.__name__}-{kind}"
            folder.mkdir()
            (folder / "config.pbtxt").write_text(render(make.__name__, plan, [], "x"))
            written.append(folder / "config.pbtxt")
        if plan.no_tensorrt is None:
            folder = tmp_path / f"{make.__name__}_trt"
            folder.mkdir()
            (folder / "config.pbtxt").write_text(add_model.trt_config(folder.name, plan, []))
            written.append(folder / "config.pbtxt")
    return written


def test_the_standard_library_reader_agrees_with_protobuf(tmp_path: Path) -> None:
    """What the launcher reads without protobuf (the image has none of ours) is what protobuf
    reads, for every config of the repository and what add-model writes."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    configs = _configs(tmp_path)
    assert len(configs) >= 10
    for path in configs:
        parsed = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        ours = ModelConfig(path.parent)
        assert ours.max_batch_size == parsed.max_batch_size, path
        assert ours.is_tensorrt_plan == (parsed.platform == "tensorrt_plan"), path
        assert ours.inputs() == [(i.name, [str(d) for d in i.dims]) for i in parsed.input], path
        for key, value in parsed.parameters.items():
            assert ours.parameter(key) == value.string_value, (path, key)
        variant = path.parent / "configs" / "gpu.pbtxt"  # what tritonserver loads on a GPU
        on_gpu = (
            text_format.Parse(variant.read_text(), model_config_pb2.ModelConfig())
            if variant.is_file()
            else parsed
        )
        engines = [
            p
            for a in on_gpu.optimization.execution_accelerators.gpu_execution_accelerator
            for k, p in a.parameters.items()
            if k == "trt_engine_cache_path"
        ]
        assert ours.onnxruntime_engine_cache() == (engines[0] if engines else ""), path
        gpu = any(
            g.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU for g in parsed.instance_group
        )
        assert ours.needs_gpu == (gpu or parsed.platform == "tensorrt_plan"), path


def test_each_added_model_caches_its_engines_in_a_folder_of_its_own(tmp_path) -> None:
    """Two models exported by one script share tensor names, which is all ONNX Runtime's engine
    id hashes: each needs its own engine directory."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    zoo = model_zoo.image(tmp_path / "zoo")
    plan = zoo_plan(zoo)
    for name in ("detector", "segmenter"):
        text = add_model.gpu_config(name, plan, [], "x")
        config = text_format.Parse(text, model_config_pb2.ModelConfig())
        (accelerator,) = config.optimization.execution_accelerators.gpu_execution_accelerator
        assert accelerator.parameters["trt_engine_cache_path"] == f"{ENGINE_LINKS}/{name}"
