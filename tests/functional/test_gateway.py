"""The gateway (real HAProxy, gateway/haproxy.cfg) in front of the real Triton serving the demo:
routes, the request checks every public model gets (format, size, the values a shape declares;
the rest is Triton's to refuse, with a 400 of its own), gRPC passthrough, API keys and their
rotation, TLS, least-connections balancing, metrics. test_own_models.py does the same for a
model of the tests' own making.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ROOT, embeddings, require_tool
from tritonstack.cli import main as cli_main
from tritonstack.clients.client import infer
from tritonstack.clients.metrics import scrape
from tritonstack.core.contract import LLM_MODEL
from tritonstack.core.limits import limits
from tritonstack.core.ports import free_ports
from tritonstack.core.settings import load
from tritonstack.serve.gateway import Gateway

LIMITS = {m.model: m for m in limits().models}
PUBLIC = load().public_models


def call(url: str, method: str, path: str, body: bytes | str = b"", headers=None, context=None):
    """(status, headers, text) of one request on a fresh connection."""
    host, port = url.split(":")
    if context is None:
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
    else:
        connection = http.client.HTTPSConnection(host, int(port), timeout=10, context=context)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def infer_body(shape, data=None) -> str:
    values = [0.5] * int(np.prod([max(d, 0) for d in shape[:2]])) if data is None else data
    return json.dumps({"inputs": [{"name": "features", "shape": shape, "datatype": "FP32",
                                   "data": values[:128 * 64]}]})  # fmt: skip


def assert_triton_up(triton) -> None:
    """Triton itself (not the gateway) is ready and serves a real inference."""
    assert infer(triton.http_url, "pipeline", embeddings(2))["label"].shape == (2, 1)


PUBLIC_ROUTES = [
    ("GET", "/v2/health/live"),
    ("GET", "/v2/health/ready"),
    ("GET", "/v2"),
    *[("GET", f"/v2/models/{m}{s}") for m in PUBLIC for s in ("", "/ready", "/config")],
    ("GET", "/v2/models/classifier/versions/1/ready"),
]


@pytest.mark.parametrize(("method", "path"), PUBLIC_ROUTES)
def test_public_routes_reach_triton(gateway, method, path):
    status, _, text = call(gateway.http_url, method, path)
    assert status == 200, text


ADMIN_ROUTES = [
    ("POST", "/v2/repository/index", "{}"),
    ("POST", "/v2/repository/models/classifier/unload", "{}"),
    ("GET", "/v2/models/stats", ""),
    ("GET", "/v2/models/classifier/stats", ""),
    ("GET", "/v2/systemsharedmemory/status", ""),
    ("POST", "/v2/systemsharedmemory/region/x/register", "{}"),
    ("GET", "/v2/cudasharedmemory/status", ""),
    ("GET", "/v2/trace/setting", ""),
    ("POST", "/v2/models/classifier/trace/setting", "{}"),
    ("GET", "/v2/logging", ""),
    ("GET", "/metrics", ""),
    ("POST", "/v2/models/postprocess/infer", infer_body([1, 2])),  # internal step, not public
    ("POST", "/v2/models/classifier_trt/infer", infer_body([1, 128])),
    ("GET", "/v2/models/../repository/index", ""),
    ("GET", "/v2/models/classifier/../../repository/index", ""),
]


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_ROUTES)
def test_admin_and_private_routes_are_not_routed_even_with_the_admin_key(
    gateway, triton, method, path, body
):
    status, _, text = call(gateway.http_url, method, path, body, triton.admin_headers)
    assert status == 404, text
    assert "not routed by the gateway" in json.loads(text)["error"]


def test_admin_key_works_on_triton_directly_so_the_404_is_the_gateways(triton):
    status, _, text = call(triton.http_url, "POST", "/v2/repository/index", "{}",
                           triton.admin_headers)  # fmt: skip
    assert status == 200 and "classifier" in text


def test_wrong_method_is_405_naming_the_allowed_one(gateway):
    status, headers, _ = call(gateway.http_url, "GET", "/v2/models/pipeline/infer")
    assert status == 405 and headers["allow"] == "POST"
    status, headers, _ = call(gateway.http_url, "DELETE", "/v2/models/pipeline")
    assert status == 405 and headers["allow"] == "GET"


#: A shape and who refuses it: the gateway (what would hurt Triton: a shape that is not a list of
#: integers, or declares more values than the model takes, which Triton 2.51 allocates before
#: comparing it with the data) or Triton (any other mismatch with the model: its own 400).
SHAPES = [
    # The first aborts Triton 2.51 (bad_alloc).
    (
        [100000000, 128],
        "the inputs' shapes declare 12800000000 values; pipeline takes at most 8192",
    ),
    ([65, 128], "declare 8320 values; pipeline takes at most 8192"),
    ([1, 100000000], "declare 100000000 values"),
    ([1, 128, 100000000], "declare 12800000000 values"),
    ([-1, 128], "every shape is a list of at most 8 non-negative integers"),
    ([1, -128], "every shape is a list of at most 8 non-negative integers"),
    ([1.5, 128], "every shape is a list of at most 8 non-negative integers"),
    (["1e8", 128], "every shape is a list of at most 8 non-negative integers"),
    # Data that disagrees with its shape (Triton 2.51: a 500).
    ([0, 128], "features: shape [0,128] declares 0 values, data holds 1"),
    ([1, 127], "features: shape [1,127] declares 127 values, data holds 1"),
    # Consistent, but not the model's: Triton's own 400.
    ([1], None),
    ([], None),
]


@pytest.mark.parametrize(("shape", "message"), SHAPES, ids=[str(s) for s, _ in SHAPES])
def test_a_wrong_shape_is_a_400_and_triton_stays_up(gateway, triton, shape, message):
    """The gateway's own refusals name what was wrong; the others are Triton's 400s."""
    status, _, text = call(gateway.http_url, "POST", "/v2/models/pipeline/infer",
                           infer_body(shape, data=[0.5]))  # fmt: skip
    assert status == 400, text
    error = json.loads(text)["error"]
    if message is not None:
        assert message in error
    assert_triton_up(triton)


def test_a_shape_the_model_does_not_take_is_triton_s_400(gateway, triton):
    """Names, shapes and datatypes are the model's: Triton refuses them with a 400 naming the
    model's own, which the gateway passes on."""
    status, _, text = call(gateway.http_url, "POST", "/v2/models/pipeline/infer",
                           infer_body([1, 127], data=[0.5] * 127))  # fmt: skip
    assert status == 400, text
    assert "[-1,128]" in json.loads(text)["error"].replace(" ", "")
    assert_triton_up(triton)


