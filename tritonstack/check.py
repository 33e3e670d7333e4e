"""Static checks of a Triton model repository, run before any server starts.

Triton reports a broken repository one model at a time, in a long startup log, after it has
spent seconds loading everything else; an ensemble whose wiring is wrong only fails once all of
its steps have loaded. `check_repository` finds the same mistakes in well under a second, all at
once, and says each in one line: the file, the field (in Triton's naming), what is wrong, and the
fix. Configs are parsed with Triton's own schema (see tritonstack.repository) and ONNX models
are read with `onnx`, so nothing here hand-parses protobuf text.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2

from tritonstack.errors import UserError
from tritonstack.repository import Model, ModelConfig, parse_config

DataType = model_config_pb2.DataType

# Platforms and backends this repository serves, with the backend each platform runs on.
PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorrt_plan": "tensorrt",
    "ensemble": "ensemble",
}
BACKENDS = ("python", "onnxruntime", "vllm")
DEFAULT_FILENAMES = {"onnxruntime": "model.onnx", "tensorrt": "model.plan", "python": "model.py"}

# ONNX TensorProto element types -> Triton data types (Triton's onnxruntime backend mapping).
ONNX_TO_TRITON = {
    onnx.TensorProto.FLOAT: DataType.TYPE_FP32,
    onnx.TensorProto.FLOAT16: DataType.TYPE_FP16,
    onnx.TensorProto.BFLOAT16: DataType.TYPE_BF16,
    onnx.TensorProto.DOUBLE: DataType.TYPE_FP64,
    onnx.TensorProto.INT8: DataType.TYPE_INT8,
    onnx.TensorProto.INT16: DataType.TYPE_INT16,
    onnx.TensorProto.INT32: DataType.TYPE_INT32,
    onnx.TensorProto.INT64: DataType.TYPE_INT64,
    onnx.TensorProto.UINT8: DataType.TYPE_UINT8,
    onnx.TensorProto.UINT16: DataType.TYPE_UINT16,
    onnx.TensorProto.UINT32: DataType.TYPE_UINT32,
    onnx.TensorProto.UINT64: DataType.TYPE_UINT64,
    onnx.TensorProto.BOOL: DataType.TYPE_BOOL,
    onnx.TensorProto.STRING: DataType.TYPE_STRING,
}

# One ONNX dimension: a fixed size, a named dynamic size (dim_param), or None (unknown/dynamic).
OnnxDim = int | str | None
Say = Callable[[str, str, str], None]


def check_repository(repository: Path) -> list[str]:
    """Return one message per problem; an empty list means the repository is servable.

    Every model is checked even when another one is broken (a syntax error in one config does
    not hide the problems of the others), because fixing a repository one server start per
    mistake is exactly the slow loop this check exists to avoid.
    """
    repository = _shown(Path(repository))
    if not repository.is_dir():
        return [
            f"{repository}: model repository not found; pass the directory that holds one "
            "sub-directory per model (e.g. model_repository)"
        ]
    problems: list[str] = []
    models: dict[str, Model] = {}
    broken: set[str] = set()  # models whose own problem is already reported: no follow-ups
    for directory in sorted(p for p in repository.iterdir() if p.is_dir()):
        if directory.name.startswith("."):
            continue
        config_path = directory / "config.pbtxt"
        if not config_path.is_file():
            broken.add(directory.name)
            problems.append(
                f"{config_path}: missing; every model directory needs a config.pbtxt "
                "(Triton loads every sub-directory as a model): add one or move "
                f"{directory.name}/ out of the repository"
            )
            continue
        try:
            models[directory.name] = Model(directory, parse_config(config_path))
        except UserError as exc:
            broken.add(directory.name)
            problems.append(" ".join(str(exc).split("\n")))
    if not models and not broken:
        problems.append(
            f"{repository}: no models (no sub-directory with a config.pbtxt); add one "
            "directory per model, e.g. classifier/config.pbtxt and classifier/1/model.onnx"
        )
    # Two passes: a model with problems of its own is not also compared with the models that
    # mirror it (classifier_trt would be told to copy classifier's mistake).
    own = {name: _check_model(model) for name, model in models.items()}
    suspect = broken | {name for name, found in own.items() if found}
    for name, model in models.items():
        problems.extend(own[name])
        problems.extend(_check_references(model, models, broken, suspect))
        problems.extend(_check_queue_policy(model))
    problems.extend(_check_variants(models, broken, suspect, problems))
    problems.extend(check_schema_skew(repository))
    return problems


def _check_variants(
    models: dict[str, Model], broken: set[str], suspect: set[str], reported: list[str]
) -> list[str]:
    """`<model>/configs/<name>.pbtxt`, served with --model-config-name=<name> (configs/gpu.pbtxt
    on GPU hosts): the same checks, against the repository that server sees, i.e. every model's
    variant where it has one and its config.pbtxt otherwise. Messages already given are not
    repeated."""
    problems: list[str] = []
    variant_names = sorted(
        {p.stem for m in models.values() for p in (m.directory / "configs").glob("*.pbtxt")}
    )
    for variant_name in variant_names:
        variants, paths = {}, {}
        for name, model in models.items():
            path = model.directory / "configs" / f"{variant_name}.pbtxt"
            if not path.is_file():
                continue
            try:
                variants[name] = Model(model.directory, parse_config(path))
                paths[name] = path
            except UserError as exc:
                problems.append(" ".join(str(exc).split("\n")))
        for name, model in variants.items():
            problems.extend(_check_queue_policy(model, paths[name]))
        served = {**models, **variants}
        own = {name: _check_model(model, paths[name]) for name, model in variants.items()}
        doubtful = suspect | {name for name, found in own.items() if found}
        for name, model in served.items():
            found = own.get(name, [])
            found += _check_references(model, served, broken, doubtful, paths.get(name))
            for message in found:
                # A problem of the model's files (a missing model.onnx) is the same for every
                # configuration: said once, for config.pbtxt.
                default = message.replace(
                    str(paths.get(name)), str(model.directory / "config.pbtxt"), 1
                )
                if default not in reported and message not in problems:
                    problems.append(message)
    return problems


def _shown(path: Path) -> Path:
    """The path as the user should see it: relative to the working directory when under it."""
    if path.is_absolute():
        try:
            return path.relative_to(Path.cwd())
        except ValueError:
            return path
    return path


def _sayer(model: Model, config_path: Path | None = None) -> tuple[list[str], Say]:
    """A message list and the one way to add to it: `<config>: <field> <problem>; <fix>`."""
    problems: list[str] = []
    config_path = config_path or model.directory / "config.pbtxt"

    def say(field: str, problem: str, fix: str) -> None:
        problems.append(f"{config_path}: {field} {problem}; {fix}")

    return problems, say


def _check_model(model: Model, config_path: Path | None = None) -> list[str]:
    """What one model directory and its config must satisfy on their own."""
    problems, say = _sayer(model, config_path)
    config = model.config
    if config.name and config.name != model.name:
        say(
            f'name "{config.name}"',
            f'does not match its directory "{model.name}"',
            "rename one of them (Triton requires them to be equal)",
        )
    kind = _kind(config, say)
    versions = sorted(
        (p for p in model.directory.iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    if not versions:
        what = {
            "ensemble": "an empty 1/ (Triton requires a version directory even for an "
            "ensemble; keep it in git with a .gitkeep)",
            "onnxruntime": "1/ holding model.onnx",
            "tensorrt": "1/ (model.plan inside it may be built at container start)",
            "python": "1/ holding model.py",
            "vllm": "1/ holding model.json (vLLM's engine arguments)",
        }.get(kind or "", "1/ holding the model file")
        say(
            "version directory",
            f"is missing: {model.directory}/ has no numeric sub-directory, so Triton loads "
            "no version of this model",
            f"create {what}",
        )
    if kind == "python":
        _check_python_files(model, versions, say)
    elif kind == "onnxruntime":
        _check_onnx(model, versions, say)
    elif kind == "tensorrt":
        _check_tensorrt_files(model, versions, say)
    elif kind == "vllm":
        _check_vllm(model, versions, say)
    return problems


def _check_queue_policy(model: Model, config_path: Path | None = None) -> list[str]:
    """No queue policy: it makes the dynamic batcher stall, and overload belongs to the gateway.

    Triton's core turns the batcher's payload prefetching off whenever a model has a
    max_queue_size, a default queue timeout or priority levels; on that path the batcher is not
    woken when a busy instance frees up and sleeps out its 500 ms idle timeout (Triton 2.51, and
    core at HEAD). Kept apart from _check_model: the model is still servable and its other
    checks (a TensorRT twin, an ensemble's wiring) stay meaningful.
    """
    problems, say = _sayer(model, config_path)
    batching = model.config.dynamic_batching
    policy = batching.default_queue_policy
    fields = [
        f"{name} {value}"
        for name, value in (
            ("default_queue_policy.max_queue_size", policy.max_queue_size),
            (
                "default_queue_policy.default_timeout_microseconds",
                policy.default_timeout_microseconds,
            ),
            ("priority_levels", batching.priority_levels),
            ("priority_queue_policy", len(batching.priority_queue_policy)),
        )
        if value
    ]
    if fields:
        say(
            "dynamic_batching",
            "has a queue policy (" + ", ".join(fields) + "), which stalls the dynamic batcher: "
            "any queue policy turns off its payload prefetching, and then Triton waits out a "
            "500 ms idle timeout whenever a busy instance frees up under load (p99 ~500 ms)",
            "delete default_queue_policy, priority_levels and priority_queue_policy, and let the "
            "gateway refuse overload (gateway/haproxy.cfg: requests in flight capped, then 503)",
        )
    return problems


def _check_references(
    model: Model,
    models: dict[str, Model],
    broken: set[str],
    suspect: set[str],
    config_path: Path | None = None,
) -> list[str]:
    """What a model must satisfy against the other models it names, mirrors or wires up."""
    problems, say = _sayer(model, config_path)
    if model.kind == "python":
        _check_python_references(model, models, broken, say)
    elif model.kind == "tensorrt":
        _check_tensorrt_twin(model, models, suspect, say)
    elif model.kind == "ensemble":
        _check_ensemble(model, models, broken, say)
    return problems


def _kind(config: ModelConfig, say: Say) -> str | None:
    """The backend the model runs on, or None (after saying why) when it is unset or unknown."""
    platform, backend = config.platform, config.backend
    known_platforms = ", ".join(f'"{p}"' for p in PLATFORM_BACKENDS)
    if backend:
        if backend not in BACKENDS:
            say(
                f'backend "{backend}"',
                'is not one this repository serves (known: backend "python", backend '
                f'"onnxruntime", or platform {known_platforms})',
                'use backend: "python" for a model.py model, platform: "onnxruntime_onnx" '
                'for model.onnx, platform: "tensorrt_plan" for model.plan',
            )
            return None
        if platform and PLATFORM_BACKENDS.get(platform) != backend:
            say(
                f'platform "{platform}"',
                f'contradicts backend "{backend}"',
                f'remove platform (backend "{backend}" alone selects the runtime)',
            )
            return None
        return backend
    if platform:
        if platform in PLATFORM_BACKENDS:
            return PLATFORM_BACKENDS[platform]
        if platform in BACKENDS:
            fix = f'write backend: "{platform}" instead (it is a backend, not a platform)'
        else:
            fix = f'use one of {known_platforms}, or backend: "python" for a model.py model'
            fix += _did_you_mean(platform, PLATFORM_BACKENDS)
        say(f'platform "{platform}"', f"is not a known platform (known: {known_platforms})", fix)
        return None
    say(
        "platform/backend",
        "is not set, so Triton cannot tell which runtime loads this model",
        'add platform: "onnxruntime_onnx" (model.onnx), platform: "tensorrt_plan" (model.plan), '
        'platform: "ensemble", or backend: "python" (model.py)',
    )
    return None


# --- vLLM backend -------------------------------------------------------------------------------


def _check_vllm(model: Model, versions: Sequence[Path], say: Say) -> None:
    """Triton's vLLM backend: one KIND_MODEL instance, engine arguments in <version>/model.json,
    and the two settings whose defaults users trip on (metrics off, 90% of the GPU taken)."""
    kinds = [group.kind for group in model.config.instance_group]
    if (
        any(kind != model_config_pb2.ModelInstanceGroup.Kind.KIND_MODEL for kind in kinds)
        or len(kinds) > 1
    ):
        say(
            "instance_group",
            "must be one group of kind KIND_MODEL: the vLLM engine places itself on its GPUs "
            "(tensor_parallel_size) and batches on its own",
            "write instance_group [{ count: 1, kind: KIND_MODEL }]",
        )
    if (model.parameter("REPORT_CUSTOM_METRICS") or "").lower() != "true":
        say(
            "parameters",
            'lack REPORT_CUSTOM_METRICS "true", so none of the vllm:* metrics (time to first '
            "token, tokens/s) reach Triton's metrics port",
            'add parameters: { key: "REPORT_CUSTOM_METRICS" value: { string_value: "true" } }',
        )
    for version in versions:
        path = version / "model.json"
        try:
            engine = json.loads(path.read_text(encoding="utf-8"))
        except OSError:
            say('backend "vllm"', f"reads {path} and it is missing", "add vLLM's engine arguments")
            continue
        except json.JSONDecodeError as exc:
            say('backend "vllm"', f"reads {path}, which is not JSON ({exc})", "fix its syntax")
            continue
        if not isinstance(engine, dict) or not isinstance(engine.get("model"), str):
            say(
                'backend "vllm"',
                f'reads {path}, which needs a JSON object naming "model"',
                'write {"model": "<Hugging Face id or folder>", ...}',
            )
            continue
        if "gpu_memory_utilization" not in engine:
            say(
                'backend "vllm"',
                f"starts vLLM with gpu_memory_utilization unset in {path}: vLLM then takes 90% "
                "of the GPU's memory, and a Triton sharing that GPU runs out",
                'set "gpu_memory_utilization" to the share the model may use (weights plus KV '
                "cache), e.g. 0.3",
            )


# --- Python backend -----------------------------------------------------------------------------


def _check_python_files(model: Model, versions: Sequence[Path], say: Say) -> None:
    filename = model.config.default_model_filename or DEFAULT_FILENAMES["python"]
    for version in versions:
        if not (version / filename).is_file():
            say(
                'backend "python"',
                f"loads {version.name}/{filename} and {version / filename} is missing",
                f"add the model's Python file there (class TritonPythonModel in {filename})",
            )
        # A module shared between models is a relative symlink (the stub puts only the model's
        # own folders on sys.path); a broken one fails only when Triton loads the model.
        for link in sorted(p for p in version.iterdir() if p.is_symlink() and not p.exists()):
            say(
                'backend "python"',
                f"imports from {version.name}/, where {_shown(link)} links to "
                f"{os.readlink(link)}, which does not exist",
                "point the link at the file, relative to its folder, or put the file there",
            )


def _check_python_references(
    model: Model, models: dict[str, Model], broken: set[str], say: Say
) -> None:
    for key in ("preferred_model", "fallback_model"):
        target = model.parameter(key)
        if target and target not in models and target not in broken:
            say(
                f'parameters "{key}"',
                f'names model "{target}", which is not in the repository',
                "set it to one of " + _names(models) + _did_you_mean(target, models),
            )
    relative = model.parameter("labels_file")
    if relative is not None:
        _check_labels(model, relative, models, say)


def _check_labels(model: Model, relative: str, models: dict[str, Model], say: Say) -> None:
    """Labels are indexed by the classifier's argmax: one per class, in class order."""
    field = 'parameters "labels_file"'
    if not relative:
        say(field, "is empty", "set it to the labels file, relative to the model directory")
        return
    path = Path(os.path.normpath(model.directory / relative))
    if not path.is_file():
        say(
            field,
            f'is "{relative}" but {path} does not exist',
            f"create it (one label per line, in class-index order) or fix the path, which is "
            f"relative to {model.directory}/",
        )
        return
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        say(field, f"points at {path}, which cannot be read ({exc})", "write it as UTF-8 text")
        return
    labels = [line.strip() for line in text.splitlines() if line.strip()]
    if len(labels) < 2:
        say(
            field,
            f"points at {path}, which has {len(labels)} non-empty line(s)",
            "write one label per class (a classifier has at least 2), one per line",
        )
        return
    wrong = [
        f"{source} has {n} scores" for source, n in _class_counts(model, models) if n != len(labels)
    ]
    if wrong:
        say(
            field,
            f"points at {path}, which has {len(labels)} labels, but " + " and ".join(wrong),
            "write exactly one label per class, in class-index order",
        )


def _class_counts(model: Model, models: dict[str, Model]) -> Iterable[tuple[str, int]]:
    """Class counts the labels must match: this model's `class` input, or the models it calls."""
    for io in model.config.input:
        if io.name == "class" and io.dims and io.dims[-1] > 0:
            yield f'input "class" (dims {_dims(io.dims)})', io.dims[-1]
    for key in ("preferred_model", "fallback_model"):
        target = models.get(model.parameter(key) or "")
        for io in target.config.output if target else ():
            if io.name == "class" and io.dims and io.dims[-1] > 0:
                yield f'output "class" of {target.name} (dims {_dims(io.dims)})', io.dims[-1]


# --- ONNX ---------------------------------------------------------------------------------------


def _check_onnx(model: Model, versions: Sequence[Path], say: Say) -> None:
    filename = model.config.default_model_filename or DEFAULT_FILENAMES["onnxruntime"]
    for version in versions:
        path = version / filename
        if not path.is_file():
            if (version / "model.py").is_file():
                _say_python_in_disguise(model, version, say)
            else:
                say(
                    f'platform "{model.config.platform or "onnxruntime_onnx"}"',
                    f"loads {version.name}/{filename} and {path} is missing",
                    "export the ONNX model there (for the demo classifier: `tritonstack "
                    "export`) or set default_model_filename",
                )
            continue
        try:
            graph = onnx.load(str(path)).graph
        except Exception as exc:  # any decode failure means onnxruntime cannot load it either
            reason = " ".join(str(exc).split()) or type(exc).__name__
            say(
                f"{version.name}/{filename}",
                f"cannot be loaded by onnx ({reason})",
                "re-export the model (for the demo classifier: `tritonstack export`)",
            )
            continue
        _cross_check_onnx(model, f"{version.name}/{filename}", graph, say)


@dataclass(frozen=True)
class _OnnxTensor:
    name: str
    elem_type: int | None  # None: not a tensor (sequence, map, ...)
    shape: list[OnnxDim] | None  # None: rank unknown


def _onnx_tensors(values: Iterable[onnx.ValueInfoProto]) -> dict[str, _OnnxTensor]:
    tensors = {}
    for value in values:
        if value.type.WhichOneof("value") != "tensor_type":
            tensors[value.name] = _OnnxTensor(value.name, None, None)
            continue
        tensor_type = value.type.tensor_type
        shape = None
        if tensor_type.HasField("shape"):
            shape = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tensor_type.shape.dim
            ]
        tensors[value.name] = _OnnxTensor(value.name, tensor_type.elem_type, shape)
    return tensors


