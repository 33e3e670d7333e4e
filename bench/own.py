"""The `own` family: models of one's own, served as `tritonstack add-model` serves them, against
onnxruntime in-process and FastAPI + onnxruntime, on the same batches.

Two models of the kinds a user brings that the demo is not, with work enough per row that a
server's cost per request is not all there is to measure: `image`, a small CNN (three 3x3
convolutions, pooling, a linear head; random weights) taking any height and width, bounded by
--shape, every request at its opt size, 3x64x64; and `lightgbm`, a LightGBM classifier of 400
trees over 20 features converted by onnxmltools (ai.onnx.ml's TreeEnsembleClassifier, its label
output corrected by add-model). Every request holds ROWS rows. For each model, rows per second
of:

- `onnxruntime`: the graph run in this process on one ROWS-row batch after another, with
  onnxruntime's own thread count (every core): the ceiling a server is measured against;
- `triton`: the embedded Triton on a repository add-model wrote (dynamic batching, two
  instances of one thread), CLIENTS clients sending ROWS-row requests, as KServe v2 JSON and as
  binary tensors;
- `fastapi`: bench/fastapi_onnx_app.py in one uvicorn worker (one intra-op thread, as the model's
  config gives Triton's instances), the same JSON requests.

The target: Triton serves at least FLOOR of onnxruntime in-process.
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

from bench.loadgen import Generator, Target
from bench.servers import baseline_venv, cpu_delta, start_triton, start_uvicorn
from bench.stats import Rep, summarize

#: Rows per request: the batch the target names (≥ 8).
ROWS = 8
CLIENTS = 16
FLOOR = 0.8
#: The models measured, and the --shape bounds add-model gets for each.
MODELS = ("image", "lightgbm")
SHAPES = {"image": ["images=1x3x32x32:8x3x64x64:16x3x128x128"], "lightgbm": []}
OPSET = 17
#: Points per model: (server, protocol); onnxruntime is measured in-process.
SERVERS = {
    "onnxruntime": "onnxruntime in-process (one caller, every core)",
    "triton": "Triton (add-model's config)",
    "fastapi": "FastAPI + onnxruntime (1 worker)",
}
PROTOCOLS = {"triton": ("http-json", "http-binary"), "fastapi": ("http-json",)}


@dataclass(frozen=True)
class OwnSettings:
    quick: bool
    warmup_s: float
    seconds: float
    reps: int


FULL = OwnSettings(quick=False, warmup_s=2, seconds=5, reps=3)
QUICK = OwnSettings(quick=True, warmup_s=1, seconds=1, reps=1)


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


def batch(signature, seed: int = 0) -> dict[str, np.ndarray]:
    """ROWS rows at the model's opt shape (what every server gets)."""
    return signature.random_inputs(ROWS, np.random.default_rng(seed))


def in_process(model_path: Path, feeds: dict[str, np.ndarray], settings: OwnSettings) -> dict:
    """Rows/s of onnxruntime running the batch back to back in this process."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    graph_feeds = {}
    for tensor in session.get_inputs():
        value = feeds[tensor.name]
        graph_feeds[tensor.name] = value.reshape(value.shape[: len(tensor.shape)])
    names = [o.name for o in session.get_outputs()]

    def window(seconds: float) -> tuple[int, float, float]:
        started, cpu = time.monotonic(), time.process_time()
        runs = 0
        while time.monotonic() - started < seconds:
            session.run(names, graph_feeds)
            runs += 1
        wall = time.monotonic() - started
        return runs, wall, (time.process_time() - cpu) / wall

    window(settings.warmup_s)
    reps = []
    for _ in range(settings.reps):
        runs, wall, cores = window(settings.seconds)
        reps.append(Rep(runs, 0, wall, 0, 0, 0, 0, server_cores=cores, generator_cores=0))
    return asdict(summarize(reps, rows_per_request=ROWS))


def measure(server, generator: Generator, model: str, protocol: str, s: OwnSettings) -> dict:
    target = Target(protocol, server.url(protocol, model), model)
    generator.run(target, CLIENTS, s.warmup_s)
    tree = server.tree()
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
    return asdict(summarize(reps, rows_per_request=ROWS))


def run_family(settings: OwnSettings, workdir: Path, log: Callable[[str], None]) -> dict:
    from tritonstack.core.signature import Signature

    started, load_before = datetime.now(timezone.utc), os.getloadavg()
    from tritonstack.core.repository import iter_models

    paths = build_models(workdir / "models")
    repository = workdir / "models" / "repository"

    signatures = {
        m.name: Signature.from_model(m) for m in iter_models(repository) if m.name in MODELS
    }
    generator = Generator(workdir / "load", signatures, rows=ROWS)
    points = []
    for name in MODELS:
        feeds = batch(signatures[name])
        summary = in_process(paths[name], feeds, settings)
        points.append({"model": name, "server": "onnxruntime", "protocol": "", "summary": summary})
        log(f"own: {name} onnxruntime in-process: {rows_per_s(summary):,.0f} rows/s")
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
                for protocol in PROTOCOLS[server_key]:
                    summary = measure(server, generator, name, protocol, settings)
                    points.append({"model": name, "server": server_key, "protocol": protocol,
                                   "summary": summary})  # fmt: skip
                    log(f"own: {name} {server_key} {protocol}: {rows_per_s(summary):,.0f} rows/s")
        finally:
            server.stop()
    finished = datetime.now(timezone.utc)
    return {
        "meta": {
            "started": started.isoformat(timespec="seconds"),
            "duration_s": round((finished - started).total_seconds()),
            "load_before": [round(x, 2) for x in load_before],
            "settings": asdict(settings),
            "rows": ROWS,
            "clients": CLIENTS,
        },
        "points": points,
    }


def rows_per_s(summary: dict) -> float:
    return summary["rps"]["median"] * summary["rows_per_request"]


def run(quick: bool, log: Callable[[str], None] = print) -> dict:
    settings = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="tritonstack-bench-own-") as workdir:
        return run_family(settings, Path(workdir), log)