def test_body_that_is_not_a_request_is_400_not_triton_500(gateway):
    """Triton 2.51 answers 500 to unparseable JSON (upstream server#8762); the gateway's format
    check answers 400 first, naming what it needs."""
    for body in ("features=1,2,3", json.dumps({"inputs": 5}), "{", json.dumps({"inputs": []})):
        status, _, text = call(gateway.http_url, "POST", "/v2/models/pipeline/infer", body)
        assert status == 400, (body, text)
        assert "not an inference request the gateway accepts" in json.loads(text)["error"]


def test_a_second_input_declaring_too_much_is_refused(gateway, triton):
    """The declared values of every input count: a second tensor cannot hide a huge shape."""
    tensor = {"name": "features", "shape": [1, 128], "datatype": "FP32", "data": [0.5] * 128}
    hidden = dict(tensor, name="extra", shape=[100000000, 128], data=[0.5])
    body = json.dumps({"inputs": [tensor, hidden]})
    status, _, text = call(gateway.http_url, "POST", "/v2/models/pipeline/infer", body)
    assert status == 400 and "declare 12800000128 values" in text, text
    assert_triton_up(triton)


GOOD_INPUT = '{"name": "features", "shape": [1, 128], "datatype": "FP32", "data": [0.5]}'
SMUGGLED = [
    # A second input with escaped keys: the checks read keys as written, Triton decodes them.
    '{"n\\u0061me": "x", "\\u0073hape": [100000000, 128], "datatype": "FP32", "data": [1]}',
    '{"\\u0073hape": [100000000, 128], "datatype": "FP32", "data": [1]}',
    # A second input without a name.
    '{"shape": [100000000, 128], "datatype": "FP32", "data": [1]}',
]


