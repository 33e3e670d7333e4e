"""Build the stand-in images into the Docker engine DOCKER_HOST names: `make standin-images`.

One Debian 12 root filesystem (debootstrap, every package the stand-ins need) is imported once as
a base image; each stand-in in tests/standins/<image>/ is built from it with `docker build
--network none`, and wheels downloaded here for the base's Python go in through the build
context, so nothing inside a container reaches a network. Each is tagged with the official
reference its Dockerfile names (`LABEL tritonstack.standin.for=...`), which is what compose and
our Dockerfiles use, so those run unchanged. Because of that name, the builder refuses the
machine's default engine: a developer's own engine must never hold a stand-in under an official
name.

The downloads (the root filesystem's tarball, the wheelhouses) are cached in
~/.cache/tritonstack/standins/ under a key of what they contain, so a warm build downloads nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tritonstack.serve.runtime import default_cache_dir

STANDINS = Path(__file__).resolve().parent
ROOT = STANDINS.parent.parent
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
#: Debian 12's Python, which the stand-ins' wheels are downloaded for.
PYTHON = "3.11"
GLIBC = (2, 36)
#: Everything any stand-in needs, installed once into the shared root filesystem.
PACKAGES = (
    "busybox",
    "haproxy",
    "libpython3.11",  # the Python backend's stub embeds the interpreter
    "prometheus",
    "prometheus-blackbox-exporter",
    "python3",
    "python3-pip",
    "python3-venv",
)
#: The machine's own engine, wherever its socket is named (/var/run links to /run).
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


@dataclass(frozen=True)
class Standin:
    """One stand-in image: its folder, the official reference it is tagged with, its wheels."""

    folder: str
    #: Requirement lines downloaded with their dependencies, and ones without.
    wheels: tuple[str, ...] = ()
    wheels_no_deps: tuple[str, ...] = ()

    @property
    def dockerfile(self) -> Path:
        return STANDINS / self.folder / "Dockerfile"

    @property
    def reference(self) -> str:
        found = re.search(r'tritonstack\.standin\.for="([^"]+)"', self.dockerfile.read_text())
        if not found:
            raise SystemExit(f"{self.dockerfile}: no tritonstack.standin.for label")
        return found[1]


def _pins(*names: str) -> tuple[str, ...]:
    """pyproject.toml's exact pins for these distributions (the versions the tests run)."""
    pins = dict(re.findall(r'"([\w-]+)==([^"]+)"', (ROOT / "pyproject.toml").read_text()))
    return tuple(f"{name}=={pins[name]}" for name in names)


def _requirements(path: Path) -> tuple[str, ...]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return tuple(line for line in lines if line)


def standins() -> list[Standin]:
    return [
        Standin("busybox"),
        Standin(
            "tritonserver",
            wheels=_pins("numpy", "onnxruntime"),
            wheels_no_deps=_pins("nvidia-pytriton"),  # only its tritonserver binary is used
        ),
        Standin("haproxy"),
        Standin("prometheus"),
        Standin("blackbox-exporter"),
        Standin("locust", wheels=_requirements(ROOT / "loadtest" / "requirements.txt")),
    ]


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return default_cache_dir() / "standins"


@contextlib.contextmanager
def _scratch(target: Path) -> Iterator[Path]:
    """A scratch folder beside `target` (same file system, so the result renames into place);
    an interrupted download never leaves a half-filled cache entry under the final name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def rootfs_tarball(log: Callable[[str], None] = print) -> Path:
    """debootstrap's minbase with PACKAGES, as a tarball for `docker import` (cached)."""
    tarball = cache_dir() / f"rootfs-{SUITE}-{_key(SUITE, MIRROR, PACKAGES)}.tar"
    if tarball.is_file():
        log(f"standins: root filesystem cached: {tarball}")
        return tarball
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    started = time.monotonic()
    with _scratch(tarball) as scratch:
        rootfs = scratch / "rootfs"
        _run(debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
             str(rootfs), MIRROR)  # fmt: skip
        # apt's downloaded packages and lists: 130 MB no image needs (nothing installs later).
        for leftover in (
            *rootfs.glob("var/cache/apt/**/*.deb"),
            *rootfs.glob("var/lib/apt/lists/*"),
        ):
            if leftover.is_file():
                leftover.unlink()
        _run("tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(scratch / "rootfs.tar"), ".")
        os.replace(scratch / "rootfs.tar", tarball)
    log(f"standins: root filesystem built in {time.monotonic() - started:.0f} s: {tarball}")
    return tarball


def _platforms() -> list[str]:
    """Every manylinux tag the base's glibc runs: pip takes --platform literally."""
    major, minor = GLIBC
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 16, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def wheelhouse(standin: Standin, log: Callable[[str], None] = print) -> Path | None:
    """Wheels of the stand-in's requirements for the base's Python and platform (cached)."""
    if not (standin.wheels or standin.wheels_no_deps):
        return None
    target = cache_dir() / f"wheels-{standin.folder}-{_key(PYTHON, _platforms(), standin)}"
    if target.is_dir():
        log(f"standins: {standin.folder} wheels cached: {target}")
        return target
    started = time.monotonic()
    base = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
            "--implementation", "cp", "--python-version", PYTHON,
            *(arg for tag in _platforms() for arg in ("--platform", tag))]  # fmt: skip
    with _scratch(target) as scratch:
        wheels = scratch / "wheels"
        if standin.wheels:
            _run(*base, "--dest", str(wheels), *standin.wheels)
        if standin.wheels_no_deps:
            _run(*base, "--no-deps", "--dest", str(wheels), *standin.wheels_no_deps)
        os.replace(wheels, target)
    log(f"standins: {standin.folder} wheels downloaded in {time.monotonic() - started:.0f} s")
    return target


