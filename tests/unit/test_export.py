"""The committed classifier is reproducible: `tritonstack export` regenerates it bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest

from tests.support import IN_CI, REPOSITORY, embeddings
from tritonstack.models.export import (
    METADATA_NAME,
    MIN_ACCURACY,
    TRAIN_FRACTION,
    cpu_runs_pinned_kernels,
    export,
    make_dataset,
    train_pinned,
)


def predict(model: Path | bytes, features: np.ndarray) -> np.ndarray:
    source = model if isinstance(model, bytes) else str(model)
    # One thread: onnxruntime's thread pool may split a sum differently from one run to the next
    # on a busy machine, and these tests compare models, not schedules.
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return session.run(["class"], {"features": features})[0]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Two independent exports: one in-process, one by the command a user runs (its output is
    kept for the progress test; one training fewer keeps `make test-unit` quick)."""
    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    result = export(first, log=lambda _: None)
    command = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "export", "--model-repository", str(second)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result, first, command.stdout, second


def test_two_exports_write_the_same_model(exported):
    _, first, _, second = exported
    model = "classifier/1/model.onnx"
    assert (first / model).read_bytes() == (second / model).read_bytes()
    features = embeddings(256, seed=7)
    np.testing.assert_array_equal(
        predict(first / model, features), predict(second / model, features)
    )


#: Converts a small MLP with to_onnx and prints the written model's SHA-256 and opset domains.
CONVERT_ONE = """
import hashlib, warnings
import numpy as np
import onnx
from sklearn.neural_network import MLPClassifier
from tritonstack.models.export import FEATURES, to_onnx
warnings.simplefilter("ignore")  # 3 iterations do not converge, and need not
x = np.random.default_rng(0).standard_normal((64, FEATURES)).astype(np.float32)
model = MLPClassifier(hidden_layer_sizes=(4,), max_iter=3, random_state=0).fit(x, x[:, 0] > 0)
blob = to_onnx(model)
domains = [o.domain for o in onnx.load_from_string(blob).opset_import]
print(hashlib.sha256(blob).hexdigest(), domains)
"""


