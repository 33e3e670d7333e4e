"""What the gateway lets through, derived from the model repository and stack.env.

Per public model, from its config.pbtxt: the most tensor values one request may declare
(max_batch_size rows of every input together), and from that the largest body it can take as
JSON and as binary tensors. HAProxy reads them from a map file (`models.map`, one line per
public model), so the gateway routes and bounds any model the repository serves without naming
one; what a model's tensors are called, their shapes and datatypes stay Triton's to check (it
answers a wrong one with a 400 of its own).

Stack-wide: the request buffer, one size whatever the models (a body that fits it is checked
whole; a larger binary one on its JSON header, then streamed), the connections the memory budget
allows at that size, and the LLM's limits, from stack.env.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tritonstack.core.contract import LLM_MODEL
from tritonstack.core.errors import UserError
from tritonstack.core.repository import Model, iter_models
from tritonstack.core.settings import Settings, load
from tritonstack.core.signature import BOUNDS_PARAMETER, value_bytes

#: Longest JSON rendering of one value plus its separator ("-1.2345678901234567e-05, "; an
#: INT64 or a boolean is shorter): what one tensor value of a JSON request can cost in bytes.
JSON_BYTES_PER_VALUE = 26
#: Room for a JSON request's envelope (keys, names, parameters, requested outputs), plus a little
#: per input for its name, datatype and shape.
ENVELOPE_BYTES = 4096
ENVELOPE_BYTES_PER_INPUT = 256
#: Room for a binary request's JSON header (tritonclient's is about 200 bytes per tensor).
BINARY_HEADER_BYTES = 8192
#: The gateway's buffer (HAProxy's tune.bufsize), whatever the models: each request in flight
#: holds one for its request and one for its answer, so a size that followed the largest model's
#: body (3 MB requests made it 3.4 MB) would multiply every connection's cost.
BUFSIZE = 262144
#: Headers beside a whole body in one buffer.
HEADER_ROOM = 16384
#: The largest body checked whole; a larger one (binary tensors only) is checked on its JSON
#: header and streamed to Triton. The committed models' full batches as JSON fit.
BUFFERED_BODY = BUFSIZE - HEADER_ROOM
#: gRPC streams one HTTP/2 connection may have open at once (HAProxy's default: 100). Each holds
#: two buffers, like an HTTP/1 request; a client past it waits for a stream on its side.
H2_STREAMS = 8
#: What a busy connection costs the gateway besides its buffers (connection, session, stream,
#: multiplexer): measured with HAProxy 2.6, tests/functional/test_gateway_memory.py.
CONNECTION_OVERHEAD = 32768
#: Sequences (of models keeping state in the server) the gateway remembers per protocol, each
#: stuck to its replica, and what one entry of such a stick table may cost (a 200-byte key).
SEQUENCE_ENTRIES = 10000
SEQUENCE_ENTRY_BYTES = 320
#: The two stick tables at their fullest, taken from the memory budget before connections.
SEQUENCE_TABLES_BYTES = 2 * SEQUENCE_ENTRIES * SEQUENCE_ENTRY_BYTES
#: Connections of the metrics and health listener (Prometheus, probes): no body, small answers.
METRICS_CONNECTIONS = 64
#: The largest body this stack lets through for one model: Triton's own --http-max-input-size
#: default (64 MB). A model whose full batch needs more is refused with the fix (a smaller
#: max_batch_size): a buffer that size is allocated per request in flight.
MAX_BODY = 64 * 2**20
#: Room in a generate request's body beside the prompt: every allowed key and parameter written
#: out is under 1 kB; the rest is for stop strings.
LLM_PARAMETER_BYTES = 4096


#: What one value of a string input may cost beyond its bytes: as JSON, a byte may be written
#: as a 6-character escape (\u0001), plus the quotes and a separator; as a binary tensor, each
#: value is prefixed with its 4-byte length.
JSON_STRING_COST = (6, 4)
BINARY_STRING_PREFIX = 4


@dataclass(frozen=True)
class ModelLimits:
    """One public model's bounds: the values one request may declare, their bytes as JSON and as
    binary tensors, and the largest shape each input with variable dims may declare."""

    model: str
    max_values: int
    max_bytes: int
    inputs: int
    #: JSON bytes of the values beyond JSON_BYTES_PER_VALUE each (string inputs' text)
    json_extra: int = 0
    #: input name -> its largest request shape (the batch first when the model batches)
    max_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    #: whether an input holds strings (the gateway's tensor check reads them with care)
    strings: bool = False
    #: dims a request's inputs must agree in: per dim name the graph gives several inputs'
    #: dims, each (input, axis of its request shape)
    shared: tuple[tuple[tuple[str, int], ...], ...] = ()

    @property
    def json_body(self) -> int:
        """The largest JSON body: a full batch written out, at most MAX_BODY (a request past
        that can only travel as binary tensors, which Triton takes up to MAX_BODY too)."""
        envelope = ENVELOPE_BYTES + ENVELOPE_BYTES_PER_INPUT * self.inputs
        return min(self.max_values * JSON_BYTES_PER_VALUE + self.json_extra + envelope, MAX_BODY)

    @property
    def gateway_json_body(self) -> int:
        """The largest JSON body the gateway takes: one its buffer holds whole (its checks read
        every value of a JSON body); a larger batch travels as binary tensors."""
        return min(self.json_body, BUFFERED_BODY)

    @property
    def binary_body(self) -> int:
        return self.max_bytes + BINARY_HEADER_BYTES

    @property
    def grpc_body(self) -> int:
        """The largest gRPC message (ModelInferRequest): raw tensor bytes (tritonclient's
        raw_input_contents) take what binary tensors take, typed contents (a protobuf number or
        string per value) at most what JSON takes."""
        return max(self.json_body, self.binary_body)

    def map_line(self) -> str:
        """`<model> <values>:<JSON bytes>:<binary bytes>:<shapes>:<kinds>:<gRPC bytes>:<shared>`:
        HAProxy's map entry. Shapes: `;`-separated `<name, hex>=<AxB...>` of the inputs with
        variable dims (names in hex, so any name can sit in the line), empty when there are
        none; kinds: `s` when an input holds strings; shared: `;`-separated groups of
        `,`-separated `<name, hex>.<axis>` (1-based, as Lua counts) that must be equal."""
        shapes = ";".join(
            f"{_hex(name)}={'x'.join(str(d) for d in dims)}" for name, dims in self.max_shapes
        )
        kinds = "s" if self.strings else ""
        shared = ";".join(
            ",".join(f"{_hex(name)}.{axis + 1}" for name, axis in group) for group in self.shared
        )
        return (
            f"{self.model} {self.max_values}:{self.gateway_json_body}:{self.binary_body}:"
            f"{shapes}:{kinds}:{self.grpc_body}:{shared}"
        )


def _hex(name: str) -> str:
    return name.encode().hex().upper()


def model_limits(model: Model) -> ModelLimits:
    """A public model's bounds from its config.pbtxt; a UserError says why a model cannot be
    public (the gateway must bound every request: fixed dims, or bounds for variable ones)."""
    from tritonstack.core.signature import Signature

    config = model.config
    where = f"{model.directory}/config.pbtxt"
    if not config.input:
        raise UserError(
            f"{where}: declares no inputs; a public model declares them (the gateway bounds its "
            "requests from their dims; `tritonstack add-model` writes them from the ONNX graph)"
        )
    signature = Signature.from_model(model)
    rows = config.max_batch_size if config.max_batch_size > 0 else 1
    values = size = extra = 0
    shapes = []
    for tensor, io in zip(signature.inputs, config.input, strict=True):
        datatype = model_config_type(io.data_type)
        dims = list(tensor.dims)
        if any(d < 1 for d in dims):
            if tensor.bounds is None:
                raise UserError(
                    f"{where}: input {tensor.name} has dims {dims} and no bounds for the "
                    f"variable ones (the {BOUNDS_PARAMETER} parameter): the gateway must bound "
                    "every request; `tritonstack add-model --shape NAME=MIN:OPT:MAX` writes them"
                )
            dims = list(tensor.bounds[2])
            shapes.append(
                (tensor.name, tuple([rows, *dims] if config.max_batch_size > 0 else dims))
            )
        count = rows * math.prod(dims)
        values += count
        if datatype == "TYPE_STRING":
            if tensor.max_bytes is None:
                raise UserError(
                    f"{where}: input {tensor.name} holds strings and no bound of their size "
                    f"(max_bytes in the {BOUNDS_PARAMETER} parameter): the gateway must bound "
                    "every request; `tritonstack add-model --max-string-bytes N` writes it"
                )
            per_byte, framing = JSON_STRING_COST
            extra += count * (per_byte * tensor.max_bytes + framing)
            size += count * (BINARY_STRING_PREFIX + tensor.max_bytes)
        else:
            try:
                size += count * value_bytes(datatype)
            except UserError:
                raise UserError(
                    f"{where}: input {tensor.name} is {datatype}, which Triton does not serve"
                ) from None
    skip = int(config.max_batch_size > 0)
    shared = tuple(
        tuple((name, axis + skip) for name, axis in group)
        for group in signature.shared_dims.values()
    )
    found = ModelLimits(
        model.name, values, size, len(config.input), extra, tuple(shapes), extra > 0, shared
    )
    if found.binary_body > MAX_BODY:
        raise UserError(
            f"{where}: a full batch of {rows} rows at the inputs' largest shapes is "
            f"{found.binary_body:,} bytes even as binary tensors, over the {MAX_BODY:,} bytes a "
            "request may have (Triton's --http-max-input-size): lower max_batch_size or the "
            "inputs' max bounds (--shape)"
        )
    return found


def model_config_type(value: int) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(value)


@dataclass(frozen=True)
class Limits:
    """What the gateway lets through: the public models' bounds, and the LLM's."""

    models: tuple[ModelLimits, ...]
    settings: Settings
    llm_model: str = LLM_MODEL

    @property
    def public_models(self) -> tuple[str, ...]:
        return tuple(m.model for m in self.models)

    @property
    def max_binary_body(self) -> int:
        """The largest binary (or gRPC) body any public model takes."""
        return max(m.binary_body for m in self.models)

    @property
    def llm_max_body(self) -> int:
        return self.settings.GATEWAY_LLM_MAX_PROMPT + LLM_PARAMETER_BYTES

    @property
    def bufsize(self) -> int:
        """BUFSIZE; a generate request is checked whole, so a longer prompt limit raises it."""
        return max(BUFSIZE, self.llm_max_body + HEADER_ROOM)

    @property
    def http_connections(self) -> int:
        """HTTP/1 connections the gateway accepts: half the memory budget, each connection
        busy with two buffers."""
        return self._connections(2 * self.bufsize + CONNECTION_OVERHEAD)

    @property
    def grpc_connections(self) -> int:
        """gRPC (HTTP/2) connections: the other half, each with H2_STREAMS streams of two
        buffers and the multiplexer's own two."""
        return self._connections((2 * H2_STREAMS + 2) * self.bufsize + CONNECTION_OVERHEAD)

    def _connections(self, worst_each: int) -> int:
        half = (self.settings.GATEWAY_MEMORY_MB * 2**20 - SEQUENCE_TABLES_BYTES) // 2
        found = half // worst_each
        if found < 1:
            raise UserError(
                f"stack.env: GATEWAY_MEMORY_MB={self.settings.GATEWAY_MEMORY_MB} leaves no "
                f"connection at {worst_each:,} bytes each at worst: raise it"
            )
        return found

    @property
    def worst_case_bytes(self) -> int:
        """The buffers and connections of every connection the gateway accepts, all busy, and
        the sequences' stick tables full."""
        http = self.http_connections * (2 * self.bufsize + CONNECTION_OVERHEAD)
        grpc = self.grpc_connections * ((2 * H2_STREAMS + 2) * self.bufsize + CONNECTION_OVERHEAD)
        return http + grpc + SEQUENCE_TABLES_BYTES

    def models_map(self) -> str:
        """gateway/models.map's lines: one per public model."""
        return "".join(f"{m.map_line()}\n" for m in self.models)

    def environment(self) -> dict[str, str]:
        """The values HAProxy reads that follow from the repository and stack.env (the rest of
        stack.env it reads as it is)."""
        return {
            "GATEWAY_BUFSIZE": str(self.bufsize),
            "GATEWAY_BUFFERED_BODY": str(self.bufsize - HEADER_ROOM),
            "GATEWAY_HTTP_CONNECTIONS": str(self.http_connections),
            "GATEWAY_GRPC_CONNECTIONS": str(self.grpc_connections),
            "GATEWAY_H2_STREAMS": str(H2_STREAMS),
            "GATEWAY_SEQUENCE_ENTRIES": str(SEQUENCE_ENTRIES),
            "GATEWAY_MAX_CONNECTIONS": str(
                self.http_connections + self.grpc_connections + METRICS_CONNECTIONS
            ),
            "GATEWAY_LLM_MODEL": self.llm_model,
            "GATEWAY_LLM_MAX_BODY": str(self.llm_max_body),
            "GATEWAY_LLM_TOKENS_PATTERN": number_range_pattern(
                self.settings.GATEWAY_LLM_MAX_TOKENS
            ),
        }


