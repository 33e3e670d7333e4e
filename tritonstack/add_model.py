"""`tritonstack add-model MODEL.onnx --name NAME`: serve an ONNX model of yours as `classifier` is.

Reads the graph and writes model_repository/NAME/ (config.pbtxt for CPU hosts with dynamic
batching, configs/gpu.pbtxt for GPU hosts with ONNX Runtime's TensorRT provider, 1/model.onnx,
labels.txt with --labels) and model_repository/NAME_trt/ (the TensorRT variant the GPU
container builds a plan for from NAME/1/model.onnx; GPU hosts only). Unless --private, NAME
joins stack.env's PUBLIC_MODELS, so the gateway routes it and the health check, the deep probe
and the load test call it; then the files derived from the repository are written again
(gateway/models.map and limits.env, the deep probe's, the Kubernetes copies). Nothing else needs
an edit: `docker compose up -d --build` serves it.

The graph decides what is written: every input and output with its Triton datatype and dims,
the batch dimension taken from a symbolic first dimension (which every input and output must
have: Triton's dynamic batcher stacks requests along it). A refusal (not an ONNX file, a name
taken, a labels file missing or of the wrong count, an input Triton cannot batch or this stack
cannot serve) is one line naming what is wrong and the fix, and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tritonstack.errors import UserError

#: ONNX TensorProto element types and the Triton datatypes they are served as.
ONNX_TO_TRITON = {
    1: "TYPE_FP32",
    2: "TYPE_UINT8",
    3: "TYPE_INT8",
    4: "TYPE_UINT16",
    5: "TYPE_INT16",
    6: "TYPE_INT32",
    7: "TYPE_INT64",
    8: "TYPE_STRING",
    9: "TYPE_BOOL",
    10: "TYPE_FP16",
    11: "TYPE_FP64",
    12: "TYPE_UINT32",
    13: "TYPE_UINT64",
    16: "TYPE_BF16",
}
DEFAULT_MAX_BATCH_SIZE = 64
LABELS_FILE = "labels.txt"
#: The TensorRT variant's name: the container's entrypoint builds a plan for `<name>_trt` from
#: `<name>/1/model.onnx` (scripts/entrypoint.sh).
TRT_SUFFIX = "_trt"


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1: any size


@dataclass(frozen=True)
class Graph:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]


def read_graph(path: Path) -> Graph:
    """The graph's inputs and outputs, each with its batch dimension taken off."""
    import onnx

    if not path.is_file():
        raise UserError(f"{path}: no such file; give the path of an .onnx model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError and friends: whatever protobuf raises
        raise UserError(f"{path}: not an ONNX file ({type(exc).__name__}); export one with "
                        "torch.onnx.export or skl2onnx") from None  # fmt: skip
    graph = model.graph
    if not graph.output or not graph.node:
        raise UserError(f"{path}: not an ONNX model (no graph); export one with torch.onnx.export")
    initializers = {i.name for i in graph.initializer}
    inputs = [v for v in graph.input if v.name not in initializers]
    if not inputs:
        raise UserError(f"{path}: the graph takes no input")
    return Graph(
        tuple(_tensor(path, v, "input") for v in inputs),
        tuple(_tensor(path, v, "output") for v in graph.output),
    )


def _tensor(path: Path, value, role: str) -> Tensor:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        raise UserError(
            f"{path}: {role} {value.name} is a {kind}, not a tensor: Triton serves tensors"
        )
    tensor = value.type.tensor_type
    datatype = ONNX_TO_TRITON.get(tensor.elem_type)
    if datatype is None:
        raise UserError(f"{path}: {role} {value.name} has ONNX element type {tensor.elem_type}, "
                        "which Triton does not serve")  # fmt: skip
    if role == "input" and datatype == "TYPE_STRING":
        raise UserError(
            f"{path}: input {value.name} holds strings: this stack serves numeric and boolean "
            "inputs, whose request size the gateway bounds from their dims; tokenize before the "
            "model (or serve the strings through a Python model of your own)"
        )
    if not tensor.HasField("shape") or not tensor.shape.dim:
        raise UserError(
            f"{path}: {role} {value.name} has no batch dimension (shape "
            f"{'unknown' if not tensor.HasField('shape') else '[]'}): Triton's dynamic batcher "
            "stacks requests along a symbolic first dimension; export with one (torch.onnx.export "
            "dynamic_axes={name: {0: 'batch'}})"
        )
    dims = list(tensor.shape.dim)
    first = dims[0]
    if first.HasField("dim_value"):
        raise UserError(
            f"{path}: {role} {value.name}'s first dimension is fixed ({first.dim_value}): Triton's "
            "dynamic batcher stacks requests along a symbolic first dimension; export with "
            "dynamic_axes={name: {0: 'batch'}} (torch.onnx.export)"
        )
    rest = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims[1:])
    if role == "input" and any(d < 1 for d in rest):
        shape = ["batch", *("?" if d < 1 else d for d in rest)]
        raise UserError(
            f"{path}: input {value.name} has shape {shape}: besides the batch dimension this "
            "stack serves fixed sizes (the gateway bounds each request from them); export with "
            "the other dimensions fixed (pad sequences to a length)"
        )
    return Tensor(value.name, datatype, rest)


