"""Locust users: one class per way of calling Triton, each checking what comes back.

The classifier's users (http_json, http_binary, grpc) send `features` FP32 [rows, 128] to one
model and fail the request unless the answer is right in *content*, not only in status: the
expected outputs with the expected shapes, scores that are probabilities, labels from the labels
file, and (for `pipeline`) the label of the highest-scoring class. Options (model, rows, labels
file, gRPC address) come from Locust's parsed options, so the command line, locust.conf,
LOCUST_* variables and the web UI all set them; the target host comes from the environment, the
only place a worker receives it.

Users wait zero seconds between requests: a closed loop where the number of users is the number
of requests in flight, which is what drives Triton's dynamic batcher.

The LLM's user (llm_stream) streams generations from /v2/models/llm/generate_stream instead; the
answers are checked and timed by generation.py, and the timings reported as gates.py describes.
"""

from __future__ import annotations

import functools
import http.client
import itertools
import json
import random
import ssl
import time
from pathlib import Path
from urllib.parse import urlsplit

import gates
import generation
import grpc.experimental.gevent as grpc_gevent
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from locust import FastHttpUser, User, constant, task

# gRPC's C core blocks the whole process unless it cooperates with gevent; this must run before
# any channel exists (Locust has already monkey-patched the standard library at this point).
grpc_gevent.init_gevent()

# The model contract and Triton's gRPC port. The Locust image installs loadtest/requirements.txt,
# not the tritonstack package, so these are spelled out here; tests/unit/test_contract.py fails when
# they differ from tritonstack/contract.py.
INPUT_NAME = "features"
INPUT_DATATYPE = "FP32"
FEATURES = 128
MAX_ROWS = 64  # every model's max_batch_size
MODEL_OUTPUTS = {
    "classifier": ("class",),
    "pipeline": ("label", "class"),
    "classify": ("label", "score"),
}
GRPC_PORT = 8001
#: `--rows mix`: mostly single embeddings, sometimes a page of results to re-rank.
ROWS_MIX = ((1, 0.6), (4, 0.25), (16, 0.1), (64, 0.05))
#: Distinct payloads prepared per rows value, sent in turn (building one costs client CPU).
PAYLOADS_PER_ROWS = 8
#: The labels file the models serve, in this checkout. The Locust containers have no checkout:
#: compose mounts the file and the Kubernetes ConfigMap carries it, each naming it in
#: LOCUST_LABELS_FILE.
DEFAULT_LABELS_FILE = (
    Path(__file__).resolve().parent.parent / "model_repository" / "postprocess" / "labels.txt"
)
TIMEOUT_S = 10.0
#: Longest wait for the next event of a stream (a queued prompt waits for a free batch slot).
STREAM_TIMEOUT_S = 60.0


class ValidationError(Exception):
    """The server answered, but not with a correct classification."""


def parse_rows(value: str) -> tuple[tuple[int, float], ...]:
    """`--rows` as (rows, weight) choices: an integer 1-64, or `mix`."""
    if value == "mix":
        return ROWS_MIX
    try:
        rows = int(value)
    except ValueError:
        rows = 0
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"--rows must be an integer from 1 to {MAX_ROWS} or 'mix', got {value!r}")
    return ((rows, 1.0),)


