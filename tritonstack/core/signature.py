"""A model's tensors as the server describes them, and requests and answers made from that.

Every client of the stack (`tritonstack infer`, Locust's users, the supervisor, the bench) asks
the server for the model's metadata (`GET /v2/models/<model>`: inputs and outputs with their
datatypes and shapes) and configuration (`/config`: max_batch_size, which outputs have labels)
rather than restating them, so any model the repository serves is called the same way:

    signature = fetch("127.0.0.1:8000", "pipeline")
    arrays = signature.random_inputs(rows=4, rng=np.random.default_rng(0))
    ... send them ...
    signature.check_answer(outputs, rows=4)

Imports only numpy and the standard library (plus tritonclient.utils for datatypes): the Locust
image runs this module as it is.
"""

from __future__ import annotations

import json
import math
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tritonstack.core import health
from tritonstack.core.errors import UserError

#: Random inputs when none are given: floats uniform in [-1, 1], integers 0-9 (integer inputs
#: are usually indices into a vocabulary or a table, so small non-negative values are valid),
#: strings of a few lowercase letters.
FLOAT_RANGE = (-1.0, 1.0)
INTEGER_RANGE = (0, 9)
WORD_LENGTHS = (3, 8)
#: Datatypes that JSON cannot carry: Triton answers "use the binary data format" (its HTTP
#: frontend, http_server.cc); every client sends and asks for them as binary tensors.
BINARY_ONLY = frozenset(health.BINARY_ONLY)
#: The config parameters in which tritonstack add-model writes what Triton has no field for
#: (tritonstack.check.onnx_serving says what): each input's bounds, and the state the
#: client carries.
BOUNDS_PARAMETER = health.BOUNDS_PARAMETER
STATE_PARAMETER = "tritonstack.client_state"


def numpy_type(datatype: str):
    """The numpy type of a KServe datatype's values, as tritonclient reads and writes them
    (BYTES: object, BF16: ml_dtypes.bfloat16)."""
    from tritonclient.utils import triton_to_np_dtype

    found = triton_to_np_dtype(datatype)
    if found is None:
        raise UserError(f"datatype {datatype} is not supported")
    return found


def value_bytes(config_type: str) -> int | None:
    """Bytes one value of a config's datatype (`TYPE_FP32`) takes as a binary tensor; None for
    strings, whose size is their own."""
    if config_type == "TYPE_STRING":
        return None
    return np.dtype(numpy_type(config_type.removeprefix("TYPE_"))).itemsize


def random_values(datatype: str, shape, rng: np.random.Generator) -> np.ndarray:
    """Made-up values of one tensor: FLOAT_RANGE, INTEGER_RANGE, booleans, short words."""
    kind = np.dtype(numpy_type(datatype)).kind
    if datatype == "BYTES":
        count = int(np.prod(shape, dtype=np.int64))
        lengths = rng.integers(WORD_LENGTHS[0], WORD_LENGTHS[1] + 1, size=count)
        letters = rng.integers(ord("a"), ord("z") + 1, size=int(lengths.sum()), dtype=np.uint8)
        words, start = [], 0
        for length in lengths:
            words.append(letters[start : start + length].tobytes())
            start += length
        return np.array(words, dtype=np.object_).reshape(shape)
    if kind == "f" or datatype == "BF16":
        values = rng.uniform(*FLOAT_RANGE, size=shape)
    elif kind in "iu":
        values = rng.integers(INTEGER_RANGE[0], INTEGER_RANGE[1] + 1, size=shape)
    elif kind == "b":
        values = rng.integers(0, 2, size=shape).astype(bool)
    else:
        raise UserError(f"no made-up values for datatype {datatype}: pass --input")
    return np.ascontiguousarray(np.asarray(values).astype(numpy_type(datatype)))


class AnswerError(Exception):
    """The server answered, but not with what the model's metadata promises."""


