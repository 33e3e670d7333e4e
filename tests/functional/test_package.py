"""The built wheel: `pip install tritonstack` gets the product package, not the benchmark, and
the core alone is small and works.

Here rather than in tests/unit/: pip builds the wheel in an isolated environment, fetching the
build backend from PyPI (~15 s on 2 busy cores), too slow for `make test-unit`'s minute."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

from tests.package_sizes import CORE_LIMIT_MB, install, site_packages, tree_mb
from tests.support import ROOT


def test_the_wheel_holds_the_product_and_no_benchmark_code(tmp_path):
    """`pip install tritonstack` gets the product package; the benchmark stays in the checkout.
    Installed without extras (the core) it stays under CORE_LIMIT_MB, reads and checks the
    repository's configs, and a command that needs an extra names it."""
    # A copy of what the build reads, bench/ included, so setuptools' build/ and egg-info
    # land in tmp_path and not in the checkout.
    source, root = tmp_path / "source", ROOT
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("tritonstack", "bench"):
        shutil.copytree(root / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(tmp_path)]
    subprocess.run([*command, str(source)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("tritonstack-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"tritonstack"}, top
    assert "tritonstack/cli.py" in names
    assert not [n for n in names if "bench" in n.split("/")[-1] or "/benchmarks/" in n], names
    core = install(tmp_path, wheel, "core")
    empty = tmp_path / "empty"
    subprocess.run([sys.executable, "-m", "venv", str(empty)], check=True, timeout=300)
    size = tree_mb(site_packages(core)) - tree_mb(site_packages(empty))
    assert size <= CORE_LIMIT_MB, f"the core installs {size:.0f} MB"
    read = subprocess.run(
        [str(core / "bin" / "python"), "-c", "from tritonstack.core.repository import iter_models; "
         f"print(sorted(m.name for m in iter_models({str(ROOT / 'model_repository')!r})))"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert read.returncode == 0, read.stderr
    assert "classifier" in read.stdout
    serve = subprocess.run(
        [str(core / "bin" / "tritonstack"), "serve"], capture_output=True, text=True, timeout=120
    )
    assert serve.returncode == 1 and "Traceback" not in serve.stderr
    assert "needs the [serve] extra" in serve.stderr
    assert "pip install 'tritonstack[serve]'" in serve.stderr
