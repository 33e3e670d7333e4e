"""`tritonstack infer` against the real server: results printed, and every mistake one line."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.unit.test_cli import assert_one_line_error, run


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("model", "columns"),
    [("classifier", ["class"]), ("pipeline", ["label", "class"]), ("classify", ["label", "score"])],
)
def test_infer_prints_every_output_of_the_model(triton, protocol, model, columns):
    """The columns are the model's outputs as its metadata lists them; a vector is a list."""
    url = triton.http_url if protocol == "http" else triton.grpc_url
    result = run("infer", "--url", url, "--protocol", protocol, "--model", model, "--rows", "6")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.strip().splitlines()
    assert header.split() == ["row", *columns]
    assert len(rows) == 6
    for row in rows:
        cells = dict(zip(columns, re.split(r"\s{2,}", row.strip())[1:], strict=True))
        if "label" in cells:
            assert cells["label"] in {"relevant", "not relevant"}, row
        if "class" in cells:
            scores = [float(v) for v in cells["class"].strip("[]").split(",")]
            assert len(scores) == 2 and abs(sum(scores) - 1) < 1e-3, row


def test_infer_reads_embeddings_from_npy(triton, tmp_path):
    path = tmp_path / "batch.npy"
    np.save(path, np.ones((3, 128), np.float32))
    result = run("infer", "--url", triton.http_url, "--input", str(path))
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 4


def test_infer_batch_above_limit_is_one_line(triton):
    result = run("infer", "--url", triton.http_url, "--rows", "65")
    assert_one_line_error(
        result, "pipeline takes 1 to 64 (max_batch_size) rows per request, not 65"
    )


def test_infer_rejects_wrongly_shaped_npy(triton, tmp_path):
    path = tmp_path / "bad.npy"
    np.save(path, np.ones((2, 64), np.float32))
    result = run("infer", "--url", triton.http_url, "--input", str(path))
    assert_one_line_error(result, "input features has shape [2, 64]; pipeline takes ['rows', 128]")


def test_infer_rejects_a_file_that_is_not_npy(triton, tmp_path):
    path = tmp_path / "bad.npy"
    path.write_text("not numpy")
    result = run("infer", "--url", triton.http_url, "--input", str(path))
    assert_one_line_error(result, "cannot read a .npy or .npz file")
