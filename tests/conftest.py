"""Suite-wide hooks: a test outside tests/functional/ fails if it starts a server (kinds.py)."""

from __future__ import annotations

import sys

import pytest

from tests import kinds

sys.addaudithook(kinds.audit)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of a unit test: watch what it starts."""
    kinds.watch(None if kinds.is_functional(item.path) else item.nodeid)


@pytest.fixture(autouse=True)
def _unit_tests_start_no_server(request):
    """A test outside tests/functional/ fails if it (or a fixture) starts a server."""
    yield
    kinds.watch(None)
    started = kinds.spawns.pop(request.node.nodeid, [])
    if started:
        pytest.fail(
            f"{request.node.nodeid} starts {sorted(set(started))}: a test that starts a server "
            "belongs in tests/functional/ (`make test-unit` runs tests/unit/ on every core)"
        )