def _cross_check_onnx(model: Model, shown: str, graph: onnx.GraphProto, say: Say) -> None:
    """Config inputs/outputs against the graph: what Triton's onnxruntime backend validates."""
    config = model.config
    initializers = {init.name for init in graph.initializer}  # listed as inputs before IR 4
    graph_io = {
        "input": _onnx_tensors(i for i in graph.input if i.name not in initializers),
        "output": _onnx_tensors(graph.output),
    }
    for section, declared, other in (
        ("input", config.input, "output"),
        ("output", config.output, "input"),
    ):
        available = graph_io[section]
        for index, io in enumerate(declared):
            field = f'{section}[{index}] "{io.name}"'
            tensor = available.get(io.name)
            if tensor is None:
                names = ", ".join(f'"{n}"' for n in available) or "none"
                if io.name in graph_io[other]:
                    say(
                        field,
                        f"is an {other} of {shown}, not an {section} (its {section}s: {names})",
                        f"move it from {section} to {other}",
                    )
                else:
                    say(
                        field,
                        f"is not an {section} of {shown} (its {section}s: {names})",
                        "rename it to the graph's name" + _did_you_mean(io.name, available),
                    )
                continue
            _compare_onnx_tensor(config, field, io, tensor, shown, say)
    declared_inputs = {io.name for io in config.input}
    for tensor in graph_io["input"].values():
        if tensor.name not in declared_inputs:
            say(
                "input",
                f'does not declare "{tensor.name}", an input of {shown}, so Triton cannot feed it',
                "add " + _suggest_io(config, tensor),
            )


