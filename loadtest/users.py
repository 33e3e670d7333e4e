"""Locust users: one class per way of calling Triton, each checking what comes back.

The model's users (http_json, http_binary, grpc) call any model the server serves (through the
gateway: a public one). Each asks the server for the model's metadata first
(tritonstack.core.signature: `GET /v2/models/<model>` and `/config`), builds its requests from it
(random values, or rows drawn from `--input-file`, a .npy or .npz file), and fails a request
unless the answer is right in *form*, not only in status: every output the metadata lists, of
its shape and datatype for the rows sent, numbers finite. What the answers mean is each model's
own business, checked by its own tests. Options (model, rows, input file, gRPC address) come
from Locust's parsed options, so the command line, locust.conf, LOCUST_* variables and the web UI
all set them; the target host comes from the environment, the only place a worker receives it.

Users wait zero seconds between requests: a closed loop where the number of users is the number
of requests in flight, which is what drives Triton's dynamic batcher.

The LLM's user (llm_stream) streams generations from /v2/models/llm/generate_stream instead; the
answers are checked and timed by streaming.py, and the timings reported as gates.py describes.
"""

from __future__ import annotations

import functools
import http.client
import itertools
import json
import os
import random
import ssl
import time
from pathlib import Path
from urllib.parse import urlsplit

import gates
import grpc.experimental.gevent as grpc_gevent
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from locust import FastHttpUser, User, constant, task

from tritonstack.clients import streaming
from tritonstack.clients.client import new_sequence_id
from tritonstack.core import signature
from tritonstack.core.errors import UserError

# gRPC's C core blocks the whole process unless it cooperates with gevent; this must run before
# any channel exists (Locust has already monkey-patched the standard library at this point).
grpc_gevent.init_gevent()

#: `--rows mix`: mostly single rows, sometimes a page of results to re-rank (kept to the model's
#: max_batch_size).
ROWS_MIX = ((1, 0.6), (4, 0.25), (16, 0.1), (64, 0.05))
#: Distinct payloads prepared per rows value, sent in turn (building one costs client CPU).
PAYLOADS_PER_ROWS = 8
#: Requests per sequence a user sends to a model keeping state in the server, then a new one.
SEQUENCE_REQUESTS = 16
TIMEOUT_S = 10.0
#: Pause after a failed metadata request, before the user asks again.
RETRY_S = 1.0
#: Longest wait for the next event of a stream (a queued prompt waits for a free batch slot).
STREAM_TIMEOUT_S = 60.0


def default_model() -> str:
    """The first of $PUBLIC_MODELS (compose passes stack.env to Locust); `tritonstack loadtest`
    always names one."""
    models = os.environ.get("PUBLIC_MODELS", "").split()
    return models[0] if models else ""


def parse_rows(value: str, max_rows: int | None = None) -> tuple[tuple[int, float], ...]:
    """`--rows` as (rows, weight) choices: an integer, or `mix`; with `max_rows` (the model's
    max_batch_size, 1 for a model without batching) kept within it."""
    if value == "mix":
        mix = tuple((rows, weight) for rows, weight in ROWS_MIX if rows <= (max_rows or rows))
        return mix or ((1, 1.0),)
    try:
        rows = int(value)
    except ValueError:
        rows = 0
    if rows < 1 or (max_rows is not None and rows > max_rows):
        bound = f"1 to {max_rows}" if max_rows is not None else "a positive integer"
        raise ValueError(f"--rows must be {bound} or 'mix', got {value!r}")
    return ((rows, 1.0),)


def read_option_file(path: str, what: str, fix: str) -> str:
    """The text of the file an option names; a ValueError saying which option, and how to fix."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the {what} {path} ({exc.strerror}); {fix}") from None


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


def http_target(host: str | None) -> tuple[str, str]:
    """(scheme, host:port) of the environment's HTTP host."""
    if not host:
        raise ValueError("no target host: start Locust with --host (or set it in the web UI)")
    url = urlsplit(host if "://" in host else f"http://{host}")
    return url.scheme, url.netloc


