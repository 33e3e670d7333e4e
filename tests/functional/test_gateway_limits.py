"""The gateway refuses what would hurt Triton and answers every well-formed request completely.

Tried the way Triton's own QA tries its HTTP front end (qa/L0_http_fuzz, qa/L0_input_validation):
raw requests on a socket through the real HAProxy to the real Triton 2.51. Each case ends with
tritonserver still the same process (its pid unchanged: nothing crashed it) and answering a
good request, and each answer is complete: a status line, a delimited body, within seconds.

What Triton's HTTP server does with these on its own (research on server, common and
third_party at r24.10 and r26.07, and measured on 2.51): libevhtp closes the connection without
an answer on any URI, header name or header value of 8192 bytes or more; 2.51 parses JSON
recursively (a body nested ~50,000 levels deep crashes it; r26.05+ parse iteratively); an
HTTP/1.0 request for an empty answer gets no Content-Length on a kept-alive connection.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import tritonclient.http as httpclient

from tests.functional.test_gateway import assert_triton_up
from tests.support import embeddings

INFER = "/v2/models/classifier/infer"
ROW = [round(float(x), 6) for x in embeddings(1).ravel()]


def raw(gateway, data: bytes, timeout: float = 15.0, shutdown: bool = False):
    """(status line, headers, body, seconds) of one exchange on a fresh connection. The answer
    must be complete: delimited by Content-Length, or by the gateway closing the connection."""
    host, port = gateway.http_url.split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as connection:
        connection.sendall(data)
        if shutdown:
            connection.shutdown(socket.SHUT_WR)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = connection.recv(65536)
            assert chunk, f"connection closed before an answer: {received!r}"
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
        if data.startswith(b"HEAD "):
            pass  # a HEAD answer has headers only, whatever its Content-Length says
        elif "content-length" in headers:
            while len(body) < int(headers["content-length"]):
                chunk = connection.recv(65536)
                assert chunk, "connection closed inside the body"
                body += chunk
        else:  # no length: the end of the connection must end the answer, promptly
            while chunk := connection.recv(65536):
                body += chunk
    return lines[0], headers, body, time.monotonic() - started


def request(method: str, path: str, headers=(), body: bytes = b"", version: str = "HTTP/1.1"):
    lines = [f"{method} {path} {version}", "Host: gateway", *(f"{k}: {v}" for k, v in headers)]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def infer_json(**overrides) -> bytes:
    tensor = {"name": "features", "shape": [1, 128], "datatype": "FP32", "data": ROW}
    tensor.update(overrides)
    return json.dumps({"inputs": [tensor]}).encode()


@pytest.fixture
def same_triton(triton):
    """Triton's pid before the case; after it, the same process must still answer."""
    pid = triton.process.pid
    yield
    assert triton.process.poll() is None and triton.process.pid == pid, "tritonserver restarted"
    assert_triton_up(triton)


def refused(answer, status: int, *words: str) -> None:
    line, headers, body, _ = answer
    assert line.split()[1] == str(status), (line, body[:300])
    assert headers.get("content-type") == "application/json", headers
    error = json.loads(body)["error"]
    for word in words:
        assert word in error, error


NESTED = {
    # The case that crashed 2.51: data nested 50,000 levels (~100 kB, under the body cap).
    "data": infer_json(data=None).replace(
        b'"data": null', b'"data": ' + b"[" * 50000 + b"]" * 50000
    ),
    "parameters": infer_json().replace(
        b'"datatype"', b'"parameters": {"x": ' + b"{" * 20000 + b"}" * 20000 + b'}, "datatype"'
    ),
    "before the shape": b'{"inputs": [{"x": '
    + b"[" * 50000
    + b"]" * 50000
    + b', "shape": [1, 128]}]}',
    "inside outputs": infer_json()[:-1] + b', "outputs": [' + b"[" * 20000 + b"]" * 20000 + b"]}",
}


