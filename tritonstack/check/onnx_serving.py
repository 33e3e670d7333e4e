"""How an ONNX model of one's own is served: what `tritonstack add-model` learns from the graph
and from running it once, before it writes a config.

The graph says what each tensor is; running it with onnxruntime says what it really does, which
converters do not always declare (KServe's and Seldon's runtimes, and ONNX Runtime's own tests,
do the same). From both:

- **Batching**, by Triton's rule (`onnxruntime_rules.supports_batching`: every input and output
  has a dynamic first dim), and only when the first axis really is a batch: two rows run together
  must give what each gives alone. Otherwise the model is served with `max_batch_size: 0` and its
  full shapes (a fixed-shape PyTorch export, a scalar input beside a batched one, state whose
  batch sits on another axis).
- **Outputs as they are**: an output declared with a fixed size where it follows the batch (a
  LightGBM classifier's `label` declared `[1]`) or with no shape is written into the served
  graph with the dims the runs showed; weights are never touched.
- **Bounds** for every variable dim besides the batch: from `--shape NAME=MIN:OPT:MAX` (full
  shapes as the graph has them, the batch first when it batches), else DEFAULT_DIM_BOUNDS. They
  drive the gateway's caps, the TensorRT profiles, and the shape every client sends when it
  makes up an input (the opt shape); the model must run at min and opt.
- **Strings**: each string input's size per value is bounded (`--max-string-bytes`), so the
  gateway can bound a request.
- **State** the client carries: an output fed back as an input on the next call (`--state
  IN=OUT`, or found by name: `state`/`stateN`, `h0`/`hn`, `past_key_values.*`/`present.*`);
  or, with `--server-state`, the same pairs kept in the server: Triton's sequence batcher with
  implicit state (`sequence_batching { state [...] }`), the state tensors left out of the
  config's inputs and outputs, and clients sending a sequence ID instead.
- **TensorRT**: whether TensorRT could build the graph (no ai.onnx.ml or other custom-domain
  operators, no type TensorRT lacks), so that a plan variant is made only where it can be.

What the config holds that Triton has no field for goes in two parameters, which clients read
from the server's `/config` (tritonstack.core.signature) and Triton's backends ignore:
BOUNDS_PARAMETER (JSON: per input, min/opt/max dims, max_bytes, and the names of dims it shares
with another input) and STATE_PARAMETER (JSON: input -> output).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tritonstack.core import onnxruntime_rules as rules
from tritonstack.core.errors import UserError
from tritonstack.core.signature import BOUNDS_PARAMETER, STATE_PARAMETER, random_values

DEFAULT_MAX_BATCH_SIZE = 64
#: (min, opt, max) of a variable dim that the graph leaves open and no --shape bounds: small
#: enough that a full batch of a few such dims stays a modest request, large enough for short
#: sequences and chunks. Give --shape for images, long texts and audio.
DEFAULT_DIM_BOUNDS = (1, 16, 256)
#: The most bytes one ONNX file can hold: protobuf's limit on a message (2 GiB).
PROTOBUF_LIMIT = 2**31
#: A sequence with no request for this long is ended by Triton and its state forgotten.
SEQUENCE_IDLE_US = 10_000_000
#: Bytes one value of a string input may hold, unless --max-string-bytes says otherwise.
DEFAULT_MAX_STRING_BYTES = 1024
#: Element types TensorRT 10 builds (FP32, FP16, BF16, INT8, INT32, INT64, BOOL, UINT8).
TENSORRT_TYPES = frozenset({1, 10, 16, 3, 6, 7, 9, 2})
BFLOAT16 = 16
#: Converter options that turn scikit-learn's ZipMap (a sequence of maps) into a tensor.
ZIPMAP_FIX = (
    "convert without ZipMap: skl2onnx `convert_sklearn(model, ..., options={id(model): "
    "{'zipmap': False}})`, onnxmltools `convert_lightgbm(model, ..., zipmap=False)`; the "
    "probabilities are then a [batch, classes] tensor"
)


@dataclass(frozen=True)
class Bounds:
    """One input's dims as served (the config's dims: without the batch when it batches): the
    smallest, the usual and the largest a request may send. Fixed dims are equal in all three."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def to_json(self) -> dict:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