def _run(*command: str, env: dict[str, str] | None = None) -> None:
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode:
        raise SystemExit(
            f"standins: `{' '.join(command[:4])} ...` failed ({result.returncode}):\n"
            f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
        )


def docker_environment(host: str | None = None) -> dict[str, str]:
    """The caller's environment for the docker CLI, refusing the machine's default engine.

    DOCKER_BUILDKIT=0: Debian's engine is 20.10 and a newer CLI on PATH has no buildx plugin
    here; the classic builder reads local images and needs nothing more.
    """
    host = os.environ.get("DOCKER_HOST", "") if host is None else host
    socket = os.path.realpath(host.removeprefix("unix://")) if host.startswith("unix://") else ""
    if not host or socket in {os.path.realpath(s) for s in DEFAULT_SOCKETS}:
        raise SystemExit(
            "standins: DOCKER_HOST must name a private engine (unix:///path/to/its.sock), not "
            f"{host or 'the default socket'}: the stand-ins carry official image names and "
            "must never replace those in a developer's own engine"
        )
    return {**os.environ, "DOCKER_HOST": host, "DOCKER_BUILDKIT": "0"}


def _context(standin: Standin, wheels: Path | None, scratch: Path) -> Path:
    """The build context: the stand-in's folder, its wheels, and the files it takes from ours."""
    context = scratch / standin.folder
    shutil.copytree(STANDINS / standin.folder, context)
    (context / "wheels").mkdir()
    for wheel in sorted(wheels.iterdir()) if wheels else ():
        try:
            os.link(wheel, context / "wheels" / wheel.name)
        except OSError:
            shutil.copy2(wheel, context / "wheels" / wheel.name)
    if standin.folder == "tritonserver":
        backend = ROOT / "tritonstack" / "backends" / "onnxruntime" / "model.py"
        shutil.copy2(backend, context / "onnxruntime_backend.py")
        shutil.copy2(ROOT / "tritonstack" / "core" / "onnxruntime_rules.py", context)
    return context


def build(host: str | None = None, log: Callable[[str], None] = print) -> dict[str, float]:
    """Build every stand-in into the engine at `host` (default DOCKER_HOST); seconds per step."""
    env = docker_environment(host)
    timings: dict[str, float] = {}
    started = time.monotonic()
    tarball = rootfs_tarball(log)
    items = [(s, wheelhouse(s, log)) for s in standins()]
    timings["downloads"] = time.monotonic() - started
    base = f"tritonstack-standins/base:{tarball.stem.rsplit('-', 1)[-1]}"
    started = time.monotonic()
    known = subprocess.run(["docker", "image", "inspect", base], capture_output=True, env=env)
    if known.returncode:
        _run("docker", "import", str(tarball), base, env=env)
    timings["import"] = time.monotonic() - started
    with tempfile.TemporaryDirectory(prefix="tritonstack-standins-") as scratch:
        for standin, wheels in items:
            started = time.monotonic()
            context = _context(standin, wheels, Path(scratch))
            _run("docker", "build", "--quiet", "--network", "none", "--build-arg",
                 f"BASE={base}", "--tag", standin.reference, str(context), env=env)  # fmt: skip
            timings[standin.reference] = time.monotonic() - started
            log(f"standins: {standin.reference} built in {timings[standin.reference]:.0f} s")
    return timings


def main() -> int:
    started = time.monotonic()
    build()
    print(f"standins: every stand-in built in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