@pytest.mark.parametrize("where", NESTED)
def test_deep_nesting_is_refused_before_triton(gateway, same_triton, where):
    body = NESTED[where]
    assert len(body) < 217088  # under the body cap: only the nesting check stands in the way
    answer = raw(gateway, request("POST", INFER, [("Content-Type", "application/json")], body))
    refused(answer, 400)


OVERSIZE = {
    "an 8 KiB header value": (431, request("GET", "/v2/health/ready", [("X-Big", "a" * 8192)])),
    "many small headers": (
        431,
        request("GET", "/v2/health/ready", [(f"X-H{i}", "v" * 90) for i in range(95)]),
    ),
    "a 10,000-digit version": (
        414,
        request("GET", "/v2/models/classifier/versions/" + "1" * 10000 + "/ready"),
    ),
    "a long query string": (414, request("GET", "/v2/health/ready?" + "q=1&" * 2000)),
    "a 19-digit version": (
        400,
        request("GET", "/v2/models/classifier/versions/" + "9" * 19 + "/ready"),
    ),
    "a body on a GET": (400, request("GET", "/v2/health/ready", body=b"{}")),
}


@pytest.mark.parametrize("case", OVERSIZE)
def test_oversize_fields_get_a_4xx_naming_the_limit(gateway, same_triton, case):
    status, data = OVERSIZE[case]
    answer = raw(gateway, data)
    refused(answer, status)
    assert answer[3] < 5, "answered at once"


@pytest.mark.parametrize(
    "data",
    [
        request("GET", "/v2/health/ready", [("X" * 8192, "1")]),
        request("GET", "/v2/health/ready", [(f"X-{i}", "1") for i in range(150)]),
        b"GET /v2/health/ready\r\n\r\n",  # HTTP/0.9-style request line
        b"GET /v2/health/ready HTTP/1.x\r\nHost: x\r\n\r\n",
    ],
    ids=["an 8 KiB header name", "more headers than HAProxy parses", "0.9", "garbage version"],
)
def test_what_haproxy_cannot_parse_gets_its_own_400(gateway, same_triton, data):
    """Refused while parsing, before any rule runs: HAProxy 2.6 answers with its own short
    HTML page, not the gateway's JSON (its error files do not reach that stage)."""
    line, headers, _, seconds = raw(gateway, data)
    assert line.split()[1] == "400" and headers["connection"] == "close"
    assert seconds < 5


def test_an_18_digit_version_reaches_triton_and_gets_its_answer(gateway, same_triton):
    line, _, body, _ = raw(
        gateway, request("GET", f"/v2/models/classifier/versions/{'9' * 18}/ready")
    )
    assert line.split()[1] in {"400", "404"}, (line, body)


@pytest.mark.parametrize(
    "data",
    [
        request("GET", "/v2/health/ready", version="HTTP/1.0"),
        request("GET", "/v2/health/ready", [("Connection", "keep-alive")], version="HTTP/1.0"),
        request("GET", "/v2/models/classifier/ready", version="HTTP/1.0"),
    ],
    ids=["ready", "ready keep-alive", "model ready"],
)
def test_http_1_0_gets_a_complete_answer(gateway, same_triton, data):
    """ApacheBench and many probes speak HTTP/1.0; the answer must end, not hang."""
    line, _, body, seconds = raw(gateway, data, timeout=5)
    assert line.split()[1] == "200" and body == b""
    assert seconds < 2


def test_http_1_0_inference_is_answered_with_its_body(gateway, same_triton):
    data = request("POST", INFER, [("Content-Type", "application/json")], infer_json(), "HTTP/1.0")
    line, _, body, _ = raw(gateway, data, timeout=5)
    assert line.split()[1] == "200", body
    assert json.loads(body)["outputs"][0]["name"] == "class"


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET /v2/health/ready HTTP/2.0\r\nHost: x\r\n\r\n", 200),  # read as HTTP/1.1
        (b"GET /v2/health/ready HTTP/1.2\r\nHost: x\r\n\r\n", 200),
        (b"BREW /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    ],
    ids=["2.0 over HTTP/1", "1.2", "unknown method"],
)
def test_other_protocol_versions_and_methods_are_answered(gateway, same_triton, data, status):
    line, _, body, _ = raw(gateway, data, timeout=5)
    assert line.split()[1] == str(status), (line, body[:200])