def _compare_onnx_tensor(
    config: ModelConfig,
    field: str,
    io: model_config_pb2.ModelInput | model_config_pb2.ModelOutput,
    tensor: _OnnxTensor,
    shown: str,
    say: Say,
) -> None:
    if tensor.elem_type is None:
        say(
            field, f"is not a tensor in {shown}", "Triton's onnxruntime backend serves tensors only"
        )
        return
    expected_type = ONNX_TO_TRITON.get(tensor.elem_type)
    onnx_type = onnx.TensorProto.DataType.Name(tensor.elem_type)
    if expected_type is None:
        say(field, f"is ONNX {onnx_type} in {shown}, which Triton has no type for", "re-export it")
    elif io.data_type != expected_type:
        say(
            f"{field}.data_type",
            f"is {DataType.Name(io.data_type)} but {shown} has {onnx_type}",
            f"set data_type: {DataType.Name(expected_type)}",
        )
    if tensor.shape is None:
        return  # rank unknown to ONNX: onnxruntime checks at run time
    has_reshape = io.HasField("reshape")
    dims = list(io.reshape.shape if has_reshape else io.dims)
    dims_field = f"{field}.{'reshape.shape' if has_reshape else 'dims'}"
    shape, batch = tensor.shape, config.max_batch_size
    onnx_text = f"{shown} has {_onnx_dims(shape)}"
    if batch > 0:
        if not shape or isinstance(shape[0], int):
            first = "no dimensions" if not shape else f"a fixed first dimension {shape[0]}"
            say(
                "max_batch_size",
                f"is {batch} but {field} in {shown} has {first}, so it cannot take a batch",
                "set max_batch_size: 0 and put the full shape in dims, or re-export the model "
                "with a dynamic batch dimension",
            )
            return
        rest = shape[1:]
        if _dims_match(dims, rest):
            return
        fix = _set_dims(has_reshape, _config_dims(rest))
        if len(dims) == len(shape) and _dims_match(dims[1:], rest):
            say(
                dims_field,
                f"is {_dims(dims)} but {onnx_text}: the first dimension is the batch, which "
                f"max_batch_size {batch} already adds",
                f"do not include the batch dimension in dims when max_batch_size > 0: {fix}",
            )
        else:
            say(
                dims_field,
                f"is {_dims(dims)} but {onnx_text}, i.e. {_onnx_dims(rest)} after the batch "
                f"dimension that max_batch_size {batch} adds",
                fix,
            )
        return
    if _dims_match(dims, shape):
        return
    fix = _set_dims(has_reshape, _config_dims(shape))
    if shape and not isinstance(shape[0], int) and _dims_match(dims, shape[1:]):
        fix = (
            f"the model's first dimension is a dynamic batch: set max_batch_size (e.g. 64) "
            f"to batch it, or {fix}"
        )
    say(dims_field, f"is {_dims(dims)} but {onnx_text} (max_batch_size is 0)", fix)


