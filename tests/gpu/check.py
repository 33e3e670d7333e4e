"""The GPU check: the real tritonserver (the nvidia-pytriton wheel's 2.51) serving the model
repository with `classifier` on a GPU, its outputs left in GPU memory as Triton's C++ backends
leave them, and what reads them (`classify` by BLS, `pipeline` by ensemble) checked end to end.

Run by `tests/gpu/run.sh` (which installs what this needs offline); `--device cpu` runs the same
steps on a CPU instance, which is how `make test` keeps this script working on machines without a
GPU. It prints a short report (Markdown) and writes the numbers as JSON with `--report`:

1. where `classifier`'s outputs arrive in a BLS caller that asks for no memory type (a probe
   model): on a GPU instance they must be in GPU memory, or the check proves nothing;
2. every public model's answers against the ONNX reference implementation (`onnx.reference`, on
   the CPU) within `--tolerance`, for batches of 1, 7 and 64 rows;
3. throughput and latency percentiles for each model at each `--clients` count (closed loop,
   batch-1 JSON requests), and the average batch the dynamic batcher formed on `classifier`.

Exit status: 0 when every check passed, 1 when one failed (the report says which), 2 for a usage
error (one line).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
#: The demo this check serves: its public models (stack.env), the classifier's width and the
#: labels postprocess and classify read, as the demo's own files declare them.
MODEL_OUTPUTS = {
    "classifier": ("class",),
    "pipeline": ("label", "class"),
    "classify": ("label", "score"),
}
FEATURES = 128
LABELS_FILE = "postprocess/labels.txt"

HERE = Path(__file__).resolve().parent
PROBE = "output_memory_probe"
#: Rows per request of the correctness check: one, an odd count, a full dynamic batch.
BATCHES = (1, 7, 64)
#: The models served: the classifier family but the TensorRT plan (the wheel has no TensorRT
#: backend), so `classify` routes to its fallback, `classifier`.
MODELS = ("classifier", "postprocess", "pipeline", "classify")
STUB = "triton_python_backend_stub"


class UsageError(Exception):
    """A bad argument or a missing file: one line, exit 2."""


@dataclass
class LoadPoint:
    model: str
    clients: int
    requests: int
    errors: int
    seconds: float
    throughput: float
    p50_ms: float
    p99_ms: float


@dataclass
class Result:
    device: str
    gpu: str
    tritonserver: str
    python: str
    tolerance: float
    outputs_on_gpu: bool | None = None
    max_abs_error: dict[str, float] = field(default_factory=dict)
    labels_match: dict[str, bool] = field(default_factory=dict)
    load: list[LoadPoint] = field(default_factory=list)
    average_batch: float | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def parse_clients(text: str) -> list[int]:
    try:
        clients = [int(c) for c in text.split(",")]
    except ValueError:
        raise UsageError(f"--clients {text!r}: expected counts like 1,4,16,64") from None
    if not clients or min(clients) < 1 or max(clients) > 256:
        raise UsageError(f"--clients {text!r}: each count must be 1-256")
    return clients


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tests/gpu/check.py", description=__doc__.split("\n")[0])
    parser.add_argument("--runtime", type=Path, required=True, help="the unpacked Triton runtime")
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--clients", default="1,4,16,64", help="concurrent clients per point")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per point")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="max |GPU - reference|")
    parser.add_argument("--report", type=Path, help="write the numbers here as JSON")
    args = parser.parse_args(argv)
    args.clients = parse_clients(args.clients)
    if args.seconds <= 0 or args.tolerance <= 0:
        raise UsageError("--seconds and --tolerance must be positive")
    server = args.runtime / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    if not server.is_file():
        raise UsageError(f"--runtime {args.runtime}: no pytriton/tritonserver/bin/tritonserver")
    if not (args.repository / "classifier" / "1" / "model.onnx").is_file():
        raise UsageError(f"--repository {args.repository}: no classifier/1/model.onnx")
    return args


# --- the server ---------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def assemble(runtime: Path, repository: Path, work: Path) -> tuple[Path, Path]:
    """(backend directory, model repository view) for this run, under `work`."""
    tree = runtime / "pytriton" / "tritonserver"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = tree / "python_backend_stubs" / python / STUB
    if not stub.is_file():
        raise UsageError(f"{runtime}: no Python backend stub for Python {python}")
    backends = work / "backends"
    (backends / "python").mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(tree / "backends" / "python" / name, backends / "python" / name)
    shutil.copy2(stub, backends / "python" / STUB)
    shutil.copytree(HERE / "backend", backends, dirs_exist_ok=True)
    view = work / "models"
    view.mkdir()
    for model in MODELS:
        (view / model).symlink_to((repository / model).resolve())
    (view / PROBE).symlink_to(HERE / "models" / PROBE)
    return backends, view


@contextlib.contextmanager
def tritonserver(args: argparse.Namespace, work: Path, log: Path):
    """The server, ready, as (http port, metrics port); stopped on exit."""
    backends, view = assemble(args.runtime, args.repository, work)
    http_port, grpc_port, metrics_port = free_ports(3)
    tree = args.runtime / "pytriton" / "tritonserver"
    command = [
        str(tree / "bin" / "tritonserver"),
        f"--model-repository={view}",
        f"--backend-directory={backends}",
        "--model-control-mode=none",
        "--strict-readiness=true",
        "--exit-on-error=true",
        "--exit-timeout-secs=5",
        "--http-address=127.0.0.1",
        f"--http-port={http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={metrics_port}",
        f"--allow-gpu-metrics={'true' if args.device == 'gpu' else 'false'}",
        f"--backend-config=python,shm-region-prefix-name=gpucheck_{os.getpid()}_",
    ]
    if args.device == "gpu":
        # What the container's entrypoint passes on a GPU host: classifier/configs/gpu.pbtxt
        # (one KIND_GPU instance); the other models have no such file and keep config.pbtxt.
        command.append("--model-config-name=gpu")
    env = dict(os.environ)
    libs = [sysconfig.get_config_var("LIBDIR") or "", str(args.runtime / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [p for p in libs if p] + [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    )
    # The stub embeds the `python3` first on PATH: this interpreter, so its site-packages (onnx,
    # torch) are what the models import.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 180
        while get(http_port, "/v2/health/ready")[0] != 200:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").splitlines()[-15:]
                raise RuntimeError("tritonserver did not become ready:\n" + "\n".join(tail))
            time.sleep(0.5)
        yield http_port, metrics_port
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    except OSError:
        return 0, b""
    finally:
        connection.close()


def infer_body(rows: np.ndarray) -> bytes:
    inputs = [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
               "data": rows.ravel().tolist()}]  # fmt: skip
    return json.dumps({"inputs": inputs}).encode()


def infer(connection: http.client.HTTPConnection, model: str, body: bytes) -> dict:
    connection.request(
        "POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"}
    )
    response = connection.getresponse()
    answer = response.read()
    if response.status != 200:
        raise RuntimeError(f"{model}: HTTP {response.status}: {answer[:300]!r}")
    return {o["name"]: o for o in json.loads(answer)["outputs"]}


# --- the checks ---------------------------------------------------------------------------------


def reference(repository: Path, rows: np.ndarray) -> np.ndarray:
    """The class probabilities by the ONNX reference implementation, on the CPU."""
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(str(repository / "classifier" / "1" / "model.onnx"))
    (probabilities,) = evaluator.run(["class"], {"features": rows})
    return np.asarray(probabilities, dtype=np.float32)


def check_outputs_memory(port: int, result: Result) -> None:
    rows = np.zeros((1, FEATURES), np.float32)
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=30)) as c:
        answer = infer(c, PROBE, infer_body(rows))
    result.outputs_on_gpu = bool(answer["on_gpu"]["data"][0])
    if result.device == "gpu" and not result.outputs_on_gpu:
        result.failures.append(
            "classifier answered a BLS caller in CPU memory: the check did not exercise the "
            "GPU-memory path the C++ backends take"
        )


def check_answers(port: int, repository: Path, result: Result) -> None:
    labels = np.array(
        [
            line.strip()
            for line in (repository / LABELS_FILE).read_text().splitlines()
            if line.strip()
        ]
    )
    rng = np.random.default_rng(20261204)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    with contextlib.closing(connection):
        errors, matches = compare(connection, repository, labels, rng, result.tolerance)
    result.max_abs_error, result.labels_match = errors, matches
    for model in MODEL_OUTPUTS:
        if errors[model] > result.tolerance:
            result.failures.append(
                f"{model}: answers differ from the ONNX reference by {errors[model]:.2e} "
                f"(tolerance {result.tolerance:.0e})"
            )
        if not matches[model]:
            result.failures.append(f"{model}: a label differs from the reference's")


def compare(connection, repository: Path, labels: np.ndarray, rng, tolerance: float):
    """Each public model's (max abs error, labels equal) against the reference, by model."""
    errors = {model: 0.0 for model in MODEL_OUTPUTS}
    matches = dict.fromkeys(MODEL_OUTPUTS, True)
    for size in BATCHES:
        rows = rng.standard_normal((size, FEATURES)).astype(np.float32)
        expected = reference(repository, rows)
        winners = labels[np.argmax(expected, axis=1)]
        for model in MODEL_OUTPUTS:
            answer = infer(connection, model, infer_body(rows))
            if model == "classify":
                got_labels = np.array(answer["label"]["data"])
                scores = np.array(answer["score"]["data"], np.float32)
                error = np.abs(scores - expected.max(axis=1)).max()
            else:
                got = np.array(answer["class"]["data"], np.float32).reshape(expected.shape)
                error = np.abs(got - expected).max()
                got_labels = np.array(answer["label"]["data"]) if "label" in answer else winners
            errors[model] = max(errors[model], float(error))
            # A label may differ only where the two classes are closer than the tolerance.
            margin = np.abs(expected[:, 1] - expected[:, 0]) > 2 * tolerance
            matches[model] &= bool(np.all((got_labels == winners) | ~margin))
    return errors, matches


