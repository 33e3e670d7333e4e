"""tests/gpu/run.sh, the GPU check, run here as far as a machine without a GPU allows.

What runs for real: `python -m tests.gpu.prepare` (the wheel's tritonserver cut down and the
pinned wheels, downloaded from PyPI), run.sh's offline install from that folder alone into a
fresh virtualenv, the unpacked tritonserver serving the repository, and every check and the load
sweep of tests/gpu/check.py, on a CPU instance (`--device cpu`). What only a GPU machine runs:
the KIND_GPU instance and its outputs in GPU memory (the report's first row says "no" here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

RUN = ROOT / "tests" / "gpu" / "run.sh"
CHECK = ROOT / "tests" / "gpu" / "check.py"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
#: The interpreter the virtualenv is made from: this one's base, as a bare machine has it.
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


def run(*args: object, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def prepare(out: Path, *args: str) -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", "tests.gpu.prepare", "--out", out, *args)


@pytest.fixture(scope="module")
def carry(tmp_path_factory) -> Path:
    """A carry for this machine's Python, lightly compressed (its size is not what is tested)."""
    out = tmp_path_factory.mktemp("carry")
    result = prepare(out, "--python", PYTHON, "--fast")
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def report(carry, tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict]:
    path = tmp_path_factory.mktemp("report") / "gpu-check.json"
    result = run(RUN, "--carry", carry, "--python", BASE_PYTHON, "--device", "cpu",
                 "--clients", "1,16", "--seconds", "1", "--report", path)  # fmt: skip
    return result, json.loads(path.read_text()) if path.exists() else {}


def one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_the_default_carry_fits_what_a_device_run_carries(tmp_path):
    """What a GPU session carries (Python 3.12, full compression) stays within 64 MiB, holds
    the pinned numpy 1 and onnx, and a tritonserver without the 3.13 stub's libpython."""
    result = prepare(tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "MANIFEST.json").read_text())
    assert manifest["python"] == "3.12"
    assert manifest["total_bytes"] <= 64 * 2**20, manifest["total_bytes"]
    assert manifest["total_bytes"] == sum(f["bytes"] for f in manifest["files"].values())
    assert [r.split("==")[0] for r in manifest["requirements"]] == ["numpy", "onnx", "protobuf"]
    assert any(name.startswith("wheels/numpy-1.") for name in manifest["files"])
    listing = run("tar", "-tJf", tmp_path / "tritonserver-runtime.tar.xz").stdout.split()
    assert "pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub" in listing
    assert not any("python_backend_stubs/3.13" in name for name in listing)
    assert not any("libpython3" in name for name in listing)


def test_the_check_passes_on_a_cpu_instance_installed_offline(report):
    result, data = report
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert data["passed"] and data["failures"] == []
    assert data["device"] == "cpu" and data["tritonserver"] == "2.51.0"
    assert data["outputs_on_gpu"] is False  # a CPU instance answers in CPU memory
    assert set(data["max_abs_error"]) == {"classifier", "pipeline", "classify"}
    assert all(error <= data["tolerance"] for error in data["max_abs_error"].values())
    assert all(data["labels_match"].values())
    points = {(p["model"], p["clients"]) for p in data["load"]}
    assert points == {(m, c) for m in ("classifier", "pipeline", "classify") for c in (1, 16)}
    assert all(p["requests"] > 0 and p["errors"] == 0 for p in data["load"])
    assert data["average_batch"] > 1.0  # 16 clients: the batcher merged requests
    assert "installing offline" in result.stderr  # progress, as the run goes


def test_the_report_is_the_markdown_of_its_numbers(report):
    """The printed report and the JSON's say the same, and render() rebuilds it from the
    numbers alone: a GPU machine's JSON is enough to put its report in docs/benchmarks.md."""
    sys.path.insert(0, str(CHECK.parent))
    try:
        import check
    finally:
        sys.path.remove(str(CHECK.parent))
    result, data = report
    assert result.stdout == data["markdown"]
    fields = {k: v for k, v in data.items() if k not in ("passed", "markdown", "load")}
    rebuilt = check.Result(**fields, load=[check.LoadPoint(**p) for p in data["load"]])
    assert check.render(rebuilt) == data["markdown"]
    lines = data["markdown"].splitlines()
    assert lines[0] == "# GPU check: passed"
    assert "| `pipeline` | 16 |" in data["markdown"]
    assert "| classifier's outputs reach a BLS caller in GPU memory | no |" in lines


def test_usage_and_bad_arguments_get_one_line(tmp_path, carry):
    helped = run(RUN, "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("usage: tests/gpu/run.sh")
    one_line_error(run(RUN, "--frobnicate"), "unknown argument '--frobnicate'")
    one_line_error(run(RUN, "--carry"), "--carry needs a value")
    one_line_error(run(RUN, "--carry", tmp_path), "no MANIFEST.json", "tests.gpu.prepare")
    one_line_error(run(RUN, "--carry", carry, "--python", "no-such-python"), "no interpreter")
    runtime = tmp_path / "not-a-runtime"
    runtime.mkdir()
    one_line_error(run(sys.executable, CHECK, "--runtime", runtime), "no pytriton/tritonserver")
    one_line_error(
        run(sys.executable, CHECK, "--runtime", runtime, "--clients", "1,x"), "1,4,16,64"
    )


def test_a_carry_for_another_python_or_damaged_is_refused(tmp_path, carry):
    other = tmp_path / "other"
    other.mkdir()
    manifest = json.loads((carry / "MANIFEST.json").read_text())
    (other / "MANIFEST.json").write_text(json.dumps({**manifest, "python": "3.99"}))
    one_line_error(run(RUN, "--carry", other, "--python", BASE_PYTHON), "the carry is for 3.99")
    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-r", str(carry), str(damaged)], check=True)
    wheel = next((damaged / "wheels").glob("onnx-*.whl"))
    wheel.write_bytes(wheel.read_bytes()[:1000])
    result = run(RUN, "--carry", damaged, "--python", BASE_PYTHON)
    progress, error = result.stderr.split("\n", 1)
    assert progress == "gpu check: verifying the carry", result.stderr
    result.stderr = error
    one_line_error(result, str(wheel), "prepare the carry again")
