"""python -m bench's own family end to end in quick mode: two models of one's own as add-model
serves them, on the real Triton and FastAPI + onnxruntime, against onnxruntime in-process.
The numbers are smoke; that every server answered every window, with every row, is not."""

from __future__ import annotations

import itertools
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


def test_a_variety_of_requests_goes_out_in_turn_each_as_written(tmp_path):
    """wrk sends a Generator's `variety` distinct bodies one after another, headers intact, and
    onnxruntime in-process gets the same batches: a tree ensemble fed one batch over and over
    is measured with every branch predicted."""
    import hashlib
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bench.loadgen import Generator, Target, batches, binary_body
    from bench.runner import model_signatures

    require_tool("wrk")
    classifier = model_signatures()["classifier"]
    generator = Generator(tmp_path, {"classifier": classifier}, rows=4, variety=3)
    sent = [binary_body(classifier, data)[0] for data in batches(classifier, rows=4, count=3)]
    assert len({hashlib.sha256(b).digest() for b in sent}) == 3
    received: list[tuple[bytes, str | None]] = []

    class Recorder(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((body, self.headers["Inference-Header-Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v2/models/classifier/infer"
        result = generator.run(Target("http-binary", url, "classifier"), 1, 1)
    finally:
        server.shutdown()
    assert result.requests >= 6 and result.errors == 0, result
    bodies = [body for body, _ in received]
    # One connection: the bodies in turn, starting with request 0 (the one gRPC replays).
    # One connection: the bodies one after another, in order (wrk draws one before sending).
    order = [sent.index(body) for body in bodies]
    assert all(b == (a + 1) % 3 for a, b in itertools.pairwise(order)), order[:12]
    header_length = binary_body(classifier, batches(classifier, rows=4, count=1)[0])[1]
    assert {length for _, length in received} == {str(header_length)}
