"""`tritonstack add-model MODEL.onnx --name NAME`: serve an ONNX model of yours as `classifier` is.

The graph and one run of it (tritonstack.check.onnx_serving) decide what is written: whether the
model batches, its tensors as Triton takes them (variable dims as -1 with their bounds, a per-row
scalar as `dims: [1]` with an empty reshape, strings), the state its client carries, outputs as they
really are; with --server-state, the state kept by Triton's sequence batcher instead. Into
model_repository/:

- NAME/: config.pbtxt for CPU hosts (the dynamic batcher when it batches), configs/gpu.pbtxt for
  GPU hosts (ONNX Runtime's TensorRT provider with a profile from the bounds, where TensorRT can
  build the graph), 1/model.onnx, labels.txt with --labels;
- NAME_trt/: the TensorRT plan variant the GPU container builds with trtexec from NAME's
  model.onnx, only where TensorRT can build the graph (`--tensorrt` says otherwise); its own
  copy of the labels, since Triton refuses a label file that resolves outside its model folder.

Before anything is written the model is checked as `tritonstack check` checks a repository and
loaded by the real tritonserver, whose answer to a request at the opt shape must equal
onnxruntime's; a model Triton would not load is refused with Triton's own words. Unless
--private, NAME joins stack.env's PUBLIC_MODELS and the files derived from the repository are
written again (gateway/models.map and limits.env, the deep probe's, the Kubernetes copies), so
`tritonstack serve` and `docker compose up -d --build` serve it with no other edit. Every refusal
is one line naming what is wrong and the fix, and writes nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from tritonstack.check import onnx_serving
from tritonstack.check.onnx_serving import DEFAULT_MAX_STRING_BYTES, Plan
from tritonstack.core.config_text import render
from tritonstack.core.errors import UserError
from tritonstack.launcher.tensorrt import ENGINE_LINKS

LABELS_FILE = "labels.txt"
#: The TensorRT variant's name: the container's entrypoint builds a plan for `<name>_trt` from
#: `<name>/1/model.onnx` (tritonstack.launcher.tensorrt).
TRT_SUFFIX = "_trt"
#: trtexec's --minShapes/--optShapes/--maxShapes for the plan variant, one parameter each: the
#: entrypoint passes them as they are (names quoted, so any name but one with a quote works).
TRTEXEC_SHAPES = {
    "min": "tritonstack.trtexec_min_shapes",
    "opt": "tritonstack.trtexec_opt_shapes",
    "max": "tritonstack.trtexec_max_shapes",
}
CPU_INSTANCES = 2
BATCH_DELAY_US = 100


def read_labels(path: Path, plan: Plan) -> tuple[list[str], list[str]]:
    """(labels, the outputs they name the classes of): one label per line, as many as the last
    dimension of a score output. A classifier's integer class output keeps its numbers: Triton's
    classification extension ranks an output's values, so the labels go on the scores, whose top
    class is the same one."""
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
    if len(labels) < 2:
        raise UserError(
            f"--labels {path}: one label, but a classifier's scores rank two classes or more "
            "(Triton's classification extension would give every answer that label); leave "
            "--labels out for a regressor or a single score"
        )
    scores = [
        entry["name"]
        for entry in plan.io("output")
        if entry["data_type"] in ("TYPE_FP16", "TYPE_BF16", "TYPE_FP32", "TYPE_FP64")
        and entry["dims"]
        and entry["dims"][-1] == len(labels)
    ]
    if not scores:
        counts = {e["name"]: e["dims"][-1] if e["dims"] else 1 for e in plan.io("output")}
        raise UserError(
            f"--labels {path} has {len(labels)} labels, but no score output has {len(labels)} "
            f"classes (the last dimension of each: {counts}); one label per class, in class order"
        )
    return labels, scores


def _tensors(plan: Plan, labelled: list[str]) -> dict:
    outputs = plan.io("output")
    for entry in outputs:
        if entry["name"] in labelled:
            entry["label_filename"] = LABELS_FILE
    return {"max_batch_size": plan.max_batch_size, "input": plan.io("input"), "output": outputs}


def _parameters(values: dict[str, str]) -> dict:
    return {key: {"string_value": value} for key, value in values.items()}


def _has_strings(plan: Plan) -> bool:
    return any(t.elem_type == 8 for t in (*plan.graph.inputs, *plan.graph.outputs))


def _shape_spec(plan: Plan, which: str, quote: str = "") -> str:
    """`name:AxB,...` of every input at a bound (trtexec's and ONNX Runtime's TensorRT format)."""
    return ",".join(
        f"{quote}{t.name}{quote}:{'x'.join(str(d) for d in plan.full_shape(t.name, which))}"
        for t in plan.graph.inputs
    )


def cpu_config(name: str, plan: Plan, labelled: list[str], source: str) -> str:
    config = {
        "name": name,
        "platform": "onnxruntime_onnx",
        **_tensors(plan, labelled),
        "instance_group": [{"count": CPU_INSTANCES, "kind": "KIND_CPU"}],
        "parameters": _parameters({"intra_op_thread_count": "1", **plan.parameters()}),
    }
    _batcher(config, plan)
    batching = (
        "Requests arriving while an execution runs join the next one. No queue policy: it would\n"
        "turn off the batcher's prefetching (classifier/config.pbtxt says why); the gateway\n"
        "refuses overload."
        if plan.batched
        else "No batching (max_batch_size 0): the graph's first axis is not a batch of rows."
    )
    if plan.server_state:
        batching = (
            "State kept in the server: the sequence batcher sends every request of a sequence\n"
            "(the client's sequence ID) to one instance and feeds each state output back as its\n"
            "input; a sequence starts from zeros. No queue policy: the gateway refuses overload."
        )
    return render(
        config,
        f"{name}: added by `tritonstack add-model` from {source}; served as classifier is.\n"
        "Inputs and outputs as the ONNX graph has them (and as running it showed), the batch\n"
        f"dimension (max_batch_size) taken off.\n{batching}\n"
        f"One intra-op thread per instance, {CPU_INSTANCES} instances: two requests at once on a "
        "small CPU.\nRegenerate with `tritonstack add-model`; tritonstack.* parameters are read "
        "by this\nstack's clients and the gateway (tritonstack/check/onnx_serving.py), "
        "not by Triton.",
    )


def gpu_config(name: str, plan: Plan, labelled: list[str], source: str) -> str:
    strings = _has_strings(plan)
    config = {
        "name": name,
        "platform": "onnxruntime_onnx",
        **_tensors(plan, labelled),
        # Triton's onnxruntime backend keeps string tensors on the CPU.
        "instance_group": [{"count": 1, "kind": "KIND_CPU" if strings else "KIND_GPU"}],
    }
    if plan.parameters():
        config["parameters"] = _parameters(plan.parameters())
    _batcher(config, plan)
    accelerated = plan.no_tensorrt is None and not strings
    if accelerated:
        settings = {
            "max_workspace_size_bytes": "1073741824",
            "trt_engine_cache_enable": "1",
            "trt_engine_cache_path": f"{ENGINE_LINKS}/{name}",
        }
        if _profile_names_ok(plan):
            for which in ("min", "opt", "max"):
                settings[f"trt_profile_{which}_shapes"] = _shape_spec(plan, which)
        config["optimization"] = {
            "execution_accelerators": {
                "gpu_execution_accelerator": [{"name": "tensorrt", "parameters": settings}]
            }
        }
        if not plan.server_state:
            # Warmup requests go to the backend without a sequence: no state to read or write.
            config["model_warmup"] = [
                _warmup(plan, "opt rows", plan.rows("opt")),
                _warmup(plan, "full batch", plan.rows("max")),
            ]
    why = (
        "ONNX Runtime's TensorRT provider with its engines\n"
        "cached where the entrypoint keys them (GPU, TensorRT, weights), a profile from the\n"
        "inputs' bounds, and warmup at the opt shape and a full batch, so the engines are built\n"
        "before the model reports ready."
        if accelerated
        else "ONNX Runtime's CUDA provider only:\n"
        f"TensorRT cannot build it ({plan.no_tensorrt or 'string tensors'})."
    )
    return render(
        config,
        f"{name} on GPU hosts (`--model-config-name=gpu`, which the container's entrypoint passes\n"
        f"when it sees a GPU); added by `tritonstack add-model` from {source}. As config.pbtxt,\n"
        f"but one instance on the GPU, and {why}",
    )


def _batcher(config: dict, plan: Plan) -> None:
    """The dynamic batcher for a model that batches, or the sequence batcher for state kept
    in the server (it batches too: one slot per sequence, up to max_batch_size)."""
    if plan.server_state:
        config["sequence_batching"] = plan.sequence_batching()
    elif plan.batched:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": BATCH_DELAY_US}


def _profile_names_ok(plan: Plan) -> bool:
    """ONNX Runtime's profile strings split on ',' and ':': names holding them cannot be said."""
    return not any(set(t.name) & {",", ":"} for t in plan.graph.inputs)


