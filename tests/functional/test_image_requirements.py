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
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_image_requirements import image_python

DOCKERFILES = ("Dockerfile.locust", "Dockerfile.triton")
#: Legacy manylinux names and the glibc they stand for (PEP 600); older wheels carry only these.
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


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


def test_old_numpy_pin_has_no_wheel_for_the_locust_image(tmp_path: Path) -> None:
    """The resolution check catches a pin that does not install: numpy 1.26.4 on Python 3.13."""
    image = image_python("Dockerfile.locust")
    old = [r if not r.startswith("numpy==") else "numpy==1.26.4" for r in image.requirements]
    result = pip_download(image.python, image.platforms[0], old, tmp_path)
    assert result.returncode != 0
    assert "numpy==1.26.4" in result.stderr