def _set_dims(has_reshape: bool, dims: str) -> str:
    return f"set reshape: {{ shape: {dims} }}" if has_reshape else f"set dims: {dims}"


def _dims_match(config_dims: Sequence[int], onnx_dims: Sequence[OnnxDim]) -> bool:
    """-1 in the config matches anything; a dynamic ONNX dimension matches only -1."""
    return len(config_dims) == len(onnx_dims) and all(
        c == -1 or (isinstance(o, int) and o == c)
        for c, o in zip(config_dims, onnx_dims, strict=True)
    )


def _suggest_io(config: ModelConfig, tensor: _OnnxTensor) -> str:
    shape = tensor.shape or []
    if config.max_batch_size > 0 and shape:
        shape = shape[1:]
    data_type = ONNX_TO_TRITON.get(tensor.elem_type or 0)
    type_text = f" data_type: {DataType.Name(data_type)}" if data_type is not None else ""
    return f'input {{ name: "{tensor.name}"{type_text} dims: {_config_dims(shape)} }}'


# --- TensorRT -----------------------------------------------------------------------------------


def _check_tensorrt_files(model: Model, versions: Sequence[Path], say: Say) -> None:
    """A missing model.plan is normal (built at container start); a model.py is not."""
    filename = model.config.default_model_filename or DEFAULT_FILENAMES["tensorrt"]
    for version in versions:
        if not (version / filename).exists() and (version / "model.py").is_file():
            _say_python_in_disguise(model, version, say)


