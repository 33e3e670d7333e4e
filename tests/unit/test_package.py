"""The installed package works outside a checkout: it finds the project, not its own parent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.support import ROOT
from tritonstack.project import PROJECT_DIR_ENV
from tritonstack.runtime import BACKEND_SOURCES


def installed_copy(tmp_path: Path) -> Path:
    """The package's files alone, as a non-editable `pip install` leaves them."""
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "tritonstack", site / "tritonstack", ignore=shutil.ignore_patterns("__pycache__")
    )
    return site


def run(site: Path, cwd: Path, *args: str, env: dict | None = None):
    # PYTHONSAFEPATH keeps the current directory off sys.path, so only the copy is importable.
    environment = {k: v for k, v in os.environ.items() if k != PROJECT_DIR_ENV}
    environment |= {"PYTHONPATH": str(site), "PYTHONSAFEPATH": "1", **(env or {})}
    code = "import sys; from tritonstack.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["check", "serve", "up", "infer", "loadtest", "top"])
def test_every_command_starts_from_an_installed_copy(tmp_path, command):
    result = run(installed_copy(tmp_path), tmp_path, command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: tritonstack {command}" in result.stdout


def test_installed_copy_reads_the_project_in_the_current_directory(tmp_path):
    site = installed_copy(tmp_path)
    project = tmp_path / "project"
    shutil.copytree(ROOT / "model_repository", project / "model_repository")
    result = run(site, project, "check", "--no-load")  # loading starts a server: functional
    assert result.returncode == 0, result.stderr
    elsewhere = run(site, tmp_path / "site", "check", "--no-load")
    assert elsewhere.returncode == 1
    assert "model_repository" in elsewhere.stderr
    assert "Traceback" not in elsewhere.stderr


def test_project_dir_variable_wins_over_the_current_directory(tmp_path):
    site = installed_copy(tmp_path)
    result = run(site, tmp_path, "check", env={PROJECT_DIR_ENV: str(ROOT)})
    assert result.returncode == 0, result.stderr


def test_project_dir_option_wins_over_the_variable_and_the_current_directory(tmp_path):
    """The option points every command at a project; a broken copy proves which one was read."""
    site = installed_copy(tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(ROOT / "model_repository", broken / "model_repository")
    (broken / "model_repository" / "classifier" / "1" / "model.onnx").unlink()
    result = run(
        site, ROOT, "--project-dir", str(broken), "check", env={PROJECT_DIR_ENV: str(ROOT)}
    )
    assert result.returncode == 1
    assert str(broken / "model_repository") in result.stderr
    good = run(site, broken, "--project-dir", str(ROOT), "check")
    assert good.returncode == 0, good.stderr


def test_project_dir_option_without_a_project_is_one_readable_line(tmp_path):
    result = run(installed_copy(tmp_path), tmp_path, "--project-dir", str(tmp_path), "check")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"--project-dir {tmp_path}: no model_repository/ folder there" in result.stderr


def test_package_data_covers_the_backends_the_runtime_installs():
    """setuptools ships only what package-data names; the runtime copies every backend file."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["tritonstack"]
    package = ROOT / "tritonstack"
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    needed = {p for p in BACKEND_SOURCES.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    needed -= {BACKEND_SOURCES / "__init__.py"}  # a package module, shipped as code
    assert needed and needed <= shipped


#: The one layer whose modules import their extra at the top: `tritonstack check` reads graphs.
NEEDS_ITS_EXTRA_TO_IMPORT = {"tritonstack.check": "check"}


def test_every_module_imports_with_the_core_alone():
    """The layers: a module of the package imports with the core's dependencies only, and takes
    an extra's modules (errors.EXTRAS) inside the function that needs them, so the CLI, the
    launcher and the clients start wherever the core is installed; the exceptions are named."""
    code = """
import importlib, json, pkgutil, sys
from tritonstack.errors import EXTRAS
for module in EXTRAS:
    sys.modules[module] = None
import tritonstack
failed = {}
for info in pkgutil.walk_packages(tritonstack.__path__, "tritonstack."):
    if ".backends." in info.name or info.name.endswith("__main__"):
        continue  # backends run inside Triton's stubs; __main__ runs a command
    try:
        importlib.import_module(info.name)
    except ImportError as exc:
        failed[info.name] = exc.name
print(json.dumps(failed))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    failed = json.loads(result.stdout)
    from tritonstack.errors import EXTRAS

    assert {module: EXTRAS[name] for module, name in failed.items()} == NEEDS_ITS_EXTRA_TO_IMPORT


def test_the_architecture_doc_places_every_module_in_one_layer():
    """docs/architecture.md's table of layers names each module of the package once: a new
    module needs a place (and so a layer) before it lands."""
    import re

    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("The modules by layer", 1)[1].split("\n\n", 2)[1]
    named = []
    for row in table.splitlines()[2:]:
        modules = row.split("|")[2]
        named += re.findall(r"`([a-z0-9_]+/?)`", re.sub(r"\([^)]*\)", "", modules))
    package = ROOT / "tritonstack"
    present = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    present |= {f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    present |= {"backends/"}  # the backends run inside Triton: a folder, not a package
    assert sorted(named) == sorted(set(named)), "a module is named twice"
    assert set(named) == present