def _warmup(plan: Plan, title: str, rows: int) -> dict:
    inputs = {}
    for entry in plan.io("input"):
        tensor = next(t for t in plan.graph.inputs if t.name == entry["name"])
        dims = entry["dims"]
        if tensor.name in plan.bounds:
            dims = list(plan.bounds[tensor.name].opt)
        inputs[tensor.name] = {"data_type": entry["data_type"], "dims": dims, "zero_data": True}
    return {"name": title, "batch_size": rows if plan.batched else 1, "inputs": inputs}


def trt_config(name: str, plan: Plan, labelled: list[str]) -> str:
    config = {
        "name": name,
        "platform": "tensorrt_plan",
        **_tensors(plan, labelled),
        "instance_group": [{"count": 1, "kind": "KIND_GPU"}],
        "parameters": _parameters(
            {
                **plan.parameters(),
                **{key: _shape_spec(plan, which, "'") for which, key in TRTEXEC_SHAPES.items()},
            }
        ),
    }
    _batcher(config, plan)
    source = name.removesuffix(TRT_SUFFIX)
    return render(
        config,
        f"{name} as a TensorRT engine, for GPU hosts only. 1/model.plan is not committed: the\n"
        f"container's entrypoint builds it with trtexec from {source}/1/model.onnx on first start\n"
        "(a plan is specific to the GPU and the TensorRT version), with the shapes of the\n"
        "tritonstack.trtexec_* parameters (the inputs' bounds). CPU hosts leave it out.",
    )