def _check_tensorrt_twin(
    model: Model, models: dict[str, Model], suspect: set[str], say: Say
) -> None:
    """X_trt is built from X's ONNX model, so its config must describe the same tensors."""
    if not model.name.endswith("_trt"):
        return
    source = models.get(model.name.removesuffix("_trt"))
    if source is None or source.name in suspect:
        return
    same = (
        f"{model.name} is the same network as {source.name} (its plan is built from "
        f"{source.name}'s ONNX model), so inputs, outputs and max_batch_size must be equal"
    )
    if model.config.max_batch_size != source.config.max_batch_size:
        say(
            "max_batch_size",
            f"is {model.config.max_batch_size} but {source.name} has "
            f"{source.config.max_batch_size}",
            f"{same}: set max_batch_size: {source.config.max_batch_size}",
        )
    for section in ("input", "output"):
        mine = {io.name: (i, io) for i, io in enumerate(getattr(model.config, section))}
        theirs = {io.name: io for io in getattr(source.config, section)}
        for name, (index, io) in mine.items():
            field = f'{section}[{index}] "{name}"'
            other = theirs.get(name)
            if other is None:
                say(field, f"is not an {section} of {source.name}", f"{same}: remove or rename it")
                continue
            if io.data_type != other.data_type:
                say(
                    f"{field}.data_type",
                    f"is {DataType.Name(io.data_type)} but {source.name} has "
                    f"{DataType.Name(other.data_type)}",
                    f"{same}: set data_type: {DataType.Name(other.data_type)}",
                )
            if list(io.dims) != list(other.dims):
                say(
                    f"{field}.dims",
                    f"is {_dims(io.dims)} but {source.name} has {_dims(other.dims)}",
                    f"{same}: set dims: {_dims(other.dims)}",
                )
        for name in theirs.keys() - mine.keys():
            say(
                section,
                f'does not declare "{name}", an {section} of {source.name}',
                f"{same}: add it with the same data_type and dims",
            )


