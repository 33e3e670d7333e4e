"""A model of the tests' own making through the whole stack, as a user brings one: `add-model`,
`check`, `serve` behind the gateway (HTTP JSON, binary tensors, gRPC), `infer`, a gated
`loadtest`, the health check, and the Kubernetes copies, with no file edited by hand.

The project is a copy of this checkout (what a user clones), in a folder of its own, given to
every command with `--project-dir`. The models (tests/own_models.py) share nothing with the
demo: `ranker` takes an FP32 `query` [24] and an INT64 `bucket` [2] and has labels; `linear`
takes one FP32 `x` [5], batches of at most 8, no labels. tests/functional/test_compose_stack.py
runs the compose stack on such a copy.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from tests import own_models
from tests.functional.test_serve import serve_project
from tests.support import copy_project

pytestmark = pytest.mark.timeout(600)


def tritonstack(project: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI as a user runs it on the project at `project`."""
    return subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "--project-dir", str(project), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("own-models")
    return {
        "ranker": own_models.two_inputs(folder / "ranker.onnx"),
        "linear": own_models.one_input(folder / "linear.onnx"),
        "labels": own_models.labels_file(folder / "labels.txt"),
    }


@pytest.fixture(scope="module")
def project(tmp_path_factory, models) -> Path:
    """A copy of the checkout with `ranker` and `linear` added, both public."""
    root = copy_project(tmp_path_factory.mktemp("project") / "tritonstack")
    added = tritonstack(root, "add-model", str(models["ranker"]), "--name", "ranker",
                        "--labels", str(models["labels"]))  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "added ranker (public: the gateway routes it)" in added.stdout
    added = tritonstack(root, "add-model", str(models["linear"]), "--name", "linear",
                        "--max-batch-size", "8")  # fmt: skip
    assert added.returncode == 0, added.stderr
    return root


def test_add_model_writes_the_model_and_everything_derived_from_it(project):
    ranker = project / "model_repository" / "ranker"
    assert (ranker / "1" / "model.onnx").is_file() and (ranker / "labels.txt").is_file()
    assert (ranker / "configs" / "gpu.pbtxt").is_file()
    assert (project / "model_repository" / "ranker_trt" / "config.pbtxt").is_file()
    assert (
        "PUBLIC_MODELS=pipeline classify classifier ranker linear\n"
        in (project / "stack.env").read_text()
    )
    # Every derived file is written again, so nothing is stale ...
    for module in ("tritonstack.render.derived", "tritonstack.render.k8s"):
        check = subprocess.run(
            [sys.executable, "-m", module, "--check"],
            capture_output=True,
            text=True,
            env={**os.environ, "TRITONSTACK_PROJECT_DIR": str(project)},
            timeout=120,
        )
        assert check.returncode == 0, check.stderr
    # ... and each names the new models: the gateway's map, the deep probe, Kubernetes' copies.
    gateway_map = (project / "gateway/models.map").read_text()
    assert re.search(r"^ranker 1664:\d+:\d+:::\d+:$", gateway_map, re.M)
    assert re.search(r"^linear 40:\d+:\d+:::\d+:$", gateway_map, re.M)
    blackbox = (project / "prometheus" / "blackbox.yml").read_text()
    assert "infer_ranker:" in blackbox and "infer_linear:" in blackbox
    assert "/v2/models/ranker/infer" in (project / "prometheus" / "deep-probe.yml").read_text()
    generated = project / "deploy" / "kubernetes" / "base" / "generated"
    assert "ranker 1664:" in (generated / "models.map").read_text()
    assert "ranker linear" in (generated / "gateway.env").read_text()
    checked = tritonstack(project, "check")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def tree(root: Path) -> dict[str, str]:
    """Every file under `root` and its content's hash."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def graph_with(path: Path, batch, width) -> Path:
    """A one-input graph whose input's first dim is `batch` and second `width` (an int, a
    symbol or None)."""
    shape = [batch, width]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def zipmap_graph(path: Path) -> Path:
    """A scikit-learn classifier as skl2onnx converts it by default: probabilities as ZipMap's
    sequence of maps."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    model = LogisticRegression().fit(rng.standard_normal((40, 3)), rng.integers(0, 2, 40))
    onx = convert_sklearn(model, initial_types=[("x", FloatTensorType([None, 3]))])
    onnx.save(onx, str(path))
    return path