def wants_tensorrt(plan: Plan, option: str) -> bool:
    """Whether to write NAME_trt: `auto` where TensorRT can build the graph."""
    if option == "never":
        return False
    if plan.server_state:
        if option == "always":
            raise UserError("--tensorrt always: a plan variant keeping state in the server is "
                            "not made (the ONNX model on a GPU host uses TensorRT through ONNX "
                            "Runtime); leave --server-state out or --tensorrt auto")  # fmt: skip
        return False
    if any("'" in t.name or '"' in t.name or "\\" in t.name for t in plan.graph.inputs):
        if option == "always":
            raise UserError("--tensorrt always: an input name holds a quote or a backslash, "
                            "which trtexec's shape options cannot carry")  # fmt: skip
        return False
    return option == "always" or plan.no_tensorrt is None


def write_model(
    staging: Path,
    name: str,
    source: str,
    plan: Plan,
    labels: list[str] | None,
    labelled: list[str],
    tensorrt: bool,
) -> list[str]:
    """NAME/ (and NAME_trt/ with `tensorrt`) under `staging`; the folders written."""
    import onnx

    model = staging / name
    (model / "1").mkdir(parents=True)
    (model / "configs").mkdir()
    onnx.save(plan.model, str(model / "1" / "model.onnx"))
    (model / "config.pbtxt").write_text(cpu_config(name, plan, labelled, source))
    (model / "configs" / "gpu.pbtxt").write_text(gpu_config(name, plan, labelled, source))
    written = [name]
    if labels is not None:
        (model / LABELS_FILE).write_text("\n".join(labels) + "\n")
    if tensorrt:
        trt = staging / f"{name}{TRT_SUFFIX}"
        (trt / "1").mkdir(parents=True)
        (trt / "config.pbtxt").write_text(trt_config(f"{name}{TRT_SUFFIX}", plan, labelled))
        if labels is not None:
            # A copy, not a link: Triton (core r26.02 on) refuses a label file that resolves
            # outside its own model folder.
            shutil.copyfile(model / LABELS_FILE, trt / LABELS_FILE)
        # An empty version directory survives git (the plan is built on the GPU host).
        (trt / "1" / ".gitkeep").write_text("")
        written.append(trt.name)
    return written


