"""What the gateway lets through, derived from the model repository and stack.env.

Per public model, from its config.pbtxt: the most tensor values one request may declare
(max_batch_size rows of every input together), and from that the largest body it can take as
JSON and as binary tensors. HAProxy reads them from a map file (`models.map`, one line per
public model), so the gateway routes and bounds any model the repository serves without naming
one; what a model's tensors are called, their shapes and datatypes stay Triton's to check (it
answers a wrong one with a 400 of its own).

Stack-wide: the request buffer (it must hold the largest body any model or the LLM takes, for the
body checks to see it whole) and the LLM's limits, from stack.env.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tritonstack.contract import LLM_MODEL
from tritonstack.errors import UserError
from tritonstack.repository import Model, iter_models
from tritonstack.settings import Settings, load

#: Longest JSON rendering of one value plus its separator ("-1.2345678901234567e-05, "; an
#: INT64 or a boolean is shorter): what one tensor value of a JSON request can cost in bytes.
JSON_BYTES_PER_VALUE = 26
#: Room for a JSON request's envelope (keys, names, parameters, requested outputs), plus a little
#: per input for its name, datatype and shape.
ENVELOPE_BYTES = 4096
ENVELOPE_BYTES_PER_INPUT = 256
#: Room for a binary request's JSON header (tritonclient's is about 200 bytes per tensor).
BINARY_HEADER_BYTES = 8192
#: HAProxy's default request buffer; raised only when a body cap needs more.
MIN_BUFSIZE = 262144
#: Headers beside a whole body in one buffer.
HEADER_ROOM = 16384
#: The largest body this stack lets through for one model: Triton's own --http-max-input-size
#: default (64 MB). A model whose full batch needs more is refused with the fix (a smaller
#: max_batch_size): a buffer that size is allocated per request in flight.
MAX_BODY = 64 * 2**20
#: Room in a generate request's body beside the prompt: every allowed key and parameter written
#: out is under 1 kB; the rest is for stop strings.
LLM_PARAMETER_BYTES = 4096
#: Bytes per value of each numeric Triton datatype (TYPE_STRING has no fixed size).
VALUE_BYTES = {
    "TYPE_BOOL": 1,
    "TYPE_UINT8": 1,
    "TYPE_INT8": 1,
    "TYPE_UINT16": 2,
    "TYPE_INT16": 2,
    "TYPE_FP16": 2,
    "TYPE_BF16": 2,
    "TYPE_UINT32": 4,
    "TYPE_INT32": 4,
    "TYPE_FP32": 4,
    "TYPE_UINT64": 8,
    "TYPE_INT64": 8,
    "TYPE_FP64": 8,
}


@dataclass(frozen=True)
class ModelLimits:
    """One public model's bounds: the values one request may declare, and their bytes."""

    model: str
    max_values: int
    max_bytes: int
    inputs: int

    @property
    def json_body(self) -> int:
        envelope = ENVELOPE_BYTES + ENVELOPE_BYTES_PER_INPUT * self.inputs
        return self.max_values * JSON_BYTES_PER_VALUE + envelope

    @property
    def binary_body(self) -> int:
        return self.max_bytes + BINARY_HEADER_BYTES

    def map_line(self) -> str:
        """`<model> <values>:<JSON body bytes>:<binary body bytes>`: HAProxy's map entry."""
        return f"{self.model} {self.max_values}:{self.json_body}:{self.binary_body}"


def model_limits(model: Model) -> ModelLimits:
    """A public model's bounds from its config.pbtxt; a UserError says why a model cannot be
    public (the gateway must bound every request from the model's fixed dims)."""
    config = model.config
    where = f"{model.directory}/config.pbtxt"
    if not config.input:
        raise UserError(
            f"{where}: declares no inputs; a public model declares them (the gateway bounds its "
            "requests from their dims; `tritonstack add-model` writes them from the ONNX graph)"
        )
    rows = config.max_batch_size if config.max_batch_size > 0 else 1
    values = size = 0
    for tensor in config.input:
        datatype = model_config_type(tensor.data_type)
        if datatype not in VALUE_BYTES:
            raise UserError(
                f"{where}: input {tensor.name} is {datatype}: a public model takes numeric or "
                "boolean tensors, whose size the gateway can bound from their dims; serve string "
                "inputs behind a model of this repository that is public"
            )
        if any(d < 1 for d in tensor.dims):
            raise UserError(
                f"{where}: input {tensor.name} has dims {list(tensor.dims)}: a public model's "
                "dims are fixed (besides the batch dimension), so the gateway can bound each "
                "request; give every dim its size"
            )
        count = rows * math.prod(tensor.dims)
        values += count
        size += count * VALUE_BYTES[datatype]
    found = ModelLimits(model.name, values, size, len(config.input))
    if found.json_body > MAX_BODY:
        raise UserError(
            f"{where}: a full batch of {rows} rows is {found.json_body:,} bytes as JSON, over "
            f"the {MAX_BODY:,} bytes a request may have (Triton's --http-max-input-size): "
            "lower max_batch_size"
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
    def max_body(self) -> int:
        """The largest JSON body any public model takes."""
        return max(m.json_body for m in self.models)

    @property
    def max_binary_body(self) -> int:
        """The largest binary (or gRPC) body any public model takes."""
        return max(m.binary_body for m in self.models)

    @property
    def llm_max_body(self) -> int:
        return self.settings.GATEWAY_LLM_MAX_PROMPT + LLM_PARAMETER_BYTES

    @property
    def bufsize(self) -> int:
        # A whole body plus headers must fit one buffer for the body checks to see it.
        largest = max(self.max_body, self.max_binary_body, self.llm_max_body)
        return max(MIN_BUFSIZE, largest + HEADER_ROOM)

    def models_map(self) -> str:
        """gateway/models.map's lines: one per public model."""
        return "".join(f"{m.map_line()}\n" for m in self.models)

    def environment(self) -> dict[str, str]:
        """The values HAProxy reads that follow from the repository and stack.env (the rest of
        stack.env it reads as it is)."""
        return {
            "GATEWAY_MAX_BODY": str(self.max_body),
            "GATEWAY_BUFSIZE": str(self.bufsize),
            "GATEWAY_LLM_MODEL": self.llm_model,
            "GATEWAY_LLM_GRPC_NAME": grpc_name_prefix(self.llm_model),
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


def grpc_name_prefix(model: str) -> str:
    """How a gRPC ModelReady/ModelMetadata/ModelConfig request for `model` starts after gRPC's
    5-byte message prefix, in hex: protobuf field 1 (tag 0x0A), its length, the name."""
    name = model.encode()
    if len(name) > 127:  # one length byte holds up to 127 (a varint)
        raise ValueError(f"model name longer than 127 bytes: {model}")
    return (bytes([0x0A, len(name)]) + name).hex().upper()


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