@functools.cache
def model_signature(host: str, model: str, api_key: str) -> signature.Signature:
    """The model's signature, asked of the server once per process."""
    if not model:
        raise ValueError("no model: set --model (or LOCUST_MODEL, or PUBLIC_MODELS)")
    scheme, netloc = http_target(host)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        return signature.fetch(netloc, model, headers, scheme=scheme)
    except UserError as exc:
        raise ValueError(str(exc)) from None


@functools.cache
def input_rows(path: str, sig: signature.Signature) -> dict[str, np.ndarray] | None:
    """`--input-file`'s arrays, checked against the model (None: random inputs)."""
    if not path:
        return None
    try:
        return signature.load_arrays(Path(path), sig)
    except UserError as exc:
        raise ValueError(str(exc)) from None


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
        self.model = options.model or default_model()
        self.key = read_api_key(options.api_key_file)
        #: Sent on every request; the gateway asks for a key only beyond loopback.
        self.auth = {"authorization": f"Bearer {self.key}"} if self.key else {}
        self.signature: signature.Signature | None = None
        self.payloads: dict = {}
        self.random = random.Random()

    def prepare(self) -> bool:
        """Ask the server for the model's signature and build the payloads, once; until that
        works, each attempt is a failed request (a missing key, a model the gateway does not
        route, a server that is down, rows the model does not take), so a run shows why it
        sends nothing."""
        if self.payloads:
            return True
        started = time.perf_counter()
        try:
            self.signature = model_signature(self.environment.host, self.model, self.key)
            self.payloads = self.build_payloads()
        except (ValueError, UserError) as exc:
            self.signature, self.payloads = None, {}
            self.environment.events.request.fire(
                request_type="GET",
                name=f"{self.model} metadata",
                response_time=(time.perf_counter() - started) * 1000.0,
                response_length=0,
                exception=exc,
                context=self.context(),
            )
            time.sleep(RETRY_S)  # cooperative: Locust has patched time.sleep for gevent
            return False
        return True

    def build_payloads(self) -> dict:
        """PAYLOADS_PER_ROWS payloads for each rows choice, from the model's signature."""
        options = self.environment.parsed_options
        choices = parse_rows(options.rows, self.signature.max_rows)
        self.rows_choices = [rows for rows, _ in choices]
        self.rows_weights = [weight for _, weight in choices]
        rng = np.random.default_rng()
        given = input_rows(options.input_file, self.signature)

        def arrays(rows: int) -> dict[str, np.ndarray]:
            if given is None:
                return self.signature.random_inputs(rows, rng)
            if not self.signature.batched:
                return given
            return signature.sample_rows(given, rows, rng)

        self.first_arrays = arrays
        self.carried = None
        self.sequence_id, self.sequence_step = 0, 0
        return {
            rows: [self.payload(arrays(rows)) for _ in range(PAYLOADS_PER_ROWS)]
            for rows in self.rows_choices
        }

    def context(self) -> dict:
        """Added to every request event: the exporter labels its metrics with it."""
        return {"user_type": self.user_type, "model": self.model}

    def next_payload(self):
        """(rows, the request's payload, its sequence: (ID, start, end) or None)."""
        rows = self.random.choices(self.rows_choices, self.rows_weights)[0]
        if self.signature.sequence:
            # The server keeps the state: each request carries its place in the user's
            # sequence, SEQUENCE_REQUESTS long, so its payload is built anew.
            if self.sequence_step == 0:
                self.sequence_id = new_sequence_id()
            step = self.sequence_step
            sequence = (self.sequence_id, step == 0, step == SEQUENCE_REQUESTS - 1)
            return rows, self.payload(self.first_arrays(rows), sequence), sequence
        if self.signature.state:
            # The client carries the model's state: each request sends back what the last
            # answer returned, so its payload is built anew (tritonstack.core.signature.next_state).
            if self.carried is None:
                self.carried = self.first_arrays(rows)
            return rows, self.payload(self.carried), None
        return rows, self.random.choice(self.payloads[rows]), None

    def carry(self, outputs: dict[str, np.ndarray]) -> None:
        """After a good answer: the next request's state is this answer's, or the next step of
        the sequence."""
        if self.signature.state:
            self.carried = self.signature.next_state(self.carried, outputs)
        self.sequence_step = (self.sequence_step + 1) % SEQUENCE_REQUESTS

    def failed(self) -> None:
        """After a failed request: a sequence the server may not have started starts again."""
        self.sequence_step = 0

    def request_name(self, rows: int) -> str:
        return f"{self.model} rows={rows}"

    def payload(self, arrays: dict[str, np.ndarray], sequence=None):
        raise NotImplementedError