@pytest.mark.parametrize("second", SMUGGLED, ids=["escaped keys", "escaped shape", "no name"])
def test_a_smuggled_second_input_is_refused_and_triton_stays_up(gateway, triton, second):
    body = f'{{"inputs": [{GOOD_INPUT}, {second}]}}'
    assert json.loads(body)["inputs"][1]["shape"] == [100000000, 128]  # what Triton would read
    status, _, text = call(gateway.http_url, "POST", "/v2/models/classifier/infer", body)
    assert status == 400, text
    assert_triton_up(triton)


def test_an_escaped_shape_key_in_the_first_input_is_refused(gateway, triton):
    body = '{"inputs": [{"name": "features", "\\u0073hape": [100000000, 128], "data": [1]}]}'
    status, _, text = call(gateway.http_url, "POST", "/v2/models/classifier/infer", body)
    assert status == 400 and "plain ASCII" in text
    assert_triton_up(triton)


def test_body_size_is_capped_from_max_batch_size(gateway):
    pipeline = LIMITS["pipeline"]
    assert pipeline.max_values == 64 * 128  # max_batch_size rows of its input
    host, port = gateway.http_url.split(":")
    # Refused on the headers alone: the gateway answers before the body is sent or buffered.
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", "/v2/models/pipeline/infer")
    connection.putheader("Content-Length", str(pipeline.json_body + 1))
    connection.endheaders()
    response = connection.getresponse()
    text = response.read().decode()
    assert response.status == 413 and "split the batch" in text
    assert f"body larger than {pipeline.json_body} bytes, the most pipeline takes as JSON" in text
    connection.close()
    # A chunked body has no length to check before it arrives: refused with 411.
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.putrequest("POST", "/v2/models/pipeline/infer")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    assert connection.getresponse().status == 411
    connection.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary tensors", "JSON"])
def test_largest_legal_batch_passes_in_both_encodings(gateway, binary):
    """64 rows of full-precision JSON numbers: the largest legitimate body fits the cap."""
    features = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32) * 1e-5
    client = httpclient.InferenceServerClient(gateway.http_url)
    tensor = httpclient.InferInput("features", [64, 128], "FP32")
    tensor.set_data_from_numpy(features, binary_data=binary)
    result = client.infer("classify", [tensor])
    client.close()
    assert result.as_numpy("label").shape == (64, 1)