def answer_or_close(gateway, data: bytes, wait: float = 5.0) -> tuple[bytes, float]:
    """Everything the gateway sends back to `data` until it closes the connection (b"" for a
    close without an answer), and the seconds it took; a gateway still silent after `wait`
    seconds fails the test."""
    host, port = gateway.http_url.split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=wait) as connection:
        connection.sendall(data)
        received = b""
        try:
            while chunk := connection.recv(65536):
                received += chunk
        except TimeoutError:
            pytest.fail(f"no answer and no close within {wait} s; received {received[:200]!r}")
        except ConnectionResetError:
            pass  # a reset is a close too
    return received, time.monotonic() - started


@pytest.mark.parametrize(
    "data",
    [
        b"GET /v2/health/ready HTTP/0.9\r\n\r\n",
        b"GET /v2/models/classifier HTTP/0.9\r\nHost: x\r\n\r\n",
        b"GET /v2/health/ready\r\n",
        b"GET /\r\n\r\n",
    ],
    ids=["HTTP/0.9 health", "HTTP/0.9 model metadata", "no version", "no version root"],
)
def test_an_http_0_9_request_line_is_refused_by_the_gateway(gateway, same_triton, data):
    """A request line of HTTP/0.9 (or none) is the gateway's 400 at once. HAProxy passes a
    `HTTP/0.9` request on unless told, Triton closes the connection, and the client got a 502
    naming Triton."""
    answer, seconds = answer_or_close(gateway, data)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert seconds < 2, seconds


@pytest.mark.parametrize(
    "data",
    [
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        # the preface and an empty SETTINGS frame, as an HTTP/2 client opens
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000"),
    ],
    ids=["preface", "preface and settings"],
)
def test_an_http_2_preface_on_the_http_1_port_is_refused_promptly(gateway, same_triton, data):
    """HTTP/2 with prior knowledge belongs on the gRPC port; on the HTTP/1 port the gateway
    answers 4xx or closes at once, rather than waiting on the client for seconds."""
    answer, seconds = answer_or_close(gateway, data)
    # HAProxy 2.6 cannot parse the preface as HTTP/1: 400; 3.4 sees the preface and, the upgrade
    # being off, answers 405 (mux_h1.c: "H2 upgrade not allowed").
    status = answer.split(b" ")[1] if answer.startswith(b"HTTP/1.1 ") else answer[:300]
    assert status in (b"400", b"405"), answer[:300]
    assert seconds < 2, seconds