def read_labels(path: Path, graph: Graph) -> tuple[list[str], list[str]]:
    """(labels, the outputs they name the classes of): one label per line, as many as the last
    dimension of at least one output."""
    try:
        labels = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise UserError(f"--labels {path}: cannot read it ({reason})") from None
    while labels and not labels[-1].strip():
        labels.pop()
    if not labels:
        raise UserError(
            f"--labels {path}: no label in it; write one label per line, in class order"
        )
    blank = [n for n, label in enumerate(labels, 1) if not label.strip()]
    if blank:
        raise UserError(f"--labels {path}: line {blank[0]} is empty; one label per line")
    if len(set(labels)) < len(labels):
        raise UserError(f"--labels {path}: a label appears twice; each class needs its own")
    outputs = [o.name for o in graph.outputs if o.dims and o.dims[-1] == len(labels)]
    if not outputs:
        counts = {o.name: (o.dims[-1] if o.dims else 1) for o in graph.outputs}
        raise UserError(
            f"--labels {path} has {len(labels)} labels, but no output has {len(labels)} classes "
            f"(the last dimension of each: {counts}); one label per class, in class order"
        )
    return labels, outputs


def _io(tensors, labelled: list[str] = ()) -> str:
    entries = []
    for t in tensors:
        dims = ", ".join(str(d) for d in t.dims)
        label = f'\n    label_filename: "{LABELS_FILE}"' if t.name in labelled else ""
        lines = [f'    name: "{t.name}"', f"    data_type: {t.datatype}", f"    dims: [ {dims} ]"]
        entries.append("  {\n" + "\n".join(lines) + label + "\n  }")
    return "[\n" + ",\n".join(entries) + "\n]"


def _tensors(
    name: str, platform: str, graph: Graph, max_batch_size: int, labelled: list[str]
) -> str:
    """What every config written here opens with: the model, its platform and its tensors."""
    return f"""name: "{name}"
platform: "{platform}"
max_batch_size: {max_batch_size}
input {_io(graph.inputs)}
output {_io(graph.outputs, labelled)}"""


def cpu_config(
    name: str, graph: Graph, max_batch_size: int, labelled: list[str], source: str
) -> str:
    return f"""# {name}: added by `tritonstack add-model` from {source}; served as classifier is.
# Inputs and outputs as the ONNX graph has them, the batch dimension (max_batch_size) taken off.
{_tensors(name, "onnxruntime_onnx", graph, max_batch_size, labelled)}
# Requests arriving while an execution runs join the next one. No queue policy: it would turn off
# the batcher's prefetching (classifier/config.pbtxt says why); the gateway refuses overload.
dynamic_batching {{
  max_queue_delay_microseconds: 100
}}
# One intra-op thread per instance, two instances: two batches at once on a small CPU.
parameters {{
  key: "intra_op_thread_count"
  value: {{ string_value: "1" }}
}}
instance_group [
  {{
    count: 2
    kind: KIND_CPU
  }}
]
"""


def _warmup(graph: Graph, rows: int, title: str) -> str:
    inputs = "\n".join(
        f'    inputs {{\n      key: "{t.name}"\n      value: {{ data_type: {t.datatype}, '
        f"dims: [ {', '.join(str(d) for d in t.dims)} ], zero_data: true }}\n    }}"
        for t in graph.inputs
    )
    return f'  {{\n    name: "{title}"\n    batch_size: {rows}\n{inputs}\n  }}'


