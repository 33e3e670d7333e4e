"""python -m bench's own family end to end in quick mode: two models of one's own as add-model
serves them, on the real Triton and FastAPI + onnxruntime, against onnxruntime in-process.
The numbers are smoke; that every server answered every window, with every row, is not."""

from __future__ import annotations

import json

import pytest

from bench import own, own_report
from bench.runner import main
from tests.support import require_tool
from tritonstack.check.onnx_serving import DEFAULT_MAX_BATCH_SIZE


@pytest.mark.timeout(600)
def test_quick_own_family_compares_triton_with_onnxruntime_in_process(tmp_path, capsys):
    require_tool("wrk")
    assert main(["--quick", "--scenarios", "own", "--out", str(tmp_path)]) == 0
    progress = capsys.readouterr().out
    assert "own: image x8 onnxruntime in-process, every core:" in progress
    results = json.loads((tmp_path / "benchmarks" / "results.json").read_text())
    section = results["own"]
    measured = sorted(
        (p["model"], p["rows"], p["server"], p["protocol"]) for p in section["points"]
    )
    servers = [("onnxruntime", layout) for layout in own.LAYOUTS] + [
        (server, protocol) for server, protocols in own.PROTOCOLS.items() for protocol in protocols
    ]
    expected = sorted(
        (m, rows, *point) for m in own.MODELS for rows in own.QUICK.row_counts for point in servers
    )
    assert measured == expected
    for point in section["points"]:
        summary = point["summary"]
        assert summary["errors"] == 0 and summary["rps"]["median"] > 0, point
        assert summary["rows_per_request"] == point["rows"], point
        if point["server"] == "triton":
            # Where Triton's CPU went, by its own processes, and the batches its batcher ran.
            split = point["cpu_us_per_row"]
            assert split["tritonserver"] > 0 and split["stubs"] > 0, point
            assert point["rows"] <= summary["avg_batch"] <= DEFAULT_MAX_BATCH_SIZE, point
    found = own_report.targets(section)
    verdicts = len(own.MODELS) * len(own.QUICK.row_counts)
    assert [t.passed is not None for t in found] == [True] * verdicts, found
    text = (tmp_path / "benchmarks.md").read_text()
    assert own_report.HEADING in text and "QUICK MODE" in text
