"""Load testing, the pure parts: the load shapes, the gates, and the CLI's mistakes as one line.
tests/functional/test_loadtest.py runs Locust against the real server."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.support import ROOT


def load(name: str):
    """A module of loadtest/ under a private name (gates and shapes import no Locust)."""
    path = ROOT / "loadtest" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"loadtest_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gates = load("gates")
shapes = load("shapes")


# --- the files themselves ------------------------------------------------------------------------


# --- shapes and gates, as pure functions ---------------------------------------------------------


def test_step_shape_ramps_in_four_steps_then_stops():
    users = [shapes.step(t, 8, 8.0, 12.0)[0] for t in (0, 2.9, 3, 6, 9, 11.9)]
    assert users == [2, 2, 4, 6, 8, 8]
    assert shapes.step(12.0, 8, 8.0, 12.0) is None
    assert shapes.step(4 * shapes.STEP_SECONDS, 8, 8.0, None) is None  # default length


def test_spike_shape_bursts_in_the_middle_and_comes_back():
    stages = [shapes.spike(t, 40, 2.0, 10.0) for t in (0, 3.9, 4, 5.9, 6, 9.9)]
    assert [users for users, _ in stages] == [10, 10, 40, 40, 10, 10]
    assert all(rate >= 40 for _, rate in stages)  # the burst arrives within a second
    assert shapes.spike(10.0, 40, 2.0, 10.0) is None


def test_soak_and_constant_hold_the_users():
    assert shapes.soak(29 * 60, 16, 4.0, None) == (16, 4.0)
    assert shapes.soak(30 * 60, 16, 4.0, None) is None
    assert shapes.constant(1e6, 16, 4.0, None) == (16, 4.0)  # plain Locust: until stopped
    assert shapes.constant(10, 16, 4.0, 10) is None


def test_gates_name_the_gate_and_the_value():
    measured = {"requests": 100, "fail_ratio": 0.25, "p99_ms": 12}
    assert gates.evaluate(measured, None, None) == []
    assert gates.evaluate(measured, 20, 0.5) == []
    assert gates.evaluate(measured, 5, 0.1) == [
        "p99 12 ms > --max-p99-ms 5",
        "fail ratio 0.2500 > --max-fail-ratio 0.1",
    ]
    assert gates.evaluate({**measured, "requests": 0}, 5, None) == ["no request completed"]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "loadtest", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--rows", "65"], "--rows '65'"),
        (["--duration", "3x"], "--duration '3x'"),
        (["--max-fail-ratio", "2"], "--max-fail-ratio 2"),
        (["--host", "127.0.0.1:1"], "cannot reach Triton at 127.0.0.1:1"),
    ],
)
def test_cli_mistakes_are_one_line(args, fragment):
    result = run_cli(*args)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert fragment in result.stderr
