"""The demo's own contract, stated once, here: what the seed guide's models take and return.

Nothing outside the demo's model folders and its tests names these; every other part of the
stack reads them from the model repository or asks the server. These tests keep the demo what
the guide teaches: `classifier` (ONNX, and its TensorRT twin) and the `pipeline` and `classify`
models around it take one 128-dim FP32 embedding per row, 64 rows at most, and return two class
probabilities, or a label with its score.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2

from tests.support import REPOSITORY
from tritonstack.core.repository import iter_models
from tritonstack.core.settings import load
from tritonstack.models import export

DEMO_OUTPUTS = {
    "classifier": ("class",),
    "classifier_trt": ("class",),
    "pipeline": ("label", "class"),
    "classify": ("label", "score"),
}


def test_the_demo_models_take_one_128_dim_embedding_per_row():
    configs = {m.name: m.config for m in iter_models(REPOSITORY)}
    for name, outputs in DEMO_OUTPUTS.items():
        config = configs[name]
        assert config.max_batch_size == 64, name
        [tensor] = config.input
        assert tensor.name == "features", name
        assert model_config_pb2.DataType.Name(tensor.data_type) == "TYPE_FP32", name
        assert list(tensor.dims) == [128], name
        assert tuple(output.name for output in config.output) == outputs, name


def test_the_demo_is_public_and_its_steps_are_not():
    public = load().public_models
    assert {"pipeline", "classify", "classifier"} <= set(public)
    assert not {"postprocess", "classifier_trt"} & set(public)


def test_the_exporter_makes_the_classifier_its_config_declares():
    config = next(m.config for m in iter_models(REPOSITORY) if m.name == "classifier")
    assert (config.input[0].name, list(config.input[0].dims)) == (
        export.INPUT_NAME,
        [export.FEATURES],
    )
    assert (config.output[0].name, list(config.output[0].dims)) == (
        export.OUTPUT_NAME,
        [export.CLASSES],
    )
    labels = (REPOSITORY / "postprocess" / "labels.txt").read_text().splitlines()
    assert len(labels) == export.CLASSES