def _say_python_in_disguise(model: Model, version: Path, say: Say) -> None:
    field = f'platform "{model.config.platform}"' if model.config.platform else "backend"
    say(
        field,
        f"does not fit {version / 'model.py'}, which is a Python backend model",
        'replace it with backend: "python"',
    )


# --- Ensembles ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tensor:
    """What an ensemble tensor is, and which end of the wiring said so (for the message)."""

    origin: str
    data_type: int
    dims: tuple[int, ...]
    batching: bool

    @property
    def full_dims(self) -> tuple[int, ...]:
        return ((-1,) if self.batching else ()) + self.dims


def _check_ensemble(model: Model, models: dict[str, Model], broken: set[str], say: Say) -> None:
    """The checks Triton runs when it loads an ensemble, after all its step models loaded."""
    config = model.config
    steps = config.ensemble_scheduling.step
    if config.instance_group:
        say("instance_group", "is set on an ensemble", "remove it (ensembles have no instances)")
    if not steps:
        say(
            "ensemble_scheduling.step",
            "is empty",
            "add one step per model, with input_map and output_map",
        )
        return
    batching = config.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for io in config.input:
        dims = io.reshape.shape if io.HasField("reshape") else io.dims
        origin = f'ensemble input "{io.name}"'
        tensors.setdefault(io.name, _Tensor(origin, io.data_type, tuple(dims), batching))

    producers: dict[str, int] = {}
    for index, step in enumerate(steps):
        for key, value in sorted(step.output_map.items()):
            if value in producers:
                say(
                    f'ensemble_scheduling.step[{index}].output_map "{key}"',
                    f'writes tensor "{value}", which step[{producers[value]}] already writes',
                    "give each step output its own ensemble tensor name (Triton allows one "
                    "writer per tensor)",
                )
            producers.setdefault(value, index)
    ensemble_inputs = [io.name for io in config.input]

    for index, step in enumerate(steps):
        field = f"ensemble_scheduling.step[{index}]"
        if not step.input_map:
            say(f"{field}.input_map", "is empty", "map each input of the step's model")
        if not step.output_map:
            say(f"{field}.output_map", "is empty", "map the outputs the ensemble uses")
        target = models.get(step.model_name)
        if target is None:
            if step.model_name not in broken:
                say(
                    f'{field}.model_name "{step.model_name}"',
                    "is not a model in the repository",
                    "use one of " + _names(models) + _did_you_mean(step.model_name, models),
                )
            continue
        _check_step(model, index, step, target, tensors, say)

    # Data flow, as Triton resolves it: a step runs once all its input tensors exist.
    ready = set(ensemble_inputs)
    pending = list(range(len(steps)))
    progress = True
    while progress:
        progress = False
        for index in list(pending):
            if all(value in ready for value in steps[index].input_map.values()):
                ready.update(steps[index].output_map.values())
                pending.remove(index)
                progress = True
    produced_names = ", ".join(f'"{n}"' for n in [*ensemble_inputs, *producers]) or "none"
    for index in pending:
        for key, value in sorted(steps[index].input_map.items()):
            if value in ready:
                continue
            field = f'ensemble_scheduling.step[{index}].input_map "{key}"'
            if value in producers:
                say(
                    field,
                    f'reads "{value}", which step[{producers[value]}] can only produce after '
                    "this step ran (circular wiring)",
                    "break the cycle",
                )
            else:
                say(
                    field,
                    f'reads "{value}", which neither an ensemble input nor any step\'s '
                    f"output_map produces (available: {produced_names})",
                    "map it from one of those"
                    + _did_you_mean(value, [*ensemble_inputs, *producers]),
                )
    consumed = {value for step in steps for value in step.input_map.values()}
    for index, io in enumerate(config.output):
        field = f'output[{index}] "{io.name}"'
        if io.name not in producers:
            say(
                field,
                "is not produced by any step",
                f'add output_map {{ key: "<model output>" value: "{io.name}" }} to the step '
                "that computes it",
            )
            continue
        # Compared after the steps, so a mismatch names the step that produces the tensor.
        dims = io.reshape.shape if io.HasField("reshape") else io.dims
        mine = _Tensor(f'ensemble output "{io.name}"', io.data_type, tuple(dims), batching)
        _connect(tensors, io.name, mine, field, say)
    readers = {}
    for index, step in reversed(list(enumerate(steps))):
        readers.update(dict.fromkeys(step.input_map.values(), index))
    for index, io in enumerate(config.output):
        if io.name in readers and io.name in producers:
            say(
                f'output[{index}] "{io.name}"',
                f"is also read by step[{readers[io.name]}]: Triton then fails requests that ask "
                'for only some of the outputs with "unexpected deadlock" '
                "(triton-inference-server/server#7482)",
                "feed the step from an internal tensor of another name and return a pass-through "
                "copy of it (a step output) as this ensemble output",
            )
    for index, io in enumerate(config.input):
        if io.name not in consumed:
            say(
                f'input[{index}] "{io.name}"',
                "is not read by any step (Triton rejects unused ensemble inputs)",
                "map it in a step's input_map or remove it",
            )
    outputs = {io.name for io in config.output}
    for value, index in sorted(producers.items()):
        if value not in consumed and value not in outputs:
            say(
                f"ensemble_scheduling.step[{index}].output_map",
                f'produces "{value}", which no step reads and is not an ensemble output '
                "(Triton rejects unused ensemble tensors)",
                "declare it as an ensemble output or remove the mapping",
            )