def _one_gpu_instance(
    name: str, platform: str, graph: Graph, max_batch_size: int, labelled: list[str]
) -> str:
    """What both GPU configs hold: the tensors, the batcher and one instance on the GPU."""
    return f"""{_tensors(name, platform, graph, max_batch_size, labelled)}
dynamic_batching {{
  max_queue_delay_microseconds: 100
}}
instance_group [
  {{
    count: 1
    kind: KIND_GPU
  }}
]
"""


def gpu_config(
    name: str, graph: Graph, max_batch_size: int, labelled: list[str], source: str
) -> str:
    warmups = ",\n".join(
        [_warmup(graph, 1, "one row"), _warmup(graph, max_batch_size, "full batch")]
    )
    return f"""# {name} on GPU hosts (`--model-config-name=gpu`, which the container's entrypoint
# passes when it sees a GPU); added by `tritonstack add-model` from {source}. As config.pbtxt,
# but one instance on the GPU, ONNX Runtime's TensorRT provider with its engines cached where
# the entrypoint keys them (GPU, TensorRT, weights), and warmup with one row and a full batch,
# so the engine for every batch size is built before the model reports ready.
{_one_gpu_instance(name, "onnxruntime_onnx", graph, max_batch_size, labelled)}optimization {{
  execution_accelerators {{
    gpu_execution_accelerator: [
      {{
        name: "tensorrt"
        parameters {{ key: "max_workspace_size_bytes" value: "1073741824" }}
        parameters {{ key: "trt_engine_cache_enable" value: "1" }}
        parameters {{ key: "trt_engine_cache_path" value: "/tmp/tritonstack-onnxruntime-trt" }}
      }}
    ]
  }}
}}
model_warmup [
{warmups}
]
"""


def trt_config(name: str, graph: Graph, max_batch_size: int, labelled: list[str]) -> str:
    return f"""# {name} as a TensorRT engine, for GPU hosts only. 1/model.plan is not committed: the
# container's entrypoint builds it with trtexec from {name.removesuffix(TRT_SUFFIX)}/1/model.onnx
# on first start (a plan is specific to the GPU and the TensorRT version). CPU hosts leave it out.
{_one_gpu_instance(name, "tensorrt_plan", graph, max_batch_size, labelled)}"""


def write_model(
    staging: Path,
    name: str,
    onnx_file: Path,
    graph: Graph,
    max_batch_size: int,
    labels: list[str] | None,
    labelled: list[str],
) -> None:
    """NAME/ and NAME_trt/ under `staging`."""
    source = onnx_file.name
    model = staging / name
    (model / "1").mkdir(parents=True)
    (model / "configs").mkdir()
    shutil.copyfile(onnx_file, model / "1" / "model.onnx")
    (model / "config.pbtxt").write_text(cpu_config(name, graph, max_batch_size, labelled, source))
    (model / "configs" / "gpu.pbtxt").write_text(
        gpu_config(name, graph, max_batch_size, labelled, source)
    )
    trt = staging / f"{name}{TRT_SUFFIX}"
    (trt / "1").mkdir(parents=True)
    (trt / "config.pbtxt").write_text(
        trt_config(f"{name}{TRT_SUFFIX}", graph, max_batch_size, labelled)
    )
    if labels is not None:
        text = "\n".join(labels) + "\n"
        (model / LABELS_FILE).write_text(text)
        # The engine's labels: Triton reads label_filename from the model's own directory.
        (trt / LABELS_FILE).symlink_to(Path("..") / name / LABELS_FILE)
    # An empty version directory survives git (the plan is built on the GPU host).
    (trt / "1" / ".gitkeep").write_text("")


