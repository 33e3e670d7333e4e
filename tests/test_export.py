"""The committed classifier is reproducible: `tritonstack export` regenerates it exactly."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import REPOSITORY, embeddings
from tritonstack.export import METADATA_NAME, MIN_ACCURACY, export


def predict(model_path, features):
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return session.run(["class"], {"features": features})[0]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Two independent exports, as two users running the command would get."""
    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    return export(first, log=lambda _: None), first, export(second, log=lambda _: None), second


def test_two_exports_give_identical_predictions(exported):
    _, first, _, second = exported
    features = embeddings(256, seed=7)
    a = predict(first / "classifier/1/model.onnx", features)
    b = predict(second / "classifier/1/model.onnx", features)
    np.testing.assert_array_equal(a, b)


def test_export_meets_the_accuracy_floor_and_records_how_it_was_made(exported):
    result, first, _, _ = exported
    metadata = json.loads((first / "classifier/1" / METADATA_NAME).read_text())
    assert metadata["heldout_accuracy"] == result.heldout_accuracy >= MIN_ACCURACY
    assert metadata["regenerate"] == "tritonstack export"
    assert set(metadata["libraries"]) == {"scikit-learn", "skl2onnx", "onnx", "onnxruntime"}
    assert metadata["opset"] == result.opset


def test_exported_graph_has_the_contract_names_and_shapes(exported):
    _, first, _, _ = exported
    graph = onnx.load(first / "classifier/1/model.onnx").graph
    assert [i.name for i in graph.input] == ["features"]
    assert [o.name for o in graph.output] == ["class"]
    dims = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 128]
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_committed_model_has_not_drifted_from_the_exporter(exported):
    """Fails when model.onnx or its metadata is edited by hand or the exporter changes."""
    _, first, _, _ = exported
    features = embeddings(256, seed=8)
    np.testing.assert_array_equal(
        predict(REPOSITORY / "classifier/1/model.onnx", features),
        predict(first / "classifier/1/model.onnx", features),
    )
    committed = json.loads((REPOSITORY / "classifier/1" / METADATA_NAME).read_text())
    fresh = json.loads((first / "classifier/1" / METADATA_NAME).read_text())
    assert committed == fresh, "regenerate with `tritonstack export` and commit both files"


def test_export_cli_shows_progress(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "export", "--model-repository", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert [line[:5] for line in result.stdout.splitlines()] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert (tmp_path / "classifier/1/model.onnx").is_file()
