"""`classify` on a GPU host: its BLS sub-request's outputs come back in GPU memory.

The committed model.py runs unchanged against tests/fakes/fake_gpu_pb_utils.py, a stand-in for
`triton_python_backend_utils` that reproduces the one GPU behaviour the CPU runtime cannot show:
a BLS response keeps its outputs on the device the called model produced them on unless the
request asks for CPU memory. The called models are onnxruntime on the real model.onnx, so the
answers are checked against the reference, not against themselves. The real Python backend on
a real GPU runs the same path in tests/gpu/run.sh; the real 2.51 server accepts the request's
`preferred_memory` in tests/functional/test_inference.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import json_format

from tests.support import REPOSITORY, ROOT, embeddings
from tritonstack.core.repository import parse_config

FAKE = ROOT / "tests" / "fakes" / "fake_gpu_pb_utils.py"
CLASSIFY = REPOSITORY / "classify"


@pytest.fixture
def pb_utils(monkeypatch):
    spec = importlib.util.spec_from_file_location("triton_python_backend_utils", FAKE)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", module)
    spec.loader.exec_module(module)
    session = ort.InferenceSession(
        str(REPOSITORY / "classifier" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )

    def classifier(inputs: dict) -> dict:
        return {"class": session.run(["class"], inputs)[0]}

    module.SERVER.models.update(classifier=classifier, classifier_trt=classifier)
    # Both run on the GPU there: TensorRT always, ONNX Runtime with configs/gpu.pbtxt (KIND_GPU).
    module.SERVER.gpu_models.update({"classifier", "classifier_trt"})
    module.SERVER.reference = classifier
    return module


def load_classify(pb_utils, monkeypatch):
    monkeypatch.syspath_prepend(str(CLASSIFY / "1"))  # how the stub finds labels_file.py
    monkeypatch.delitem(sys.modules, "labels_file", raising=False)
    model = pb_utils.import_model(CLASSIFY / "1" / "model.py", "classify_model").TritonPythonModel()
    config = json_format.MessageToDict(
        parse_config(CLASSIFY / "config.pbtxt"), preserving_proto_field_name=True
    )
    model.initialize(
        {
            "model_config": json.dumps(config),
            "model_repository": str(CLASSIFY),
            "model_version": "1",
            "model_name": "classify",
        }
    )
    return model


def requests(pb_utils, *row_counts: int) -> list:
    return [
        pb_utils.InferenceRequest(
            "classify", [pb_utils.Tensor("features", embeddings(rows, seed))], ["label", "score"]
        )
        for seed, rows in enumerate(row_counts)
    ]


@pytest.mark.parametrize("target", ["classifier_trt", "classifier"])
def test_classify_reads_gpu_outputs_through_cpu_memory(pb_utils, monkeypatch, target):
    if target == "classifier_trt":
        pb_utils.SERVER.ready.add("classifier_trt")
    model = load_classify(pb_utils, monkeypatch)
    batch = requests(pb_utils, 1, 7, 64 - 8)
    responses = asyncio.run(model.execute(batch))

    (call,) = pb_utils.SERVER.calls
    assert call.model_name == target
    assert call.preferred_memory.preferred_memory_type == pb_utils.TRITONSERVER_MEMORY_CPU
    lines = (REPOSITORY / "postprocess" / "labels.txt").read_text().splitlines()
    labels = np.array([line for line in lines if line])
    for request, response in zip(batch, responses, strict=True):
        assert not response.has_error(), response.error().message()
        features = request.inputs[0].as_numpy()
        expected = pb_utils.SERVER.reference({"features": features})["class"]
        got = {t.name(): t.as_numpy() for t in response.output_tensors()}
        assert [v.decode() for v in got["label"][:, 0]] == list(labels[expected.argmax(axis=1)])
        np.testing.assert_allclose(got["score"][:, 0], expected.max(axis=1), rtol=1e-6)


def test_classify_names_a_backend_that_leaves_outputs_on_the_gpu(pb_utils, monkeypatch):
    pb_utils.SERVER.ignores_preferred_memory = True
    model = load_classify(pb_utils, monkeypatch)
    responses = asyncio.run(model.execute(requests(pb_utils, 2, 3)))
    messages = {r.error().message() for r in responses if r.has_error()}
    assert len(responses) == 2 and len(messages) == 1, messages
    (message,) = messages
    assert "classifier returned `class` in GPU memory" in message
    assert "preferred_memory" in message


def test_without_preferred_memory_the_fake_fails_as_the_gpu_does(pb_utils):
    """The fake reproduces the fault: a request without preferred_memory gets a GPU tensor."""
    request = pb_utils.InferenceRequest(
        "classifier", [pb_utils.Tensor("features", embeddings(1))], ["class"]
    )
    output = asyncio.run(request.async_exec()).output_tensors()[0]
    assert not output.is_cpu()
    with pytest.raises(pb_utils.TritonModelException, match="stored in GPU"):
        output.as_numpy()