def _check_step(
    ensemble: Model,
    index: int,
    step: model_config_pb2.ModelEnsembling.Step,
    target: Model,
    tensors: dict[str, _Tensor],
    say: Say,
) -> None:
    """One step against its model's config; records/compares every tensor it touches."""
    field = f"ensemble_scheduling.step[{index}]"
    step_config = target.config
    if 0 < step_config.max_batch_size < ensemble.config.max_batch_size:
        say(
            f'{field}.model_name "{target.name}"',
            f"allows max_batch_size {step_config.max_batch_size}, less than the ensemble's "
            f"{ensemble.config.max_batch_size}",
            f"lower the ensemble's max_batch_size to {step_config.max_batch_size} or raise "
            f"{target.name}'s",
        )
    batching = step_config.max_batch_size > 0
    for section, mapping, declared in (
        ("input", step.input_map, step_config.input),
        ("output", step.output_map, step_config.output),
    ):
        by_name = {io.name: io for io in declared}
        map_field = f"{field}.{section}_map"
        for key, value in sorted(mapping.items()):
            io = by_name.get(key)
            if io is None:
                say(
                    f'{map_field} key "{key}"',
                    f"is not an {section} of {target.name} (its {section}s: {_names(by_name)})",
                    f"use the name {target.name}'s config.pbtxt declares"
                    + _did_you_mean(key, by_name),
                )
                continue
            origin = f'{section} "{key}" of {target.name} (step[{index}])'
            mine = _Tensor(origin, io.data_type, tuple(io.dims), batching)
            _connect(tensors, value, mine, f'{map_field} "{key}"', say)
        if section == "input":
            for io in declared:
                if io.name not in mapping and not io.optional:
                    say(
                        map_field,
                        f'does not map input "{io.name}" of {target.name}, which is required',
                        f'add input_map {{ key: "{io.name}" value: "<ensemble tensor>" }}',
                    )