@dataclass
class Plan:
    """What add-model writes for one ONNX model."""

    model: object  # onnx.ModelProto, outputs corrected where the runs showed they must be
    graph: rules.Graph
    max_batch_size: int
    #: per input with a variable dim: its bounds
    bounds: dict[str, Bounds]
    #: per string input: the bytes one value may hold
    string_bytes: dict[str, int]
    #: input -> the output the client feeds back into it
    state: dict[str, str]
    #: why there is no TensorRT plan variant, or None when TensorRT can build the graph
    no_tensorrt: str | None
    #: what the runs changed in the served graph, said to the user
    notes: list[str] = field(default_factory=list)
    #: rows of a request at the opt bound (TensorRT's opt batch)
    opt_rows: int = 1
    #: `state` kept in the server (the sequence batcher's implicit state), not by the client
    server_state: bool = False
    #: per input with a dim another input (or another of its axes) names alike: its config
    #: dims' names, None for the rest; a request's tensors must agree in such a dim
    dim_names: dict[str, tuple[str | None, ...]] = field(default_factory=dict)

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def io(self, role: str) -> list[dict]:
        """The config's inputs or outputs (JSON, as Triton reads a config)."""
        entries = []
        hidden = set(self.state if role == "input" else self.state.values())
        for tensor in self.graph.inputs if role == "input" else self.graph.outputs:
            if self.server_state and tensor.name in hidden:
                continue  # Triton's: sequence_batching's state
            dims, reshape = rules.config_dims(tensor, self.batched)
            entry = {"name": tensor.name, "data_type": tensor.triton_type, "dims": dims}
            if reshape is not None:
                entry["reshape"] = {"shape": reshape}
            entries.append(entry)
        return entries

    def parameters(self) -> dict[str, str]:
        """This stack's facts about the model that Triton has no field for, as config
        parameters (string values)."""
        found = {}
        described = {
            name: {**(bounds.to_json() if bounds else {}), **extra, **names}
            for name in sorted({*self.bounds, *self.string_bytes, *self.dim_names})
            for bounds, extra, names in [
                (
                    self.bounds.get(name),
                    {"max_bytes": self.string_bytes[name]} if name in self.string_bytes else {},
                    {"names": list(self.dim_names[name])} if name in self.dim_names else {},
                )
            ]
        }
        if described:
            found[BOUNDS_PARAMETER] = json.dumps(described, separators=(",", ":"))
        if self.state and not self.server_state:
            found[STATE_PARAMETER] = json.dumps(self.state, separators=(",", ":"))
        return found

    def sequence_batching(self) -> dict:
        """The sequence batcher keeping the state in the server: each state's initial value
        zeros, a sequence idle SEQUENCE_IDLE_US forgotten."""
        inputs = {t.name: t for t in self.graph.inputs}
        states = []
        for name, output in self.state.items():
            dims, _ = rules.config_dims(inputs[name], self.batched)
            kind = inputs[name].triton_type
            states.append({
                "input_name": name, "output_name": output, "data_type": kind, "dims": dims,
                "initial_state": [{"name": "zeros", "data_type": kind, "dims": dims,
                                   "zero_data": True}],
            })  # fmt: skip
        return {"max_sequence_idle_microseconds": SEQUENCE_IDLE_US, "state": states}

    def rows(self, which: str) -> int:
        """Rows of a request at the min, opt or max bound (1 without batching)."""
        if not self.batched:
            return 1
        return {"min": 1, "opt": min(self.opt_rows, self.max_batch_size)}.get(
            which, self.max_batch_size
        )

    def full_shape(self, name: str, which: str) -> list[int]:
        """An input's shape as the graph takes it at the min, opt or max bound, the batch first
        when it batches (TensorRT's profiles)."""
        tensor = next(t for t in self.graph.inputs if t.name == name)
        dims, _ = rules.config_dims(tensor, self.batched)
        if name in self.bounds:
            dims = list(getattr(self.bounds[name], which))
        if not tensor.dims:  # rank 0: fed as a scalar
            dims = []
        elif len(dims) == 1 and len(tensor.dims) == 1 and self.batched:
            dims = []  # a [batch] input: dims [1] reshaped away
        return [self.rows(which), *dims] if self.batched else dims