def read_option_file(path: str, what: str, fix: str) -> str:
    """The text of the file an option names; a ValueError saying which option, and how to fix."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path} ({exc.strerror}); {fix}") from None


@functools.cache
def read_labels(path: str) -> tuple[str, ...]:
    """The class labels, one per line in class order (model_repository/postprocess/labels.txt)."""
    fix = "set --labels-file or LOCUST_LABELS_FILE to model_repository/postprocess/labels.txt"
    labels = tuple(line for line in read_option_file(path, "labels file", fix).splitlines() if line)
    if len(labels) != 2:
        raise ValueError(f"{path}: expected 2 labels, one per line, found {len(labels)}")
    return labels


@functools.cache
def read_api_key(path: str) -> str:
    """The gateway API key in the file `path` (its only line), or "" when no file is named."""
    if not path:
        return ""
    fix = "set --api-key-file or LOCUST_API_KEY_FILE to a file holding the key, or leave it empty"
    key = read_option_file(path, "API key file", fix).strip()
    if not key or len(key.split()) != 1:
        raise ValueError(f"{path}: expected one API key on one line")
    return key


def check_outputs(
    model: str, rows: int, outputs: dict[str, np.ndarray], labels: tuple[str, ...]
) -> None:
    """Raise ValidationError unless `outputs` is a correct answer of `model` for `rows` rows."""
    missing = set(MODEL_OUTPUTS[model]) - {k for k, v in outputs.items() if v is not None}
    if missing:
        raise ValidationError(f"missing output(s) {sorted(missing)}")
    expected = {"class": (rows, 2), "label": (rows, 1), "score": (rows, 1)}
    for name in MODEL_OUTPUTS[model]:
        if outputs[name].shape != expected[name]:
            raise ValidationError(
                f"output {name!r} has shape {list(outputs[name].shape)}, "
                f"expected {list(expected[name])}"
            )
    for name in ("class", "score"):
        if name in outputs:
            values = np.asarray(outputs[name], dtype=np.float64)
            if not np.all((values >= 0.0) & (values <= 1.0)):
                raise ValidationError(f"output {name!r} has values outside [0, 1]")
    if "class" in outputs and not np.allclose(outputs["class"].sum(axis=1), 1.0, atol=1e-3):
        raise ValidationError("output 'class' rows do not sum to 1")
    if "label" in outputs:
        names = [v.decode() if isinstance(v, bytes) else str(v) for v in outputs["label"][:, 0]]
        unknown = sorted(set(names) - set(labels))
        if unknown:
            raise ValidationError(f"label(s) {unknown} not in the labels file {list(labels)}")
        if "class" in outputs:
            argmax = [labels[i] for i in np.asarray(outputs["class"]).argmax(axis=1)]
            if names != argmax:
                raise ValidationError("label does not match the highest-scoring class")


def embeddings(rows: int, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((rows, FEATURES)).astype(np.float32)


def grpc_target(options, host: str | None) -> str:
    """`--grpc-host`, or the name of `host` (the HTTP target) with `--grpc-port`.

    `host` must be the environment's host, not `options.host`: a master forwards only the
    locustfile's own options to its workers, so on a worker `options.host` is None while the
    environment holds the host the master was started with.
    """
    if options.grpc_host:
        return options.grpc_host.removeprefix("grpc://")
    if not host:
        raise ValueError("no target host: start Locust with --host (or set it in the web UI)")
    name = urlsplit(host if "://" in host else f"http://{host}").hostname
    return f"{name}:{options.grpc_port}"


class TritonUser(User):
    """Common options and payload rotation; subclasses send and check one request."""

    abstract = True
    wait_time = constant(0)
    #: The value of `--user-type` that selects this class, and the exporter's `user_type` label.
    user_type = ""

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.model = options.model
        self.labels = read_labels(options.labels_file)
        key = read_api_key(options.api_key_file)
        #: Sent on every request; the gateway asks for a key only beyond loopback.
        self.auth = {"authorization": f"Bearer {key}"} if key else {}
        choices = parse_rows(options.rows)
        self.rows_choices = [rows for rows, _ in choices]
        self.rows_weights = [weight for _, weight in choices]
        self.random = random.Random()
        rng = np.random.default_rng()
        self.payloads = {
            rows: [self.payload(embeddings(rows, rng)) for _ in range(PAYLOADS_PER_ROWS)]
            for rows in self.rows_choices
        }

    def context(self) -> dict:
        """Added to every request event: the exporter labels its metrics with it."""
        return {"user_type": self.user_type, "model": self.model}

    def next_payload(self):
        rows = self.random.choices(self.rows_choices, self.rows_weights)[0]
        return rows, self.random.choice(self.payloads[rows])

    def request_name(self, rows: int) -> str:
        return f"{self.model} rows={rows}"

    def payload(self, features: np.ndarray):
        raise NotImplementedError


class TritonHttpUser(TritonUser, FastHttpUser):
    """One HTTP request per task through Locust's FastHttpUser; subclasses pick the wire format."""

    abstract = True
    #: What parsing a malformed answer raises: reported as a request failure, never a crash.
    answer_errors: tuple[type[Exception], ...] = (ValidationError, ValueError, KeyError, TypeError)

    def payload(self, features: np.ndarray) -> tuple[bytes, dict[str, str]]:
        """The request body and its headers, built once per pre-generated payload."""
        raise NotImplementedError

    def outputs(self, response) -> dict[str, np.ndarray]:
        """The answer's tensors by name."""
        raise NotImplementedError

    @task
    def infer(self) -> None:
        rows, (body, headers) = self.next_payload()
        with self.client.post(
            f"/v2/models/{self.model}/infer",
            data=body,
            headers={**headers, **self.auth},
            name=self.request_name(rows),
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            try:
                check_outputs(self.model, rows, self.outputs(response), self.labels)
            except self.answer_errors as exc:
                response.failure(f"bad answer: {exc}")
            else:
                response.success()


class HttpJsonUser(TritonHttpUser):
    """KServe v2 JSON over HTTP: what any client without Triton's library sends."""

    abstract = False
    user_type = "http_json"

    def payload(self, features: np.ndarray) -> tuple[bytes, dict[str, str]]:
        tensor = {
            "name": INPUT_NAME,
            "shape": list(features.shape),
            "datatype": INPUT_DATATYPE,
            "data": features.ravel().tolist(),
        }
        return json.dumps({"inputs": [tensor]}).encode(), {"Content-Type": "application/json"}

    def outputs(self, response) -> dict[str, np.ndarray]:
        return {
            out["name"]: np.array(
                out["data"], dtype=object if out["datatype"] == "BYTES" else np.float32
            ).reshape(out["shape"])
            for out in response.json()["outputs"]
        }


class HttpBinaryUser(TritonHttpUser):
    """HTTP with Triton's binary tensor extension: a JSON header, then raw little-endian tensors.

    The body and the answer go through tritonclient.http's own `generate_request_body` and
    `parse_response_body`, so the wire format is exactly the library's; Locust's FastHttpUser
    sends it (tritonclient's HTTP client is not safe to share and would hide the timing).
    """

    abstract = False
    user_type = "http_binary"
    answer_errors = (Exception,)  # a malformed body raises from deep in tritonclient

    def payload(self, features: np.ndarray) -> tuple[bytes, dict[str, str]]:
        tensor = httpclient.InferInput(INPUT_NAME, list(features.shape), INPUT_DATATYPE)
        tensor.set_data_from_numpy(features, binary_data=True)
        outputs = [
            httpclient.InferRequestedOutput(name, binary_data=True)
            for name in MODEL_OUTPUTS[self.model]
        ]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            [tensor], outputs=outputs
        )
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        return body, headers

    def outputs(self, response) -> dict[str, np.ndarray]:
        length = response.headers.get("Inference-Header-Content-Length")
        result = httpclient.InferenceServerClient.parse_response_body(
            response.content, header_length=int(length) if length else None
        )
        return {name: result.as_numpy(name) for name in MODEL_OUTPUTS[self.model]}


