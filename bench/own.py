"""The `own` family: models of one's own, served as `tritonstack add-model` serves them, against
onnxruntime in-process and FastAPI + onnxruntime, on the same batches.

Two models of the kinds a user brings that the demo is not, with work enough per row that a
server's cost per request is not all there is to measure: `image`, a small CNN (three 3x3
convolutions, pooling, a linear head; random weights) taking any height and width, bounded by
--shape, every request at its opt size, 3x64x64; and `lightgbm`, a LightGBM classifier of 400
trees over 20 features converted by onnxmltools (ai.onnx.ml's TreeEnsembleClassifier, its label
output corrected by add-model). Each model is measured at every batch of ROW_COUNTS rows per
request, each apart: 8, the smallest batch the target names, and 32, where a request's fixed cost
(HTTP, the batcher, the backend's hop) is spread over four times the rows. For each model and
batch, rows per second of:

Every server and onnxruntime in-process cycle through the same VARIETY distinct batches.

- `onnxruntime`: the graph run in this process on one batch after another, in two layouts
  (one session with onnxruntime's own thread count, every core; one single-threaded session per
  core, each with its own caller): the faster is the ceiling a server is measured against;
- `triton`: the embedded Triton on a repository add-model wrote (dynamic batching, two
  instances of one thread), CLIENTS clients sending requests of that batch, as KServe v2 JSON and as
  binary tensors; its CPU split between tritonserver and the model's stubs, and the rows the
  batcher ran together (Triton's counters);
- `fastapi`: bench/fastapi_onnx_app.py in one uvicorn worker (one intra-op thread, as the model's
  config gives Triton's instances), the same JSON requests.

The target: Triton serves at least FLOOR of onnxruntime in-process, at every batch.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from bench.loadgen import Generator, Target, batches
from bench.servers import baseline_venv, cpu_delta, start_triton, start_uvicorn
from bench.stats import Rep, average_batch, summarize

#: Rows per request, each measured apart: the target names every batch of 8 rows or more.
ROW_COUNTS = (8, 32)
CLIENTS = 16
FLOOR = 0.8
#: Distinct batches every server and onnxruntime in-process cycle through: a tree ensemble fed
#: one batch over and over has every branch predicted (8 rows of `lightgbm`: 8 µs a row against
#: 20 on new rows), which no real traffic gives.
VARIETY = 16
#: The models measured, and the --shape bounds add-model gets for each.
MODELS = ("image", "lightgbm")
SHAPES = {"image": ["images=1x3x32x32:8x3x64x64:32x3x128x128"], "lightgbm": []}
OPSET = 17
#: Points per model: (server, protocol); onnxruntime is measured in-process.
SERVERS = {
    "onnxruntime": "onnxruntime in-process",
    "triton": "Triton (add-model's config)",
    "fastapi": "FastAPI + onnxruntime (1 worker)",
}
PROTOCOLS = {"triton": ("http-json", "http-binary"), "fastapi": ("http-json",)}
#: onnxruntime in-process, each measured: the faster one is the ceiling a server is held to.
LAYOUTS = ("every core", "a 1-thread session per core")


@dataclass(frozen=True)
class OwnSettings:
    quick: bool
    warmup_s: float
    seconds: float
    reps: int
    row_counts: tuple[int, ...] = ROW_COUNTS


FULL = OwnSettings(quick=False, warmup_s=2, seconds=5, reps=3)
#: Quick mode's 1 s windows are shorter than one 32-row JSON request to FastAPI (about 3 s at 16
#: clients): it measures the smallest batch only.
QUICK = OwnSettings(quick=True, warmup_s=1, seconds=1, reps=1, row_counts=ROW_COUNTS[:1])


def cnn(path: Path) -> Path:
    """A small CNN over NCHW images of any size: 3x3 convolutions of 16, 32 and 64 channels
    (the last two with stride 2), ReLU, global average pooling, a linear head to 10 scores."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)

    def weight(name: str, shape) -> onnx.TensorProto:
        scale = 1 / np.sqrt(np.prod(shape[1:]))
        return numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name
        )

    nodes, weights, last = [], [], "images"
    for index, (channels, stride) in enumerate(((16, 1), (32, 2), (64, 2))):
        before = 3 if index == 0 else weights[-1].dims[0]
        weights.append(weight(f"w{index}", (channels, before, 3, 3)))
        nodes += [
            helper.make_node("Conv", [last, f"w{index}"], [f"c{index}"], pads=[1, 1, 1, 1],
                             strides=[stride, stride]),
            helper.make_node("Relu", [f"c{index}"], [f"r{index}"]),
        ]  # fmt: skip
        last = f"r{index}"
    weights.append(weight("head", (64, 10)))
    nodes += [
        helper.make_node("GlobalAveragePool", [last], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("MatMul", ["flat", "head"], ["scores"]),
    ]
    graph = helper.make_graph(
        nodes, "cnn",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 10])],
        initializer=weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def lightgbm_classifier(path: Path) -> Path:
    """A LightGBM classifier of 400 trees over 20 features, converted as onnxmltools does it."""
    import lightgbm as lgb
    import onnx
    from onnxmltools import convert_lightgbm
    from onnxmltools.convert.common.data_types import FloatTensorType

    rng = np.random.default_rng(4)
    x = rng.standard_normal((4000, 20)).astype(np.float32)
    y = (x[:, :5].sum(axis=1) + 0.5 * x[:, 5] * x[:, 6] > 0).astype(np.int64)
    model = lgb.LGBMClassifier(n_estimators=400, num_leaves=31, verbose=-1).fit(x, y)
    onx = convert_lightgbm(model, initial_types=[("features", FloatTensorType([None, 20]))],
                           zipmap=False, target_opset=15)  # fmt: skip
    onnx.save(onx, str(path))
    return path