def test_tritonclient_sees_the_gateway_refusal_as_a_clear_error(gateway):
    client = httpclient.InferenceServerClient(gateway.http_url)
    tensor = httpclient.InferInput("features", [65, 128], "FP32")
    tensor.set_data_from_numpy(np.zeros((65, 128), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("pipeline", [tensor])
    client.close()
    assert caught.value.status() == "400"
    assert "declare 8320 values; pipeline takes at most 8192" in caught.value.message()


def test_grpc_shapes_are_triton_s_to_check_and_it_does_so_before_allocating(gateway, triton):
    """The gateway reads a gRPC message's shapes only against a model's bounds per dim (the
    demo's models have none: test_model_zoo.py has them); Triton 2.51's gRPC frontend compares
    the shape with max_batch_size and the model before it allocates (unlike JSON)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for shape in ([100000000, 128], [1, 128, 100000000]):
            tensor = service_pb2.ModelInferRequest().InferInputTensor(
                name="features", datatype="FP32", shape=shape
            )
            message = service_pb2.ModelInferRequest(
                model_name="classifier", inputs=[tensor], raw_input_contents=[bytes(512)]
            )
            with pytest.raises(grpc.RpcError) as caught:
                stub.ModelInfer(message, timeout=30)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert_triton_up(triton)


def test_a_grpc_message_past_its_model_s_largest_request_is_refused_before_triton(
    gateway, triton
) -> None:
    """gRPC sends no Content-Length: the gateway reads the message's length from gRPC's 5-byte
    prefix and its model from the protobuf's first field (lua.grpc_request), and refuses a
    message past that model's largest request (models.map) before Triton reads it; the largest
    request passes. A metadata call is capped too. The refusal reaches a gRPC client as
    RESOURCE_EXHAUSTED with the gateway's reason, or as the stream's reset (CANCELLED) when that
    overtakes it."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from tritonstack.core.limits import limits

    cap = next(m for m in limits().models if m.model == "classifier").grpc_body

    def infer(rows: int, pad: int = 0):
        tensor = service_pb2.ModelInferRequest().InferInputTensor(
            name="features", datatype="FP32", shape=[rows, 128]
        )
        raw = embeddings(rows).tobytes() + bytes(pad)
        message = service_pb2.ModelInferRequest(
            model_name="classifier", inputs=[tensor], raw_input_contents=[raw]
        )
        return message, len(message.SerializeToString())

    refusals = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED)
    with grpc.insecure_channel(gateway.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        full, size = infer(64)
        assert size <= cap
        assert len(stub.ModelInfer(full, timeout=30).raw_output_contents) == 1
        # Data past the shape: Triton would read all of it and answer INVALID_ARGUMENT.
        past, size = infer(64, pad=cap)
        assert size > cap
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(past, timeout=30)
        assert caught.value.code() in refusals, caught.value
        if caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
            assert "the model's largest request takes" in caught.value.details(), caught.value
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="x" * 5000), timeout=30)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value
        assert "a metadata call takes at most 4096" in caught.value.details()
        metadata = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="classifier"))
        assert metadata.name == "classifier"
    assert_triton_up(triton)


def test_grpc_reaches_only_the_public_models_and_says_why_it_refuses(gateway, triton):
    """Over gRPC the model is a field of the message (lua.grpc_request reads it): a model that is
    not public (a pipeline's step) is refused as over HTTP, for inference and metadata, though
    Triton serves it; so is a message naming a public model and then another one (protobuf keeps
    the last, which Triton would serve), a compressed one (unreadable, and its length bounds
    nothing Triton inflates), and the LLM's metadata with no LLM behind the gateway. Each
    refusal reaches tritonclient as a gRPC status with the gateway's reason."""
    import grpc
    from tritonclient.grpc import service_pb2

    direct = grpcclient.InferenceServerClient(triton.grpc_url)
    client = grpcclient.InferenceServerClient(gateway.grpc_url)
    try:
        assert direct.get_model_config("postprocess").config.name == "postprocess"
        scores = grpcclient.InferInput("class", [1, 2], "FP32")
        scores.set_data_from_numpy(np.zeros([1, 2], np.float32))
        for call in (
            lambda: client.get_model_config("postprocess"),
            lambda: client.get_model_metadata("postprocess"),
            lambda: client.is_model_ready("postprocess"),
            lambda: client.infer("postprocess", [scores]),
        ):
            with pytest.raises(InferenceServerException) as caught:
                call()
            assert caught.value.status() == "StatusCode.NOT_FOUND", caught.value
            assert "model postprocess is not routed by the gateway" in caught.value.message()
        tensor = grpcclient.InferInput("features", [2, 128], "FP32")
        tensor.set_data_from_numpy(embeddings(2))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("classify", [tensor], compression_algorithm="gzip")
        assert caught.value.status() == "StatusCode.UNIMPLEMENTED", caught.value
        assert "send them uncompressed" in caught.value.message()
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata(LLM_MODEL)
        assert caught.value.status() == "StatusCode.UNAVAILABLE", caught.value
        assert "no LLM is served behind this gateway" in caught.value.message()
        assert client.infer("classify", [tensor]).as_numpy("label").shape == (2, 1)
    finally:
        direct.close()
        client.close()

    # The public model first, the step after: Triton takes the step's name.
    public = service_pb2.ModelInferRequest(model_name="classify").SerializeToString()
    step = service_pb2.ModelInferRequest(
        model_name="postprocess",
        inputs=[service_pb2.ModelInferRequest().InferInputTensor(
            name="class", datatype="FP32", shape=[1, 2])],
        raw_input_contents=[bytes(8)],
    ).SerializeToString()  # fmt: skip
    crafted = service_pb2.ModelInferRequest.FromString(public + step)
    assert crafted.model_name == "postprocess"
    for url, code in ((triton.grpc_url, grpc.StatusCode.OK),
                      (gateway.grpc_url, grpc.StatusCode.INVALID_ARGUMENT)):  # fmt: skip
        with grpc.insecure_channel(url) as channel:
            raw = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=lambda message: message,
                response_deserializer=service_pb2.ModelInferResponse.FromString,
            )
            try:
                answer = raw(public + step, timeout=30)
                assert code == grpc.StatusCode.OK and answer.model_name == "postprocess"
            except grpc.RpcError as refused:
                assert refused.code() == code, refused
                assert "model_name comes twice" in refused.details()
    assert_triton_up(triton)