REFUSALS = {
    "not an ONNX file": (lambda m, t: ["add-model", str(m["labels"]), "--name", "x"],
                         "not an ONNX file"),
    "no such file": (lambda m, t: ["add-model", str(t / "none.onnx"), "--name", "x"],
                     "no such file"),
    "a name taken": (lambda m, t: ["add-model", str(m["linear"]), "--name", "classifier"],
                     "already exists"),
    "a name Triton cannot serve": (lambda m, t: ["add-model", str(m["linear"]), "--name", "a/b"],
                                   "a model name of letters"),
    "labels missing": (lambda m, t: ["add-model", str(m["ranker"]), "--name", "x", "--labels",
                                     str(t / "none.txt")], "cannot read it"),
    "a single label": (lambda m, t: ["add-model", str(m["linear"]), "--name", "x", "--labels",
                                     str(one_label(t / "one.txt"))],
                       "one label, but a classifier's scores rank two classes or more"),
    "labels of the wrong count": (lambda m, t: ["add-model", str(m["linear"]), "--name", "x",
                                                "--labels", str(m["labels"])],
                                  "has 3 labels, but no score output has 3 classes"),
    "batching a graph without a batch axis": (lambda m, t: ["add-model",
                                                            str(graph_with(t / "f.onnx", 1, 4)),
                                                            "--name", "x", "--max-batch-size", "8"],
                                              "cannot batch (input x has shape [1, 4]"),
    "bounds of the wrong rank": (lambda m, t: ["add-model",
                                               str(graph_with(t / "v.onnx", "b", "w")),
                                               "--name", "x", "--shape", "x=1:4:8"],
                                 "--shape x: each shape needs 2 dims"),
    "ZipMap's sequence of maps": (lambda m, t: ["add-model", str(zipmap_graph(t / "z.onnx")),
                                                "--name", "x"],
                                  "{'zipmap': False}"),
    "a batch too large for a request": (lambda m, t: ["add-model", str(m["ranker"]), "--name",
                                                      "x", "--max-batch-size", "1000000"],
                                        "lower max_batch_size"),
    "removing a model others call": (lambda m, t: ["remove-model", "classifier"],
                                     "classify, pipeline still call it (classify/config.pbtxt: "),
    "removing a model there is not": (lambda m, t: ["remove-model", "nope"],
                                      "nope: no such model in"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_refusal_is_one_line_and_leaves_the_project_unchanged(
    project, models, tmp_path, case
):
    arguments, words = REFUSALS[case]
    before = tree(project)
    result = tritonstack(project, *arguments(models, tmp_path))
    assert result.returncode == 1, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert words in lines[0], lines[0]
    assert tree(project) == before


def test_remove_model_undoes_add_model_to_the_byte(models, tmp_path):
    """add-model then remove-model leaves the project as it was: the folders, stack.env and
    every file derived from the repository (the gateway's map, the probes, Kubernetes' copies)."""
    root = copy_project(tmp_path / "tritonstack")
    before = tree(root)
    added = tritonstack(root, "add-model", str(models["linear"]), "--name", "linear")
    assert added.returncode == 0, added.stderr
    assert (root / "model_repository" / "linear_trt").is_dir() and tree(root) != before
    removed = tritonstack(root, "remove-model", "linear")
    assert removed.returncode == 0, removed.stderr
    assert "removed model_repository/linear\n" in removed.stdout
    assert "removed model_repository/linear_trt\n" in removed.stdout
    assert "wrote stack.env\n" in removed.stdout
    assert tree(root) == before
    assert not [p for p in root.iterdir() if p.name.startswith(".remove-model-")]
    checked = tritonstack(root, "check", "--no-load")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def one_label(path: Path) -> Path:
    path.write_text("yes\n")
    return path


@pytest.fixture(scope="module")
def served(project):
    """`tritonstack serve` on the project: the gateway in front, every model of it served."""
    with serve_project(project) as served:
        assert any("ranker" in line and line.startswith("ready:") for line in served["lines"])
        yield served


def ranker_inputs(rows: int, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "query": rng.uniform(-1, 1, (rows, own_models.WIDTH)).astype(np.float32),
        "bucket": rng.integers(0, 10, (rows, own_models.BUCKETS)).astype(np.int64),
    }


@pytest.mark.parametrize("protocol", ["http-json", "http-binary", "grpc"])
def test_the_gateway_serves_the_two_input_model_as_onnx_computes_it(served, protocol):
    inputs = ranker_inputs(5)
    reference = own_models.two_inputs_reference(**inputs)
    if protocol == "grpc":
        client, module = grpcclient.InferenceServerClient(served["grpc"]), grpcclient
    else:
        client, module = httpclient.InferenceServerClient(served["http"]), httpclient
    tensors = []
    for name, array in inputs.items():
        datatype = "INT64" if array.dtype == np.int64 else "FP32"
        tensors.append(module.InferInput(name, list(array.shape), datatype))
        if protocol == "grpc":
            tensors[-1].set_data_from_numpy(array)
        else:
            tensors[-1].set_data_from_numpy(array, binary_data=protocol == "http-binary")
    try:
        result = client.infer("ranker", tensors)
        for name in ("probs", "logits"):
            assert np.allclose(result.as_numpy(name), reference[name], atol=1e-5), name
        # the labels, through Triton's classification extension
        classified = client.infer(
            "ranker", tensors, outputs=[module.InferRequestedOutput("probs", class_count=1)]
        )
    finally:
        client.close()
    tops = [item.decode().split(":")[2] for item in classified.as_numpy("probs").reshape(-1)]
    assert tops == [own_models.LABELS[i] for i in reference["probs"].argmax(axis=1)]


def test_infer_prints_the_labels_and_reads_an_npz(served, tmp_path):
    from tritonstack.clients.client import fetch_signature

    shown = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "infer", "--url", served["http"],
         "--model", "ranker", "--rows", "3", "--seed", "5"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    header, *rows = shown.stdout.strip().splitlines()
    assert header.split() == ["row", "probs", "logits"]
    signature = fetch_signature(served["http"], "ranker")
    sent = signature.random_inputs(3, np.random.default_rng(5))
    probs = own_models.two_inputs_reference(**sent)["probs"]
    labels = [own_models.LABELS[i] for i in probs.argmax(axis=1)]
    assert [row.split()[1] for row in rows] == labels
    npz = tmp_path / "rows.npz"
    np.savez(npz, **ranker_inputs(2))
    from_file = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "infer", "--url", served["grpc"], "--protocol",
         "grpc", "--model", "ranker", "--input", str(npz)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert from_file.returncode == 0, from_file.stderr
    assert len(from_file.stdout.strip().splitlines()) == 3
    linear = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "infer", "--url", served["http"],
         "--model", "linear", "--rows", "9"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert linear.returncode == 1
    assert "linear takes 1 to 8 (max_batch_size) rows per request, not 9" in linear.stderr


BAD = {
    "a shape larger than the model takes": (
        {"inputs": [{"name": "query", "shape": [100000000, 24], "datatype": "FP32", "data": [0]}]},
        "declare 2400000000 values; ranker takes at most 1664",
    ),
    "data short of its shape": (
        {"inputs": [{"name": "bucket", "shape": [1, 2], "datatype": "INT64", "data": [1]}]},
        "bucket: shape [1,2] declares 2 values, data holds 1",
    ),
    "a missing input": (
        {"inputs": [{"name": "query", "shape": [1, 24], "datatype": "FP32", "data": [0] * 24}]},
        "expected 2 inputs but got 1 inputs for model 'ranker'",
    ),
    "the wrong datatype": (
        {"inputs": [
            {"name": "query", "shape": [1, 24], "datatype": "FP32", "data": [0] * 24},
            {"name": "bucket", "shape": [1, 2], "datatype": "FP32", "data": [1.5, 2]},
        ]},
        "expects 'INT64'",
    ),
    "the wrong width": (
        {"inputs": [
            {"name": "query", "shape": [1, 23], "datatype": "FP32", "data": [0] * 23},
            {"name": "bucket", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]},
        ]},
        "unexpected shape for input 'query'",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_request_is_a_4xx_and_triton_keeps_serving(served, case):
    body, message = BAD[case]
    host, port = served["http"].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("POST", "/v2/models/ranker/infer", json.dumps(body))
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    assert 400 <= response.status < 500, text
    assert message in json.loads(text)["error"]
    assert served["process"].poll() is None
    inputs = ranker_inputs(1)
    client = httpclient.InferenceServerClient(served["http"])
    tensors = []
    for name, array in inputs.items():
        datatype = "INT64" if name == "bucket" else "FP32"
        tensors.append(httpclient.InferInput(name, [1, array.shape[1]], datatype))
        tensors[-1].set_data_from_numpy(array)
    try:
        assert client.infer("ranker", tensors).as_numpy("probs").shape == (1, 3)
    finally:
        client.close()


@pytest.mark.parametrize("user_type", ["http_json", "grpc"])
def test_a_gated_loadtest_of_the_model_passes(served, project, tmp_path, user_type):
    result = tritonstack(
        project, "loadtest", "--host", served["http"], "--grpc-host", served["grpc"],
        "--model", "ranker", "--user-type", user_type, "--rows", "mix", "--users", "4",
        "--duration", "3s", "--max-fail-ratio", "0", "--results", str(tmp_path),
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.strip().splitlines()[-1]
    assert re.match(r"[1-9]\d* requests, 0 failed", summary), summary
    # `mix` sends up to 64 rows, kept to linear's max_batch_size of 8
    linear = tritonstack(
        project, "loadtest", "--host", served["http"], "--model", "linear", "--rows", "mix",
        "--users", "2", "--duration", "2s", "--max-fail-ratio", "0", "--results",
        str(tmp_path / "linear"), timeout=180,
    )  # fmt: skip
    assert linear.returncode == 0, linear.stdout + linear.stderr


def test_the_health_check_and_the_supervisor_call_the_added_models(served, project):
    """The container's health check (the public models of the project's stack.env), and
    serve's supervisor, which probes them every second: their requests reach ranker, and none
    of them fails."""
    from tests.unit.test_health import healthcheck
    from tritonstack.clients.metrics import model_value, scrape
    from tritonstack.core.settings import load

    metrics = f"http://{served['metrics']}/metrics"

    def ranker(name: str) -> float:
        return model_value(scrape(metrics), name, "ranker")

    # Counted from here: the module's load tests stop their users mid-request, and Triton counts
    # a gRPC call its client cancelled as a failure.
    before = ranker("nv_inference_request_success")
    failed = ranker("nv_inference_request_failure")
    public = load(project / "stack.env").public_models
    result = healthcheck("--url", served["triton"], env={"PUBLIC_MODELS": " ".join(public)})
    assert result.returncode == 0, result.stderr
    assert "healthy: ranker: probs=" in result.stdout and "healthy: linear: y=" in result.stdout
    time.sleep(3)  # the supervisor probes every second
    assert ranker("nv_inference_request_success") >= before + 4 + 4  # the check's, the probes'
    assert ranker("nv_inference_request_failure") == failed
