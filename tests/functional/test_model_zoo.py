"""Every class of model users bring (tests/model_zoo.py), through the whole stack at once: each
added with `tritonstack add-model` (which loads it in the real tritonserver before it says ok)
into one copy of the checkout, with a model Triton will not load beside them; `tritonstack
check`; `tritonstack serve` with the gateway in front, where the bad model is reported and every
other one serves; each answering HTTP JSON (where JSON can carry its types), binary tensors and
gRPC exactly as onnxruntime in-process does; a bad request answered 4xx with the server still
serving; gated load tests; the health check, `top` and the gateway naming the model that did
not load; `infer --steps` carrying a model's state. A model keeping its state in the server gets
a sequence of one request from each of these clients (tests/functional/test_server_state.py
runs longer sequences over two replicas)."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import model_zoo
from tests.functional.test_own_models import tritonstack
from tests.functional.test_serve import serve_project
from tests.support import copy_project
from tritonstack.clients.client import fetch_signature
from tritonstack.core.settings import load, with_public_model

pytestmark = pytest.mark.timeout(900)
#: The model that does not load: a copy of vector_output whose config says its output has two
#: values per row (the graph's has one), which Triton's onnxruntime backend refuses.
BROKEN = "broken"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict[str, model_zoo.ZooModel]:
    folder = tmp_path_factory.mktemp("zoo")
    return {name: build(folder) for name, build in model_zoo.BUILDERS.items()}


@pytest.fixture(scope="module")
def project(tmp_path_factory, zoo):
    """A copy of the checkout with every zoo model added (public), and the broken one beside."""
    root = copy_project(tmp_path_factory.mktemp("zoo-project") / "tritonstack")
    for model in zoo.values():
        added = tritonstack(root, "add-model", str(model.path), "--name", model.name,
                            *model.options, timeout=240)  # fmt: skip
        assert added.returncode == 0, f"{model.name}: {added.stderr}"
    repository = root / "model_repository"
    shutil.copytree(repository / "vector_output", repository / BROKEN)
    config = repository / BROKEN / "config.pbtxt"
    text = config.read_text().replace('name: "vector_output"', f'name: "{BROKEN}"')
    config.write_text(text.replace("dims: [ 1 ]\n    reshape { }", "dims: [ 2 ]", 1))
    # Public, as a user who added it by hand to stack.env would have it.
    stack = root / "stack.env"
    stack.write_text(with_public_model(stack.read_text(), BROKEN))
    derived = subprocess.run([sys.executable, "-m", "tritonstack.render.derived"],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "TRITONSTACK_PROJECT_DIR": str(root)})  # fmt: skip
    assert derived.returncode == 0, derived.stderr
    return root


def test_each_model_is_written_as_its_class_needs(project, zoo):
    from tritonstack.core.repository import iter_models

    models = {m.name: m for m in iter_models(project / "model_repository")}
    for model in zoo.values():
        config = models[model.name].config
        assert config.max_batch_size == model.max_batch_size, model.name
        assert (f"{model.name}_trt" in models) == model.tensorrt, model.name
        assert config.HasField("dynamic_batching") == (
            model.max_batch_size > 0 and not model.server_state
        ), model.name
        kept = {s.input_name: s.output_name for s in config.sequence_batching.state}
        assert kept == (model.state if model.server_state else {}), model.name
    assert set(zoo) <= set(load(project / "stack.env").public_models)


def test_check_names_the_model_triton_would_not_load(project):
    checked = tritonstack(project, "check", timeout=240)
    assert checked.returncode == 1
    problems = [line for line in checked.stderr.splitlines() if f"/{BROKEN}/" in line]
    assert problems, checked.stderr
    assert 'output[0] "total".dims is [ 2 ]' in problems[0], problems[0]
    assert "set dims: [ 1 ] with reshape: { shape: [ ] }" in problems[0], problems[0]


@pytest.fixture(scope="module")
def served(project):
    """`tritonstack serve` on the project: the gateway in front, the broken model reported."""
    with serve_project(project, timeout=300) as served:
        yield served


def test_serve_reports_the_model_that_did_not_load_and_serves_the_rest(served, zoo):
    ready = next(line for line in served["lines"] if line.startswith("ready: "))
    assert set(zoo) <= set(ready.removeprefix("ready: ").split(", ")), ready
    unloaded = [line for line in served["lines"] if line.startswith(f"not loaded: {BROKEN}: ")]
    assert unloaded and "the model expects 1 dimensions" in unloaded[0], served["lines"]


def request_inputs(model: str, served) -> tuple[object, dict[str, np.ndarray]]:
    signature = fetch_signature(served["http"], model)
    rows = min(3, signature.max_rows)
    return signature, signature.random_inputs(rows, np.random.default_rng(7))


def expected(model: model_zoo.ZooModel, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    feeds = {}
    rows = len(next(iter(arrays.values())))
    for tensor in session.get_inputs():
        if model.server_state and tensor.name in model.state:  # a sequence's start: zeros
            feeds[tensor.name] = np.zeros([rows, *tensor.shape[1:]], np.float32)
            continue
        array = arrays[tensor.name]
        if len(tensor.shape) < array.ndim:  # Triton's reshape: [rows, 1] -> [rows], [1] -> []
            array = array.reshape(array.shape[: len(tensor.shape)])
        feeds[tensor.name] = array
    return model_zoo.reference(model, feeds)


def same(got: np.ndarray, want: np.ndarray) -> bool:
    want = want.reshape(got.shape) if want.size == got.size else want
    if want.dtype == np.object_:
        want = np.array([str(v).encode() for v in want.reshape(-1)], dtype=object)
        return got.reshape(-1).tolist() == want.tolist()
    if want.dtype.kind in "fc":
        return got.shape == want.shape and np.allclose(got, want, rtol=1e-5, atol=1e-6)
    return got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("protocol", ["http-json", "http-binary", "grpc"])
@pytest.mark.parametrize("name", sorted(model_zoo.BUILDERS))
def test_each_model_answers_as_onnxruntime_does(served, zoo, name, protocol):
    model = zoo[name]
    signature, arrays = request_inputs(name, served)
    want = expected(model, arrays)
    if protocol == "http-json":
        if not model.json:
            status, text = post_json(served["http"], name, arrays, signature)
            assert status == 400 and "Please use the binary data format" in text, text
            return
        got = json_answer(served["http"], name, arrays, signature)
    else:
        got = library_answer(served, name, arrays, signature, protocol)
    for output in (t.name for t in signature.outputs):  # a state kept in the server: not one
        assert same(got[output], want[output]), (name, output, got[output], want[output])


def post_json(url: str, model: str, arrays, signature) -> tuple[int, str]:
    body = {
        "inputs": [
            {
                "name": t.name,
                "shape": list(arrays[t.name].shape),
                "datatype": t.datatype,
                "data": [v.decode() if isinstance(v, bytes) else v
                         for v in arrays[t.name].reshape(-1).tolist()],
            }
            for t in signature.inputs
        ]
    }  # fmt: skip
    if signature.sequence:  # a sequence of this one request
        body["parameters"] = {"sequence_id": 7, "sequence_start": True, "sequence_end": True}
    host, port = url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", f"/v2/models/{model}/infer", json.dumps(body),
                       {"Content-Type": "application/json"})  # fmt: skip
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    return response.status, text


def json_answer(url: str, model: str, arrays, signature) -> dict[str, np.ndarray]:
    from tritonstack.core.signature import numpy_type

    status, text = post_json(url, model, arrays, signature)
    assert status == 200, text
    answer = {}
    for out in json.loads(text)["outputs"]:
        data = out["data"]
        if out["datatype"] == "BYTES":
            data = [v.encode() for v in data]
        answer[out["name"]] = np.array(data, dtype=numpy_type(out["datatype"])).reshape(
            out["shape"]
        )
    return answer


def library_answer(served, model: str, arrays, signature, protocol: str) -> dict:
    grpc = protocol == "grpc"
    module = grpcclient if grpc else httpclient
    client = module.InferenceServerClient(served["grpc"] if grpc else served["http"])
    tensors = []
    for tensor in signature.inputs:
        array = arrays[tensor.name]
        tensors.append(module.InferInput(tensor.name, list(array.shape), tensor.datatype))
        if grpc:
            tensors[-1].set_data_from_numpy(array)
        else:
            tensors[-1].set_data_from_numpy(array, binary_data=True)
    outputs = [
        grpcclient.InferRequestedOutput(t.name)
        if grpc
        else httpclient.InferRequestedOutput(t.name, binary_data=True)
        for t in signature.outputs
    ]
    sequence = (
        {"sequence_id": 7, "sequence_start": True, "sequence_end": True}
        if signature.sequence
        else {}
    )
    try:
        result = client.infer(model, tensors, outputs=outputs, **sequence)
    finally:
        client.close()
    return {t.name: result.as_numpy(t.name) for t in signature.outputs}


BAD = {  # case: (model, its inputs, words the error holds)
    "image": ("image", [{"name": "images", "shape": [1, 3, 64, 8], "datatype": "FP32",
                         "data": [0] * 1536}],
              "images: shape [1,3,64,8] is beyond the largest the model takes, [4,3,32,32]"),
    "sequence": ("sequence", [{"name": "ids", "shape": [1, 3], "datatype": "FP32",
                               "data": [1, 2, 3]},
                              {"name": "attention_mask", "shape": [1, 3], "datatype": "INT64",
                               "data": [1, 1, 0]}],
                 "expects 'INT64'"),
    "sequence, a mask of another length": (
        "sequence", [{"name": "ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]},
                     {"name": "attention_mask", "shape": [1, 4], "datatype": "INT64",
                      "data": [1, 1, 0, 0]}],
        "attention_mask: dim 1 is 4 where ids's dim 1 is 3; the model takes them equal"),
    "text": ("text", [{"name": "text", "shape": [1, 2], "datatype": "BYTES",
                       "data": ['a, [b]"']}],
             'text: shape [1,2] declares 2 values, data holds 1'),
    "stateful": ("stateful", [{"name": "chunk", "shape": [1, 9], "datatype": "FP32",
                               "data": [0] * 9}],
                 "missing required input(s) ['state']"),
    "recurrent": ("recurrent", [{"name": "chunk", "shape": [1, 8], "datatype": "FP32",
                                 "data": [0] * 8}],
                  "must specify a non-zero or non-empty correlation ID"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_request_is_a_4xx_and_every_model_keeps_serving(served, case):
    name, inputs, words = BAD[case]
    host, port = served["http"].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", f"/v2/models/{name}/infer", json.dumps({"inputs": inputs}))
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    assert 400 <= response.status < 500, (response.status, text)
    assert words in json.loads(text)["error"], text
    assert served["process"].poll() is None
    healthy = subprocess.run(
        [sys.executable, "-m", "tritonstack.core.health", "--url", served["triton"],
         "--model", name, "--repeat", "1"], capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert healthy.returncode == 0 and healthy.stdout.startswith(f"healthy: {name}"), healthy


def test_a_grpc_shape_beyond_the_bounds_is_refused_as_over_http(served):
    """protobuf writes an input's name and shape before its bytes: the gateway refuses a gRPC
    shape beyond the model's bounds (add-model --shape) with the reason, as it does over HTTP,
    where Triton itself (its dims are -1) would run it."""
    from tritonclient.utils import InferenceServerException

    def infer(url: str, shape: list[int]):
        tensor = grpcclient.InferInput("images", shape, "FP32")
        tensor.set_data_from_numpy(np.zeros(shape, np.float32))
        client = grpcclient.InferenceServerClient(url)
        try:
            return client.infer("image", [tensor])
        finally:
            client.close()

    beyond = [1, 3, 64, 8]
    assert infer(served["triton_grpc"], beyond).get_response().model_name == "image"
    with pytest.raises(InferenceServerException) as caught:
        infer(served["grpc"], beyond)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT", caught.value
    assert BAD["image"][2] in caught.value.message(), caught.value
    assert infer(served["grpc"], [2, 3, 32, 16]).get_response().model_name == "image"


def test_inputs_sent_apart_in_a_dim_they_share_are_refused_over_http_and_grpc(served):
    """A text encoder's attention mask as long as its token ids (the graph names both dims
    `tokens`): a request whose lengths differ would fail inside the model, a 500 from Triton
    (onnxruntime's broadcast error); the gateway answers 400 / INVALID_ARGUMENT naming both."""
    from tritonclient.utils import InferenceServerException

    def infer(url: str, lengths: tuple[int, int]):
        tensors = []
        for name, length in zip(("ids", "attention_mask"), lengths, strict=True):
            tensor = grpcclient.InferInput(name, [1, length], "INT64")
            tensor.set_data_from_numpy(np.ones((1, length), np.int64))
            tensors.append(tensor)
        client = grpcclient.InferenceServerClient(url)
        try:
            return client.infer("sequence", tensors)
        finally:
            client.close()

    with pytest.raises(InferenceServerException) as caught:
        infer(served["triton_grpc"], (3, 4))
    assert caught.value.status() == "StatusCode.INTERNAL", caught.value  # Triton alone
    with pytest.raises(InferenceServerException) as caught:
        infer(served["grpc"], (3, 4))
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT", caught.value
    assert BAD["sequence, a mask of another length"][2] in caught.value.message(), caught.value
    assert infer(served["grpc"], (5, 5)).get_response().model_name == "sequence"


def test_the_model_that_did_not_load_is_named_by_the_gateway_health_and_top(served, project):
    host, port = served["http"].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", f"/v2/models/{BROKEN}/infer", json.dumps({"inputs": []}))
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    assert response.status in (400, 503), text
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", f"/v2/models/{BROKEN}")
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    assert response.status == 503 and f"{BROKEN} is not loaded on this server" in text, text
    public = " ".join(load(project / "stack.env").public_models)
    health = subprocess.run(
        [sys.executable, "-m", "tritonstack.core.health", "--url", served["triton"],
         "--repeat", "1", "--model", "vector_output", "--model", BROKEN],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PUBLIC_MODELS": public},
    )  # fmt: skip
    assert health.returncode == 0, health.stderr  # serving what it can: no restart
    assert f"not loaded: {BROKEN}: " in health.stderr and "healthy: vector_output" in health.stdout
    top = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "top", "--once", "--interval", "0.5",
         "--url", f"http://{served['metrics']}/metrics", "--server", served["triton"]],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert top.returncode == 0, top.stderr
    assert re.search(rf"^not loaded: {BROKEN}: .*the model expects 1 dimensions", top.stdout, re.M)