def load(path: Path):
    """The ONNX file, or a UserError saying why it cannot be served."""
    import onnx

    if not path.is_file():
        raise UserError(f"{path}: no such file; give the path of an .onnx model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError and friends: whatever protobuf raises
        raise UserError(f"{path}: not an ONNX file ({type(exc).__name__}); export one with "
                        "torch.onnx.export, skl2onnx or onnxmltools") from None  # fmt: skip
    if not model.graph.output or not model.graph.node:
        raise UserError(f"{path}: not an ONNX model (no graph); export one with torch.onnx.export")
    external = [i.name for i in model.graph.initializer if i.data_location == 1]
    if external:
        # torch.onnx.export(dynamo=True) writes the weights beside the graph (model.onnx.data) by
        # default: read them in, so the repository gets one file, as every other model.
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except Exception as exc:  # a data file missing, or named outside the model's folder
            raise UserError(
                f"{path}: its weights ({external[0]}, ...) are in separate files (ONNX external "
                f"data) that cannot be read ({type(exc).__name__}: {exc}); keep them beside the "
                "model, where the exporter wrote them"
            ) from None
        if model.ByteSize() >= PROTOBUF_LIMIT:
            raise UserError(
                f"{path}: with its external weights the model is "
                f"{model.ByteSize() / 2**30:.1f} GiB, over the 2 GiB one ONNX file holds; "
                "add-model serves models of one file"
            )
    return model


def _refuse_non_tensors(path: Path, model, graph: rules.Graph) -> None:
    for tensor in (*graph.inputs, *graph.outputs):
        if tensor.kind == "tensor":
            continue
        value = next(v for v in (*model.graph.input, *model.graph.output) if v.name == tensor.name)
        zipmap = tensor.kind == "sequence" and value.type.sequence_type.elem_type.HasField(
            "map_type"
        )
        if zipmap:
            raise UserError(
                f"{path}: output {tensor.name} is a sequence of maps (scikit-learn's ZipMap, "
                f"which converters add to classifiers by default), which Triton cannot serve: "
                f"{ZIPMAP_FIX}"
            )
        raise UserError(
            f"{path}: {tensor.name} is a {tensor.kind}, not a tensor: Triton's onnxruntime "
            "backend serves tensors only; export the model with tensor inputs and outputs"
        )
    for tensor in (*graph.inputs, *graph.outputs):
        if tensor.triton_type is None:
            raise UserError(
                f"{path}: {tensor.name} has ONNX element type {tensor.elem_type}, which Triton "
                "has no type for; cast it in the graph to one of bool, (u)int8-64, float16, "
                "bfloat16, float, double or string"
            )


def parse_shapes(options: Sequence[str]) -> dict[str, tuple[tuple[int, ...], ...]]:
    """`--shape NAME=MIN:OPT:MAX` (each AxBxC, as trtexec writes shapes) by input name."""
    found = {}
    for option in options:
        name, equals, spec = option.rpartition("=")
        parts = spec.split(":")
        try:
            if not (equals and name) or len(parts) != 3:
                raise ValueError
            shapes = tuple(tuple(int(d) for d in part.split("x")) if part else () for part in parts)
        except ValueError:
            raise UserError(
                f"--shape {option}: write NAME=MIN:OPT:MAX, each a shape such as 1x3x224x224 "
                "(the input's whole shape, the batch first when the model batches)"
            ) from None
        if name in found:
            raise UserError(f"--shape {name}: given twice; one --shape per input")
        found[name] = shapes
    return found


def parse_state(options: Sequence[str]) -> dict[str, str]:
    """`--state IN=OUT`: the output the client feeds back into the input on the next call."""
    found = {}
    for option in options:
        name, equals, output = option.partition("=")
        if not (equals and name and output):
            raise UserError(f"--state {option}: write INPUT=OUTPUT (e.g. state=stateN)")
        found[name] = output
    return found


#: Words that say an input holds state (the name must have one, or be an RNN's h0/c0).
STATE_WORDS = ("state", "hidden", "cache", "past", "memory")


def _state_names(name: str) -> list[str]:
    """Names of the output that feeds `name` back, for an input whose name says it is state:
    silero's state/stateN, RNNs' h0/hn and c0/cn, Hugging Face's past_key_values.*/present.*,
    state_in/state_out."""
    lowered = name.lower()
    if not (any(w in lowered for w in STATE_WORDS) or re.fullmatch(r"[hc]_?0", lowered)):
        return []
    names = [f"{name}N", f"{name}n", f"{name}_out", f"next_{name}", f"new_{name}"]
    if name.endswith("0"):
        names.append(f"{name[:-1]}n")
    if name.startswith("past_key_values"):
        names.append(name.replace("past_key_values", "present", 1))
    for old, new in (("_in", "_out"), ("in_", "out_"), ("input", "output")):
        if old in name:
            names.append(name.replace(old, new))
    return names


def find_state(graph: rules.Graph) -> dict[str, str]:
    """Input -> output pairs whose names say the output is the input's next value, and whose
    types and ranks agree."""
    outputs = {t.name: t for t in graph.outputs}
    found = {}
    for tensor in graph.inputs:
        for candidate in _state_names(tensor.name):
            other = outputs.get(candidate)
            if (
                other is not None
                and other.elem_type == tensor.elem_type
                and len(other.dims) == len(tensor.dims)
            ):
                found[tensor.name] = candidate
                break
    return found


def random_array(elem_type: int, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Values for one input as the clients make them up (tritonstack.core.signature): floats in
    [-1, 1], integers 0-9, booleans, short words."""
    return random_values(_datatype(elem_type), shape, rng)


def _datatype(elem_type: int) -> str:
    """The KServe datatype of an ONNX element type (TYPE_FP32 -> FP32, STRING -> BYTES)."""
    triton = rules.ONNX_TO_TRITON[elem_type].removeprefix("TYPE_")
    return "BYTES" if triton == "STRING" else triton


class Runner:
    """The model on onnxruntime's CPU provider, fed as Triton's backend feeds it."""

    def __init__(self, model):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        # Fatal only: an error comes back as the exception, said in one line by the caller.
        options.log_severity_level = 4
        self.session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import onnxruntime as ort

        names = [o.name for o in self.session.get_outputs()]
        if any(_is_bfloat16(a) for a in feeds.values()):
            values = {
                name: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    array.view(np.uint16), onnx_element_type=BFLOAT16
                )
                if _is_bfloat16(array)
                else ort.OrtValue.ortvalue_from_numpy(_for_onnxruntime(array))
                for name, array in feeds.items()
            }
            found = self.session.run_with_ort_values(names, values)
            return dict(zip(names, (v.numpy() for v in found), strict=True))
        found = self.session.run(names, {k: _for_onnxruntime(v) for k, v in feeds.items()})
        return dict(zip(names, found, strict=True))


def _is_bfloat16(array: np.ndarray) -> bool:
    return array.dtype.name == "bfloat16"


def _for_onnxruntime(array: np.ndarray) -> np.ndarray:
    """onnxruntime takes strings as str; Triton's bytes are decoded as its backend does."""
    if array.dtype == np.object_:
        return np.array(
            [v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v for v in
             array.reshape(-1)], dtype=np.object_,
        ).reshape(array.shape)  # fmt: skip
    return array


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as a batch and alone: numbers within what another kernel's summation order moves."""
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc":
        scale = max(1.0, float(np.max(np.abs(b))) if b.size else 1.0)
        return bool(np.allclose(a, b, rtol=1e-3, atol=1e-4 * scale, equal_nan=True))
    return bool(np.array_equal(a, b))


def plan(
    path: Path,
    max_batch_size: int | None = None,
    shapes: Mapping[str, tuple] | None = None,
    state: Mapping[str, str] | None = None,
    max_string_bytes: int = DEFAULT_MAX_STRING_BYTES,
    server_state: bool = False,
) -> Plan:
    """Read and run the model at `path`; how add-model serves it, or a UserError saying why it
    cannot be served and how to fix that."""
    import onnx

    shapes = dict(shapes or {})
    model = load(path)
    graph = rules.graph_from_onnx(model)
    _refuse_non_tensors(path, model, graph)
    bfloat16 = [t.name for t in (*graph.inputs, *graph.outputs) if t.elem_type == BFLOAT16]
    if bfloat16:
        raise UserError(
            f"{path}: {bfloat16[0]} is BF16, which the embedded runtime (Triton 2.51) cannot "
            "serve: its Python backend reads no BF16 tensor (the container's 26.08 would); cast "
            "it to FP16 or FP32 in the graph"
        )
    input_names = [t.name for t in graph.inputs]
    unknown = sorted(set(shapes) - set(input_names))
    if unknown:
        raise UserError(f"--shape {unknown[0]}: not an input of {path.name} (its inputs: "
                        f"{', '.join(input_names)})")  # fmt: skip
    if max_batch_size is not None and max_batch_size < 0:
        raise UserError(f"--max-batch-size {max_batch_size}: 0 (no batching) or more")
    if max_string_bytes < 1:
        raise UserError(f"--max-string-bytes {max_string_bytes}: at least 1")
    try:
        runner = Runner(model)
    except Exception as exc:
        hint = ""
        if "Failed to construct locale" in str(exc):
            hint = (
                "; the graph asks for a locale this machine lacks (skl2onnx's text operators "
                "ask for en_US.UTF-8 by default): convert with "
                "options={TfidfVectorizer: {'locale': 'C.UTF-8'}} (or CountVectorizer), a locale "
                "every Linux has, Triton's container included"
            )
        raise UserError(f"{path}: onnxruntime cannot load it: {_one_line(exc)}{hint}") from None
    # What Triton's backend sees: onnxruntime's report, inferred output shapes included.
    graph = rules.graph_from_session(runner.session)

    # Might the first axis be a batch? Every input must have a dynamic first dim; outputs are
    # judged by what the runs return (converters declare some wrongly).
    candidate = max_batch_size != 0 and all(
        t.dims and t.dims[0] == rules.WILDCARD for t in graph.inputs
    )
    names = _dim_names(runner.session)
    bounds = _bounds(path, graph, shapes, candidate, names)
    rng = np.random.default_rng(0)
    opt_rows = 2 if candidate else 1

    def sample(which: str, rows: int) -> dict[str, np.ndarray]:
        feeds = {}
        for tensor in graph.inputs:
            dims = list(getattr(bounds[tensor.name], which)) if tensor.name in bounds else [
                d for d in tensor.dims[1 if candidate else 0 :]]  # fmt: skip
            shape = [rows, *dims] if candidate else dims
            feeds[tensor.name] = random_array(tensor.elem_type, shape, rng)
        return feeds

    def run(feeds, which: str) -> dict[str, np.ndarray]:
        try:
            return runner.run(feeds)
        except Exception as exc:
            described = ", ".join(f"{k} {list(v.shape)} {v.dtype}" for k, v in feeds.items())
            raise UserError(
                f"{path}: onnxruntime fails on inputs at the {which} bounds ({described}): "
                f"{_one_line(exc)}; give each variable dim sizes the model takes with --shape "
                "NAME=MIN:OPT:MAX"
            ) from None

    at_opt = sample("opt", opt_rows)
    out_opt = run(at_opt, "opt")
    at_min = sample("min", 3 if candidate else 1)
    out_min = run(at_min, "min")
    notes = []
    corrected = _correct_outputs(model, graph, out_opt, out_min, opt_rows, candidate, notes)
    graph = rules.graph_from_model(corrected)

    batching = candidate and rules.supports_batching(graph)
    reason = None
    if candidate and not batching:
        fixed = [t for t in graph.outputs if not t.dims or t.dims[0] != rules.WILDCARD]
        reason = f"output {fixed[0].name} has shape {list(fixed[0].dims)}, not a batch first"
    if batching:
        alone = [run({k: v[i : i + 1] for k, v in at_opt.items()}, "opt") for i in range(2)]
        for name, together in out_opt.items():
            if not all(_same(together[i : i + 1], alone[i][name]) for i in range(2)):
                batching = False
                reason = (
                    f"two rows run together give another {name} than each alone: the first axis "
                    "is not a batch of independent rows"
                )
                break
    if max_batch_size is not None and max_batch_size > 0 and not batching:
        first = next((t for t in graph.inputs if not t.dims or t.dims[0] != -1), None)
        why = reason or (
            f"input {first.name} has shape {list(first.dims)}, not a dynamic batch first"
            if first
            else "the model does not batch"
        )
        raise UserError(
            f"--max-batch-size {max_batch_size}: {path.name} cannot batch ({why}); leave the "
            "option out (or 0) to serve it one request at a time with its full shapes"
        )
    if candidate and not batching:
        notes.append(f"served one request at a time (max_batch_size 0): {reason}")
        bounds = _bounds(path, graph, shapes, False, names)
    size = (max_batch_size or DEFAULT_MAX_BATCH_SIZE) if batching else 0
    if batching:
        size, opt_rows = _batch_rows(path, graph, shapes, size, max_batch_size)
    for name in sorted(bounds):
        described = ":".join("x".join(str(d) for d in getattr(bounds[name], w))
                             for w in ("min", "opt", "max"))  # fmt: skip
        source = "--shape" if name in shapes else _bounds_source(name, shapes, names, batching)
        per = "per request row" if batching else "per request"
        notes.append(f"{name}: variable dims bounded {described} {per} ({source})")
    strings = {t.name: max_string_bytes for t in graph.inputs if t.elem_type == 8}
    pairs = _state(path, graph, state)
    if server_state:
        _check_server_state(path, graph, pairs, size > 0)
    for name, output in pairs.items():
        notes.append(
            f"state kept in the server: Triton's sequence batcher feeds {output} back as {name} "
            "within a sequence (clients send a sequence ID)"
            if server_state
            else f"state carried by the client: {output} is sent back as {name}"
        )
    onnx.checker.check_model(corrected)
    return Plan(corrected, graph, size, bounds, strings, pairs, _no_tensorrt(corrected, graph),
                notes, opt_rows, server_state, _shared_names(graph, names, size > 0))  # fmt: skip


def _check_server_state(
    path: Path, graph: rules.Graph, pairs: Mapping[str, str], batching: bool
) -> None:
    """State Triton's sequence batcher can keep: fixed dims (its initial state has a size), a
    number type (the initial state is zeros)."""
    if not pairs:
        raise UserError(
            f"--server-state: {path.name} has no state found by name; name each pair with "
            "--state INPUT=OUTPUT"
        )
    inputs = {t.name: t for t in graph.inputs}
    for name in pairs:
        tensor = inputs[name]
        dims, _ = rules.config_dims(tensor, batching)
        if tensor.elem_type == 8:
            raise UserError(f"--server-state: state {name} is a string tensor; Triton's "
                            "initial state is zeros, which strings have not; let the client "
                            "carry it (leave --server-state out)")  # fmt: skip
        if rules.WILDCARD in dims:
            raise UserError(
                f"--server-state: state {name} has variable dims {list(tensor.dims)}"
                f"{' besides the batch' if batching else ''}; the sequence batcher keeps state "
                "of a fixed size: fix them in the export, or let the client carry it (leave "
                "--server-state out)"
            )


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)[:400]


def _dim_names(session) -> dict[str, tuple[str | None, ...]]:
    """Each input's dims by name (an exporter's `dim_param`, such as `sequence`), None where a
    dim has none: inputs naming the same dim take the same size (input_ids and attention_mask)."""
    return {
        arg.name: tuple(d if isinstance(d, str) and d else None for d in arg.shape or ())
        for arg in session.get_inputs()
    }


def _bounds(
    path: Path,
    graph: rules.Graph,
    shapes: Mapping[str, tuple],
    batching: bool,
    names: Mapping[str, tuple[str | None, ...]],
) -> dict[str, Bounds]:
    """Bounds of each input with a variable dim besides the batch, per request row. A dim the
    graph names takes the bounds --shape gives any input for that name, else the default."""
    found = {}
    skip = int(batching)
    for tensor in graph.inputs:
        given = shapes.get(tensor.name)
        if given is None:
            continue
        dims = tensor.dims[skip:]
        rank = len(tensor.dims)
        if any(len(s) != rank for s in given):
            raise UserError(
                f"--shape {tensor.name}: each shape needs {rank} dims, as the graph's "
                f"{list(tensor.dims)} (-1: variable){' (the batch first)' if batching else ''}"
            )
        per_row = [s[skip:] if batching else s for s in given]
        for axis, dim in enumerate(dims):
            low, usual, high = (s[axis] for s in per_row)
            if not 1 <= low <= usual <= high:
                raise UserError(
                    f"--shape {tensor.name}: dim {axis + skip} must satisfy 1 <= min <= "
                    f"opt <= max, not {low}:{usual}:{high}"
                )
            if dim >= 0 and not low == usual == high == dim:
                raise UserError(
                    f"--shape {tensor.name}: dim {axis + skip} is fixed at {dim} in the "
                    f"graph; give {dim} in all three shapes"
                )
        found[tensor.name] = Bounds(*(tuple(s) for s in per_row))
    named = _named_bounds(found, names, skip)
    for tensor in graph.inputs:
        dims = tensor.dims[skip:]
        if tensor.name in found or rules.WILDCARD not in dims:
            continue
        labels = names.get(tensor.name, ())[skip:]
        per_axis = [
            (d, d, d) if d >= 0
            else named.get(labels[axis] if axis < len(labels) else None, DEFAULT_DIM_BOUNDS)
            for axis, d in enumerate(dims)
        ]  # fmt: skip
        found[tensor.name] = Bounds(*(tuple(b[w] for b in per_axis) for w in range(3)))
    return found


def _shared_names(
    graph: rules.Graph, names: Mapping[str, tuple[str | None, ...]], batching: bool
) -> dict[str, tuple[str | None, ...]]:
    """Each input's variable config dims named as another variable dim is (the batch aside,
    which Triton itself keeps equal): a request whose tensors differ there would fail inside
    the model, so the gateway and the clients refuse it first."""
    skip = int(batching)
    labelled = {}
    for tensor in graph.inputs:
        labels = names.get(tensor.name, ())
        labelled[tensor.name] = tuple(
            labels[axis] if axis < len(labels) and tensor.dims[axis] == rules.WILDCARD else None
            for axis in range(skip, len(tensor.dims))
        )
    counts = Counter(label for labels in labelled.values() for label in labels if label)
    return {
        name: tuple(label if label and counts[label] > 1 else None for label in labels)
        for name, labels in labelled.items()
        if any(label and counts[label] > 1 for label in labels)
    }


def _named_bounds(
    given: Mapping[str, Bounds], names: Mapping[str, tuple[str | None, ...]], skip: int
) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of each named dim that --shape bounds; two inputs naming one dim must
    give it the same bounds, since a request's tensors share it."""
    named: dict[str, tuple[int, int, int]] = {}
    owner: dict[str, str] = {}
    for name, bounds in given.items():
        for axis, label in enumerate(names.get(name, ())[skip:]):
            if label is None or axis >= len(bounds.min):
                continue
            these = (bounds.min[axis], bounds.opt[axis], bounds.max[axis])
            if named.setdefault(label, these) != these:
                first = ":".join(map(str, named[label]))
                raise UserError(
                    f"--shape {name}: dim {axis + skip} is the graph's '{label}', which "
                    f"--shape {owner[label]} bounds {first}; a request's tensors share it, so "
                    f"give it {first} in both"
                )
            owner.setdefault(label, name)
    return named


def _bounds_source(
    name: str,
    shapes: Mapping[str, tuple],
    names: Mapping[str, tuple[str | None, ...]],
    batching: bool,
) -> str:
    """Where an input's bounds came from, for add-model's notes."""
    mine = {label for label in names.get(name, ())[int(batching) :] if label}
    for other in shapes:
        shared = sorted(mine & set(names.get(other, ())[int(batching) :]))
        if shared:
            dims = ", ".join(f"'{label}'" for label in shared)
            return f"dims {dims} as --shape {other} bounds them"
    return "the default; --shape sets them"


def _batch_rows(
    path: Path, graph: rules.Graph, shapes: Mapping[str, tuple], size: int, asked: int | None
) -> tuple[int, int]:
    """(max_batch_size, opt rows) from the batch dim of --shape, if given, and the option."""
    rows = {name: (given[0][0], given[1][0], given[2][0]) for name, given in shapes.items()}
    if not rows:
        return size, min(8, size)
    if len(set(rows.values())) > 1:
        raise UserError(
            f"--shape: the batch dims differ between inputs ({rows}); every input of a request "
            "has the same rows"
        )
    low, usual, high = next(iter(rows.values()))
    if low != 1:
        raise UserError(f"--shape: the batch's min is 1 (a request of one row), not {low}")
    if asked is not None and asked != high:
        raise UserError(
            f"--shape says at most {high} rows but --max-batch-size {asked}; give one of them"
        )
    return high, usual


def _correct_outputs(model, graph, out_opt, out_min, opt_rows, batching, notes):
    """The model with each output's declared shape replaced where the runs contradict it."""
    import onnx

    corrected = onnx.ModelProto()
    corrected.CopyFrom(model)
    declared = {t.name: t for t in graph.outputs}
    for value in corrected.graph.output:
        a, b = out_opt[value.name], out_min[value.name]
        dims = list(declared[value.name].dims)
        seen = [
            rules.WILDCARD if a.shape[i] != b.shape[i] else a.shape[i] for i in range(a.ndim)
        ] if a.ndim == b.ndim else None  # fmt: skip
        if seen is None:
            continue  # rank varies with the input: nothing fixed to declare
        if batching and seen and a.shape[0] == opt_rows and b.shape[0] == 3:
            seen[0] = rules.WILDCARD
        if len(dims) == len(seen) and all(
            d == rules.WILDCARD or d == s for d, s in zip(dims, seen, strict=True)
        ):
            continue  # the declaration holds
        fixed = [
            s if len(dims) != len(seen) or dims[i] != rules.WILDCARD else rules.WILDCARD
            for i, s in enumerate(seen)
        ]
        shape = value.type.tensor_type.shape
        shape.ClearField("dim")
        for axis, dim in enumerate(fixed):
            entry = shape.dim.add()
            if dim == rules.WILDCARD:
                entry.dim_param = "batch" if axis == 0 and batching else f"{value.name}_{axis}"
            else:
                entry.dim_value = dim
        notes.append(
            f"output {value.name}: declared {list(dims) or 'without a shape'}, returns "
            f"{['batch' if d == -1 and i == 0 and batching else d for i, d in enumerate(fixed)]}"
            "; served as it returns"
        )
    return corrected


def _state(path: Path, graph: rules.Graph, given: Mapping[str, str] | None) -> dict[str, str]:
    if given is None:
        return find_state(graph)
    inputs = {t.name: t for t in graph.inputs}
    outputs = {t.name: t for t in graph.outputs}
    for name, output in given.items():
        if name not in inputs or output not in outputs:
            missing = f"input {name}" if name not in inputs else f"output {output}"
            raise UserError(f"--state {name}={output}: {path.name} has no {missing}")
        a, b = inputs[name], outputs[output]
        if a.elem_type != b.elem_type or len(a.dims) != len(b.dims):
            raise UserError(
                f"--state {name}={output}: the output ({b.type_name} {list(b.dims)}) cannot be "
                f"sent back as the input ({a.type_name} {list(a.dims)})"
            )
    return dict(given)


def _no_tensorrt(model, graph: rules.Graph) -> str | None:
    """Why TensorRT could not build the graph, or None."""
    domains = sorted({n.domain for n in model.graph.node if n.domain not in ("", "ai.onnx")})
    if domains:
        operators = sorted({n.op_type for n in model.graph.node if n.domain in domains})
        listed = ", ".join(operators[:4])
        return f"operators of {', '.join(domains)} ({listed}), which TensorRT lacks"
    for tensor in (*graph.inputs, *graph.outputs):
        if tensor.elem_type not in TENSORRT_TYPES:
            return f"{tensor.name} is {tensor.type_name}, a type TensorRT lacks"
    return None
