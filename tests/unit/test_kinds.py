"""The suite's own rule (tests/kinds.py): only tests in tests/functional/ start servers, so
`make test-unit` (tests/unit/, on every core) cannot silently include a slow one."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests import kinds
from tests.kinds import server_command
from tests.support import ROOT, require_tool

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
        (["/usr/sbin/dockerd", "--data-root=/tmp/d"], "dockerd"),
        (["docker", "compose", "-p", "x", "-f", "a.yml", "up", "-d", "--wait"], "docker compose"),
        (["docker", "run", "--rm", "busybox:1.37.0"], "docker run"),
        (["docker", "compose", "config"], None),
        (["docker", "image", "inspect", "busybox:1.37.0"], None),
        # printing help or checking a config is not serving; neither is a one-shot command
        (["/bin/tritonserver", "--help"], None),
        (["/usr/bin/prometheus-blackbox-exporter", "--config.check", "--config.file=b.yml"], None),
        ([PYTHON, "-m", "tritonstack.cli", "export", "--model-repository", "/tmp/x"], None),
        ([PYTHON, "-m", "tritonstack.cli", "infer", "--url", "127.0.0.1:1"], None),
        (["/usr/bin/promtool", "test", "rules", "tests.yml"], None),
        (["shellcheck", "scripts/secrets.sh"], None),
    ],
)  # fmt: skip
def test_server_commands_are_recognised(command, starts):
    assert server_command(command) == starts


def test_a_unit_test_that_starts_a_server_is_caught(request):
    """The audit hook sees every subprocess this process starts, fixtures included; this is a
    unit test, so a tritonserver start is recorded against it (and then forgiven here)."""
    sys.audit("subprocess.Popen", "/bin/tritonserver", ["/bin/tritonserver", "--http-port=0"],
              None, None)  # fmt: skip
    sys.audit("subprocess.Popen", "/usr/bin/promtool", "promtool check rules r.yml", None, None)
    assert kinds.spawns.pop(request.node.nodeid) == ["tritonserver"]


def test_the_kind_is_the_folder():
    """Functional tests may start servers; any other test file is watched."""
    assert kinds.is_functional(ROOT / "tests" / "functional" / "test_gateway.py")
    assert not kinds.is_functional(ROOT / "tests" / "unit" / "test_check.py")
    assert not kinds.is_functional(ROOT / "tests" / "test_functional_lookalike.py")
    assert not kinds.is_functional(ROOT / "bench" / "functional" / "test_x.py")


def test_every_test_file_is_of_one_kind():
    """A test file directly in tests/ would run in `make test` but in neither kind's folder."""
    tests = ROOT / "tests"
    assert not sorted(p.name for p in tests.glob("test_*.py"))
    assert {p.parent.name for p in tests.rglob("test_*.py")} == {"unit", "functional"}


def test_make_test_runs_everything_and_test_unit_only_the_unit_folder():
    make = require_tool("make")

    def dry_run(target: str) -> str:
        return subprocess.run(
            [make, "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
        ).stdout

    def recipes(target: str) -> list[str]:
        return [line for line in dry_run(target).splitlines() if "/pytest" in line]

    # CI's command: every folder, the unit tests on every core (beside the prefetch of what the
    # functional tests download), then the rest, all of it, one test at a time: the timing
    # claims of the functional tests need a quiet machine. The slowest are listed, as CI holds
    # the suite under 30 minutes.
    unit, rest = recipes("test")
    assert unit.endswith("/pytest tests/unit -n auto") and "-m tests.prefetch" in dry_run("test")
    assert rest.endswith("/pytest --ignore=tests/unit --durations=30")
    assert [line.split("/pytest")[1] for line in recipes("test-unit")] == [" tests/unit -n auto"]
