"""The launcher as the image runs it: the standard library only, and reading configs as protobuf
does. Its decisions with fakes are in tests/unit/test_entrypoint.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import model_zoo
from tests.support import REPOSITORY, ROOT
from tritonstack.check import onnx_serving
from tritonstack.launcher.model_config import ModelConfig, model_filename, models
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
        assert ours.outputs() == [(o.name, [str(d) for d in o.dims]) for o in parsed.output], path
        assert ours.is_onnx == (
            parsed.platform == "onnxruntime_onnx" or parsed.backend == "onnxruntime"
        ), path
        assert model_filename(ours.text) == (parsed.default_model_filename or "model.onnx"), path
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


def _declared(path: Path) -> tuple[list[tuple], list[tuple]]:
    """A graph's inputs and outputs as `onnx` reads the file: (name, kind, element type, rank),
    rank None where the file gives no shape."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}

    def row(value) -> tuple:
        kind = value.type.WhichOneof("value") or "unknown"
        if kind != "tensor_type":
            return (value.name, kind.removesuffix("_type"), 0, 0)
        tensor = value.type.tensor_type
        rank = len(tensor.shape.dim) if tensor.HasField("shape") else None
        return (value.name, "tensor", tensor.elem_type, rank)

    return (
        [row(v) for v in graph.input if v.name not in initializers],
        [row(v) for v in graph.output],
    )


def _rows(tensors) -> list[tuple]:
    return [(t.name, t.kind, t.elem_type, len(t.dims)) for t in tensors]


def _odd_graphs(folder: Path) -> list[Path]:
    """Graphs the zoo does not write: tensors without a shape, a sequence output, initializers
    listed among the inputs (IR 3), weights in external data, and a model folder."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    v = helper.make_tensor_value_info
    folder.mkdir(parents=True, exist_ok=True)
    made = []

    def save(name: str, nodes, inputs, outputs, initializers=(), ir=8, external=False) -> None:
        graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = ir
        path = folder / name / "model.onnx" if external else folder / f"{name}.onnx"
        path.parent.mkdir(exist_ok=True)
        onnx.save(model, str(path), save_as_external_data=external, location="weights.bin",
                  size_threshold=0)  # fmt: skip
        made.append(path.parent if external else path)

    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    save("unshaped", [helper.make_node("Relu", ["x"], ["y"])],
         [v("x", TensorProto.FLOAT, None)], [v("y", TensorProto.FLOAT, None)])  # fmt: skip
    save("sequence_out", [helper.make_node("SequenceConstruct", ["x"], ["s"])],
         [v("x", TensorProto.INT64, ["n", 2])],
         [helper.make_tensor_sequence_value_info("s", TensorProto.INT64, None)])  # fmt: skip
    save("ir3_weights_as_inputs", [helper.make_node("MatMul", ["x", "w"], ["y"])],
         [v("x", TensorProto.FLOAT, ["n", 4]), v("w", TensorProto.FLOAT, [4, 4])],
         [v("y", TensorProto.FLOAT, ["n", 4])], [weight], ir=3)  # fmt: skip
    save("external", [helper.make_node("MatMul", ["x", "w"], ["y"]),
                      helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0)],
         [v("x", TensorProto.FLOAT, [4, 4])],
         [v("y", TensorProto.FLOAT, [4, 4]), v("total", TensorProto.FLOAT, [])],
         [weight], external=True)  # fmt: skip
    return made


def test_the_launcher_reads_a_graph_s_tensors_as_onnx_does(tmp_path: Path) -> None:
    """tritonstack.launcher.onnx_wire (the standard library, for the image) against `onnx`, on
    every zoo graph (exporters' and converters' output among them) and graphs the zoo lacks:
    the same inputs and outputs, kinds, element types and ranks. A tensor without a shape: an
    input reads as rank 0 (ONNX Runtime's reading), an output is left out (ONNX Runtime infers
    it at load)."""
    from tritonstack.launcher import onnx_wire

    zoo = tmp_path / "zoo"
    zoo.mkdir()
    paths = [build(zoo).path for build in model_zoo.BUILDERS.values()]
    paths += _odd_graphs(tmp_path / "odd")
    for path in paths:
        inputs, outputs = _declared(path / "model.onnx" if path.is_dir() else path)
        found = onnx_wire.graph_of(path)
        assert _rows(found.inputs) == [(*r[:3], r[3] or 0) for r in inputs], path
        assert _rows(found.outputs) == [r for r in outputs if r[3] is not None], path
    unshaped = onnx_wire.graph_of(tmp_path / "odd" / "unshaped.onnx")
    assert _rows(unshaped.inputs) == [("x", "tensor", 1, 0)] and unshaped.outputs == ()
    assert [t.name for t in onnx_wire.graph_of(tmp_path / "odd" / "ir3_weights_as_inputs.onnx")
            .inputs] == ["x"]  # fmt: skip


def test_the_launcher_seeks_past_weights_and_refuses_what_is_not_onnx(tmp_path: Path) -> None:
    """64 MiB of weights cost the reader a few kilobytes of reads; a file that is not ONNX, or
    is cut short, raises WireError (the launcher then leaves the verdict to Triton's load)."""
    import io

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tritonstack.launcher import onnx_wire

    weight = numpy_helper.from_array(np.zeros((4096, 4096), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4096])],
        initializer=[weight],
    )  # fmt: skip
    data = onnx.helper.make_model(graph).SerializeToString()

    class Counted(io.BytesIO):
        read_bytes = 0

        def read(self, size: int | None = -1) -> bytes:
            chunk = super().read(size)
            Counted.read_bytes += len(chunk)
            return chunk

    found = onnx_wire.read_graph(Counted(data))
    assert _rows(found.inputs) == [("x", "tensor", 1, 2)]
    assert len(data) > 64 << 20 and Counted.read_bytes < 4096, Counted.read_bytes
    for bad in (b"not an onnx file\n", data[: len(data) // 2], b""):
        with pytest.raises(onnx_wire.WireError):
            onnx_wire.read_graph(io.BytesIO(bad))
