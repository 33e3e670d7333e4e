"""Prepare what `tests/gpu/run.sh` installs on a GPU machine that reaches no package registry.

    python -m tests.gpu.prepare [--python 3.12] [--out tests/gpu/carry]

Run from a checkout with `.venv` (it packs the nvidia-pytriton that `make venv` installed) on a
machine that reaches PyPI. It writes, into `--out` (ignored by git):

- `tritonserver-runtime.tar.xz`: the wheel's tritonserver 2.51 cut to what the check runs (the
  server, the Python backend, the stub for the target Python, and the bundled libraries those
  need, found from their ELF `NEEDED` entries), in the wheel's own layout so their RPATHs hold;
  about a fifth of the 55 MB wheel;
- `wheels/`: numpy and onnx (the stand-in backend reads `model.onnx` with it) and what onnx
  needs, for the target Python, at the versions pyproject.toml pins. numpy is carried even where
  the machine has one: the wheel's Python backend stub (2.51) passes empty tensors under numpy 2
  (every output arrives as 0 bytes), so run.sh installs the pinned numpy 1 into its virtualenv,
  in front of the machine's own (torch runs with either);
- `MANIFEST.json`: each file's size and sha256, and what it was made for.

The device tool carries at most 64 MiB of ignored files, so this refuses to write more.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
from importlib.metadata import requires, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "gpu" / "carry"
RUNTIME = "tritonserver-runtime.tar.xz"
LIMIT = 64 * 2**20
#: Manylinux tags the machine's glibc (2.35 or newer, the wheel's own floor) accepts.
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")  # fmt: skip


def pins() -> dict[str, str]:
    """Exact versions of the installed tritonstack's dependencies, its extras' included
    (pyproject.toml's pins)."""
    found = (
        re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?==([^;\s]+)\s*(?:;.*)?$", r)
        for r in requires("tritonstack")
    )
    return {m.group(1).lower(): m.group(2) for m in found if m}


def needed(path: Path) -> list[str]:
    """The shared libraries an ELF file names as NEEDED."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", out.stdout)


def runtime_files(site: Path, python: str) -> list[Path]:
    """The wheel's files the check runs, relative to site-packages."""
    tree = Path("pytriton") / "tritonserver"
    files = [
        tree / "bin" / "tritonserver",
        tree / "backends" / "python" / "libtriton_python.so",
        tree / "backends" / "python" / "triton_python_backend_utils.py",
        tree / "python_backend_stubs" / python / "triton_python_backend_stub",
    ]
    missing = [str(f) for f in files if not (site / f).is_file()]
    if missing:
        raise SystemExit(f"prepare: nvidia-pytriton in {site} lacks {missing}")
    libs = Path("nvidia_pytriton.libs")
    bundled = {p.name for p in (site / libs).iterdir()}
    queue = [f for f in files if f.suffix != ".py"]
    seen: set[str] = set()
    while queue:
        for name in needed(site / queue.pop()):
            if name in bundled and name not in seen:
                seen.add(name)
                queue.append(libs / name)
    return files + [libs / name for name in sorted(seen)]


#: xz's blocks when it compresses on every core: each 32 MiB block is compressed apart, so the
#: ~105 MB tarball goes twice as fast on 2 cores (measured: 25 s against 52 s for one stream)
#: for 0.9 MB more (25.6 against 24.7 MB at -9).
XZ_BLOCK = "32MiB"


def pack_runtime(site: Path, python: str, target: Path, preset: int) -> None:
    """The runtime's files as a .tar.xz: by xz on every core where it is installed, else by
    Python's lzma in one stream (the same format: run.sh's `tar -xJf` reads either)."""
    xz = shutil.which("xz")
    if xz is None:
        with (
            lzma.open(target, "wb", preset=preset) as raw,
            tarfile.open(fileobj=raw, mode="w") as tar,
        ):
            for relative in runtime_files(site, python):
                tar.add(site / relative, arcname=str(relative))
        return
    with open(target, "wb") as out:
        compress = subprocess.Popen(
            [xz, f"-{preset}", "-T0", f"--block-size={XZ_BLOCK}", "-c"], stdin=subprocess.PIPE,
            stdout=out,
        )  # fmt: skip
        with tarfile.open(fileobj=compress.stdin, mode="w|") as tar:
            for relative in runtime_files(site, python):
                tar.add(site / relative, arcname=str(relative))
        compress.stdin.close()
        if compress.wait():
            raise SystemExit(f"prepare: xz failed ({compress.returncode}) writing {target}")


def download_wheels(python: str, wheels: Path) -> list[str]:
    """Download the wheels; returns the requirements run.sh installs."""
    pinned = pins()
    wanted = [f"{name}=={pinned[name]}" for name in ("numpy", "onnx", "protobuf")]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
               "--only-binary=:all:", "--python-version", python, *platforms, "-d", str(wheels),
               *wanted]  # fmt: skip
    subprocess.run(command, check=True)
    return wanted


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.prepare", description=__doc__)
    parser.add_argument("--python", default="3.12", help="the GPU machine's Python (X.Y)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--fast", action="store_true", help="light compression (for tests)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.1[0-3]", args.python):
        parser.error(f"--python {args.python}: the wheel has stubs for 3.10-3.13")
    import pytriton

    site = Path(pytriton.__file__).resolve().parents[1]
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("wheels/*.whl"):
        old.unlink()
    print(f"prepare: packing tritonserver for Python {args.python}", file=sys.stderr)
    pack_runtime(site, args.python, args.out / RUNTIME, preset=1 if args.fast else 9)
    print("prepare: downloading wheels", file=sys.stderr)
    requirements = download_wheels(args.python, args.out / "wheels")
    files = sorted(p for p in args.out.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    total = sum(p.stat().st_size for p in files)
    manifest = {
        "python": args.python,
        "nvidia-pytriton": version("nvidia-pytriton"),
        "requirements": requirements,
        "files": {
            str(p.relative_to(args.out)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
            for p in files
        },
        "total_bytes": total,
    }
    (args.out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"prepare: {len(files)} files, {total / 2**20:.1f} MiB in {args.out}", file=sys.stderr)
    if total > LIMIT:
        print(f"prepare: {total / 2**20:.1f} MiB is over the 64 MiB a device run carries",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
