"""Every public model over HTTP and gRPC equals onnxruntime on the same model.onnx."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.support import ROOT, embeddings
from tritonstack.clients.client import infer


def url(triton, protocol: str) -> str:
    return triton.http_url if protocol == "http" else triton.grpc_url


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("model", ["classifier", "pipeline", "classify"])
def test_model_matches_onnxruntime(triton, reference, protocol, rows, model):
    features = embeddings(rows, seed=rows)
    expected_probabilities, expected_labels = reference(features)

    outputs = infer(url(triton, protocol), model, features, protocol=protocol)

    if model in ("classifier", "pipeline"):
        assert outputs["class"].shape == (rows, 2)
        assert outputs["class"].dtype == np.float32
        np.testing.assert_allclose(outputs["class"], expected_probabilities, rtol=1e-6)
    if model in ("pipeline", "classify"):
        assert outputs["label"].shape == (rows, 1)
        assert [b.decode() for b in outputs["label"][:, 0]] == list(expected_labels)
    if model == "classify":
        assert outputs["score"].shape == (rows, 1)
        np.testing.assert_allclose(
            outputs["score"][:, 0], expected_probabilities.max(axis=1), rtol=1e-6
        )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_pipeline_and_classify_agree(triton, protocol):
    features = embeddings(64, seed=42)
    ensemble = infer(url(triton, protocol), "pipeline", features, protocol=protocol)
    bls = infer(url(triton, protocol), "classify", features, protocol=protocol)
    assert (ensemble["label"] == bls["label"]).all()
    np.testing.assert_array_equal(ensemble["class"].max(axis=1), bls["score"][:, 0])
    assert {b.decode() for b in bls["label"][:, 0]} == {"relevant", "not relevant"}


def test_classify_routes_to_onnx_without_tensorrt(triton):
    """On CPU `classifier_trt` is not served, so classify's one sub-request goes to `classifier`."""
    from tritonstack.clients.metrics import model_value, scrape

    before = scrape(triton.metrics_url)
    infer(triton.http_url, "classify", embeddings(5, seed=5))
    after = scrape(triton.metrics_url)
    assert "classifier_trt" in triton.skipped
    delta = model_value(after, "nv_inference_count", "classifier") - model_value(
        before, "nv_inference_count", "classifier"
    )
    assert delta == 5


def test_seed_client_example_prints_labels(triton):
    """examples/client.py is the guide's client with its mistakes fixed; it must keep working."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "client.py")],
        env={**os.environ, "TRITON_URL": triton.http_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 4
    assert all(line.split(" ", 1)[1].strip() in {"relevant", "not relevant"} for line in lines)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("requested", [("label",), ("class",)])
def test_pipeline_serves_a_subset_of_its_outputs(triton, reference, protocol, requested):
    """Requesting one output of an ensemble must work (upstream deadlock, see postprocess)."""
    features = embeddings(3, seed=3)
    expected_probabilities, expected_labels = reference(features)
    outputs = infer(url(triton, protocol), "pipeline", features, protocol, outputs=requested)
    assert set(outputs) == set(requested)
    if requested == ("label",):
        assert [b.decode() for b in outputs["label"][:, 0]] == list(expected_labels)
    else:
        np.testing.assert_allclose(outputs["class"], expected_probabilities, rtol=1e-6)
