"""What add-model learns from a graph and one run of it (tritonstack.check.onnx_serving), for every
class of model in tests/model_zoo.py, and each refusal with its fix."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests import model_zoo
from tritonstack.check import onnx_serving
from tritonstack.check.onnx_serving import BOUNDS_PARAMETER, STATE_PARAMETER, parse_shapes, plan
from tritonstack.core.errors import UserError


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict[str, model_zoo.ZooModel]:
    folder = tmp_path_factory.mktemp("zoo")
    return {name: build(folder) for name, build in model_zoo.BUILDERS.items()}


def planned(model: model_zoo.ZooModel, *extra: str) -> onnx_serving.Plan:
    options = list(model.options) + list(extra)
    shapes = [options[i + 1] for i, o in enumerate(options) if o == "--shape"]
    size = next(
        (int(options[i + 1]) for i, o in enumerate(options) if o == "--max-batch-size"), None
    )
    strings = next(
        (int(options[i + 1]) for i, o in enumerate(options) if o == "--max-string-bytes"),
        onnx_serving.DEFAULT_MAX_STRING_BYTES,
    )
    return plan(model.path, size, parse_shapes(shapes), None, strings, model.server_state)


def dims(found: onnx_serving.Plan, role: str) -> dict[str, tuple]:
    return {e["name"]: (e["dims"], e.get("reshape", {}).get("shape")) for e in found.io(role)}


@pytest.mark.parametrize("name", sorted(model_zoo.BUILDERS))
def test_every_class_is_served_as_the_zoo_expects(zoo, name):
    model = zoo[name]
    found = planned(model)
    assert found.max_batch_size == model.max_batch_size
    assert found.state == model.state and found.server_state == model.server_state
    assert (found.no_tensorrt is None and not found.server_state) == model.tensorrt
    carried = {} if model.server_state else model.state
    assert json.loads(found.parameters().get(STATE_PARAMETER, "{}")) == carried


def test_variable_dims_take_their_bounds_from_shape_and_rows_from_its_batch(zoo):
    found = planned(zoo["image"])
    assert dims(found, "input") == {"images": ([3, -1, -1], None)}
    assert found.bounds["images"] == onnx_serving.Bounds((3, 8, 8), (3, 16, 24), (3, 32, 32))
    assert (found.max_batch_size, found.opt_rows) == (4, 2)
    assert found.full_shape("images", "max") == [4, 3, 32, 32]
    described = json.loads(found.parameters()[BOUNDS_PARAMETER])
    assert described == {"images": {"min": [3, 8, 8], "opt": [3, 16, 24], "max": [3, 32, 32]}}


def test_a_variable_dim_without_shape_gets_the_stated_default(zoo):
    found = plan(zoo["sequence"].path)
    low, usual, high = onnx_serving.DEFAULT_DIM_BOUNDS
    assert found.bounds["ids"] == onnx_serving.Bounds((low,), (usual,), (high,))
    assert any("the default; --shape sets them" in note for note in found.notes)


def test_inputs_naming_one_dim_share_the_bounds_shape_gives_any_of_them(zoo):
    """A text encoder's input_ids and attention_mask both name their length `tokens`: --shape on
    the ids bounds the mask too, or onnxruntime would get tensors of two lengths."""
    found = planned(zoo["sequence"])
    assert found.bounds["ids"] == found.bounds["attention_mask"]
    assert found.bounds["attention_mask"] == onnx_serving.Bounds((1,), (12,), (64,))
    assert any(
        "attention_mask: variable dims bounded 1:12:64 per request row (dims 'tokens' as "
        "--shape ids bounds them)" in note
        for note in found.notes
    ), found.notes
    assert found.dim_names == {"ids": ("tokens",), "attention_mask": ("tokens",)}
    described = json.loads(found.parameters()[BOUNDS_PARAMETER])
    assert described["attention_mask"] == {"min": [1], "opt": [12], "max": [64],
                                           "names": ["tokens"]}  # fmt: skip
    assert "names" not in json.loads(planned(zoo["image"]).parameters()[BOUNDS_PARAMETER])
    shapes = parse_shapes(["ids=1x1:4x12:16x64", "attention_mask=1x1:4x20:16x64"])
    with pytest.raises(UserError) as raised:
        plan(zoo["sequence"].path, None, shapes)
    assert str(raised.value) == (
        "--shape attention_mask: dim 1 is the graph's 'tokens', which --shape ids bounds 1:12:64;"
        " a request's tensors share it, so give it 1:12:64 in both"
    )


def test_a_graph_without_a_batch_axis_is_served_whole(zoo):
    found = planned(zoo["fixed_export"])
    assert found.max_batch_size == 0
    assert dims(found, "input") == {"input.1": ([1, 3, 4, 4], None)}
    assert dims(found, "output") == {"13": ([1, 5], None)}
    with pytest.raises(UserError, match=r"cannot batch \(input input.1 has shape \[1, 3, 4, 4\]"):
        planned(zoo["fixed_export"], "--max-batch-size", "8")


def test_a_scalar_beside_rows_is_dims_1_without_batching(zoo):
    found = planned(zoo["scalar_and_rows"])
    assert dims(found, "input") == {"scale": ([1], None), "rows": ([-1, 3], None)}
    assert found.bounds["rows"] == onnx_serving.Bounds((1, 3), (4, 3), (8, 3))


def test_a_batch_output_is_dims_1_with_an_empty_reshape(zoo):
    found = planned(zoo["vector_output"])
    assert dims(found, "output") == {"total": ([1], [])}
    found = planned(zoo["sklearn_logistic"])
    assert dims(found, "output")["label"] == ([1], [])


def test_a_batch_written_as_minus_one_is_dynamic(zoo):
    assert planned(zoo["minus_one_batch"]).max_batch_size == model_zoo.ZooModel.max_batch_size


def test_strings_are_bounded_per_value(zoo):
    found = planned(zoo["text"])
    assert found.string_bytes == {"text": 64}
    assert json.loads(found.parameters()[BOUNDS_PARAMETER]) == {"text": {"max_bytes": 64}}


def test_state_whose_batch_sits_on_another_axis_is_served_unbatched_and_carried(zoo):
    found = planned(zoo["stateful"])
    assert found.max_batch_size == 0 and found.state == {"state": "stateN"}
    assert any("stateN is sent back as state" in note for note in found.notes)
    none = plan(zoo["stateful"].path, None, {}, {})
    assert none.state == {}
    with pytest.raises(UserError, match="cannot be sent back as the input"):
        plan(zoo["stateful"].path, None, {}, {"state": "score"})


def test_a_converters_output_declared_1_is_served_as_it_returns(zoo):
    """onnxmltools declares LightGBM's label [1] although it follows the batch: served as it
    returns, the served graph's declaration corrected (its weights untouched)."""
    found = planned(zoo["lightgbm"])
    assert found.max_batch_size == model_zoo.ZooModel.max_batch_size
    assert dims(found, "output")["label"] == ([1], [])
    assert any("output label: declared [1], returns ['batch']" in n for n in found.notes)
    original = onnx.load(str(zoo["lightgbm"].path))
    assert [i.raw_data for i in found.model.graph.initializer] == [
        i.raw_data for i in original.graph.initializer
    ]