def add_model(
    onnx_file: Path,
    name: str,
    labels_file: Path | None = None,
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    public: bool = True,
    root: Path | None = None,
) -> list[Path]:
    """Add the model to the project at `root` (default: the project folder); returns what was
    written. Everything is checked before anything is written."""
    from tritonstack import settings
    from tritonstack.check import check_repository
    from tritonstack.contract import LLM_MODEL
    from tritonstack.limits import model_limits
    from tritonstack.project import project_dir
    from tritonstack.repository import iter_models

    root = project_dir() if root is None else Path(root)
    repository = root / "model_repository"
    if not settings.MODEL_NAME.fullmatch(name) or name in (".", ".."):
        raise UserError(
            f"--name {name!r}: a model name of letters, digits, '_', '.' and '-' (Triton's model "
            "directory and URL segment), starting with a letter, digit or '_'"
        )
    taken = {m.name for m in iter_models(repository)} | {LLM_MODEL}
    for candidate in (name, f"{name}{TRT_SUFFIX}"):
        if candidate in taken or (repository / candidate).exists():
            raise UserError(
                f"--name {name}: {repository / candidate} already exists; choose another name, "
                "or remove that model first"
            )
    if max_batch_size < 1:
        raise UserError(f"--max-batch-size {max_batch_size}: at least 1 (Triton batches rows)")
    graph = read_graph(onnx_file)
    labels, labelled = read_labels(labels_file, graph) if labels_file else (None, [])
    stack_path = root / settings.FILE_NAME
    stack_text = stack_path.read_text()
    new_stack = settings.with_public_model(stack_text, name) if public else stack_text
    settings.parse(new_stack, str(stack_path))

    # Staged beside the repository (the same file system, so each move into it is one rename),
    # never inside it, where Triton would take the folder for a model.
    with tempfile.TemporaryDirectory(prefix=f".add-model-{name}-", dir=root) as staging:
        staging = Path(staging)
        write_model(staging, name, onnx_file, graph, max_batch_size, labels, labelled)
        # The new model checked as `tritonstack check` checks a repository: in a view of the
        # repository with the new model in it, before any of it is in place.
        view = staging / "view"
        view.mkdir()
        for model in iter_models(repository):
            (view / model.name).symlink_to(model.directory.resolve())
        for added in (name, f"{name}{TRT_SUFFIX}"):
            (view / added).symlink_to(staging / added)
        ours = (
            f"{view / name}/",
            f"{view / name}{TRT_SUFFIX}/",
            f"{name}/",
            f"{name}{TRT_SUFFIX}/",
        )
        problems = [p for p in check_repository(view) if any(mark in p for mark in ours)]
        if problems:
            raise UserError(f"{onnx_file}: {problems[0]}")
        if public:
            model_limits(next(m for m in iter_models(view) if m.name == name))
        written = []
        for added in (name, f"{name}{TRT_SUFFIX}"):
            os.rename(staging / added, repository / added)
            written.append(repository / added)
    try:
        if new_stack != stack_text:
            stack_path.write_text(new_stack)
            written.append(stack_path)
        written += regenerate(root)
    except BaseException:
        for added in (name, f"{name}{TRT_SUFFIX}"):
            shutil.rmtree(repository / added, ignore_errors=True)
        stack_path.write_text(stack_text)
        raise
    return written


def regenerate(root: Path) -> list[Path]:
    """The files derived from the repository and stack.env, and their Kubernetes copies."""
    from tritonstack import derived

    written = derived.write(root)
    kubernetes = root / "deploy" / "kubernetes"
    if kubernetes.is_dir():
        from tritonstack import k8s

        written += k8s.write(kubernetes)
    return written


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("onnx_file", type=Path, metavar="MODEL.onnx", help="the ONNX model")
    parser.add_argument("--name", required=True, help="the model's name in the repository and URLs")
    parser.add_argument(
        "--labels",
        type=Path,
        default=None,
        help="one label per class, in class order: served through Triton's classification "
        "extension on the outputs with that many classes",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=DEFAULT_MAX_BATCH_SIZE,
        help=f"rows per request and per batch (default {DEFAULT_MAX_BATCH_SIZE})",
    )
    parser.add_argument(
        "--private",
        dest="public",
        action="store_false",
        help="leave it out of stack.env's PUBLIC_MODELS: not routed by the gateway",
    )


def run(args: argparse.Namespace) -> int:
    from tritonstack.project import project_dir

    root = project_dir()
    written = add_model(args.onnx_file, args.name, args.labels, args.max_batch_size, args.public)
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    public = "public: the gateway routes it" if args.public else "private: not routed"
    print(
        f"added {args.name} ({public}). Next: `tritonstack check`, `tritonstack serve` (or "
        f"`docker compose up -d --build`), `tritonstack infer --model {args.name}`, "
        f"`tritonstack loadtest --model {args.name}`"
    )
    return 0