class TritonHttpUser(TritonUser, FastHttpUser):
    """One HTTP request per task through Locust's FastHttpUser; subclasses pick the wire format."""

    abstract = True
    #: What parsing a malformed answer raises: reported as a request failure, never a crash.
    answer_errors: tuple[type[Exception], ...] = (
        signature.AnswerError,
        ValueError,
        KeyError,
        TypeError,
    )

    def payload(self, arrays: dict[str, np.ndarray], sequence=None) -> tuple[bytes, dict[str, str]]:
        """The request body and its headers, built once per pre-generated payload."""
        raise NotImplementedError

    def outputs(self, response) -> dict[str, np.ndarray]:
        """The answer's tensors by name."""
        raise NotImplementedError

    @task
    def infer(self) -> None:
        if not self.prepare():
            return
        rows, (body, headers), _ = self.next_payload()
        with self.client.post(
            f"/v2/models/{self.model}/infer",
            data=body,
            headers={**headers, **self.auth},
            name=self.request_name(rows),
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                self.failed()
                return
            try:
                outputs = self.outputs(response)
                self.signature.check_answer(outputs, rows)
            except self.answer_errors as exc:
                response.failure(f"bad answer: {exc}")
                self.failed()
            else:
                self.carry(outputs)
                response.success()


def _json_values(array: np.ndarray) -> list:
    """An array's values as JSON carries them: strings for a BYTES tensor."""
    values = array.ravel().tolist()
    if array.dtype == np.object_:
        return [v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v for v in values]
    return values


def binary_payload(
    sig: signature.Signature, arrays: dict, sequence=None
) -> tuple[bytes, dict[str, str]]:
    """The request as tritonclient.http writes binary tensors (a JSON header, raw tensors)."""
    tensors = []
    for tensor in sig.inputs:
        array = arrays[tensor.name]
        tensors.append(httpclient.InferInput(tensor.name, list(array.shape), tensor.datatype))
        tensors[-1].set_data_from_numpy(array, binary_data=True)
    outputs = [
        httpclient.InferRequestedOutput(tensor.name, binary_data=True) for tensor in sig.outputs
    ]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        tensors, outputs=outputs, **sequence_arguments(sequence)
    )
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return body, headers


def sequence_arguments(sequence) -> dict:
    """tritonclient's keyword arguments for a request's place in a sequence."""
    if sequence is None:
        return {}
    sequence_id, start, end = sequence
    return {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}


def binary_outputs(sig: signature.Signature, response) -> dict[str, np.ndarray]:
    length = response.headers.get("Inference-Header-Content-Length")
    result = httpclient.InferenceServerClient.parse_response_body(
        response.content, header_length=int(length) if length else None
    )
    return {tensor.name: result.as_numpy(tensor.name) for tensor in sig.outputs}