class GeventSafeGrpcClient(grpcclient.InferenceServerClient):
    """tritonclient's gRPC client, closed only by its user's on_stop.

    tritonclient closes the channel again in `__del__`. Under gevent that second close can run
    inside a garbage collection while gRPC holds the lock it needs, and the Locust process then
    hangs on exit (seen with workers quitting: `gevent_decrement_channel_count` from `__del__`).
    """

    def __del__(self) -> None:
        pass


class GrpcUser(TritonUser):
    """gRPC through tritonclient.grpc, one client (one channel) per user.

    Locust does not time gRPC calls itself: each call is timed here and reported through
    `environment.events.request`, the same event Locust's HTTP clients fire, so statistics,
    failures, gates and the Prometheus exporter treat every user type alike.
    """

    abstract = False
    user_type = "grpc"

    def on_start(self) -> None:
        self.target = grpc_target(self.environment.parsed_options, self.environment.host)
        self.grpc = GeventSafeGrpcClient(url=self.target)
        super().on_start()

    def on_stop(self) -> None:
        client, self.grpc = getattr(self, "grpc", None), None
        if client is not None:
            client.close()

    def payload(self, features: np.ndarray) -> grpcclient.InferInput:
        tensor = grpcclient.InferInput(INPUT_NAME, list(features.shape), INPUT_DATATYPE)
        tensor.set_data_from_numpy(features)
        return tensor

    @task
    def infer(self) -> None:
        rows, tensor = self.next_payload()
        outputs = [grpcclient.InferRequestedOutput(name) for name in MODEL_OUTPUTS[self.model]]
        exception = None
        length = 0
        start = time.perf_counter()
        try:
            result = self.grpc.infer(
                self.model, [tensor], outputs=outputs, headers=self.auth, client_timeout=TIMEOUT_S
            )
        except Exception as exc:  # InferenceServerException: status, deadline, connection
            result, exception = None, exc
        elapsed_ms = (time.perf_counter() - start) * 1000.0  # the call only, not the checks
        if result is not None:
            length = result.get_response().ByteSize()
            try:
                answer = {name: result.as_numpy(name) for name in MODEL_OUTPUTS[self.model]}
                check_outputs(self.model, rows, answer, self.labels)
            except Exception as exc:  # ValidationError or an undecodable tensor
                exception = ValidationError(f"bad answer: {exc}")
        self.environment.events.request.fire(
            request_type="gRPC",
            name=self.request_name(rows),
            response_time=elapsed_ms,
            response_length=length,
            exception=exception,
            context=self.context(),
        )


