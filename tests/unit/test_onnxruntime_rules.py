"""Triton's C++ onnxruntime backend's rules, one test each, named after the function of the
backend's source (onnxruntime_backend r26.06, src/onnxruntime.cc and src/onnxruntime_utils.cc;
CheckAllowedModelInput/Output from backend r26.06, src/backend_common.cc) that applies it.
tritonstack.core.onnxruntime_rules states them once; `tritonstack check`, `add-model` and the
embedded runtime's Python backend all apply them (the functional tests load such models)."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tritonstack.core import onnxruntime_rules as rules

V = helper.make_tensor_value_info


def model(inputs, outputs, nodes=None, initializers=()) -> onnx.ModelProto:
    nodes = nodes or [helper.make_node("Identity", [inputs[0].name], [outputs[0].name])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    made.ir_version = 8
    return made


def config(max_batch_size: int, inputs, outputs, **extra) -> dict:
    return {"name": "m", "max_batch_size": max_batch_size, "input": inputs, "output": outputs,
            **extra}  # fmt: skip


def io(name: str, data_type: str, dims, reshape=None) -> dict:
    entry = {"name": name, "data_type": data_type, "dims": list(dims)}
    if reshape is not None:
        entry["reshape"] = {"shape": list(reshape)}
    return entry


def errors(made: onnx.ModelProto, cfg: dict) -> list[str]:
    return rules.load_errors(cfg, rules.graph_from_model(made))


def test_the_backend_sees_dims_as_onnxruntime_reports_them():
    """A symbolic dim, an unknown one and an exporter's dim_value -1 are all -1; an output the
    graph declares without a shape has the shape onnxruntime infers (here the input's), which is
    what the backend reads (InputOutputInitializerInfos asks the session), not the declaration."""
    x = V("x", TensorProto.FLOAT, ["batch", None, -1, 3])
    y = onnx.ValueInfoProto(name="y")
    y.type.tensor_type.elem_type = TensorProto.FLOAT  # no shape at all
    made = model([x], [y])
    declared = rules.graph_from_onnx(made)
    assert declared.inputs[0].dims == (-1, -1, -1, 3)
    assert declared.outputs[0].dims == ()
    session = ort.InferenceSession(made.SerializeToString(), providers=["CPUExecutionProvider"])
    seen = rules.graph_from_session(session)
    assert seen == rules.graph_from_model(made)
    assert seen.inputs == declared.inputs and seen.outputs[0].dims == (-1, -1, -1, 3)


def test_input_output_initializer_infos_refuse_a_sequence_anywhere():
    """InputOutputInitializerInfos: "Unsupported ONNX Type ..." (OnnxTypeName) for a graph
    output the config does not even name (scikit-learn's ZipMap)."""
    x = V("x", TensorProto.FLOAT, ["n", 2])
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    nodes = [helper.make_node("SequenceConstruct", ["x"], ["s"]),
             helper.make_node("Identity", ["x"], ["y"])]  # fmt: skip
    made = model([x], [V("y", TensorProto.FLOAT, ["n", 2]), seq], nodes)
    cfg = config(8, [io("x", "TYPE_FP32", [2])], [io("y", "TYPE_FP32", [2])])
    assert errors(made, cfg) == [
        "Unsupported ONNX Type 'ONNX_TYPE_SEQUENCE' for I/O 's', expected 'ONNX_TYPE_TENSOR'."
    ]


def test_auto_complete_max_batch_needs_a_dynamic_first_dim_on_every_tensor():
    """AutoCompleteMaxBatch: batching only if every input and output has rank >= 1 and -1 first."""
    batched = rules.graph_from_onnx(
        model([V("x", TensorProto.FLOAT, ["n", 3])], [V("y", TensorProto.FLOAT, ["n", 3])])
    )
    assert rules.supports_batching(batched)
    for out in (V("y", TensorProto.FLOAT, [1, 3]), V("y", TensorProto.FLOAT, [])):
        graph = rules.graph_from_onnx(model([V("x", TensorProto.FLOAT, ["n", 3])], [out]))
        assert not rules.supports_batching(graph)


def test_auto_complete_io_writes_a_per_row_scalar_as_dims_1_with_an_empty_reshape():
    """AutoCompleteIO: dims without the batch; none left: [1], plus reshape [] when batching
    (without batching an empty reshape is refused by core)."""
    vector = rules.GraphTensor("y", "tensor", 1, (-1,))
    assert rules.config_dims(vector, batching=True) == ([1], [])
    scalar = rules.GraphTensor("s", "tensor", 1, ())
    assert rules.config_dims(scalar, batching=False) == ([1], None)
    image = rules.GraphTensor("i", "tensor", 1, (-1, 3, -1, -1))
    assert rules.config_dims(image, batching=True) == ([3, -1, -1], None)
    assert rules.config_dims(image, batching=False) == ([-1, 3, -1, -1], None)


def test_validate_inputs_counts_every_graph_input():
    """ValidateInputs: "configuration expects N inputs, model provides M"."""
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    made = model([V("a", TensorProto.FLOAT, ["n", 2]), V("b", TensorProto.FLOAT, ["n", 2])],
                 [V("y", TensorProto.FLOAT, ["n", 2])], nodes)  # fmt: skip
    cfg = config(4, [io("a", "TYPE_FP32", [2])], [io("y", "TYPE_FP32", [2])])
    assert errors(made, cfg) == [
        "unable to load model 'm', configuration expects 1 inputs, model provides 2"
    ]


def test_check_allowed_model_input_and_output_name_what_the_graph_has():
    """CheckAllowedModelInput/Output (backend_common.cc): "unexpected inference input ..."."""
    made = model([V("x", TensorProto.FLOAT, ["n", 2])], [V("y", TensorProto.FLOAT, ["n", 2])])
    cfg = config(4, [io("z", "TYPE_FP32", [2])], [io("w", "TYPE_FP32", [2])])
    assert errors(made, cfg) == [
        "unexpected inference input 'z', allowed inputs are: x",
        "unexpected inference output 'w', allowed outputs are: y",
    ]


def test_validate_inputs_and_outputs_compare_datatypes_exactly():
    """ModelConfigDataTypeToOnnxDataType: "configuration expects datatype ..., model provides"."""
    made = model([V("x", TensorProto.FLOAT16, ["n", 2])], [V("y", TensorProto.FLOAT16, ["n", 2])])
    cfg = config(4, [io("x", "TYPE_FP32", [2])], [io("y", "TYPE_FP16", [2])])
    assert errors(made, cfg) == [
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'x', model "
        "provides TYPE_FP16"
    ]


@pytest.mark.parametrize(
    ("graph_dims", "dims", "input_loads", "output_loads"),
    [
        (["n", 3], [3], True, True),
        (["n", "w"], [-1], True, True),  # a dynamic graph dim: -1 for both
        (["n", "w"], [5], True, False),  # an input takes a size; an output must say -1
        (["n", 3], [-1], False, False),  # a fixed graph dim takes only its size
        (["n", 3], [4], False, False),
        (["n", 3, 1], [3], False, False),  # ranks differ
    ],
)
def test_compare_dims_supported_is_loose_for_inputs_and_exact_for_outputs(
    graph_dims, dims, input_loads, output_loads
):
    """CompareDimsSupported(compare_exact=false) for inputs, (true) for outputs."""
    made = model([V("x", TensorProto.FLOAT, graph_dims)], [V("y", TensorProto.FLOAT, graph_dims)])
    fine = [io("y", "TYPE_FP32", [3] if graph_dims[1] == 3 else [-1])]
    fine_in = [io("x", "TYPE_FP32", [3] if graph_dims[1] == 3 else [-1])]
    if len(graph_dims) == 3:
        fine, fine_in = [io("y", "TYPE_FP32", [3, 1])], [io("x", "TYPE_FP32", [3, 1])]
    as_input = errors(made, config(4, [io("x", "TYPE_FP32", dims)], fine))
    as_output = errors(made, config(4, fine_in, [io("y", "TYPE_FP32", dims)]))
    assert (as_input == [], as_output == []) == (input_loads, output_loads), (as_input, as_output)
    for found in as_input + as_output:
        assert "the model expects" in found and "making complete shape" in found


def test_compare_dims_supported_needs_a_dynamic_first_dim_to_batch():
    made = model([V("x", TensorProto.FLOAT, [1, 3])], [V("y", TensorProto.FLOAT, [1, 3])])
    found = errors(made, config(4, [io("x", "TYPE_FP32", [3])], [io("y", "TYPE_FP32", [3])]))
    assert len(found) == 2
    assert (
        "for the model to support batching the shape should have at least 1 dimension and "
        "the first dimension must be -1; but shape expected by the model is [1,3]" in found[0]
    )
    assert errors(made, config(0, [io("x", "TYPE_FP32", [1, 3])],
                               [io("y", "TYPE_FP32", [1, 3])])) == []  # fmt: skip


def test_a_reshape_is_what_the_backend_compares():
    """ValidateInputs/Outputs use `reshape` when there is one: a [batch] tensor is dims [1] with
    an empty reshape, whose full shape [-1] is the graph's."""
    made = model([V("x", TensorProto.FLOAT, ["n"])], [V("y", TensorProto.FLOAT, ["n"])])
    good = config(4, [io("x", "TYPE_FP32", [1], [])], [io("y", "TYPE_FP32", [1], [])])
    assert errors(made, good) == []
    bad = config(4, [io("x", "TYPE_FP32", [1])], [io("y", "TYPE_FP32", [1])])
    assert len(errors(made, bad)) == 2


def test_a_rank_0_tensor_takes_dims_of_1_only():
    """ValidateInputs/Outputs, a scalar graph tensor: "should only provide 1 in the model
    configuration when the model doesn't support batching"."""
    nodes = [helper.make_node("Identity", ["s"], ["t"])]
    made = model([V("s", TensorProto.FLOAT, [])], [V("t", TensorProto.FLOAT, [])], nodes)
    assert errors(made, config(0, [io("s", "TYPE_FP32", [1])], [io("t", "TYPE_FP32", [1])])) == []
    found = errors(made, config(0, [io("s", "TYPE_FP32", [2])], [io("t", "TYPE_FP32", [1])]))
    assert found == [
        "unable to load model 'm', scalar tensor 's', should only provide 1 in the model "
        "configuration when the model doesn't support batching. Model configuration provided: "
        "[2]."
    ]


def test_an_optional_input_never_batches():
    """ValidateInputs: "optional input ... is not supported for models that support batching"."""
    made = model([V("x", TensorProto.FLOAT, ["n", 2])], [V("y", TensorProto.FLOAT, ["n", 2])])
    optional = {**io("x", "TYPE_FP32", [2]), "optional": True}
    found = errors(made, config(4, [optional], [io("y", "TYPE_FP32", [2])]))
    assert "optional input 'x' is not supported for models that support batching" in found[-1]


def test_sequence_controls_and_states_count_as_inputs():
    """ModelInstanceState: control inputs and implicit states add to the expected count."""
    sequence = {
        "control_input": [{"name": "START"}],
        "state": [{"input_name": "h", "output_name": "hn"}],
    }
    cfg = config(0, [io("x", "TYPE_FP32", [2])], [io("y", "TYPE_FP32", [2])],
                 sequence_batching=sequence)  # fmt: skip
    assert rules.expected_input_count(cfg) == 3


def test_config_json_as_protobuf_renders_it_reads_the_same():
    """check and add-model hand the rules a config.pbtxt as json_format renders it (int64 dims
    as strings, defaults left out): read as Triton's own JSON is."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    text = (
        'name: "m" max_batch_size: 4 input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] '
        'reshape { } } ] output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape { } } ]'
    )
    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    as_json = json_format.MessageToDict(parsed, preserving_proto_field_name=True)
    made = model([V("x", TensorProto.FLOAT, ["n"])], [V("y", TensorProto.FLOAT, ["n"])])
    assert errors(made, as_json) == []


def test_a_string_tensor_is_bytes_in_the_backends_type_message():
    """ValidateInputs: "model provides TYPE_" + TRITONSERVER_DataTypeString(
    ConvertFromOnnxDataType(type)), the server's name: BYTES for a string tensor."""
    made = model([V("x", TensorProto.STRING, ["n"])], [V("y", TensorProto.STRING, ["n"])])
    cfg = config(0, [io("x", "TYPE_FP32", [-1])], [io("y", "TYPE_STRING", [-1])])
    assert errors(made, cfg) == [
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'x', model "
        "provides TYPE_BYTES"
    ]


def test_a_rank_0_tensor_in_a_batching_model_loads_and_is_refused_for_what_it_then_does():
    """ValidateInputs/ValidateOutputs compare a rank-0 tensor's dims only against 1s, so an
    empty reshape with max_batch_size > 0 loads; SetInputTensors then feeds the batch's buffer as
    one scalar, and the responder indexes the batch dim of the `[]` kept in scalar_outputs_
    (tritonserver's SIGSEGV). serving_errors names both; without batching there is nothing."""
    nodes = [helper.make_node("Add", ["x", "s"], ["y"]),
             helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0)]  # fmt: skip
    made = model(
        [V("s", TensorProto.FLOAT, []), V("x", TensorProto.FLOAT, ["n"])],
        [V("y", TensorProto.FLOAT, ["n"]), V("total", TensorProto.FLOAT, [])],
        nodes,
    )
    per_row = [io("s", "TYPE_FP32", [1], []), io("x", "TYPE_FP32", [1], [])]
    outputs = [io("y", "TYPE_FP32", [1], []), io("total", "TYPE_FP32", [1], [])]
    batched = config(4, per_row, outputs)
    assert errors(made, batched) == []  # the backend loads it
    found = rules.serving_errors(batched, rules.graph_from_model(made))
    assert len(found) == 2, found
    assert found[0].startswith("input 's' has rank 0 in the graph but max_batch_size is 4")
    assert "the first row's value" in found[0]
    assert found[1].startswith("output 'total' has rank 0 in the graph but max_batch_size is 4")
    assert "crashes (SIGSEGV)" in found[1]
    assert all(e.endswith("set max_batch_size: 0 (a graph with a rank-0 tensor does not batch)")
               for e in found)  # fmt: skip
    unbatched = config(0, [io("s", "TYPE_FP32", [1]), io("x", "TYPE_FP32", [-1])],
                       [io("y", "TYPE_FP32", [-1]), io("total", "TYPE_FP32", [1])])  # fmt: skip
    assert errors(made, unbatched) == []
    assert rules.serving_errors(unbatched, rules.graph_from_model(made)) == []


def test_onnxruntime_errors_are_worded_as_the_backend_words_them():
    """RETURN_IF_ORT_ERROR (onnxruntime_utils.h): "onnx runtime error " + code + ": " + message,
    from the error onnxruntime's Python API raises for the same failure."""
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    made = model([V("a", TensorProto.FLOAT, [2]), V("b", TensorProto.FLOAT, [4])],
                 [V("y", TensorProto.FLOAT, [2])], nodes)  # fmt: skip
    with pytest.raises(Exception) as caught:
        ort.InferenceSession(made.SerializeToString(), providers=["CPUExecutionProvider"])
    said = rules.ort_message(str(caught.value))
    assert said.startswith("onnx runtime error 1: "), said
    assert "Incompatible dimensions" in said and "[ONNXRuntimeError]" not in said, said
    assert rules.ort_message("something else") == "something else"
