"""Measure what each extra of pyproject.toml installs: `python -m tests.package_sizes`.

The wheel is built once; each variant gets a fresh venv (`pip install 'tritonstack[extra]'`) and
its size is `du` of site-packages less an empty venv's (pip's own). pyproject.toml states the
results; tests/functional/test_package.py installs the core alone again and holds it under
CORE_LIMIT_MB.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support import ROOT

VARIANTS = ("core", "clients", "check", "serve", "load", "render", "all")
CORE_LIMIT_MB = 150


def tree_mb(path: Path) -> float:
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20
    )


def site_packages(venv: Path) -> Path:
    (found,) = venv.glob("lib/python3*/site-packages")
    return found


def build_wheel(work: Path) -> Path:
    """The wheel of the checkout's package, from a copy (the build leaves egg-info behind)."""
    source = work / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "tritonstack", source / "tritonstack", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    wheels = work / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        timeout=600,
    )
    return next(wheels.glob("tritonstack-*.whl"))


def install(work: Path, wheel: Path, variant: str) -> Path:
    """A fresh venv holding the package with `variant` (core: no extra)."""
    venv = work / f"venv-{variant}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    spec = str(wheel) if variant == "core" else f"{wheel}[{variant}]"
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--find-links", str(wheel.parent), spec],
        check=True,
        timeout=900,
    )
    return venv


def measure(variants: tuple[str, ...] = VARIANTS) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        wheel = build_wheel(work)
        empty = work / "empty"
        subprocess.run([sys.executable, "-m", "venv", str(empty)], check=True, timeout=300)
        base = tree_mb(site_packages(empty))
        sizes = {}
        for variant in variants:
            print(f"[{len(sizes) + 1}/{len(variants)}] {variant}", file=sys.stderr, flush=True)
            sizes[variant] = tree_mb(site_packages(install(work, wheel, variant))) - base
        return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", help=f"of {', '.join(VARIANTS)} (default: all)")
    args = parser.parse_args()
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variant {sorted(unknown)[0]}; choose from {', '.join(VARIANTS)}")
    for variant, size in measure(tuple(args.variants) or VARIANTS).items():
        print(f"{variant:8} {size:6.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