def limits(repository: Path | None = None, settings: Settings | None = None) -> Limits:
    """The gateway's limits for `repository` (default: the project's) and stack.env."""
    from tritonstack import DEFAULT_MODEL_REPOSITORY

    repository = DEFAULT_MODEL_REPOSITORY if repository is None else Path(repository)
    settings = load() if settings is None else settings
    models = {m.name: m for m in iter_models(repository)}
    missing = [name for name in settings.public_models if name not in models]
    if missing:
        raise UserError(
            f"stack.env's PUBLIC_MODELS names {missing[0]}, which {repository} does not hold: "
            f"remove it, or add the model (it holds {', '.join(sorted(models))})"
        )
    return Limits(tuple(model_limits(models[name]) for name in settings.public_models), settings)


def number_range_pattern(highest: int) -> str:
    """A regex alternation matching the decimal integers 1..highest, written without leading
    zeros, longest alternatives first: 64 -> "64|[1-5][0-9]|6[0-3]|[1-9]"."""
    if highest < 1:
        raise ValueError(f"no integers from 1 to {highest}")
    digits = str(highest)
    parts = []
    # Numbers as long as `highest`: its prefix, then a smaller digit, then any digits.
    for i, digit in enumerate(digits):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            smaller = f"[{low}-{int(digit) - 1}]" if int(digit) - 1 > low else str(low)
            parts.append(digits[:i] + smaller + "[0-9]" * (len(digits) - i - 1))
    parts.insert(0, digits)
    # Every shorter length in full.
    for length in range(len(digits) - 1, 0, -1):
        parts.append("[1-9]" + "[0-9]" * (length - 1))
    return "|".join(parts)
