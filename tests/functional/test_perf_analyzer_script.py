"""bench/perf_analyzer.sh: every perf_analyzer run it starts can read the restricted statistics.

perf_analyzer reads the statistics API before and after each measurement when the server lists
the `statistics` extension, and stops at the first refusal; the stack restricts that API to its
admin key. perf_analyzer itself ships only in Triton's SDK image (the PyPI `perf-analyzer`
package is an empty placeholder), so `perf_analyzer` here is a stand-in that records its command
line. The test then sends, with tritonclient, the statistics call each recorded run would make
(perf_analyzer's TritonClientBackend: `-H name:value` becomes an HTTP header, or gRPC call
metadata; an ensemble asks for every model's statistics) to the real tritonserver with the
stack's restricted APIs, and checks it is allowed, and refused without the run's headers.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ROOT

SCRIPT = ROOT / "bench" / "perf_analyzer.sh"
MODELS = ("classifier", "pipeline", "classify")


def fake_perf_analyzer(bin_dir: Path, record: Path) -> None:
    """A `perf_analyzer` that appends its arguments, one JSON list per run, to `record`."""
    bin_dir.mkdir()
    tool = bin_dir / "perf_analyzer"
    tool.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    tool.chmod(0o755)


def run_script(
    triton, tmp_path: Path, key_file: Path | None
) -> tuple[subprocess.CompletedProcess, list]:
    record = tmp_path / "runs.jsonl"
    fake_perf_analyzer(tmp_path / "bin", record)
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "TRITON_HOST": "127.0.0.1",
        "TRITON_HTTP_PORT": str(triton.http_port),
        "TRITON_GRPC_PORT": str(triton.grpc_port),
        "RESULTS": str(tmp_path / "results"),
        "CONCURRENCIES": "1 4",
        "ADMIN_KEY_FILE": str(key_file or tmp_path / "missing"),
    }
    result = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
    )
    runs = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return result, runs


def option(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == flag]


def statistics_call(args: list[str], with_headers: bool = True) -> None:
    """The statistics request perf_analyzer makes for this command line (raises if refused)."""
    (model,) = option(args, "-m")
    (protocol,) = option(args, "-i")
    (url,) = option(args, "-u")
    # perf_analyzer splits -H at the first colon
    headers = dict(h.split(":", 1) for h in option(args, "-H")) if with_headers else {}
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(url)
    try:
        metadata = client.get_server_metadata(headers=headers)
        extensions = metadata.extensions if protocol == "grpc" else metadata["extensions"]
        assert "statistics" in extensions  # why perf_analyzer asks for statistics at all
        config = client.get_model_config(model, headers=headers)
        platform = config.config.platform if protocol == "grpc" else config["platform"]
        # InferenceProfiler::GetServerSideStatus: every model for an ensemble, else the model
        client.get_inference_statistics("" if platform == "ensemble" else model, headers=headers)
    finally:
        client.close()


@pytest.fixture
def script_runs(triton, tmp_path: Path) -> list[list[str]]:
    key_file = tmp_path / "admin-key"
    key_file.write_text(triton.admin_key + "\n")  # as the entrypoint writes it
    result, runs = run_script(triton, tmp_path, key_file)
    assert result.returncode == 0, result.stderr
    return runs


def test_script_runs_every_model_and_protocol(script_runs) -> None:
    seen = {
        (option(r, "-m")[0], option(r, "-i")[0], option(r, "--concurrency-range")[0])
        for r in script_runs
    }
    assert seen == {(m, p, c) for m in MODELS for p in ("http", "grpc") for c in ("1:1", "4:4")}
    assert len(script_runs) == len(MODELS) * 3 * 2  # binary and JSON over HTTP, and gRPC


def test_every_run_may_read_the_statistics(triton, script_runs) -> None:
    for args in script_runs:
        statistics_call(args)


def test_statistics_are_refused_without_the_runs_headers(triton, script_runs) -> None:
    """The check above passes because of the key the script sends, not an open API."""
    for args in script_runs:
        with pytest.raises(InferenceServerException, match=r"restricted, expecting header"):
            statistics_call(args, with_headers=False)


def test_missing_admin_key_stops_with_one_line(triton, tmp_path: Path) -> None:
    result, runs = run_script(triton, tmp_path, None)
    assert result.returncode == 1 and runs == []
    assert result.stderr.count("\n") == 1 and "ADMIN_KEY_FILE" in result.stderr
