"""State kept in the server: a batched recurrent step (tests/model_zoo.py `recurrent`) added with
`tritonstack add-model --server-state`, served by two real Triton replicas behind the gateway.

Each sequence's requests carry only the new chunk; Triton's sequence batcher and our embedded
onnxruntime backend keep the state. What would break without each part: the backend (each answer
from the initial state), the gateway's stickiness (a sequence's requests spread over replicas
that do not hold its state: least-connections sends the next one to the other replica), the
clients (a request without a sequence ID is refused by Triton).
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pytest

from tests import model_zoo
from tests.functional.test_gateway import gateway_ports, stot
from tests.functional.test_own_models import tritonstack
from tests.support import copy_project, require_tool
from tritonstack.clients.client import fetch_signature, infer
from tritonstack.core import health
from tritonstack.core.ports import free_ports
from tritonstack.core.settings import load
from tritonstack.serve.gateway import Gateway
from tritonstack.serve.runtime import EmbeddedTriton

pytestmark = pytest.mark.timeout(600)
MODEL = "recurrent"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = copy_project(tmp_path_factory.mktemp("server-state") / "tritonstack")
    model = model_zoo.recurrent(tmp_path_factory.mktemp("zoo"))
    added = tritonstack(root, "add-model", str(model.path), "--name", MODEL, *model.options,
                        timeout=240)  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "state kept in the server" in added.stdout, added.stdout
    return root, model


@pytest.fixture(scope="module")
def replicas(project, tmp_path_factory):
    """Two Triton replicas serving the model alone, the gateway in front of both."""
    require_tool("haproxy")
    root, _ = project
    alone = tmp_path_factory.mktemp("alone")
    (alone / MODEL).symlink_to(root / "model_repository" / MODEL)
    settings = dataclasses.replace(load(root / "stack.env"), PUBLIC_MODELS=(MODEL,))
    servers = [EmbeddedTriton(alone, *free_ports(3), exit_timeout_secs=2) for _ in range(2)]
    try:
        for server in servers:
            server.start(timeout=120)
        with Gateway.for_triton(servers[0], settings=settings, **gateway_ports()) as gateway:
            gateway.add_replica(servers[1].http_port, servers[1].grpc_port)
            yield gateway, servers
    finally:
        for server in servers:
            server.stop(grace=0.5)


def reference(model, chunks: list[np.ndarray]) -> list[np.ndarray]:
    """The scores of a sequence as onnxruntime in-process gives them, the state carried."""
    state = np.zeros((1, 8), np.float32)
    scores = []
    for chunk in chunks:
        answer = model_zoo.reference(model, {"chunk": chunk, "state": state})
        state = answer["stateN"]
        scores.append(answer["score"])
    return scores


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_through_two_replicas_keep_their_state(project, replicas, protocol):
    _, model = project
    gateway, _ = replicas
    url = f"127.0.0.1:{gateway.http_port if protocol == 'http' else gateway.grpc_port}"
    signature = fetch_signature(url, MODEL, protocol)
    assert signature.sequence and signature.max_rows == 1
    assert [t.name for t in signature.inputs] == ["chunk"]  # the state is the server's
    rng = np.random.default_rng(5)
    # Three sequences: with an even number, alternating replicas would keep each on one.
    steps, ids = 5, [101, 202, 303]
    chunks = {i: [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(steps)]
              for i in ids}  # fmt: skip
    backend = f"triton_{protocol}"
    before = stot(gateway, backend)
    got = {i: [] for i in ids}
    for step in range(steps):
        for i in ids:  # every sequence one step, then the next step: interleaved
            answer = infer(url, MODEL, chunks[i][step], protocol=protocol, signature=signature,
                           sequence=(i, step == 0, step == steps - 1))  # fmt: skip
            got[i].append(answer["score"])
    for i in ids:
        want = reference(model, chunks[i])
        assert all(
            np.allclose(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(got[i], want, strict=True)
        ), i
        # The state moved: a sequence's scores are not what each chunk gives from zeros.
        assert not np.allclose(got[i][-1], reference(model, chunks[i][-1:])[0])
    served = {name: count - before.get(name, 0) for name, count in stot(gateway, backend).items()}
    assert sum(served.values()) == steps * len(ids), served
    assert all(count > 0 for count in served.values()), served  # both replicas held sequences


def test_a_request_without_a_sequence_is_refused_and_the_server_keeps_serving(replicas):
    import tritonclient.http as httpclient

    gateway, _ = replicas
    client = httpclient.InferenceServerClient(f"127.0.0.1:{gateway.http_port}")
    tensor = httpclient.InferInput("chunk", [1, 8], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 8), np.float32))
    with pytest.raises(Exception, match="correlation ID"):
        client.infer(MODEL, [tensor])
    client.close()
    assert infer(f"127.0.0.1:{gateway.http_port}", MODEL, np.zeros((1, 8), np.float32))[
        "score"
    ].shape == (1, 1)


def test_the_health_probe_and_infer_steps_send_a_sequence(replicas):
    gateway, _ = replicas
    url = f"127.0.0.1:{gateway.http_port}"
    summary = health.probe(url, MODEL, health.Deadline(10, 5))
    assert "score" in summary, summary
    shown = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "infer", "--url", url, "--model", MODEL,
         "--steps", "3"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"sequence \d+: the server keeps the state across its 3 request", shown.stdout)
    scores = [line.split()[1] for line in shown.stdout.splitlines() if line.startswith("   0 ")]
    assert len(scores) == 3 and len(set(scores)) == 3, shown.stdout  # the state moved


@pytest.mark.parametrize("user_type", ["http_json", "http_binary", "grpc"])
def test_a_gated_loadtest_runs_sequences(project, replicas, tmp_path, user_type):
    root, _ = project
    gateway, _ = replicas
    result = tritonstack(
        root, "loadtest", "--host", f"127.0.0.1:{gateway.http_port}", "--grpc-host",
        f"127.0.0.1:{gateway.grpc_port}", "--model", MODEL, "--user-type", user_type,
        "--users", "2", "--duration", "3s", "--max-fail-ratio", "0", "--results", str(tmp_path),
        timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.match(r"[1-9]\d* requests, 0 failed", result.stdout.strip().splitlines()[-1])
