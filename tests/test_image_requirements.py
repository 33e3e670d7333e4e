"""Every image we build installs its pins from wheels for the image's own Python and platform.

Each Dockerfile declares its base image's interpreter and platforms once, as two build arguments
(`ARG <NAME>_PYTHON=3.13`, `ARG <NAME>_PLATFORM="manylinux_2_41_x86_64 ..."`); the test reads them,
collects what the Dockerfile installs with pip (pins on a `pip install` line and `-r` files it
copies in), and resolves them with `pip download --only-binary=:all:` for each platform. A pin
without a wheel there fails here instead of in `docker compose build`, where the slim bases have
no compiler. This needs PyPI (CI has it).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCKERFILES = ("Dockerfile.locust", "Dockerfile.triton")
#: Legacy manylinux names and the glibc they stand for (PEP 600); older wheels carry only these.
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


@dataclass
class ImagePython:
    dockerfile: str
    python: str  # "3.13"
    platforms: list[str]  # "manylinux_2_41_x86_64", one per architecture
    requirements: list[str]  # pip requirement lines


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def build_args(parsed: list[tuple[str, str]]) -> dict[str, str]:
    args = {}
    for keyword, rest in parsed:
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = " ".join(shlex.split(value))
    return args


def image_python(dockerfile: str) -> ImagePython:
    """The image's declared Python and platforms, and every requirement its pip installs."""
    parsed = instructions((ROOT / dockerfile).read_text())
    args = build_args(parsed)
    python = [v for k, v in args.items() if k.endswith("_PYTHON")]
    platforms = [v for k, v in args.items() if k.endswith("_PLATFORM")]
    assert len(python) == 1 and len(platforms) == 1, (
        f"{dockerfile} must declare its base image's Python and platform once, as build "
        f'arguments, e.g. ARG IMAGE_PYTHON=3.12 and ARG IMAGE_PLATFORM="manylinux_2_39_x86_64"; '
        f"found {sorted(args)}"
    )
    copied = {}  # where COPY puts a file inside the image -> the file in this checkout
    for keyword, rest in parsed:
        if keyword == "COPY":
            *sources, target = [a for a in shlex.split(rest) if not a.startswith("--")]
            for source in sources:
                inside = target if not target.endswith("/") else target + Path(source).name
                copied[inside] = ROOT / source
    requirements = []
    for keyword, rest in parsed:
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;", rest):
            words = shlex.split(command)
            if "install" not in words or not any(w in ("pip", "pip3") for w in words):
                continue
            words = words[words.index("install") + 1 :]
            for i, word in enumerate(words):
                if word in ("-r", "--requirement"):
                    lines = copied[words[i + 1]].read_text().splitlines()
                    requirements += [ln for ln in lines if ln.strip() and ln[0] != "#"]
                elif not word.startswith("-") and words[i - 1] not in ("-r", "--requirement"):
                    requirements.append(word)
    assert requirements, f"{dockerfile}: found no pip install"
    return ImagePython(dockerfile, python[0], platforms[0].split(), requirements)


def compatible_platforms(platform: str) -> list[str]:
    """The manylinux tags an interpreter on glibc 2.N accepts, newest first.

    pip download takes --platform tags literally: `manylinux_2_41_x86_64` alone would not match
    a wheel built for glibc 2.17, which that image runs.
    """
    match = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    assert match, f"{platform!r}: expected manylinux_2_<glibc minor>_<arch>"
    glibc, arch = int(match.group(1)), match.group(2)
    tags = []
    for minor in range(glibc, 4, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        if minor in LEGACY_MANYLINUX:
            tags.append(f"{LEGACY_MANYLINUX[minor]}_{arch}")
    return tags


def pip_download(
    python: str, platform: str, requirements: list[str], dest: Path
) -> subprocess.CompletedProcess:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "requirements.txt").write_text("\n".join(requirements) + "\n")
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
        "-d", str(dest / "wheels"), "-r", str(dest / "requirements.txt"),
    ]  # fmt: skip
    for tag in compatible_platforms(platform):
        command += ["--platform", tag]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


# pip download needs PyPI and may fetch a few hundred MB on a cold cache: above the suite's 300 s.
@pytest.mark.integration  # downloads every pinned wheel from PyPI (~30 s)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_image_requirements_have_wheels(dockerfile: str, tmp_path: Path) -> None:
    image = image_python(dockerfile)
    pinned = {re.split(r"[\[=]", r)[0].lower().replace("_", "-") for r in image.requirements}
    for platform in image.platforms:
        dest = tmp_path / platform
        result = pip_download(image.python, platform, image.requirements, dest)
        errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
        assert result.returncode == 0, (
            f"{dockerfile}: no wheels for Python {image.python} on {platform}: "
            + "\n".join(errors or result.stderr.splitlines()[-5:])
        )
        wheels = {w.name.split("-")[0].lower().replace("_", "-") for w in dest.glob("wheels/*")}
        assert pinned <= wheels  # every pin resolved to a wheel, not only its dependencies


@pytest.mark.integration  # asks PyPI
def test_old_numpy_pin_has_no_wheel_for_the_locust_image(tmp_path: Path) -> None:
    """The resolution check catches a pin that does not install: numpy 1.26.4 on Python 3.13."""
    image = image_python("Dockerfile.locust")
    old = [r if not r.startswith("numpy==") else "numpy==1.26.4" for r in image.requirements]
    result = pip_download(image.python, image.platforms[0], old, tmp_path)
    assert result.returncode != 0
    assert "numpy==1.26.4" in result.stderr


def test_the_locust_image_keeps_its_own_locust() -> None:
    """requirements.txt pins the locust the base image ships, so pip does not replace it."""
    dockerfile = (ROOT / "Dockerfile.locust").read_text()
    base = re.search(r"^FROM locustio/locust:(\S+)$", dockerfile, re.MULTILINE).group(1)
    image = image_python("Dockerfile.locust")
    assert f"locust=={base}" in image.requirements
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"locust=={base}"' in pyproject  # what the tests run
    compose = (ROOT / "docker-compose.yml").read_text()
    assert compose.count(f"image: tritonstack/locust:{base}") == 2  # master and workers


def test_pins_shared_with_the_tests_match() -> None:
    """Every pin also in pyproject.toml is the same version, except the documented numpy."""
    pyproject = dict(
        re.findall(r'"([\w-]+)(?:\[[\w,]+\])?==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    )
    image = image_python("Dockerfile.locust")
    for requirement in image.requirements:
        name, version = re.fullmatch(r"([\w-]+)(?:\[[\w,]+\])?==(\S+)", requirement).groups()
        if name in pyproject and name != "numpy":
            assert version == pyproject[name], requirement