def test_grpc_passes_through_and_admin_methods_do_not(gateway, triton):
    client = grpcclient.InferenceServerClient(gateway.grpc_url)
    try:
        assert client.is_server_ready() and client.is_model_ready("classify")
        assert client.get_model_metadata("pipeline").name == "pipeline"
        tensor = grpcclient.InferInput("features", [4, 128], "FP32")
        tensor.set_data_from_numpy(embeddings(4))
        assert client.infer("classify", [tensor]).as_numpy("label").shape == (4, 1)
        for admin in (
            lambda: client.get_model_repository_index(headers=triton.grpc_admin_headers),
            lambda: client.get_inference_statistics(headers=triton.grpc_admin_headers),
            lambda: client.get_system_shared_memory_status(),
            lambda: client.get_log_settings(headers=triton.grpc_admin_headers),
        ):
            with pytest.raises(InferenceServerException) as caught:
                admin()
            assert caught.value.status() == "StatusCode.UNIMPLEMENTED", caught.value
            assert "method not routed by the gateway" in caught.value.message()
    finally:
        client.close()


def test_prometheus_endpoint_counts_requests_by_status(gateway):
    call(gateway.http_url, "GET", "/v2/health/ready")
    call(gateway.http_url, "GET", "/v2/repository/index")
    samples = scrape(gateway.metrics_url)  # counters as exposed minus `_total` (its parser)
    names = {name for name, _ in samples}
    assert "haproxy_frontend_http_responses" in names
    assert "haproxy_backend_current_queue" in names
    assert "haproxy_server_status" in names
    four_xx = [v for (n, labels), v in samples.items()
               if n == "haproxy_frontend_http_responses"
               and ("proxy", "http") in labels and ("code", "4xx") in labels]  # fmt: skip
    assert four_xx and four_xx[0] >= 1


def gateway_ports() -> dict[str, int]:
    return dict(zip(("http_port", "grpc_port", "metrics_port"), free_ports(3), strict=True))


def stat_rows(gateway: Gateway) -> list[dict[str, str]]:
    """The gateway's `show stat` table, a dict per row keyed by its CSV header."""
    lines = gateway.runtime("show stat").splitlines()
    header = lines[0].lstrip("# ").split(",")
    return [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]


def stot(gateway: Gateway, backend: str) -> dict[str, int]:
    """Requests each server of a backend has been given (`show stat`, column stot)."""
    return {
        r["svname"]: int(r["stot"])
        for r in stat_rows(gateway)
        if r["pxname"] == backend and r["svname"] not in ("FRONTEND", "BACKEND")
    }