@dataclass(frozen=True)
class Tensor:
    """One input or output: its name, KServe datatype and dims without the batch dimension
    (-1: any size); `labelled` for an output with a labels file (classification extension);
    for an input with variable dims, their bounds (min, opt, max dims), and for a string input
    the bytes one value may hold, where the model's config says them."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    labelled: bool = False
    bounds: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None
    max_bytes: int | None = None
    #: per dim, the graph's name for it where another input's dim (or another of this one's)
    #: has that name too, else None: a request's tensors must agree there
    dim_names: tuple[str | None, ...] | None = None

    @property
    def numpy_type(self):
        try:
            return numpy_type(self.datatype)
        except UserError:
            raise UserError(
                f"tensor {self.name}: datatype {self.datatype} is not supported"
            ) from None

    @property
    def binary_only(self) -> bool:
        return self.datatype in BINARY_ONLY

    @property
    def opt_dims(self) -> tuple[int, ...]:
        """The dims a made-up request sends: the opt bound, else 1 for each variable dim."""
        if self.bounds is not None:
            return self.bounds[1]
        return tuple(d if d > 0 else 1 for d in self.dims)

    @property
    def values_per_row(self) -> int:
        return math.prod(self.opt_dims)


@dataclass(frozen=True)
class Signature:
    """What one model takes and returns. `max_batch_size` 0: no batch dimension (a request is
    one sample and shapes are the dims themselves)."""

    model: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int
    #: (input, the output whose value the client sends back into it on the next call) pairs
    state: tuple[tuple[str, str], ...] = ()
    #: the server keeps state between a sequence's requests: each request carries a sequence
    #: ID (Triton's sequence batcher refuses one without)
    sequence: bool = False

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    @property
    def max_rows(self) -> int:
        """Rows one request may carry: a sequence's requests carry one (Triton's sequence batcher
        batches the sequences' requests together)."""
        return self.max_batch_size if self.batched and not self.sequence else 1

    @property
    def labelled_outputs(self) -> tuple[Tensor, ...]:
        return tuple(o for o in self.outputs if o.labelled)

    @classmethod
    def from_server(cls, metadata: Mapping, config: Mapping) -> Signature:
        """From Triton's JSON answers to GET /v2/models/<m> and /v2/models/<m>/config."""
        max_batch_size = int(config.get("max_batch_size", 0) or 0)
        labelled = {o["name"] for o in config.get("output", []) if o.get("label_filename")}
        described = parameter_json(config, BOUNDS_PARAMETER)

        def tensors(entries, with_labels: bool) -> tuple[Tensor, ...]:
            found = []
            for entry in entries:
                shape = [int(d) for d in entry["shape"]]
                dims = tuple(shape[1:] if max_batch_size > 0 else shape)
                name = entry["name"]
                facts = described.get(name, {}) if not with_labels else {}
                bounds = None
                if "min" in facts:
                    bounds = tuple(tuple(int(d) for d in facts[w]) for w in ("min", "opt", "max"))
                found.append(
                    Tensor(
                        name,
                        entry["datatype"],
                        dims,
                        with_labels and name in labelled,
                        bounds,
                        facts.get("max_bytes"),
                        tuple(facts["names"]) if "names" in facts else None,
                    )
                )
            return tuple(found)

        return cls(
            model=metadata["name"],
            inputs=tensors(metadata.get("inputs", []), False),
            outputs=tensors(metadata.get("outputs", []), True),
            max_batch_size=max_batch_size,
            state=tuple(parameter_json(config, STATE_PARAMETER).items()),
            sequence="sequence_batching" in config,
        )

    @classmethod
    def from_model(cls, model) -> Signature:
        """From a repository's config.pbtxt (a tritonstack.core.repository.Model), as a server
        serving it describes the model."""
        return cls.from_server(*model.description())

    @property
    def shared_dims(self) -> dict[str, tuple[tuple[str, int], ...]]:
        """Each dim name inputs share: (input, axis of its config dims) of every dim so named."""
        found: dict[str, list[tuple[str, int]]] = {}
        for tensor in self.inputs:
            for axis, label in enumerate(tensor.dim_names or ()):
                if label is not None:
                    found.setdefault(label, []).append((tensor.name, axis))
        return {label: tuple(where) for label, where in found.items() if len(where) > 1}

    def check_rows(self, rows: int) -> None:
        if not 1 <= rows <= self.max_rows:
            allowed = (
                f"1 to {self.max_rows} (max_batch_size)" if self.batched else "1 (no batching)"
            )
            raise UserError(f"{self.model} takes {allowed} rows per request, not {rows}")

    @property
    def binary_only(self) -> bool:
        """Whether a tensor of the model cannot travel as JSON (FP16, BF16)."""
        return any(t.binary_only for t in (*self.inputs, *self.outputs))

    def shape(self, tensor: Tensor, rows: int) -> list[int]:
        """The request shape of `tensor` for `rows` rows (variable dims at their opt bound)."""
        dims = list(tensor.opt_dims)
        return [rows, *dims] if self.batched else dims

    def random_inputs(self, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """`rows` rows of each input at its opt shape, made up (random_values)."""
        self.check_rows(rows)
        return {
            tensor.name: random_values(tensor.datatype, self.shape(tensor, rows), rng)
            for tensor in self.inputs
        }

    def next_state(
        self, arrays: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """The inputs of the next call of a model whose client carries state: `arrays` with each
        state input replaced by the output the previous answer returned for it."""
        following = dict(arrays)
        for name, output in self.state:
            if output in outputs and outputs[output] is not None:
                tensor = next(t for t in self.inputs if t.name == name)
                following[name] = np.ascontiguousarray(outputs[output], dtype=tensor.numpy_type)
        return following

    def inputs_from_arrays(self, arrays: Mapping[str, np.ndarray], source: str) -> dict:
        """Given arrays by input name (one row set for every input), checked against the model
        and cast to its datatypes; a sample without the batch dimension becomes one row."""
        names = [t.name for t in self.inputs]
        missing = [n for n in names if n not in arrays]
        extra = sorted(set(arrays) - set(names))
        if missing or extra:
            raise UserError(
                f"{source}: {self.model} takes inputs {names}; "
                + (f"missing {missing}" if missing else f"not inputs of it: {extra}")
            )
        checked, rows = {}, set()
        for tensor in self.inputs:
            array = np.asarray(arrays[tensor.name])
            dims = list(tensor.dims)
            if self.batched and array.ndim == len(dims):
                array = array[np.newaxis]
            got = list(array.shape[1:] if self.batched else array.shape)
            low, high = (tensor.bounds[0], tensor.bounds[2]) if tensor.bounds else (dims, dims)
            if len(got) != len(dims) or any(
                (d > 0 and d != g) or (d < 0 and not lo <= g <= (hi if hi > 0 else g))
                for d, g, lo, hi in zip(dims, got, low, high, strict=True)
            ):
                wanted = ["rows", *dims] if self.batched else dims
                within = ""
                if tensor.bounds:
                    within = f", each variable dim from {list(low)} to {list(high)}"
                raise UserError(
                    f"{source}: input {tensor.name} has shape {list(array.shape)}; "
                    f"{self.model} takes {wanted} (-1: variable{within})"
                )
            if tensor.max_bytes is not None and array.dtype.kind in "OSU":
                longest = max((len(_as_bytes(v)) for v in array.reshape(-1)), default=0)
                if longest > tensor.max_bytes:
                    raise UserError(
                        f"{source}: input {tensor.name} holds a value of {longest} bytes; "
                        f"{self.model} takes at most {tensor.max_bytes} per value"
                    )
            want = np.dtype(tensor.numpy_type)
            if want.kind == "O":
                array = np.array([_as_bytes(v) for v in array.reshape(-1)],
                                 dtype=np.object_).reshape(array.shape)  # fmt: skip
            elif array.dtype != want and not np.can_cast(array.dtype, want, casting="same_kind"):
                raise UserError(
                    f"{source}: input {tensor.name} holds {array.dtype} values; {self.model} takes "
                    f"{tensor.datatype}: convert the array (numpy .astype)"
                )
            checked[tensor.name] = np.ascontiguousarray(array, dtype=want)
            if self.batched:
                rows.add(array.shape[0])
        if len(rows) > 1:
            raise UserError(f"{source}: the inputs hold different numbers of rows: {sorted(rows)}")
        skip = int(self.batched)
        for label, where in self.shared_dims.items():
            sizes = {name: checked[name].shape[axis + skip] for name, axis in where}
            if len(set(sizes.values())) > 1:
                said = ", ".join(f"{name} {size}" for name, size in sizes.items())
                raise UserError(
                    f"{source}: the inputs' dim '{label}' differs ({said}); {self.model} "
                    "takes them equal (the graph names them alike)"
                )
        if rows:
            self.check_rows(rows.pop())
        return checked

    def check_answer(
        self, outputs: Mapping[str, np.ndarray | None], rows: int, classified: int = 0
    ) -> None:
        """Raise AnswerError unless `outputs` holds every output of the model, each of its shape
        and datatype for `rows` rows, numbers finite. Labelled outputs requested through the
        classification extension (`classified` classes each) are strings "score:index:label"."""
        for tensor in self.outputs:
            value = outputs.get(tensor.name)
            if value is None:
                raise AnswerError(f"output {tensor.name} missing from the answer")
            if classified and tensor.labelled:
                check_classification(tensor, value, rows if self.batched else None, classified)
                continue
            shape = list(value.shape[1:] if self.batched else value.shape)
            dims = list(tensor.dims)
            if (
                (self.batched and value.shape[:1] != (rows,))
                or len(shape) != len(dims)
                or any(d > 0 and d != s for d, s in zip(dims, shape, strict=False))
            ):
                wanted = [rows, *dims] if self.batched else dims
                raise AnswerError(
                    f"output {tensor.name} has shape {list(value.shape)}, expected {wanted}"
                )
            if tensor.datatype == "BYTES":
                continue
            want = np.dtype(tensor.numpy_type)
            if value.dtype != want:
                raise AnswerError(f"output {tensor.name} is {value.dtype}, expected {want}")
            if want.kind == "f" and not np.all(np.isfinite(value)):
                raise AnswerError(f"output {tensor.name} holds values that are not finite")


def _as_bytes(value) -> bytes:
    """A string tensor's value as Triton carries it: plain bytes (str is sent as UTF-8).
    numpy's bytes_ (an "S" array's item) is a bytes subclass that tritonclient serializes as
    its repr (b'...'), so it becomes plain bytes here."""
    if isinstance(value, bytes):
        return bytes(value)
    return str(value).encode()


def parameter_json(config: Mapping, key: str) -> dict:
    """A config parameter's string value read as JSON (empty when absent)."""
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return json.loads(value) if value else {}


def check_classification(tensor: Tensor, value: np.ndarray, rows: int | None, classes: int) -> None:
    """A classification answer: per row, `classes` strings "score:index:label" with an index
    inside the output's last dimension and a label (the output has a labels file)."""
    expected = (rows, classes) if rows is not None else (classes,)
    if value.shape != expected:
        raise AnswerError(
            f"output {tensor.name} (classification) has shape {list(value.shape)}, "
            f"expected {list(expected)}"
        )
    for item in value.reshape(-1):
        text = item.decode() if isinstance(item, bytes) else str(item)
        score, _, rest = text.partition(":")
        index, _, label = rest.partition(":")
        try:
            valid = math.isfinite(float(score)) and 0 <= int(index) < tensor.dims[-1]
        except ValueError:
            valid = False
        if not valid or not label:
            raise AnswerError(
                f"output {tensor.name} (classification): {text!r} is not score:index:label"
            )


def parse_classification(value: np.ndarray) -> list[tuple[str, float]]:
    """(label, score) of each row's first class in a classification answer."""
    rows = value.reshape(value.shape[0], -1) if value.ndim > 1 else value.reshape(1, -1)
    found = []
    for row in rows:
        text = row[0].decode() if isinstance(row[0], bytes) else str(row[0])
        score, _, rest = text.partition(":")
        found.append((rest.partition(":")[2], float(score)))
    return found


def read_json(url: str, headers: Mapping[str, str], timeout: float, context=None) -> dict:
    request = urllib.request.Request(url, headers=dict(headers))
    with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
        return json.load(answer)


def fetch(
    url: str,
    model: str,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    scheme: str = "http",
) -> Signature:
    """Ask the server at `url` (host:port of Triton or the gateway) for `model`'s signature."""
    base = f"{scheme}://{url}/v2/models/{model}"
    # A gateway with a self-signed certificate is as valid a target as the load test's.
    context = ssl._create_unverified_context() if scheme == "https" else None
    try:
        metadata = read_json(base, headers or {}, timeout, context)
        config = read_json(f"{base}/config", headers or {}, timeout, context)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace").strip()
        if exc.code == 404:
            raise UserError(
                f"{url} serves no model {model!r} ({detail}); name a model of the repository "
                "that is public (stack.env's PUBLIC_MODELS) when going through the gateway"
            ) from None
        raise UserError(
            f"{url} answered HTTP {exc.code} for {model}'s metadata: {detail}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UserError(
            f"cannot reach Triton at {url} ({reason}) for {model}'s metadata; start it with "
            "`tritonstack serve` or `docker compose up`"
        ) from None
    return Signature.from_server(metadata, config)


def load_arrays(path: Path, signature: Signature) -> dict[str, np.ndarray]:
    """`--input FILE`: a .npy array (a model with one input) or an .npz of one array per input."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.ndarray):
            with loaded:  # an .npz reads each array when asked: read them all here
                loaded = {name: loaded[name] for name in loaded.files}
    except (OSError, ValueError, EOFError) as exc:
        hint = ""
        if "allow_pickle" in str(exc):  # numpy's object arrays, often strings, need pickle
            hint = (
                ": it holds Python objects, which --input never unpickles; save strings as a "
                "numpy string array (array.astype(str) or .astype(bytes))"
            )
        raise UserError(f"{path}: cannot read a .npy or .npz file ({exc}){hint}") from None
    if isinstance(loaded, np.ndarray):
        if len(signature.inputs) != 1:
            names = [t.name for t in signature.inputs]
            raise UserError(
                f"{path}: one array, but {signature.model} takes {len(names)} inputs {names}: "
                "save them with numpy.savez(file, **{name: array})"
            )
        return signature.inputs_from_arrays({signature.inputs[0].name: loaded}, str(path))
    return signature.inputs_from_arrays(loaded, str(path))


def sample_rows(arrays: Mapping[str, np.ndarray], rows: int, rng: np.random.Generator) -> dict:
    """`rows` rows drawn at random (with replacement) from batched input arrays."""
    count = next(iter(arrays.values())).shape[0]
    picked = rng.integers(0, count, size=rows)
    return {name: np.ascontiguousarray(array[picked]) for name, array in arrays.items()}
