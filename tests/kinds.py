"""The suite's two kinds of test, told apart by folder.

`tests/unit/` starts no server and downloads nothing, so `make test-unit` runs it on every core in
under a minute; `tests/functional/` starts the real programs (tritonserver, HAProxy, Prometheus,
Locust). An audit hook (installed by tests/conftest.py) sees every subprocess this process starts,
fixtures included, and a test outside `tests/functional/` that starts a server fails: a slow test
cannot slip into the fast kind unnoticed.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

FUNCTIONAL = Path(__file__).resolve().parent / "functional"

#: Programs that serve or generate load.
SERVER_PROGRAMS = frozenset(
    {
        "tritonserver",
        "prometheus",
        "prometheus-blackbox-exporter",
        "haproxy",
        "wrk",
        "locust",
        "uvicorn",
        "mlserver",
        "dockerd",
    }
)
#: docker subcommands that start containers (`docker compose up`, `docker run`, ...).
DOCKER_STARTS = frozenset({"up", "run", "start", "restart", "create"})
#: `tritonstack` subcommands that do nothing but start servers. (bench, loadtest and soak start
#: them in-process, where the programs above are seen; their argument errors start nothing.)
SERVING_SUBCOMMANDS = frozenset({"serve", "up"})
#: Arguments that make a server program print or check something and exit without serving.
NOT_SERVING = frozenset({"--help", "-h", "--version", "--config.check"})

#: Server-starting commands each watched (non-functional) test ran: {test id: [program]}.
spawns: dict[str, list[str]] = {}
_watching: list[str] = []


def is_functional(path: Path) -> bool:
    """Whether a test file is of the kind that may start servers."""
    return FUNCTIONAL in Path(path).resolve().parents


def server_command(args: Sequence[object]) -> str | None:
    """The server or load generator a command line starts, if any (`python -m x` included)."""
    words = [os.path.basename(os.fsdecode(a)) if isinstance(a, (str, bytes, os.PathLike))
             else str(a) for a in args]  # fmt: skip
    if words[:1] and words[0].startswith("python") and words[1:2] == ["-m"]:
        words = words[2:]
    if not words or NOT_SERVING & set(words):
        return None
    program = words[0].split(".")[0]
    if program in SERVER_PROGRAMS:
        return program
    if program == "tritonstack" and len(words) > 1 and words[1] in SERVING_SUBCOMMANDS:
        return f"tritonstack {words[1]}"
    if program == "docker":
        # `docker compose [options] up ...` or `docker run ...`: any word after `compose` may
        # be the subcommand (its options take values), the first one for docker itself.
        if words[1:2] == ["compose"] and DOCKER_STARTS & set(words[2:]):
            return "docker compose"
        if words[1:2] in (["run"], ["start"]):
            return f"docker {words[1]}"
    return None


def audit(event: str, args: tuple) -> None:
    """sys.addaudithook callback: record a server started while a unit test runs."""
    if event == "subprocess.Popen" and _watching:
        executable, command = args[0], args[1]
        if isinstance(command, (str, bytes)):
            command = shlex.split(os.fsdecode(command))
        found = server_command(list(command) or [executable])
        if found:
            spawns.setdefault(_watching[-1], []).append(found)


def watch(test_id: str | None) -> None:
    """Record what `test_id` starts from now on (None: stop watching)."""
    _watching.clear()
    if test_id is not None:
        _watching.append(test_id)