def client_loop(port: int, model: str, body: bytes, stop_at: float) -> tuple[list[float], int]:
    """One closed-loop client: (latencies in seconds, errors) until `stop_at`."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    with contextlib.closing(connection):
        return closed_loop(connection, model, body, stop_at)


def closed_loop(connection, model: str, body: bytes, stop_at: float):
    latencies, errors = [], 0
    while time.monotonic() < stop_at:
        started = time.perf_counter()
        try:
            infer(connection, model, body)
            latencies.append(time.perf_counter() - started)
        except (OSError, RuntimeError, http.client.HTTPException):
            errors += 1
            connection.close()  # http.client reconnects on the next request
    return latencies, errors


def client_process(port: int, model: str, clients: int, seconds: float, warmup: float):
    """`clients` threads in one process (Python's HTTP client holds the GIL while it parses)."""
    body = infer_body(np.full((1, FEATURES), 0.01, np.float32))
    client_loop(port, model, body, time.monotonic() + warmup)
    stop_at = time.monotonic() + seconds
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        runs = list(pool.map(lambda _: client_loop(port, model, body, stop_at), range(clients)))
    return [t for latencies, _ in runs for t in latencies], sum(e for _, e in runs)


def measure(port: int, model: str, clients: int, seconds: float) -> LoadPoint:
    processes = max(1, min(clients, (os.cpu_count() or 2) // 2))
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    with concurrent.futures.ProcessPoolExecutor(processes) as pool:
        futures = [pool.submit(client_process, port, model, n, seconds, 1.0) for n in shares]
        runs = [future.result() for future in futures]
    latencies = np.array([t for run, _ in runs for t in run]) * 1000
    errors = sum(e for _, e in runs)
    return LoadPoint(
        model=model,
        clients=clients,
        requests=len(latencies),
        errors=errors,
        seconds=seconds,
        throughput=len(latencies) / seconds,
        p50_ms=float(np.percentile(latencies, 50)) if len(latencies) else float("nan"),
        p99_ms=float(np.percentile(latencies, 99)) if len(latencies) else float("nan"),
    )


def counters(metrics_port: int, model: str) -> tuple[float, float]:
    """Triton's (inferences, executions) of `model` so far."""
    text = get(metrics_port, "/metrics")[1].decode()
    values = []
    for name in ("nv_inference_count", "nv_inference_exec_count"):
        match = re.search(rf'^{name}{{model="{model}",version="1"}} (\S+)$', text, re.MULTILINE)
        values.append(float(match.group(1)) if match else 0.0)
    return values[0], values[1]


def check_load(port: int, metrics_port: int, args: argparse.Namespace, result: Result) -> None:
    for model in MODEL_OUTPUTS:
        for clients in args.clients:
            before = counters(metrics_port, "classifier")
            point = measure(port, model, clients, args.seconds)
            after = counters(metrics_port, "classifier")
            result.load.append(point)
            print(f"  {model} c={clients}: {point.throughput:,.0f} req/s", file=sys.stderr)
            if point.errors or not point.requests:
                result.failures.append(f"{model} at {clients} clients: {point.errors} errors")
            if model == "classifier" and clients == max(args.clients):
                executions = after[1] - before[1]
                result.average_batch = (after[0] - before[0]) / executions if executions else None
    if max(args.clients) >= 16 and not (result.average_batch or 0) > 1.0:
        result.failures.append(
            f"classifier at {max(args.clients)} clients: average batch {result.average_batch}, "
            "so the dynamic batcher merged nothing"
        )


# --- the report ---------------------------------------------------------------------------------


def render(result: Result) -> str:
    """The report in Markdown: what ran, each check's verdict, the load table."""
    lines = [
        f"# GPU check: {'passed' if result.passed else 'FAILED'}",
        "",
        f"Device: {result.device} ({result.gpu}); tritonserver {result.tritonserver}; "
        f"Python {result.python}.",
        "",
        "| check | result |",
        "|---|---|",
        f"| classifier's outputs reach a BLS caller in GPU memory | "
        f"{'yes' if result.outputs_on_gpu else 'no'} |",
    ]
    for model, error in result.max_abs_error.items():
        same = "labels equal" if result.labels_match.get(model) else "a label differs"
        lines.append(
            f"| `{model}` vs ONNX reference (tolerance {result.tolerance:.0e}) | "
            f"max abs error {error:.2e}, {same} |"
        )
    batch = "n/a" if result.average_batch is None else f"{result.average_batch:.1f} rows"
    lines += [f"| `classifier` average dynamic batch at the most clients | {batch} |", ""]
    if result.load:
        lines += [
            "| model | clients | req/s | p50 ms | p99 ms | errors |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        lines += [
            f"| `{p.model}` | {p.clients} | {p.throughput:,.0f} | {p.p50_ms:.2f} | "
            f"{p.p99_ms:.2f} | {p.errors} |"
            for p in result.load
        ]
        lines.append("")
    lines += [f"- FAILED: {failure}" for failure in result.failures]
    return "\n".join(lines).rstrip() + "\n"


def gpu_name(device: str) -> str:
    if device != "gpu":
        return "no GPU used"
    import torch

    if not torch.cuda.is_available():
        raise UsageError("torch sees no CUDA device: run on a GPU machine, or pass --device cpu")
    return f"{torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    try:
        args = arguments(argv)
        gpu = gpu_name(args.device)
    except UsageError as error:
        print(f"tests/gpu/check.py: {error}", file=sys.stderr)
        return 2
    result = Result(
        device=args.device,
        gpu=gpu,
        tritonserver="not started",
        python=".".join(map(str, sys.version_info[:3])),
        tolerance=args.tolerance,
    )
    with tempfile.TemporaryDirectory(prefix="tritonstack-gpu-check-") as work:
        log = Path(work) / "tritonserver.log"
        try:
            with tritonserver(args, Path(work), log) as (port, metrics_port):
                result.tritonserver = json.loads(get(port, "/v2")[1])["version"]
                print(
                    f"tritonserver {result.tritonserver} ready; checking answers", file=sys.stderr
                )
                check_outputs_memory(port, result)
                check_answers(port, args.repository, result)
                check_answers(port, args.repository, result)
                print("measuring load", file=sys.stderr)
                check_load(port, metrics_port, args, result)
        except (RuntimeError, OSError, KeyError) as error:
            result.failures.append(f"{type(error).__name__}: {error}")
            if log.exists():
                print(log.read_text(errors="replace")[-4000:], file=sys.stderr)
    report = render(result)
    print(report, end="")
    if args.report:
        data = {**asdict(result), "passed": result.passed, "markdown": report}
        args.report.write_text(json.dumps(data, indent=2) + "\n")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