def test_keep_alive_client_is_balanced_per_request(triton, tmp_path):
    """One keep-alive client, many requests: least-connections spreads them over both
    replicas instead of pinning the connection to one. The second replica is added through the
    runtime API, as natively started replicas are (here it is the same Triton on the same port:
    which process answers does not matter, where HAProxy sends each request does)."""
    require_tool("haproxy")
    with Gateway.for_triton(triton, **gateway_ports()) as gateway:
        gateway.add_replica(triton.http_port, triton.grpc_port)
        client = httpclient.InferenceServerClient(gateway.http_url, concurrency=1)
        tensor = httpclient.InferInput("features", [1, 128], "FP32")
        tensor.set_data_from_numpy(embeddings(1))
        before = stot(gateway, "triton_http")
        for _ in range(40):
            client.infer("classifier", [tensor])
        client.close()
        after = stot(gateway, "triton_http")
        served = {name: after[name] - before.get(name, 0) for name in after}
        assert set(served) == {"triton1", "triton2"}
        assert sum(served.values()) == 40
        assert min(served.values()) >= 10, served
        grpc = grpcclient.InferenceServerClient(gateway.grpc_url)
        gtensor = grpcclient.InferInput("features", [1, 128], "FP32")
        gtensor.set_data_from_numpy(embeddings(1))
        before = stot(gateway, "triton_grpc")
        for _ in range(20):
            grpc.infer("classifier", [gtensor])
        grpc.close()
        after = stot(gateway, "triton_grpc")
        assert min(after[n] - before.get(n, 0) for n in ("triton1", "triton2")) >= 5, after


def write_keys(path, keys: dict[str, str]) -> None:
    path.write_text("# key client\n" + "".join(f"{k} {v}\n" for k, v in keys.items()))


