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
from tritonstack.core.project import PROJECT_DIR_ENV
from tritonstack.serve.runtime import BACKEND_SOURCES


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


#: The one layer whose modules may import their extra at the top: `tritonstack check` reads graphs.
NEEDS_ITS_EXTRA_TO_IMPORT = ("tritonstack.check.", "check")


def test_every_module_imports_with_the_core_alone():
    """The layers: a module of the package imports with the core's dependencies only, and takes
    an extra's modules (errors.EXTRAS) inside the function that needs them, so the CLI, the
    launcher and the clients start wherever the core is installed; the exceptions are named."""
    code = """
import importlib, json, pkgutil, sys
from tritonstack.core.errors import EXTRAS
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
    from tritonstack.core.errors import EXTRAS

    prefix, extra = NEEDS_ITS_EXTRA_TO_IMPORT
    assert failed, "no module needs the [check] extra to import: is the extra blocked?"
    assert {module: EXTRAS[name] for module, name in failed.items()} == {
        module: extra for module in failed if module.startswith(prefix)
    }


#: The subpackages in layer order: a module imports from its own folder and the folders before
#: it only (the top-level cli and stack compose them all; the backends run inside Triton's stubs
#: and import nothing of ours).
LAYERS = ("core", "launcher", "clients", "check", "serve", "load", "render", "models")


def test_each_layer_imports_only_the_layers_before_it():
    """Every import of tritonstack in a layer's modules (top-level or inside a function) names
    its own folder or one listed before it in LAYERS; each folder of the package is a layer."""
    import ast

    package = ROOT / "tritonstack"
    folders = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    assert folders == {*LAYERS, "backends"}
    wrong = []
    for folder in (*LAYERS, "backends"):
        allowed = set(LAYERS[: LAYERS.index(folder) + 1]) if folder in LAYERS else set()
        for path in sorted((package / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module] if node.module != "tritonstack" else []
                    if node.module == "tritonstack":
                        names = [f"tritonstack.{alias.name}" for alias in node.names]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                for name in names:
                    parts = name.split(".")
                    if parts[0] != "tritonstack" or len(parts) < 2:
                        continue
                    if parts[1] not in allowed and parts[1] != "DEFAULT_MODEL_REPOSITORY":
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_architecture_doc_places_every_module_in_its_folder():
    """docs/architecture.md's table of layers names each folder of the package and each module
    in it once: a new module needs a place (and so a layer) before it lands."""
    import re

    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc.split("| folder | modules |", 1)[1].split("\n\n", 1)[0]
    named: dict[str, list[str]] = {}
    for row in table.splitlines()[2:]:
        folder, modules = row.split("|")[1:3]
        folder = folder.strip().strip("`") if "`" in folder else ""
        named[folder] = re.findall(r"`([a-z0-9_]+/?)`", re.sub(r"\([^)]*\)", "", modules))
    package = ROOT / "tritonstack"
    present = {"": sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")}
    for folder in package.iterdir():
        if folder.is_dir() and (folder / "__init__.py").is_file():
            inside = [p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")]
            inside += [f"{p.name}/" for p in folder.iterdir() if (p / "model.py").is_file()]
            present[f"{folder.name}/"] = sorted(inside)
    assert {folder: sorted(modules) for folder, modules in named.items()} == present
