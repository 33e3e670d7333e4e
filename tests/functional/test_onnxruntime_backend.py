"""The embedded runtime's onnxruntime backend against Triton's C++ one, where a served model
shows it: stricter on purpose for a graph with a rank-0 tensor configured to batch (the C++
backend loads it, then serves wrong rows for a rank-0 input or kills tritonserver for a rank-0
output): refused, named with the fix, every other model serving (onnxruntime_rules.
serving_errors); alike for a rank-0 output's shape (the config's dims) and onnxruntime's own
errors (its words)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tritonstack.clients.client import infer
from tritonstack.core.ports import free_ports
from tritonstack.serve.runtime import EmbeddedTriton

V = helper.make_tensor_value_info
ROW = "dims: [ 1 ] reshape { shape: [ ] }"


def add_model(repository, name: str, graph: onnx.GraphProto, config: str) -> None:
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    made.ir_version = 8
    (repository / name / "1").mkdir(parents=True)
    onnx.save(made, repository / name / "1" / "model.onnx")
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\n{config}'
    )


def test_a_rank_0_tensor_in_a_batching_model_is_refused_and_the_rest_serve(tmp_path):
    repository = tmp_path / "model_repository"
    offset = helper.make_graph(
        [helper.make_node("Add", ["x", "s"], ["y"])], "offset",
        [V("s", TensorProto.FLOAT, []), V("x", TensorProto.FLOAT, ["n"])],
        [V("y", TensorProto.FLOAT, ["n"])],
    )  # fmt: skip
    total = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)], "total",
        [V("x", TensorProto.FLOAT, ["n"])], [V("total", TensorProto.FLOAT, [])],
    )  # fmt: skip
    add_model(repository, "scalar_input_batched", offset,
              f'max_batch_size: 4\ninput [ {{ name: "s" data_type: TYPE_FP32 {ROW} }},'
              f' {{ name: "x" data_type: TYPE_FP32 {ROW} }} ]\n'
              f'output [ {{ name: "y" data_type: TYPE_FP32 {ROW} }} ]\n')  # fmt: skip
    add_model(repository, "scalar_output_batched", total,
              f'max_batch_size: 4\ninput [ {{ name: "x" data_type: TYPE_FP32 {ROW} }} ]\n'
              f'output [ {{ name: "total" data_type: TYPE_FP32 {ROW} }} ]\n')  # fmt: skip
    # A rank-0 output is answered in the shape its config declares (scalar_outputs_).
    add_model(repository, "total", total,
              'max_batch_size: 0\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
              'output [ { name: "total" data_type: TYPE_FP32 dims: [ 1, 1 ] } ]\n')  # fmt: skip
    clash = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "clash",
        [V("a", TensorProto.FLOAT, [2]), V("b", TensorProto.FLOAT, [4])],
        [V("y", TensorProto.FLOAT, [2])],
    )  # fmt: skip
    add_model(repository, "clash", clash,
              'max_batch_size: 0\ninput [ { name: "a" data_type: TYPE_FP32 dims: [ 2 ] },'
              ' { name: "b" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
              'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')  # fmt: skip
    # The same offset graph as add-model writes it: no batching, the scalar as dims [1].
    add_model(repository, "offset", offset,
              'max_batch_size: 0\ninput [ { name: "s" data_type: TYPE_FP32 dims: [ 1 ] },'
              ' { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
              'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')  # fmt: skip

    with EmbeddedTriton(repository, *free_ports(3), log_path=tmp_path / "triton.log") as triton:
        assert sorted(triton.loaded) == ["offset", "total"], triton.failed
        said = triton.failed["clash"]
        assert "onnx runtime error 1: Load model from" in said and "Incompatible" in said, said
        said = triton.failed["scalar_input_batched"]
        assert "input 's' has rank 0 in the graph but max_batch_size is 4" in said, said
        assert "set max_batch_size: 0" in said, said
        said = triton.failed["scalar_output_batched"]
        assert "output 'total' has rank 0 in the graph but max_batch_size is 4" in said, said
        assert "crashes (SIGSEGV)" in said, said
        x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
        answer = infer(triton.http_url, "offset", {"s": np.array([10.0], np.float32), "x": x})
        np.testing.assert_allclose(answer["y"], x + 10.0)
        answer = infer(triton.http_url, "total", {"x": x})
        assert answer["total"].shape == (1, 1) and answer["total"][0, 0] == 6.0, answer
