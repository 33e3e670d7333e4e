"""`tritonstack infer` against the real server: results printed, and every mistake one line."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.test_cli import assert_one_line_error, run


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["classifier", "pipeline", "classify"])
def test_infer_prints_labels_and_scores(triton, protocol, model):
    url = triton.http_url if protocol == "http" else triton.grpc_url
    result = run("infer", "--url", url, "--protocol", protocol, "--model", model, "--rows", "6")
    assert result.returncode == 0, result.stderr
    rows = result.stdout.strip().splitlines()[1:]
    assert len(rows) == 6
    for row in rows:
        _row, *label, score = row.split()
        assert " ".join(label) in {"relevant", "not relevant"}
        assert 0.5 <= float(score) <= 1.0


def test_infer_reads_embeddings_from_npy(triton, tmp_path):
    path = tmp_path / "batch.npy"
    np.save(path, np.ones((3, 128), np.float32))
    result = run("infer", "--url", triton.http_url, "--input", str(path))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 4


def test_infer_batch_above_limit_is_one_line(triton):
    result = run("infer", "--url", triton.http_url, "--rows", "65")
    assert_one_line_error(result, "batch-size must be <= 64")