class HttpJsonUser(TritonHttpUser):
    """KServe v2 JSON over HTTP: what any client without Triton's library sends. A model with an
    FP16 or BF16 tensor, which JSON cannot carry (Triton refuses it), gets binary tensors."""

    abstract = False
    user_type = "http_json"

    def payload(self, arrays: dict[str, np.ndarray], sequence=None) -> tuple[bytes, dict[str, str]]:
        if self.signature.binary_only:
            return binary_payload(self.signature, arrays, sequence)
        tensors = [
            {
                "name": tensor.name,
                "shape": list(arrays[tensor.name].shape),
                "datatype": tensor.datatype,
                "data": _json_values(arrays[tensor.name]),
            }
            for tensor in self.signature.inputs
        ]
        outputs = [{"name": tensor.name} for tensor in self.signature.outputs]
        body = {"inputs": tensors, "outputs": outputs}
        if sequence is not None:
            body["parameters"] = dict(zip(("sequence_id", "sequence_start", "sequence_end"),
                                          sequence, strict=True))  # fmt: skip
        return json.dumps(body).encode(), {"Content-Type": "application/json"}

    def outputs(self, response) -> dict[str, np.ndarray]:
        if self.signature.binary_only:
            return binary_outputs(self.signature, response)
        return {
            out["name"]: np.array(out["data"], dtype=signature.numpy_type(out["datatype"])).reshape(
                out["shape"]
            )
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

    def payload(self, arrays: dict[str, np.ndarray], sequence=None) -> tuple[bytes, dict[str, str]]:
        return binary_payload(self.signature, arrays, sequence)

    def outputs(self, response) -> dict[str, np.ndarray]:
        return binary_outputs(self.signature, response)


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

    def payload(self, arrays: dict[str, np.ndarray], sequence=None) -> list[grpcclient.InferInput]:
        tensors = []
        for tensor in self.signature.inputs:
            array = arrays[tensor.name]
            tensors.append(grpcclient.InferInput(tensor.name, list(array.shape), tensor.datatype))
            tensors[-1].set_data_from_numpy(array)
        return tensors

    @task
    def infer(self) -> None:
        if not self.prepare():
            return
        rows, tensors, sequence = self.next_payload()
        names = [tensor.name for tensor in self.signature.outputs]
        outputs = [grpcclient.InferRequestedOutput(name) for name in names]
        exception = None
        length = 0
        start = time.perf_counter()
        try:
            result = self.grpc.infer(
                self.model,
                tensors,
                outputs=outputs,
                headers=self.auth,
                client_timeout=TIMEOUT_S,
                **sequence_arguments(sequence),
            )
        except Exception as exc:  # InferenceServerException: status, deadline, connection
            result, exception = None, exc
        elapsed_ms = (time.perf_counter() - start) * 1000.0  # the call only, not the checks
        if result is not None:
            length = result.get_response().ByteSize()
            try:
                answer = {name: result.as_numpy(name) for name in names}
                self.signature.check_answer(answer, rows)
                self.carry(answer)
            except Exception as exc:  # AnswerError or an undecodable tensor
                exception = signature.AnswerError(f"bad answer: {exc}")
        if exception is not None:
            self.failed()
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
    request_name = f"{streaming.LLM_MODEL} generate_stream"

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.max_tokens = options.max_tokens
        self.ignore_eos = not options.stop_at_eos
        key = read_api_key(options.api_key_file)
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.prompts = itertools.cycle(streaming.PROMPTS)
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
        return {"user_type": self.user_type, "model": streaming.LLM_MODEL}

    @task
    def generate(self) -> None:
        exception: Exception | None = None
        length = 0
        start = time.perf_counter()
        stream = streaming.Stream(start)
        try:
            prompt = streaming.unique(next(self.prompts), self.random)
            body = streaming.request_body(prompt, self.max_tokens, self.ignore_eos)
            self.connection.request("POST", streaming.ROUTE, body, self.headers)
            response = self.connection.getresponse()
            if response.status != 200:
                text = response.read()[:200].decode("utf-8", errors="replace")
                raise streaming.AnswerError(f"HTTP {response.status}: {text}")
            for line in response:  # each line as soon as it arrives
                length += len(line)
                stream.feed(line, time.perf_counter())
            stream.check(self.max_tokens, self.ignore_eos)
        except streaming.AnswerError as exc:
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
