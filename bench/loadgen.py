"""Load generators: wrk (C, HTTP) and a multi-process gRPC client, both closed-loop.

Every server gets the same requests for a model: rows of seeded random values, shaped and typed
as the model's config declares (tritonstack.core.signature; the baselines reproduce `classifier` and
take its request), as KServe v2 JSON, as JSON header + binary tensors (Triton's binary-data
extension), or as a gRPC ModelInferRequest serialised once. By default one request is replayed;
with `variety`, wrk sends that many distinct ones in turn, for models whose speed depends on the
values (a tree ensemble replaying one batch runs with every branch predicted: at 8 rows of 400
trees, 2.5x faster than on new rows). The generators replay those bytes without parsing the answers
(one answer per point is checked beforehand), so their own cost stays small and is measured:
wrk's CPU comes from the kernel's accounting of the reaped child (getrusage), the gRPC workers
report their process CPU time over the measured window.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.stats import correct_coordinated_omission
from tritonstack.core.errors import UserError
from tritonstack.core.signature import Signature

#: http-classification: KServe JSON asking Triton's classification extension for the top class
#: of each output ("score:index:label" strings, labels from the model's label_filename).
PROTOCOLS = ("http-json", "http-binary", "grpc", "http-classification")
ROWS = 1


#: The gRPC workers run `-m bench.grpc_worker`: the bench is a folder of the checkout, not an
#: installed package, so its parent goes on their path whatever the caller's working directory.
def worker_env() -> dict[str, str]:
    parent = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [parent, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PYTHONPATH=path)


#: wrk prints this line from the Lua `done` hook; the bench parses it.
WRK_SCRIPT = """\
local f = assert(io.open(%(body)s, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
%(headers)s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests":%%d,"duration_us":%%d,"connect":%%d,"read":%%d,"write":%%d,' ..
    '"status":%%d,"timeout":%%d,"mean_us":%%f,"p50_us":%%d,"p95_us":%%d,"p99_us":%%d}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
"""
#: With several bodies: each thread formats every request once, then sends them in turn (wrk calls
#: `request` for each one it sends).
WRK_ROTATING_SCRIPT = """\
local paths = {%(bodies)s}
local requests, sent = {}, 0
wrk.method = "POST"
%(headers)s
init = function(args)
  for i, path in ipairs(paths) do
    local f = assert(io.open(path, "rb"))
    requests[i] = wrk.format(nil, nil, nil, f:read("*a"))
    f:close()
  end
end
request = function()
  sent = sent %% #requests + 1
  return requests[sent]
end
""" + WRK_SCRIPT[WRK_SCRIPT.index("done = function") :]


def inputs(signature: Signature, seed: int = 0, rows: int = ROWS) -> dict[str, np.ndarray]:
    """`rows` rows of seeded random values for each of the model's inputs."""
    return signature.random_inputs(rows, np.random.default_rng(seed))


def batches(signature: Signature, rows: int, count: int) -> list[dict[str, np.ndarray]]:
    """The `count` distinct requests a Generator of that `variety` sends (seeds 0 to count-1)."""
    return [inputs(signature, seed, rows) for seed in range(count)]


def json_body(signature: Signature, data: dict[str, np.ndarray], classification=False) -> bytes:
    tensors = [
        {
            "name": t.name,
            "shape": list(data[t.name].shape),
            "datatype": t.datatype,
            "data": [round(float(x), 6) for x in data[t.name].ravel()],
        }
        for t in signature.inputs
    ]
    body: dict = {"inputs": tensors}
    if classification:
        body["outputs"] = [
            {"name": t.name, "parameters": {"classification": 1}} for t in signature.outputs
        ]
    return json.dumps(body).encode()


def binary_body(signature: Signature, data: dict[str, np.ndarray]) -> tuple[bytes, int]:
    """(body, length of its JSON header) for Triton's binary tensor extension."""
    raws = [np.ascontiguousarray(data[t.name]).tobytes() for t in signature.inputs]
    header = {
        "inputs": [
            {
                "name": t.name,
                "shape": list(data[t.name].shape),
                "datatype": t.datatype,
                "parameters": {"binary_data_size": len(raw)},
            }
            for t, raw in zip(signature.inputs, raws, strict=True)
        ],
        "parameters": {"binary_data_output": True},
    }
    head = json.dumps(header).encode()
    return head + b"".join(raws), len(head)


def grpc_body(signature: Signature, data: dict[str, np.ndarray]) -> bytes:
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=signature.model)
    for t in signature.inputs:
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = t.name, t.datatype
        tensor.shape.extend(data[t.name].shape)
        request.raw_input_contents.append(np.ascontiguousarray(data[t.name]).tobytes())
    return request.SerializeToString()


@dataclass(frozen=True)
class Target:
    """Where to send load: an HTTP URL (wrk) or a gRPC host:port plus model."""

    protocol: str
    url: str  # http://host:port/v2/models/<m>/infer, or host:port for grpc
    model: str


@dataclass(frozen=True)
class Result:
    requests: int  # answered with 2xx / OK
    errors: int
    seconds: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    generator_cpu_s: float
    #: Of `errors`, the answers that were not 2xx (the rest: connect, read, write, timeout).
    status_errors: int = 0


def wrk_path() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise UserError(
            "wrk is not installed; `apt-get install wrk` (Debian/Ubuntu) — the bench's HTTP "
            "load generator"
        )
    return path


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Generator:
    """Writes each model's request bodies once and runs timed closed-loop load against a target.

    `signatures`: the models load is sent to, by name (the bench reads them from the model
    repository); a baseline's point names the model it reproduces. Each request holds `rows`
    rows (the `own` family sends batches); `variety` distinct requests (seeds 0, 1, ...) go out
    in turn over HTTP, request 0 alone over gRPC (`batches` gives the same data)."""

    def __init__(
        self,
        workdir: Path,
        signatures: dict[str, Signature],
        grpc_processes: int = 2,
        rows: int = ROWS,
        variety: int = 1,
    ):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.grpc_processes = grpc_processes
        self.signatures = signatures
        self.scripts: dict[tuple[str, str], Path] = {}
        for model, signature in signatures.items():
            bodies: dict[str, list[str]] = {"json": [], "classification.json": [], "bin": []}
            for seed, data in enumerate(batches(signature, rows, variety)):
                suffix = "" if seed == 0 else f".{seed}"
                binary, header_length = binary_body(signature, data)
                written = {
                    "json": json_body(signature, data),
                    "classification.json": json_body(signature, data, True),
                    "bin": binary,
                }
                for kind, content in written.items():
                    # Request 0 keeps the plain name: the check request and gRPC send it.
                    name = f"body.{model}{suffix}.{kind}"
                    (self.workdir / name).write_bytes(content)
                    bodies[kind].append(name)
                if seed == 0:
                    (self.workdir / f"grpc-{model}.bin").write_bytes(grpc_body(signature, data))
                    binary_headers = {
                        "Content-Type": "application/octet-stream",
                        "Inference-Header-Content-Length": str(header_length),
                    }
                if binary_headers["Inference-Header-Content-Length"] != str(header_length):
                    # One script's header gives the JSON header's length for all its bodies.
                    raise UserError(
                        f"{model}: requests {seed} and 0 differ in their binary header's length "
                        "(strings of other sizes); a variety of binary bodies needs equal ones"
                    )
            json_headers = {"Content-Type": "application/json"}
            self.scripts[model, "http-json"] = self._script(bodies["json"], json_headers)
            self.scripts[model, "http-classification"] = self._script(
                bodies["classification.json"], json_headers
            )
            self.scripts[model, "http-binary"] = self._script(bodies["bin"], binary_headers)

    def _script(self, bodies: list[str], headers: dict[str, str]) -> Path:
        lines = "\n".join(
            f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()
        )
        path = self.workdir / f"{bodies[0]}.lua"
        paths = [json.dumps(str(self.workdir / body)) for body in bodies]
        if len(paths) == 1:
            text = WRK_SCRIPT % {"body": paths[0], "headers": lines}
        else:
            text = WRK_ROTATING_SCRIPT % {"bodies": ", ".join(paths), "headers": lines}
        path.write_text(text)
        return path

    def check_body(self, model: str, protocol: str) -> bytes:
        """The JSON body a point's check request sends (binary bodies are checked as JSON)."""
        kind = ".classification" if protocol == "http-classification" else ""
        return (self.workdir / f"body.{model}{kind}.json").read_bytes()

    def run(self, target: Target, concurrency: int, seconds: float) -> Result:
        if target.protocol == "grpc":
            return self._grpc(target, concurrency, seconds)
        if (target.model, target.protocol) not in self.scripts:
            raise UserError(
                f"no {target.protocol} body for {target.model}: protocols {PROTOCOLS}, models "
                f"{sorted(self.signatures)}"
            )
        return self._wrk(target, concurrency, seconds)

    def _wrk(self, target: Target, concurrency: int, seconds: float) -> Result:
        # One wrk thread: it drives well over 20k req/s, and a second one would take a core
        # from the server on a 2-core machine.
        command = [
            wrk_path(),
            "-t1",
            f"-c{concurrency}",
            f"-d{max(1, round(seconds))}s",
            "--timeout=10s",
            "-s",
            str(self.scripts[target.model, target.protocol]),
            target.url,
        ]
        cpu_before = children_cpu()
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
        cpu = children_cpu() - cpu_before
        line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
        if done.returncode != 0 or line is None:
            raise UserError(f"wrk failed on {target.url}: {done.stderr.strip() or done.stdout}")
        stats = json.loads(line[len("BENCH ") :])
        errors = sum(stats[k] for k in ("connect", "read", "write", "status", "timeout"))
        return Result(
            requests=stats["requests"] - stats["status"],
            errors=errors,
            seconds=stats["duration_us"] / 1e6,
            mean_ms=stats["mean_us"] / 1000,
            p50_ms=stats["p50_us"] / 1000,
            p95_ms=stats["p95_us"] / 1000,
            p99_ms=stats["p99_us"] / 1000,
            generator_cpu_s=cpu,
            status_errors=stats["status"],
        )

    def _grpc(self, target: Target, concurrency: int, seconds: float) -> Result:
        processes = max(1, min(self.grpc_processes, concurrency))
        shares = [
            concurrency // processes + (i < concurrency % processes) for i in range(processes)
        ]
        body = self.workdir / f"grpc-{target.model}.bin"
        outdir = Path(tempfile.mkdtemp(dir=self.workdir, prefix="grpc-"))
        workers = []
        for i, share in enumerate(shares):
            command = [
                sys.executable,
                "-m",
                "bench.grpc_worker",
                target.url,
                str(body),
                str(share),
                str(seconds),
                str(outdir / f"{i}.json"),
            ]
            workers.append(
                subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=worker_env(),
                )
            )
        try:
            for worker in workers:  # each connects and sends one request, then says READY
                if worker.stdout.readline().strip() != "READY":
                    raise UserError(f"gRPC load worker could not reach {target.url}")
            for worker in workers:
                worker.stdin.write("GO\n")
                worker.stdin.flush()
            for worker in workers:
                worker.wait(timeout=seconds + 60)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        reports = [json.loads((outdir / f"{i}.json").read_text()) for i in range(len(shares))]
        latencies = np.concatenate(
            [np.asarray(r["latencies_us"], dtype=np.float64) for r in reports]
        )
        shutil.rmtree(outdir, ignore_errors=True)
        if latencies.size == 0:
            raise UserError(f"no gRPC request to {target.url} succeeded")
        requests = int(latencies.size)
        seconds = max(r["seconds"] for r in reports)
        # wrk's percentiles are corrected for coordinated omission; the same correction here
        # makes the protocols' percentiles mean the same thing.
        latencies = correct_coordinated_omission(latencies, seconds * 1e6 * concurrency / requests)
        p50, p95, p99 = np.percentile(latencies, [50, 95, 99]) / 1000
        return Result(
            requests=requests,
            errors=sum(r["errors"] for r in reports),
            seconds=seconds,
            mean_ms=float(latencies.mean() / 1000),
            p50_ms=float(p50),
            p95_ms=float(p95),
            p99_ms=float(p99),
            generator_cpu_s=sum(r["cpu_s"] for r in reports),
        )