def test_the_conversion_writes_the_same_bytes_whatever_the_string_hashing():
    """skl2onnx lists the opsets from a set, in an order that follows Python's per-process string
    hashing: PYTHONHASHSEED 30 put `ai.onnx.ml` first (1 seed in 41 here), and an export in such
    a process wrote other bytes than the committed model. The conversion sorts them."""
    written = {
        seed: subprocess.run(
            [sys.executable, "-c", CONVERT_ONE],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.strip()
        for seed in ("0", "30")
    }
    assert written["0"] == written["30"], written
    assert written["0"].endswith("['', 'ai.onnx.ml']")


def test_export_meets_the_accuracy_floor_and_records_how_it_was_made(exported):
    result, first, _, _ = exported
    metadata = json.loads((first / "classifier/1" / METADATA_NAME).read_text())
    assert metadata["heldout_accuracy"] == result.heldout_accuracy >= MIN_ACCURACY
    assert metadata["regenerate"] == "tritonstack export"
    assert set(metadata["libraries"]) == {"scikit-learn", "skl2onnx", "onnx", "onnxruntime"}
    assert metadata["opset"] == result.opset


def test_the_recorded_accuracy_is_the_same_on_any_cpu(exported):
    """The metadata's accuracy is onnxruntime's on the held-out rows, and onnxruntime's kernels
    differ by CPU (in the 7th decimal of these probabilities): no held-out row sits that close to
    a tie, so every CPU counts the same rows right."""
    _, first, _, _ = exported
    features, labels = make_dataset()
    heldout = features[int(len(labels) * TRAIN_FRACTION) :]
    probabilities = predict(first / "classifier/1/model.onnx", heldout)
    assert np.abs(probabilities[:, 1] - 0.5).min() > 1e-4


def test_exported_graph_has_the_contract_names_and_shapes(exported):
    _, first, _, _ = exported
    graph = onnx.load(first / "classifier/1/model.onnx").graph
    assert [i.name for i in graph.input] == ["features"]
    assert [o.name for o in graph.output] == ["class"]
    dims = [d.dim_param or d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", 128]
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT


@pytest.fixture
def pinned_cpu() -> None:
    """The committed model is what the pinned kernels compute: a CPU without them (an ARM laptop)
    cannot reproduce it. CI machines are x86-64 with AVX2 and FMA: there it fails instead."""
    if not cpu_runs_pinned_kernels():
        message = "this CPU lacks AVX2/FMA, which export's pinned training kernels need"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def differences(committed: onnx.ModelProto, fresh: onnx.ModelProto) -> list[str]:
    """What tells two exports apart: each weight array not equal bit for bit, then the rest of
    the graph (nodes, names, opsets, doc strings) compared without the weights."""
    found = []
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in fresh.graph.initializer}
    for initializer in committed.graph.initializer:
        theirs = weights.pop(initializer.name, None)
        ours = onnx.numpy_helper.to_array(initializer)
        if theirs is None or theirs.dtype != ours.dtype or not np.array_equal(theirs, ours):
            found.append(f"weights {initializer.name}")
    found += [f"weights {name} (only in the fresh export)" for name in weights]
    bare = [onnx.ModelProto(), onnx.ModelProto()]
    for copy, model in zip(bare, (committed, fresh), strict=True):
        copy.CopyFrom(model)
        del copy.graph.initializer[:]
    if bare[0].SerializeToString() != bare[1].SerializeToString():
        found.append("the graph besides its weights")
    return found


def test_committed_model_has_not_drifted_from_the_exporter(exported, pinned_cpu):
    """Fails when model.onnx or its metadata is edited by hand or the exporter changes.

    Training is pinned to one set of BLAS kernels on one thread
    (tritonstack.models.export.TRAINING_ENV), so a re-export on any x86-64 CPU is the committed file
    bit for bit: no tolerance.
    """
    _, first, _, _ = exported
    committed_path, fresh_path = (
        REPOSITORY / "classifier/1/model.onnx",
        first / "classifier/1/model.onnx",
    )
    hint = "regenerate with `tritonstack export` and commit both files"
    assert differences(onnx.load(committed_path), onnx.load(fresh_path)) == [], hint
    assert committed_path.read_bytes() == fresh_path.read_bytes(), hint
    committed_metadata = json.loads((REPOSITORY / "classifier/1" / METADATA_NAME).read_text())
    fresh_metadata = json.loads((first / "classifier/1" / METADATA_NAME).read_text())
    assert committed_metadata == fresh_metadata, hint


def test_the_drift_check_catches_a_one_step_weight_edit():
    """The smallest edit there is: one weight moved to the next float32 is a difference."""
    model = onnx.load(REPOSITORY / "classifier/1/model.onnx")
    edited = onnx.ModelProto()
    edited.CopyFrom(model)
    weights = next(i for i in edited.graph.initializer if len(i.dims) == 2)
    nudged = onnx.numpy_helper.to_array(weights).copy()
    nudged.flat[0] = np.nextafter(nudged.flat[0], np.float32(np.inf))
    weights.CopyFrom(onnx.numpy_helper.from_array(nudged, weights.name))
    assert differences(model, edited) == [f"weights {weights.name}"]
    assert differences(model, model) == []


def test_training_is_pinned_whatever_the_callers_blas_settings(monkeypatch, pinned_cpu):
    """The child's kernels and thread count are TRAINING_ENV's, not the caller's: with the
    caller asking for other kernels and threads (which alone move the weights: see TRAINING_ENV),
    training gives the committed model's first-layer weights bit for bit."""
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Sandybridge")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    model, *_ = train_pinned(log=lambda _: None)
    committed = onnx.load(REPOSITORY / "classifier/1/model.onnx")
    first_layer = next(i for i in committed.graph.initializer if list(i.dims) == [128, 64])
    np.testing.assert_array_equal(model.coefs_[0], onnx.numpy_helper.to_array(first_layer))


@pytest.mark.parametrize(
    ("machine", "flags", "pinned"),
    [
        ("x86_64", "fpu sse2 avx avx2 fma avx512f", True),
        ("x86_64", "fpu sse2 avx avx2 fma", True),
        ("x86_64", "fpu sse2 avx", False),  # no AVX2: the Haswell kernels would not run
        ("aarch64", "fp asimd", False),
    ],
)
def test_training_pins_the_kernels_only_where_the_cpu_runs_them(
    monkeypatch, machine, flags, pinned
):
    monkeypatch.setattr("platform.machine", lambda: machine)
    cpuinfo = f"processor\t: 0\nflags\t\t: {flags}\n"
    assert cpu_runs_pinned_kernels(cpuinfo) is pinned


def test_export_cli_shows_progress(exported):
    _, _, output, second = exported
    assert [line[:5] for line in output.splitlines()] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert (second / "classifier/1/model.onnx").is_file()
