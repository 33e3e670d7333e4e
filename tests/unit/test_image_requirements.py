"""Each image's Python and platform, read from its Dockerfile the way the build reads them, and
the pins the images share with the tests. tests/functional/test_image_requirements.py resolves
every pin for them on PyPI."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.support import ROOT


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
