"""`tritonstack top`: the delta arithmetic on fixed scrapes and its one-line errors."""

from __future__ import annotations

import threading

import pytest

from tritonstack.cli import main
from tritonstack.clients.top import rates, table
from tritonstack.core.ports import free_ports


def counters(model: str, version: str = "1", **values: float) -> dict:
    """Samples in tritonstack.clients.metrics.scrape's shape for one model version."""
    samples = {}
    for name, value in values.items():
        labels = {"model": model, "version": version}
        if name.startswith("failure_"):
            labels["reason"] = name.removeprefix("failure_")
            name = "nv_inference_request_failure"
        samples[(name, frozenset(labels.items()))] = value
    return samples


def test_rates_from_two_scrapes():
    before = {
        **counters(
            "classifier",
            nv_inference_request_success=100,
            nv_inference_count=100,
            nv_inference_exec_count=50,
            nv_inference_queue_duration_us=1000,
            nv_inference_compute_infer_duration_us=5000,
            failure_REJECTED=3,
            failure_BACKEND=0,
        ),
        **counters("idle", nv_inference_request_success=7, nv_inference_exec_count=7),
        ("nv_cpu_utilization", frozenset()): 0.5,  # not per model: ignored
    }
    after = {
        **counters(
            "classifier",
            nv_inference_request_success=300,
            nv_inference_count=500,  # requests of several rows
            nv_inference_exec_count=100,
            nv_inference_queue_duration_us=3000,
            nv_inference_compute_infer_duration_us=45000,
            failure_REJECTED=7,
            failure_BACKEND=0,
        ),
        **counters("idle", nv_inference_request_success=7, nv_inference_exec_count=7),
    }
    classifier, idle = rates(before, after, seconds=2.0)
    assert classifier.model == "classifier"
    assert classifier.requests_per_s == 100.0
    assert classifier.inferences_per_s == 200.0
    assert classifier.batch_size == 8.0  # inferences / executions, not requests / executions
    assert classifier.queue_us == 10.0  # per successful request
    assert classifier.compute_us == 200.0
    assert classifier.failures_per_s == {"REJECTED": 2.0}  # reasons that did not occur: left out
    assert idle.model == "idle"
    assert (idle.requests_per_s, idle.batch_size, idle.queue_us, idle.compute_us) == (
        0.0,
        None,
        None,
        None,
    )
    text = table([classifier, idle])
    assert text.splitlines()[1].split() == [
        "classifier", "100.0", "200.0", "8.00", "10.0", "200.0", "REJECTED", "2.0",
    ]  # fmt: skip
    assert text.splitlines()[2].split() == ["idle", "0.0", "0.0", "-", "-", "-", "-"]


def test_a_scrape_that_read_a_request_before_its_rows_shows_no_impossible_row():
    """A request completing mid-scrape is counted in nv_inference_request_success and not yet in
    nv_inference_count (Triton updates and the scrape reads them one after the other): the
    window then holds one request more than inferences. Every request has at least one row, so
    top shows inferences at the requests' rate and a batch of at least 1, never below."""
    before = counters(
        "classifier",
        nv_inference_request_success=100,
        nv_inference_count=99,  # the 100th request's row not counted yet when this was read
        nv_inference_exec_count=99,
    )
    after = counters(
        "classifier",
        nv_inference_request_success=893,
        nv_inference_count=892,
        nv_inference_exec_count=892,
    )
    (row,) = rates(before, after, seconds=1.5)
    assert row.requests_per_s == pytest.approx(528.67, abs=0.01)
    assert row.inferences_per_s == row.requests_per_s
    assert row.batch_size == 1.0
    # Executions read after a batch's rows were: more executions than inferences in the window.
    skewed = counters("classifier", nv_inference_request_success=893, nv_inference_count=891,
                      nv_inference_exec_count=899)  # fmt: skip
    (row,) = rates(before, skewed, seconds=1.0)
    assert row.inferences_per_s == 793.0 and row.batch_size == 1.0
    batched = counters("classifier", nv_inference_request_success=110, nv_inference_count=139,
                       nv_inference_exec_count=104)  # fmt: skip
    (row,) = rates(before, batched, seconds=1.0)
    assert (row.inferences_per_s, row.batch_size) == (40.0, 8.0)  # real batches: untouched


def test_versions_are_summed_and_a_restart_counts_from_zero():
    before = {
        **counters("m", "1", nv_inference_request_success=50, nv_inference_exec_count=50),
        **counters("m", "2", nv_inference_request_success=1000, nv_inference_exec_count=1000),
    }
    after = {  # version 2's counter went down: the server restarted, 10 requests since
        **counters("m", "1", nv_inference_request_success=60, nv_inference_exec_count=55),
        **counters("m", "2", nv_inference_request_success=10, nv_inference_exec_count=10),
        **counters("new", nv_inference_request_success=4, nv_inference_count=4),
    }
    m_rates = {row.model: row for row in rates(before, after, seconds=1.0)}
    assert m_rates["m"].requests_per_s == 20.0
    assert m_rates["new"].requests_per_s == 4.0  # loaded between the scrapes


def test_rates_needs_a_positive_window():
    with pytest.raises(ValueError):
        rates({}, {}, 0)


def test_unreachable_url_is_one_line_error(capsys):
    (port,) = free_ports(1)
    code = main(["top", "--url", f"http://127.0.0.1:{port}/metrics", "--once"])
    err = capsys.readouterr().err
    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert "cannot read Triton's metrics" in err and "Traceback" not in err


def test_a_page_that_is_not_triton_metrics_is_one_line_error(capsys, tmp_path):
    import http.server

    handler = type(
        "Handler",
        (http.server.BaseHTTPRequestHandler,),
        {
            "do_GET": lambda self: (
                self.send_response(200),
                self.end_headers(),
                self.wfile.write(b"# HELP up up\n# TYPE up gauge\nup 1\n"),
            ),
            "log_message": lambda *a: None,
        },
    )
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        code = main(["top", "--url", url, "--once", "--interval", "0.1"])
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert code == 1
    assert "is this Triton's metrics port" in err