def test_a_first_axis_whose_rows_depend_on_each_other_is_not_a_batch(tmp_path):
    """A cumulative sum over the first axis: two rows together are not each row alone."""
    axis = numpy_helper.from_array(np.array(0, np.int64), "axis")
    path = model_zoo._save(
        [helper.make_node("CumSum", ["x", "axis"], ["y"])],
        [model_zoo.V("x", TensorProto.FLOAT, ["t", 5])],
        [model_zoo.V("y", TensorProto.FLOAT, ["t", 5])],
        tmp_path / "cumsum.onnx",
        [axis],
    )
    found = plan(path)
    assert found.max_batch_size == 0
    assert any("not a batch of independent rows" in note for note in found.notes)


REFUSED = {
    "ZipMap": ("zipmap", "{'zipmap': False}"),
    "a shape of the wrong rank": ("image_rank", "each shape needs 4 dims"),
    "a fixed dim bounded otherwise": ("image_fixed", "is fixed at 3 in the graph"),
    "min above opt": ("image_order", "must satisfy 1 <= min <= opt <= max"),
    "an input it does not have": ("image_name", "not an input of image.onnx"),
    "bounds it cannot run at": ("conv", "onnxruntime fails on inputs at the min bounds"),
    "a zero-sized bound": ("image_zero", "must satisfy 1 <= min"),
    "an operator onnxruntime lacks": ("custom_op", "onnxruntime cannot load it"),
    "BF16, which 2.51 cannot serve": ("bf16", "is BF16, which the embedded runtime"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_each_refusal_says_what_to_do(zoo, tmp_path, case):
    kind, words = REFUSED[case]
    image = zoo["image"].path
    if kind == "zipmap":
        from skl2onnx import convert_sklearn
        from skl2onnx.common.data_types import FloatTensorType
        from sklearn.linear_model import LogisticRegression

        x, y = model_zoo._training_data()
        onx = convert_sklearn(
            LogisticRegression().fit(x, y), initial_types=[("x", FloatTensorType([None, 4]))]
        )
        onnx.save(onx, str(tmp_path / "zipmap.onnx"))
        call = lambda: plan(tmp_path / "zipmap.onnx")  # noqa: E731
    elif kind == "conv":  # a 3x3 kernel cannot run on a 1x1 image
        kernel = numpy_helper.from_array(np.ones((2, 3, 3, 3), np.float32), "k")
        path = model_zoo._save(
            [helper.make_node("Conv", ["images", "k"], ["features"])],
            [model_zoo.V("images", TensorProto.FLOAT, ["N", 3, "H", "W"])],
            [model_zoo.V("features", TensorProto.FLOAT, ["N", 2, "h", "w"])],
            tmp_path / "conv.onnx",
            [kernel],
        )
        shape = "images=1x3x1x1:2x3x16x16:4x3x32x32"
        call = lambda: plan(path, None, parse_shapes([shape]))  # noqa: E731
    elif kind == "bf16":
        path = model_zoo._save(
            [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
            [model_zoo.V("x", TensorProto.BFLOAT16, ["n", 2])],
            [model_zoo.V("y", TensorProto.FLOAT, ["n", 2])],
            tmp_path / "bf16.onnx",
        )
        call = lambda: plan(path)  # noqa: E731
    elif kind == "custom_op":
        graph = helper.make_graph(
            [helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")],
            "g",
            [model_zoo.V("x", TensorProto.FLOAT, ["n", 2])],
            [model_zoo.V("y", TensorProto.FLOAT, ["n", 2])],
        )
        made = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
        )
        onnx.save(made, str(tmp_path / "custom.onnx"))
        call = lambda: plan(tmp_path / "custom.onnx")  # noqa: E731
    else:
        shape = {
            "image_rank": "images=1x3x8:2x3x16:4x3x32",
            "image_fixed": "images=1x4x8x8:2x4x16x24:4x4x32x32",
            "image_order": "images=1x3x16x16:2x3x8x8:4x3x32x32",
            "image_name": "pixels=1x3x8x8:2x3x16x24:4x3x32x32",
            "image_zero": "images=1x3x0x8:2x3x16x24:4x3x32x32",
        }[kind]
        call = lambda: plan(image, None, parse_shapes([shape]))  # noqa: E731
    with pytest.raises(UserError) as raised:
        call()
    assert words in str(raised.value)
    assert "\n" not in str(raised.value)


def test_shapes_are_written_as_trtexec_writes_them():
    assert parse_shapes(["in:put=1x3:8x3:16x3"]) == {"in:put": ((1, 3), (8, 3), (16, 3))}
    for bad in ("x=1x3:8x3", "x", "=1:2:3", "x=1xa:2:3"):
        with pytest.raises(UserError, match="write NAME=MIN:OPT:MAX"):
            parse_shapes([bad])


def test_state_kept_in_the_server_is_the_sequence_batchers(tmp_path):
    """--server-state: the state pair leaves the config's inputs and outputs for
    sequence_batching's state (zeros to start), no client-state parameter, one row a request."""
    from tritonstack.models.add_model import cpu_config, gpu_config, wants_tensorrt

    model = model_zoo.recurrent(tmp_path)
    found = plan(model.path, None, {}, None, server_state=True)
    assert found.server_state and found.state == {"state": "stateN"} and found.batched
    assert [e["name"] for e in found.io("input")] == ["chunk"]
    assert [e["name"] for e in found.io("output")] == ["score"]
    assert STATE_PARAMETER not in found.parameters()
    assert any("state kept in the server" in note for note in found.notes)
    for text in (cpu_config("r", found, [], "r.onnx"), gpu_config("r", found, [], "r.onnx")):
        config = message_from_text(text)
        assert not config.HasField("dynamic_batching") and not config.model_warmup
        (state,) = config.sequence_batching.state
        assert (state.input_name, state.output_name, list(state.dims)) == ("state", "stateN", [8])
        assert state.initial_state[0].zero_data and list(state.initial_state[0].dims) == [8]
    assert not wants_tensorrt(found, "auto")
    with pytest.raises(UserError, match="--tensorrt always"):
        wants_tensorrt(found, "always")


def message_from_text(text: str):
    from google.protobuf import text_format

    from tritonstack.core.config_text import ModelConfig

    return text_format.Parse(text, ModelConfig())


def test_state_the_server_cannot_keep_is_refused_with_the_way_out(tmp_path, zoo):
    with pytest.raises(UserError, match="no state found by name; name each pair"):
        plan(zoo["image"].path, None, {}, None, server_state=True)
    variable = model_zoo._save(
        [helper.make_node("Add", ["state", "x"], ["stateN"])],
        [model_zoo.V("x", TensorProto.FLOAT, ["n", "t"]),
         model_zoo.V("state", TensorProto.FLOAT, ["n", "t"])],
        [model_zoo.V("stateN", TensorProto.FLOAT, ["n", "t"])],
        tmp_path / "variable.onnx",
    )  # fmt: skip
    with pytest.raises(UserError) as raised:
        plan(variable, None, {}, None, server_state=True)
    assert "state state has variable dims" in str(raised.value)
    assert "leave --server-state out" in str(raised.value)


def test_weights_written_beside_the_graph_are_read_in_as_dynamo_exports_write_them(zoo, tmp_path):
    """torch.onnx.export(dynamo=True) saves the weights in `<model>.onnx.data` by default (ONNX
    external data): the plan holds them inline, so the repository gets one file that serves
    as the original; a data file that is missing is refused in one line."""
    original = onnx.load(str(zoo["image"].path))
    weights = [numpy_helper.to_array(i).tolist() for i in original.graph.initializer]
    path = tmp_path / "image.onnx"  # onnx.save moves `original`'s weights out too
    onnx.save(original, str(path), save_as_external_data=True, location="image.onnx.data",
              size_threshold=0)  # fmt: skip
    assert onnx.load(str(path), load_external_data=False).graph.initializer[0].data_location == 1
    found = plan(path, None, parse_shapes(["images=1x3x8x8:2x3x16x24:4x3x32x32"]))
    assert all(i.data_location == 0 for i in found.model.graph.initializer)
    assert [numpy_helper.to_array(i).tolist() for i in found.model.graph.initializer] == weights
    (tmp_path / "image.onnx.data").unlink()
    with pytest.raises(UserError) as raised:
        plan(path)
    message = str(raised.value)
    assert "are in separate files (ONNX external data) that cannot be read" in message
    assert "image.onnx.data" in message and "\n" not in message


def test_a_locale_the_machine_lacks_is_refused_with_the_converter_s_option(tmp_path, capfd):
    """skl2onnx's text operators (StringNormalizer) ask for en_US.UTF-8 by default, which many
    machines and containers lack; onnxruntime then cannot load the graph. The refusal names the
    converter's option, and onnxruntime's own log line stays out of the terminal."""
    path = model_zoo._save(
        [helper.make_node("StringNormalizer", ["text"], ["words"], case_change_action="LOWER",
                          locale="xx_XX.UTF-8")],
        [model_zoo.V("text", TensorProto.STRING, [1, "c"])],
        [model_zoo.V("words", TensorProto.STRING, [1, "c"])],
        tmp_path / "text.onnx",
    )  # fmt: skip
    with pytest.raises(UserError) as raised:
        plan(path)
    message = str(raised.value)
    assert "onnxruntime cannot load it" in message and "\n" not in message
    assert "options={TfidfVectorizer: {'locale': 'C.UTF-8'}}" in message
    assert "onnxruntime" not in capfd.readouterr().err