def _connect(tensors: dict[str, _Tensor], name: str, mine: _Tensor, field: str, say: Say) -> None:
    """Record what one end says tensor `name` is, or compare it with what an earlier end said.

    Same rule as Triton: equal data types, and dims equal up to -1, either as declared or with
    the batch dimension added (a batching and a non-batching model may share a tensor).
    """
    known = tensors.setdefault(name, mine)
    if known is mine:
        return
    if known.data_type != mine.data_type:
        say(
            field,
            f'connects tensor "{name}" of {DataType.Name(known.data_type)} '
            f"({known.origin}) to {DataType.Name(mine.data_type)} ({mine.origin})",
            "declare the same data_type on both ends",
        )
    elif not _wildcard_equal(known.dims, mine.dims) and not _wildcard_equal(
        known.full_dims, mine.full_dims
    ):
        say(
            field,
            f'connects tensor "{name}" of shape {_dims(known.full_dims)} '
            f"({known.origin}) to shape {_dims(mine.full_dims)} ({mine.origin})",
            "declare the same dims on both ends (-1 for a variable dimension)",
        )


def _wildcard_equal(left: Sequence[int], right: Sequence[int]) -> bool:
    return len(left) == len(right) and all(
        a == b or -1 in (a, b) for a, b in zip(left, right, strict=True)
    )


# --- Formatting ---------------------------------------------------------------------------------


def _dims(dims: Iterable[int]) -> str:
    """Dims as config.pbtxt writes them, so a fix can be pasted."""
    values = ", ".join(str(d) for d in dims)
    return f"[ {values} ]" if values else "[ ]"


def _config_dims(shape: Iterable[OnnxDim]) -> str:
    return _dims(d if isinstance(d, int) else -1 for d in shape)


def _onnx_dims(shape: Iterable[OnnxDim]) -> str:
    values = ", ".join("?" if d is None else str(d) for d in shape)
    return f"[ {values} ]" if values else "[ ]"


def _names(names: Iterable[str]) -> str:
    return ", ".join(f'"{n}"' for n in sorted(names)) or "none"


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""


# --- both servers' schemas ------------------------------------------------------------------------
# Configs are parsed with tritonclient's model_config_pb2, whose schema is the container's
# (tritonclient 2.73 ships common's model_config.proto, unchanged since release 26.07 = Triton
# 2.71): a field unknown there is a parse error above. The embedded runtime runs Triton 2.51
# (release 24.10), which refuses the fields added since; docs/versions.md has the diff.
FIELDS_NEWER_THAN_EMBEDDED = {
    "ModelConfig.model_metrics": "26.xx (per-model metric histogram buckets)",
    "ModelEnsembling.max_inflight_requests": "26.xx (ensemble in-flight limit)",
}
EMBEDDED_TRITON = "2.51"


def check_schema_skew(repository: Path) -> list[str]:
    """One message per config (config.pbtxt and configs/*.pbtxt) that sets a field Triton 2.51
    does not know: the container would serve it, the embedded runtime would refuse to load it."""
    repository = Path(repository)
    problems: list[str] = []
    paths = sorted(repository.glob("*/config.pbtxt")) + sorted(repository.glob("*/configs/*.pbtxt"))
    for config_path in paths:
        try:
            config = parse_config(config_path)
        except UserError:
            continue  # the schema check itself reports it
        for field in sorted(_set_fields(config) & FIELDS_NEWER_THAN_EMBEDDED.keys()):
            problems.append(
                f"{_shown(config_path)}: {field} is not in Triton {EMBEDDED_TRITON}'s schema "
                f"(added in {FIELDS_NEWER_THAN_EMBEDDED[field]}), so the embedded runtime "
                f"would refuse this config; remove `{field.split('.')[-1]}` so that both "
                "runtimes serve the same repository"
            )
    return problems


def _set_fields(message: Message) -> set[str]:
    """`<MessageType>.<field>` of every field set anywhere in a parsed config."""
    found: set[str] = set()
    for field, value in message.ListFields():
        found.add(f"{message.DESCRIPTOR.name}.{field.name}")
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = list(value.values())
        elif field.is_repeated:
            items = list(value)
        else:
            items = [value]
        for item in items:
            if isinstance(item, Message):
                found |= _set_fields(item)
    return found