def test_a_request_cut_off_in_its_headers_gets_408(gateway, same_triton):
    line, headers, _, seconds = raw(gateway, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n")
    assert line.split()[1] == "408" and headers["connection"] == "close"
    assert seconds < 12  # timeout http-request


def test_a_body_cut_off_short_of_its_content_length_gets_408(gateway, same_triton):
    body = infer_json()
    head = request("POST", INFER, [("Content-Type", "application/json")], body)
    answer = raw(gateway, head[: -len(body) // 2], timeout=20)
    refused(answer, 408)
    assert answer[3] < 12


def test_a_half_request_closed_by_the_client_does_not_reach_triton(gateway, same_triton):
    host, port = gateway.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        body = infer_json()
        connection.sendall(request("POST", INFER, body=body)[: -len(body) // 2])
        connection.shutdown(socket.SHUT_WR)
        answer = connection.recv(65536)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:200]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([("Inference-Header-Content-Length", "abc")], 400),
        ([("Inference-Header-Content-Length", "-5")], 400),
        ([("Inference-Header-Content-Length", "999999")], 400),
        # Beyond a C int: Triton through 26.08 aborts on it (std::out_of_range, uncaught).
        ([("Inference-Header-Content-Length", "99999999999")], 400),
        ([("Transfer-Encoding", "chunked")], 411),
    ],
    ids=["not a number", "negative", "beyond the body", "beyond an int", "chunked"],
)
def test_binary_header_and_framing_lies_are_refused(gateway, same_triton, headers, status):
    body = infer_json()
    if status == 411:
        data = (
            request("POST", INFER, headers)
            + f"{len(body):x}\r\n".encode()
            + body
            + b"\r\n0\r\n\r\n"
        )
    else:
        data = request("POST", INFER, headers, body)
    refused(raw(gateway, data), status)


def test_a_binary_body_past_its_cap_is_413(gateway, same_triton):
    body = b"\0" * 50000
    data = request("POST", INFER, [("Inference-Header-Content-Length", "10")], body)
    refused(raw(gateway, data), 413, "binary tensors")


def well_formed_bodies() -> dict[str, tuple[bytes, dict[str, str], int]]:
    """Requests a client may well send: tritonclient's own, and JSON as other libraries write
    it (nested rows, pretty-printed, keys in another order, the classification extension)."""
    bodies = {}
    for rows in (1, 7, 64):
        features = embeddings(rows, seed=rows)
        for binary in (False, True):
            tensor = httpclient.InferInput("features", [rows, 128], "FP32")
            tensor.set_data_from_numpy(features, binary_data=binary)
            outputs = [httpclient.InferRequestedOutput("class", binary_data=binary)]
            body, length = httpclient.InferenceServerClient.generate_request_body(
                [tensor],
                outputs=outputs,
                request_id=f"r{rows}",
                parameters={"tag": "test"},
            )
            headers = {} if length is None else {"Inference-Header-Content-Length": str(length)}
            bodies[f"tritonclient rows={rows} binary={binary}"] = (body, headers, rows)
        flat = features.ravel().tolist()
        other = {
            "nested rows, shape last": json.dumps(
                {
                    "inputs": [
                        {
                            "data": features.tolist(),
                            "datatype": "FP32",
                            "name": "features",
                            "shape": [rows, 128],
                        }
                    ]
                },
                # Pretty-printed, 64 rows are larger than the cap, which counts compact JSON.
                indent=2 if rows < 64 else None,
            ),
            "classification extension": json.dumps(
                {
                    "id": "x",
                    "inputs": [
                        {"name": "features", "shape": [rows, 128], "datatype": "FP32", "data": flat}
                    ],
                    "outputs": [{"name": "class", "parameters": {"classification": 1}}],
                }
            ),
            "exponents and NaN": json.dumps(
                {
                    "inputs": [
                        {
                            "name": "features",
                            "shape": [rows, 128],
                            "datatype": "FP32",
                            "data": [1e-30, float("nan"), *flat[2:]],
                        }
                    ]
                }
            ),
        }
        for name, text in other.items():
            headers = {"Content-Type": "application/json"}
            bodies[f"{name} rows={rows}"] = (text.encode(), headers, rows)
    return bodies


WELL_FORMED = well_formed_bodies()


@pytest.mark.parametrize("name", WELL_FORMED)
def test_well_formed_requests_pass_the_gateway_and_get_a_complete_answer(gateway, name):
    body, headers, rows = WELL_FORMED[name]
    line, answer_headers, answer, _ = raw(gateway, request("POST", INFER, headers.items(), body))
    assert line.split()[1] == "200", (line, answer[:300])
    length = answer_headers.get("inference-header-content-length")
    result = httpclient.InferenceServerClient.parse_response_body(
        answer, header_length=int(length) if length else None
    )
    if "classification" in name:
        assert result.as_numpy("class").shape == (rows, 1)
    else:
        assert result.as_numpy("class").shape == (rows, 2)