def test_the_deep_probe_passes_for_every_model_and_fails_for_the_one_not_loaded(
    served, project, zoo, tmp_path
):
    """The real blackbox_exporter with the project's generated modules (binary tensors of zeros
    for the FP16 model, strings, the opt shapes of the bounded ones), through the gateway."""
    import urllib.request

    from tests.functional.test_observability_live import blackbox_exporter

    source = project / "prometheus" / "blackbox.yml"
    with blackbox_exporter(tmp_path, source=source) as blackbox:
        for name in [*zoo, BROKEN]:
            target = f"http://{served['http']}/v2/models/{name}/infer"
            url = f"http://{blackbox}/probe?module=infer_{name}&target={target}"
            with urllib.request.urlopen(url, timeout=15) as answer:
                text = answer.read().decode()
            success = "0" if name == BROKEN else "1"
            assert f"\nprobe_success {success}\n" in text, (name, text[-600:])
    # The container's health check builds the same requests, straight to Triton: every model.
    checked = subprocess.run(
        [sys.executable, "-m", "tritonstack.core.health", "--url", served["triton"],
         "--repeat", "1", *(f"--model={name}" for name in zoo)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    assert sorted(line.split(":")[1].strip() for line in checked.stdout.splitlines()) == sorted(zoo)


def test_infer_steps_carry_the_state_the_model_returns(served):
    shown = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "infer", "--url", served["http"],
         "--model", "stateful", "--steps", "3"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "state carried from each answer to the next request: stateN -> state" in shown.stdout
    scores = [line.split()[1] for line in shown.stdout.splitlines() if line.startswith("   0 ")]
    assert len(scores) == 3 and len(set(scores)) == 3, shown.stdout  # the state moved


LOADS = {
    "image": "http_json",
    "sequence": "grpc",
    "text": "http_json",
    "every_type": "http_json",  # FP16: binary tensors, though the user is JSON's
    "stateful": "http_binary",
    "recurrent": "grpc",
    "lightgbm": "grpc",
}


@pytest.mark.parametrize("name", sorted(LOADS))
def test_a_gated_loadtest_of_each_class_passes(served, project, tmp_path, name):
    result = tritonstack(
        project, "loadtest", "--host", served["http"], "--grpc-host", served["grpc"],
        "--model", name, "--user-type", LOADS[name], "--users", "2", "--duration", "2s",
        "--max-fail-ratio", "0", "--results", str(tmp_path), timeout=180,
    )  # fmt: skip
    # serve's own output (Triton's log among it) says why, should the server have stopped
    # answering: a 503 from the gateway alone does not.
    said = "\n".join(served["lines"][-40:])
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\nserve printed:\n{said}"
    assert re.match(r"[1-9]\d* requests, 0 failed", result.stdout.strip().splitlines()[-1])