def load_in_triton(view: Path, name: str, plan: Plan) -> None:
    """Serve `name` alone from the repository at `view` with the real tritonserver and send it
    one request at the opt shape: Triton's own refusal, or an answer other than onnxruntime's,
    is a UserError."""
    from tritonstack.clients.client import infer
    from tritonstack.core.ports import free_ports
    from tritonstack.serve.runtime import EmbeddedTriton

    alone = view.parent / "alone"
    alone.mkdir()
    (alone / name).symlink_to((view / name).resolve())
    http, grpc, metrics = free_ports(3)
    log = view.parent / "tritonserver.log"
    server = EmbeddedTriton(alone, http, grpc, metrics, log_path=log, exit_timeout_secs=2)
    try:
        server.start(timeout=120)
    except UserError:
        raise UserError(f"Triton does not load {name}: {triton_error(log, name)}") from None
    try:
        rng = np.random.default_rng(1)
        feeds = {
            t.name: onnx_serving.random_array(t.elem_type, plan.full_shape(t.name, "opt"), rng)
            for t in plan.graph.inputs
        }
        if plan.server_state:  # a sequence's start: one row, its state the initial one (zeros)
            feeds = {k: v[:1] if plan.batched else v for k, v in feeds.items()}
            for state in plan.state:
                feeds[state] = np.zeros_like(feeds[state])
        sent = {e["name"]: _as_request(plan, e["name"], feeds[e["name"]]) for e in plan.io("input")}
        answer = infer(server.http_url, name, sent, timeout=60)
        expected = onnx_serving.Runner(plan.model).run(feeds)
    finally:
        server.stop(grace=0.5)  # a throwaway server: no request of anyone's to drain
    for output in plan.io("output"):
        output = next(t for t in plan.graph.outputs if t.name == output["name"])
        got, want = answer[output.name], expected[output.name]
        want = want.reshape(got.shape) if want.size == got.size else want
        same = (
            np.allclose(got, want, rtol=1e-5, atol=1e-6)
            if want.dtype.kind in "fc"
            else np.array_equal(got, _as_triton(want))
        )
        if got.shape != want.shape or not same:
            raise UserError(
                f"{name}: Triton answered {output.name} {list(got.shape)} unlike onnxruntime "
                f"{list(want.shape)} on the same input; report this as a tritonstack bug"
            )


def _as_request(plan: Plan, name: str, array: np.ndarray) -> np.ndarray:
    """A graph-shaped input as a request carries it: a rank-0 or per-row scalar as [1]."""
    entry = next(e for e in plan.io("input") if e["name"] == name)
    if entry["dims"] == [1] and array.ndim == int(plan.batched):
        return array.reshape(*array.shape, 1)
    return array


