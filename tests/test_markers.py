"""The suite's own rule: a test that starts a server is marked `integration`, so `make test-unit`
(-m "not integration") runs only tests that need none, and cannot silently include a slow one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import conftest
from tests.conftest import ROOT, require_tool, server_command

PYTHON = sys.executable


@pytest.mark.parametrize(
    ("command", "starts"),
    [
        (["/venv/pytriton/tritonserver/bin/tritonserver", "--http-port=0"], "tritonserver"),
        (["/usr/bin/prometheus", "--config.file=p.yml"], "prometheus"),
        (["/usr/bin/prometheus-blackbox-exporter", "--web.listen-address=:0"],
         "prometheus-blackbox-exporter"),
        (["wrk", "-c", "16", "http://127.0.0.1:8000/"], "wrk"),
        ([PYTHON, "-m", "locust", "-f", "loadtest/locustfile.py"], "locust"),
        (["/venv/bin/uvicorn", "app:app"], "uvicorn"),
        ([PYTHON, "-m", "tritonstack.cli", "serve", "--http-port", "0"], "tritonstack serve"),
        (["/venv/bin/tritonstack", "up"], "tritonstack up"),
        # printing help or checking a config is not serving; neither is a one-shot command
        (["/bin/tritonserver", "--help"], None),
        (["/usr/bin/prometheus-blackbox-exporter", "--config.check", "--config.file=b.yml"], None),
        ([PYTHON, "-m", "tritonstack.cli", "export", "--model-repository", "/tmp/x"], None),
        ([PYTHON, "-m", "tritonstack.cli", "infer", "--url", "127.0.0.1:1"], None),
        (["/usr/bin/promtool", "test", "rules", "tests.yml"], None),
        (["shellcheck", "scripts/entrypoint.sh"], None),
    ],
)  # fmt: skip
def test_server_commands_are_recognised(command, starts):
    assert server_command(command) == starts


def test_an_unmarked_test_that_starts_a_server_is_caught(request):
    """The audit hook sees every subprocess this process starts, fixtures included; this test
    is unmarked, so a tritonserver start is recorded against it (and then forgiven here)."""
    sys.audit("subprocess.Popen", "/bin/tritonserver", ["/bin/tritonserver", "--http-port=0"],
              None, None)  # fmt: skip
    sys.audit("subprocess.Popen", "/usr/bin/promtool", "promtool check rules r.yml", None, None)
    assert conftest._unmarked_spawns.pop(request.node.nodeid) == ["tritonserver"]


@pytest.mark.integration
def test_a_marked_test_may_start_servers(request):
    sys.audit("subprocess.Popen", "/bin/tritonserver", ["/bin/tritonserver"], None, None)
    assert request.node.nodeid not in conftest._unmarked_spawns


def test_the_integration_marker_is_registered(pytestconfig):
    """An unregistered marker would be a typo that `-m "not integration"` silently ignores."""
    assert any(m.startswith("integration:") for m in pytestconfig.getini("markers"))


def test_make_test_runs_everything_and_test_unit_leaves_out_only_integration():
    make = require_tool("make")

    def recipe(target: str) -> str:
        result = subprocess.run(
            [make, "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
        )
        return next(line for line in result.stdout.splitlines() if "/pytest" in line)

    assert recipe("test").endswith("/pytest")  # CI's command: no selection at all
    # Only the unit tests run in parallel: the full suite's timing claims need a quiet machine.
    assert recipe("test-unit").endswith('/pytest -m "not integration" -n auto')
