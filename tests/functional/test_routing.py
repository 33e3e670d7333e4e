"""classify's BLS routing, proven on a server of its own.

A TensorRT engine cannot run here, so `classifier_trt` is replaced by a CPU stand-in (the same
ONNX model under that name): a fake for the GPU we lack, named as one. What is under test is
classify's choice, which only looks at whether a model of that name is ready.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import REPOSITORY, embeddings
from tritonstack.clients.client import infer
from tritonstack.clients.metrics import model_value, scrape
from tritonstack.core.ports import free_ports
from tritonstack.serve.runtime import EmbeddedTriton


def make_repository(root):
    repository = root / "model_repository"
    shutil.copytree(REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
    stand_in = repository / "classifier_trt"
    config = (REPOSITORY / "classifier" / "config.pbtxt").read_text()
    (stand_in / "config.pbtxt").write_text(
        config.replace('name: "classifier"', 'name: "classifier_trt"')
    )
    shutil.copy(REPOSITORY / "classifier/1/model.onnx", stand_in / "1" / "model.onnx")
    misrouted = repository / "classify_misrouted"
    shutil.copytree(repository / "classify", misrouted)
    config = (misrouted / "config.pbtxt").read_text()
    config = config.replace('name: "classify"', 'name: "classify_misrouted"')
    config = config.replace('"classifier_trt"', '"no_such_model"')
    config = config.replace('string_value: "classifier" }', 'string_value: "postprocess" }')
    (misrouted / "config.pbtxt").write_text(config)
    return repository


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("routing")
    ports = free_ports(3)
    with EmbeddedTriton(make_repository(root), *ports, log_path=root / "triton.log") as triton:
        yield triton


def inference_counts(server) -> dict[str, float]:
    samples = scrape(server.metrics_url)
    return {
        name: model_value(samples, "nv_inference_count", name)
        for name in ("classifier", "classifier_trt")
    }


def test_classify_prefers_the_tensorrt_model_when_it_is_ready(server):
    assert "classifier_trt" in server.served
    before = inference_counts(server)
    outputs = infer(server.http_url, "classify", embeddings(9, seed=9))
    after = inference_counts(server)
    assert after["classifier_trt"] - before["classifier_trt"] == 9
    assert after["classifier"] == before["classifier"]
    assert outputs["label"].shape == (9, 1)


def test_failed_sub_request_is_a_clear_error_and_the_server_stays_ready(server):
    """has_error() on the sub-response: its message reaches the client, named and explained."""
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("features", [2, 128], "FP32")
    tensor.set_data_from_numpy(np.zeros((2, 128), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("classify_misrouted", [tensor])
    message = caught.value.message()
    assert "classify: sub-request to postprocess failed" in message
    assert "unexpected inference output 'class'" in message
    assert client.is_server_ready()
    client.close()
    assert infer(server.http_url, "classify", embeddings(2))["score"].shape == (2, 1)