def build_models(folder: Path) -> dict[str, Path]:
    """The models, and the repository add-model writes for them (without loading each in a
    server of its own: the bench's Triton loads them all); model name -> its ONNX file."""
    from tritonstack.check import onnx_serving
    from tritonstack.models import add_model

    (folder / "onnx").mkdir(parents=True)
    paths = {
        "image": cnn(folder / "onnx" / "image.onnx"),
        "lightgbm": lightgbm_classifier(folder / "onnx" / "lightgbm.onnx"),
    }
    repository = folder / "repository"
    repository.mkdir()
    for name, path in paths.items():
        plan = onnx_serving.plan(path, shapes=onnx_serving.parse_shapes(SHAPES[name]))
        add_model.write_model(repository, name, path.name, plan, None, [], tensorrt=False)
    return paths


def in_process(
    model_path: Path, batches: list[dict[str, np.ndarray]], settings: OwnSettings, layout: str
) -> dict:
    """Rows/s of onnxruntime running the batches in turn, back to back, in this process, in one
    of the LAYOUTS: one session with onnxruntime's default threads (every core) and one caller,
    or one session of one intra-op thread per core, each with a caller thread of its own
    (onnxruntime releases the GIL while it runs). Which is faster depends on the model and the
    batch: a tree ensemble splits a small batch across threads at a loss."""
    import threading

    import onnxruntime as ort

    callers = 1 if layout == "every core" else os.cpu_count() or 1
    options = ort.SessionOptions()
    if layout != "every core":
        options.intra_op_num_threads = 1
    sessions = [
        ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        for _ in range(callers)
    ]
    graph_feeds = [
        {
            tensor.name: feeds[tensor.name].reshape(feeds[tensor.name].shape[: len(tensor.shape)])
            for tensor in sessions[0].get_inputs()
        }
        for feeds in batches
    ]
    names = [o.name for o in sessions[0].get_outputs()]

    def window(seconds: float) -> tuple[int, float, float]:
        started, cpu = time.monotonic(), time.process_time()
        counts = [0] * callers

        def call(index: int) -> None:
            while time.monotonic() - started < seconds:
                sessions[index].run(names, graph_feeds[counts[index] % len(graph_feeds)])
                counts[index] += 1

        threads = [threading.Thread(target=call, args=(i,)) for i in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.monotonic() - started
        return sum(counts), wall, (time.process_time() - cpu) / wall

    window(settings.warmup_s)
    reps = []
    for _ in range(settings.reps):
        runs, wall, cores = window(settings.seconds)
        reps.append(Rep(runs, 0, wall, 0, 0, 0, 0, server_cores=cores, generator_cores=0))
    rows = len(next(iter(batches[0].values())))
    return asdict(summarize(reps, rows_per_request=rows))


def measure(
    server, generator: Generator, model: str, protocol: str, s: OwnSettings, rows: int
) -> dict:
    """A point's measurements: its summary and, served by Triton, where its CPU went
    (`cpu_us_per_row`: tritonserver, the model's stubs, the rest, each process by its own
    counters) and the rows the dynamic batcher ran together (`summary.avg_batch`)."""
    from tritonstack.clients.metrics import model_value, scrape

    def batches() -> dict[str, float]:
        samples = scrape(server.metrics)
        return {
            "inferences": model_value(samples, "nv_inference_count", model),
            "executions": model_value(samples, "nv_inference_exec_count", model),
        }

    target = Target(protocol, server.url(protocol, model), model)
    generator.run(target, CLIENTS, s.warmup_s)
    tree = server.tree()
    triton = server.metrics is not None
    roles_before = tree.cpu_seconds_by_role()
    batches_before = batches() if triton else None
    reps = []
    for _ in range(s.reps):
        cpu_before, wall_before = tree.cpu_seconds(), time.monotonic()
        result = generator.run(target, CLIENTS, s.seconds)
        wall = time.monotonic() - wall_before
        reps.append(
            Rep(
                requests=result.requests,
                errors=result.errors,
                seconds=result.seconds,
                mean_ms=result.mean_ms,
                p50_ms=result.p50_ms,
                p95_ms=result.p95_ms,
                p99_ms=result.p99_ms,
                server_cores=cpu_delta(cpu_before, tree.cpu_seconds()) / wall,
                generator_cores=result.generator_cpu_s / result.seconds,
            )
        )
    summary = summarize(reps, rows_per_request=rows)
    point = {"summary": summary}
    if triton:
        summary.avg_batch = average_batch(batches_before, batches())
        point["cpu_us_per_row"] = cpu_by_part(
            roles_before, tree.cpu_seconds_by_role(), model, sum(r.requests for r in reps) * rows
        )
    return {**point, "summary": asdict(summary)}


def cpu_by_part(
    before: dict[str, float], after: dict[str, float], model: str, rows: int
) -> dict[str, float]:
    """CPU µs per row served, by part of Triton: `tritonserver` (HTTP, the batcher, moving the
    tensors), `stubs` (the model's instances: onnxruntime and the Python backend around it) and
    `other` (every other process of the tree: other models' idle stubs)."""
    found = {"tritonserver": 0.0, "stubs": 0.0, "other": 0.0}
    if not rows:
        return found
    for role in before.keys() & after.keys():
        part = role if role == "tritonserver" else "stubs" if role == model else "other"
        found[part] += max(0.0, after[role] - before[role]) / rows * 1e6
    return found


def run_family(settings: OwnSettings, workdir: Path, log: Callable[[str], None]) -> dict:
    from tritonstack.core.signature import Signature

    started, load_before = datetime.now(timezone.utc), os.getloadavg()
    from tritonstack.core.repository import iter_models

    build_models(workdir / "models")
    repository = workdir / "models" / "repository"
    # Every server runs the graph add-model wrote (a converter's wrongly declared outputs
    # corrected), not the converter's file: onnxruntime logs a warning on every run of the
    # latter, which would cost the baselines what Triton does not pay.
    paths = {name: repository / name / "1" / "model.onnx" for name in MODELS}

    signatures = {
        m.name: Signature.from_model(m) for m in iter_models(repository) if m.name in MODELS
    }
    generators = {
        rows: Generator(workdir / f"load-{rows}", signatures, rows=rows, variety=VARIETY)
        for rows in settings.row_counts
    }
    points = []
    for name in MODELS:
        for rows in settings.row_counts:
            for layout in LAYOUTS:
                feeds = batches(signatures[name], rows, VARIETY)
                summary = in_process(paths[name], feeds, settings, layout)
                points.append({"model": name, "rows": rows, "server": "onnxruntime",
                               "protocol": layout, "summary": summary})  # fmt: skip
                log(f"own: {name} x{rows} onnxruntime in-process, {layout}: "
                    f"{rows_per_s(summary):,.0f} rows/s")  # fmt: skip
    venv = baseline_venv(progress=log)
    for server_key in ("triton", "fastapi"):
        log_path = workdir / f"{server_key}.log"
        if server_key == "triton":
            server = start_triton(repository, log_path, "triton:own")
        else:
            models = {name: str(paths[name]) for name in MODELS}
            server = start_uvicorn(venv, log_path, "fastapi:own", "fastapi_onnx_app:app",
                                   {"BENCH_MODELS": json.dumps(models)})  # fmt: skip
        try:
            for name in MODELS:
                for rows in settings.row_counts:
                    for protocol in PROTOCOLS[server_key]:
                        found = measure(server, generators[rows], name, protocol, settings, rows)
                        points.append({"model": name, "rows": rows, "server": server_key,
                                       "protocol": protocol, **found})  # fmt: skip
                        log(f"own: {name} x{rows} {server_key} {protocol}: "
                            f"{rows_per_s(found['summary']):,.0f} rows/s")  # fmt: skip
        finally:
            server.stop()
    finished = datetime.now(timezone.utc)
    return {
        "meta": {
            "started": started.isoformat(timespec="seconds"),
            "duration_s": round((finished - started).total_seconds()),
            "load_before": [round(x, 2) for x in load_before],
            "settings": asdict(settings),
            "rows": list(settings.row_counts),
            "clients": CLIENTS,
            "variety": VARIETY,
        },
        "points": points,
    }


def rows_per_s(summary: dict) -> float:
    return summary["rps"]["median"] * summary["rows_per_request"]


def run(quick: bool, log: Callable[[str], None] = print) -> dict:
    settings = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="tritonstack-bench-own-") as workdir:
        return run_family(settings, Path(workdir), log)