class LlmStreamUser(User):
    """Streaming generation from the LLM (serve --llm, compose's profile llm), one at a time.

    Plain http.client over one kept-alive connection (Locust's gevent makes its socket
    cooperative): it returns each line as it arrives, which is what the timings need, while
    FastHttpUser's streamed body is read in blocks of a kilobyte, several events at a time. Each
    request is reported through `environment.events.request` like the gRPC user's; then its
    time to first token and each inter-token gap, as entries of the types gates.TTFT and
    gates.ITL under the same name.
    """

    abstract = False
    wait_time = constant(0)
    user_type = "llm_stream"
    request_name = f"{generation.LLM_MODEL} generate_stream"

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.max_tokens = options.max_tokens
        self.ignore_eos = not options.stop_at_eos
        key = read_api_key(options.api_key_file)
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.prompts = itertools.cycle(generation.PROMPTS)
        self.random = random.Random()
        self.connection = self.connect(self.environment.host)

    def on_stop(self) -> None:
        connection, self.connection = getattr(self, "connection", None), None
        if connection is not None:
            connection.close()

    @staticmethod
    def connect(host: str | None) -> http.client.HTTPConnection:
        """A connection to the target host (opened on first use, reopened after an error)."""
        if not host:
            raise ValueError("no target host: start Locust with --host (or set it in the web UI)")
        url = urlsplit(host if "://" in host else f"http://{host}")
        if url.scheme == "https":
            # Unverified, like FastHttpUser's default (insecure = True): a load test talks to
            # gateways with self-signed certificates.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return http.client.HTTPSConnection(
                url.hostname, url.port, timeout=STREAM_TIMEOUT_S, context=context
            )
        return http.client.HTTPConnection(url.hostname, url.port, timeout=STREAM_TIMEOUT_S)

    def context(self) -> dict:
        return {"user_type": self.user_type, "model": generation.LLM_MODEL}

    @task
    def generate(self) -> None:
        exception: Exception | None = None
        length = 0
        start = time.perf_counter()
        stream = generation.Stream(start)
        try:
            prompt = generation.unique(next(self.prompts), self.random)
            body = generation.request_body(prompt, self.max_tokens, self.ignore_eos)
            self.connection.request("POST", generation.ROUTE, body, self.headers)
            response = self.connection.getresponse()
            if response.status != 200:
                text = response.read()[:200].decode("utf-8", errors="replace")
                raise generation.AnswerError(f"HTTP {response.status}: {text}")
            for line in response:  # each line as soon as it arrives
                length += len(line)
                stream.feed(line, time.perf_counter())
            stream.check(self.max_tokens, self.ignore_eos)
        except generation.AnswerError as exc:
            exception = exc
        except (OSError, http.client.HTTPException) as exc:  # reset, timeout, malformed HTTP
            exception = exc
            self.connection.close()  # the next request opens a new one
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        fire = self.environment.events.request.fire
        context = {**self.context(), "output_tokens": stream.output_tokens}
        fire(
            request_type="POST",
            name=self.request_name,
            response_time=elapsed_ms,
            response_length=length,
            exception=exception,
            context=context,
        )
        timings = [(gates.TTFT, stream.ttft_s)] if stream.ttft_s is not None else []
        timings += [(gates.ITL, gap) for gap in stream.itl_s]
        for kind, seconds in timings:
            fire(
                request_type=kind,
                name=self.request_name,
                response_time=seconds * 1000.0,
                response_length=0,
                exception=None,
                context=self.context(),
            )


#: `--user-type` values.
USER_TYPES: dict[str, type[User]] = {
    cls.user_type: cls for cls in (HttpJsonUser, HttpBinaryUser, GrpcUser, LlmStreamUser)
}