def test_api_keys_guard_inference_and_rotate_without_restart(triton, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRITONSTACK_API_KEY", raising=False)
    require_tool("haproxy")
    alice, bob, carol = "alice-" + "a" * 20, "bob-" + "b" * 20, "carol-" + "c" * 20
    keys = tmp_path / "api-keys"
    write_keys(keys, {alice: "alice", bob: "bob"})
    with Gateway.for_triton(triton, api_keys=keys, **gateway_ports()) as gateway:
        path, body = "/v2/models/pipeline/infer", infer_body([1, 128])

        def status(key: str | None, route: str = path, method: str = "POST") -> int:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return call(gateway.http_url, method, route, body if method == "POST" else "",
                        headers)[0]  # fmt: skip

        assert status(None) == 401
        assert status("bob-" + "x" * 20) == 401
        assert status(alice) == 200 and status(bob) == 200
        assert status(None, "/v2/models/pipeline", "GET") == 401
        assert status(None, "/v2/health/ready", "GET") == 200  # probes need no key
        # tritonclient passes the key as a header; gRPC as metadata.
        client = grpcclient.InferenceServerClient(gateway.grpc_url)
        tensor = grpcclient.InferInput("features", [1, 128], "FP32")
        tensor.set_data_from_numpy(embeddings(1))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("classify", [tensor])
        assert caught.value.status() == "StatusCode.UNAUTHENTICATED", caught.value
        assert "missing or unknown API key" in caught.value.message()
        result = client.infer("classify", [tensor], headers={"authorization": f"Bearer {bob}"})
        assert result.as_numpy("label").shape == (1, 1)
        client.close()

        # The CLI, as a user calls it: the key from --api-key; without it, one readable line.
        url = ["infer", "--url", gateway.http_url, "--rows", "2"]
        assert cli_main([*url, "--api-key", alice]) == 0
        assert "relevant" in capsys.readouterr().out
        assert cli_main(url) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert "missing or unknown API key" in line

        pid = gateway.process.pid
        write_keys(keys, {bob: "bob", carol: "carol"})  # alice's key retired, carol's issued
        assert gateway.reload_keys() == 2
        assert status(alice) == 401
        assert status(bob) == 200 and status(carol) == 200
        assert gateway.process.pid == pid and gateway.process.poll() is None


def test_public_address_without_keys_is_refused_before_starting(triton):
    from tritonstack.core.errors import UserError

    with pytest.raises(UserError, match="without API keys"):
        Gateway.for_triton(triton, address="0.0.0.0").start()


def test_tls_terminates_with_the_users_certificate(triton, tmp_path):
    require_tool("haproxy")
    openssl = require_tool("openssl")
    key, cert, pem = tmp_path / "key.pem", tmp_path / "cert.pem", tmp_path / "gateway.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    pem.write_text(cert.read_text() + key.read_text())
    with Gateway.for_triton(triton, tls_cert=pem, **gateway_ports()) as gateway:
        trusting = ssl.create_default_context(cafile=str(cert))
        status, _, text = call(gateway.http_url, "POST", "/v2/models/pipeline/infer",
                               infer_body([1, 128]), context=trusting)  # fmt: skip
        assert status == 200 and "relevant" in text
        with pytest.raises(ssl.SSLCertVerificationError):
            call(gateway.http_url, "GET", "/v2/health/ready", context=ssl.create_default_context())
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            call(gateway.http_url, "GET", "/v2/health/ready")  # plain HTTP on the TLS port
        client = grpcclient.InferenceServerClient(
            gateway.grpc_url, ssl=True, root_certificates=str(cert)
        )
        tensor = grpcclient.InferInput("features", [2, 128], "FP32")
        tensor.set_data_from_numpy(embeddings(2))
        assert client.infer("classify", [tensor]).as_numpy("label").shape == (2, 1)
        client.close()


def test_the_example_keys_file_is_what_the_gateway_reads():
    from tritonstack.serve.gateway import CONFIG, parse_keys

    assert parse_keys(CONFIG.parent / "api-keys.example") == {
        "replace-me-with-a-random-key-0001": "example-client"
    }


def test_soft_stop_answers_a_request_on_an_idle_keep_alive_connection(triton):
    """A stop must not close a keep-alive connection under a client that is sending on it:
    after SIGUSR1 the idle connection's next request is answered, with `Connection: close`
    (option idle-close-on-response); without it HAProxy closes idle connections at once and the
    request is lost."""
    require_tool("haproxy")
    with Gateway.for_triton(triton, **gateway_ports()) as gateway:
        host, port = gateway.http_url.split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.request("GET", "/v2/health/ready")
        first = connection.getresponse()
        first.read()
        assert first.status == 200
        gateway.process.send_signal(signal.SIGUSR1)  # what `stop()` and compose send
        # The soft stop has run once the listener is closed (a new connection is refused); the
        # idle connection is handled in the same pass.
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < deadline, "the listener stayed open after SIGUSR1"
            time.sleep(0.05)
        connection.request("POST", "/v2/models/classifier/infer", body=infer_body([1, 128]))
        last = connection.getresponse()
        last.read()
        connection.close()
        assert last.status == 200
        assert last.getheader("connection", "").lower() == "close"


def test_runtime_socket_hands_out_no_listening_sockets(triton):
    """`_getsocks` passes the listeners' file descriptors to whoever holds the runtime socket
    when it has `expose-fd listeners`; master-worker mode (the compose image) does not need
    that, and the native gateway never reloads that way, so nothing is handed out."""
    import array
    import socket

    require_tool("haproxy")
    with Gateway.for_triton(triton, **gateway_ports()) as gateway:
        with socket.socket(socket.AF_UNIX) as runtime:
            runtime.connect(str(gateway.runtime_socket))
            runtime.settimeout(2)
            runtime.sendall(b"_getsocks\n")
            data, descriptors = b"", array.array("i")
            while True:
                message, ancillary, _, _ = runtime.recvmsg(65536, socket.CMSG_SPACE(64 * 4))
                if not message and not ancillary:
                    break
                data += message
                for _, _, payload in ancillary:
                    descriptors.frombytes(payload[: len(payload) - len(payload) % 4])
        for descriptor in descriptors:
            os.close(descriptor)
        assert len(descriptors) == 0 and data == b""


def test_the_native_gateway_runs_one_thread_and_a_container_keeps_haproxys_default(gateway):
    """Natively HAProxy shares the machine with Triton: one thread
    (tritonstack.serve.gateway.THREADS, measured cheaper per request on 2 cores); compose sets no
    GATEWAY_THREADS, so the official
    image keeps HAProxy's one thread per CPU."""
    info = dict(
        line.split(": ", 1) for line in gateway.runtime("show info").splitlines() if ": " in line
    )
    assert info["Nbthread"] == "1", info.get("Nbthread")
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "GATEWAY_THREADS" not in compose