def _as_triton(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.object_:
        return np.array([str(v).encode() for v in array.reshape(-1)], dtype=np.object_).reshape(
            array.shape
        )
    return array


def triton_error(log: Path, name: str) -> str:
    """Triton's own words for why `name` did not load, from its log."""
    text = log.read_text(errors="replace") if log.is_file() else ""
    for line in text.splitlines():
        if f"failed to load '{name}'" in line:
            reason = line.split(f"failed to load '{name}' version 1: ", 1)[-1]
            reason = reason.split("\\n\\nAt:")[0].replace("\\n", " ").strip().rstrip('"')
            return " ".join(reason.split())
    errors = [line for line in text.splitlines() if line.startswith("E")]
    return " ".join((errors[-1] if errors else "no reason in its log").split())[:500]


def add_model(
    onnx_file: Path,
    name: str,
    labels_file: Path | None = None,
    max_batch_size: int | None = None,
    public: bool = True,
    root: Path | None = None,
    shapes: list[str] = (),
    state: list[str] | None = None,
    max_string_bytes: int = DEFAULT_MAX_STRING_BYTES,
    tensorrt: str = "auto",
    server_state: bool = False,
    log=print,
) -> list[Path]:
    """Add the model to the project at `root` (default: the project folder); returns what was
    written. Everything is checked, and the model loaded by Triton, before anything is written."""
    from tritonstack.check.repository import check_repository
    from tritonstack.core import settings
    from tritonstack.core.contract import LLM_MODEL
    from tritonstack.core.limits import model_limits
    from tritonstack.core.project import project_dir
    from tritonstack.core.repository import iter_models

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
    given_state = None
    if state is not None:
        given_state = {} if list(state) == ["none"] else onnx_serving.parse_state(state)
    plan = onnx_serving.plan(
        Path(onnx_file),
        max_batch_size,
        onnx_serving.parse_shapes(shapes),
        given_state,
        max_string_bytes,
        server_state,
    )
    labels, labelled = read_labels(labels_file, plan) if labels_file else (None, [])
    with_plan = wants_tensorrt(plan, tensorrt)
    stack_path = root / settings.FILE_NAME
    stack_text = stack_path.read_text()
    new_stack = settings.with_public_model(stack_text, name) if public else stack_text
    settings.parse(new_stack, str(stack_path))

    # Staged beside the repository (the same file system, so each move into it is one rename),
    # never inside it, where Triton would take the folder for a model.
    with tempfile.TemporaryDirectory(prefix=f".add-model-{name}-", dir=root) as staging:
        staging = Path(staging)
        added = write_model(staging, name, Path(onnx_file).name, plan, labels, labelled,
                            with_plan)  # fmt: skip
        # The new model checked as `tritonstack check` checks a repository: in a view of the
        # repository with the new model in it, before any of it is in place.
        view = staging / "view"
        view.mkdir()
        for model in iter_models(repository):
            (view / model.name).symlink_to(model.directory.resolve())
        for folder in added:
            (view / folder).symlink_to(staging / folder)
        ours = tuple(mark for folder in added for mark in (f"{view / folder}/", f"{folder}/"))
        shown = f"{view}/"
        problems = [p for p in check_repository(view) if any(mark in p for mark in ours)]
        if problems:
            raise UserError(f"{onnx_file}: {problems[0].replace(shown, '')}")
        if public:
            try:
                model_limits(next(m for m in iter_models(view) if m.name == name))
            except UserError as exc:
                raise UserError(f"{onnx_file}: {str(exc).replace(shown, '')}") from None
        load_in_triton(view, name, plan)
        for note in plan.notes:
            log(f"{name}: {note}")
        if not with_plan:
            log(f"{name}: no TensorRT plan variant ({plan.no_tensorrt or '--tensorrt never'})")
        written = []
        for folder in added:
            os.rename(staging / folder, repository / folder)
            written.append(repository / folder)
    try:
        if new_stack != stack_text:
            stack_path.write_text(new_stack)
            written.append(stack_path)
        written += regenerate(root)
    except BaseException:
        for folder in added:
            shutil.rmtree(repository / folder, ignore_errors=True)
        stack_path.write_text(stack_text)
        raise
    return written


def regenerate(root: Path) -> list[Path]:
    """The files derived from the repository and stack.env, and their Kubernetes copies."""
    from tritonstack.render import derived

    written = derived.write(root)
    kubernetes = root / "deploy" / "kubernetes"
    if kubernetes.is_dir():
        from tritonstack.render import k8s

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
        "extension on the score outputs with that many classes",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help=f"rows per request and per batch (default {onnx_serving.DEFAULT_MAX_BATCH_SIZE} "
        "when the graph batches; 0: one request at a time with full shapes)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=MIN:OPT:MAX",
        help="bounds of an input's variable dims, each a whole shape as the graph has it "
        "(e.g. images=1x3x32x32:8x3x640x640:16x3x1280x1280; the batch first when it batches); "
        "default for a dim the graph leaves open: "
        + ":".join(map(str, onnx_serving.DEFAULT_DIM_BOUNDS)),
    )
    parser.add_argument(
        "--state",
        action="append",
        default=None,
        metavar="INPUT=OUTPUT",
        help="state the client carries: OUTPUT's value is sent back as INPUT on the next call "
        "(default: pairs found by name, such as state=stateN, h0=hn; `--state none`: no state)",
    )
    parser.add_argument(
        "--server-state",
        action="store_true",
        help="keep that state in the server instead: Triton's sequence batcher feeds each "
        "output back within a sequence, and clients send a sequence ID (START and END) "
        "instead of the state; the gateway keeps a sequence on one replica",
    )
    parser.add_argument(
        "--max-string-bytes",
        type=int,
        default=DEFAULT_MAX_STRING_BYTES,
        help="the most bytes one value of a string input may hold (the gateway bounds requests "
        "with it; default %(default)s)",
    )
    parser.add_argument(
        "--tensorrt",
        choices=("auto", "always", "never"),
        default="auto",
        help="write the TensorRT plan variant NAME_trt: auto (default) where TensorRT can build "
        "the graph",
    )
    parser.add_argument(
        "--private",
        dest="public",
        action="store_false",
        help="leave it out of stack.env's PUBLIC_MODELS: not routed by the gateway",
    )


def run(args: argparse.Namespace) -> int:
    from tritonstack.core.project import project_dir

    root = project_dir()
    written = add_model(
        args.onnx_file,
        args.name,
        args.labels,
        args.max_batch_size,
        args.public,
        shapes=args.shape,
        state=args.state,
        max_string_bytes=args.max_string_bytes,
        tensorrt=args.tensorrt,
        server_state=args.server_state,
    )
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    public = "public: the gateway routes it" if args.public else "private: not routed"
    print(
        f"added {args.name} ({public}). Next: `tritonstack check`, `tritonstack serve` (or "
        f"`docker compose up -d --build`), `tritonstack infer --model {args.name}`, "
        f"`tritonstack loadtest --model {args.name}`"
    )
    return 0
