"""The stand-in images (tests/standins/), read without building them: one for every image compose
and our Dockerfiles use, each tagged with exactly that reference and saying what it stands in for
and what differs; and `make standin-images` refuses a developer's own engine.
tests/functional/test_compose_stack.py builds them and runs the stack on them."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.standins import build
from tests.support import ROOT

#: Images nothing here can build, and why: the compose stack runs without them.
NOT_STOOD_IN = {
    "grafana/grafana:13.3.2": "no Grafana build is obtainable from Debian or PyPI",
    "nvcr.io/nvidia/tritonserver:26.08-py3-sdk": "perf_analyzer needs a GPU (the bench profile)",
    "nvcr.io/nvidia/tritonserver:26.08-vllm-python-py3": "its vLLM needs a GPU (the llm profile)",
}


def used_images() -> set[str]:
    """Every image compose runs without building it, and every Dockerfile's FROM."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    images = {s["image"] for s in compose.values() if "build" not in s}
    images -= {s["image"] for s in compose.values() if "build" in s}  # shared built images
    for dockerfile in ("Dockerfile.triton", "Dockerfile.locust"):
        images |= set(re.findall(r"^FROM\s+(\S+)", (ROOT / dockerfile).read_text(), re.M))
    return images


def test_every_image_the_stack_uses_has_a_stand_in_but_those_that_cannot() -> None:
    references = [standin.reference for standin in build.standins()]
    assert len(references) == len(set(references))
    assert set(references) == used_images() - set(NOT_STOOD_IN)
    assert set(NOT_STOOD_IN) <= used_images()
    folders = {p.parent.name for p in (ROOT / "tests" / "standins").glob("*/Dockerfile")}
    assert folders == {standin.folder for standin in build.standins()}


@pytest.mark.parametrize("standin", build.standins(), ids=lambda s: s.folder)
def test_each_dockerfile_names_its_official_image_its_interface_and_what_differs(standin) -> None:
    text = standin.dockerfile.read_text()
    header = text.split("\nARG BASE", 1)[0]
    assert header.startswith(f"# Stand-in for {standin.reference}"), header[:80]
    assert "The interface" in header and "What differs:" in header
    assert re.search(r"^LABEL tritonstack\.standin\.for=", text, re.M)
    assert 'tritonstack.standin.differs="' in text
    # Built with `docker build --network none` from the shared base: nothing is fetched.
    assert re.findall(r"^FROM\s+(\S+)", text, re.M) == ["${BASE}"]
    assert not re.search(r"\b(curl|wget|apt-get|apk)\b.*https?://", text)


def test_wheels_are_the_pins_the_tests_run() -> None:
    """The Triton stand-in's Python packages are pyproject.toml's pins; Locust's are
    loadtest/requirements.txt, what Dockerfile.locust installs on the official image."""
    pins = dict(re.findall(r'"([\w-]+)==([^"]+)"', (ROOT / "pyproject.toml").read_text()))
    triton = next(s for s in build.standins() if s.folder == "tritonserver")
    assert set(triton.wheels + triton.wheels_no_deps) == {
        f"{name}=={pins[name]}" for name in ("numpy", "onnxruntime", "nvidia-pytriton")
    }
    locust = next(s for s in build.standins() if s.folder == "locust")
    assert f"locust=={pins['locust']}" in locust.wheels
    assert build.PYTHON == "3.11"  # Debian 12's; the Dockerfiles assert what they get


@pytest.mark.parametrize(
    "host",
    ["", "unix:///var/run/docker.sock", "unix:///run/docker.sock", "unix:///run//docker.sock"],
)
def test_the_default_engine_is_refused(monkeypatch, host) -> None:
    monkeypatch.setenv("DOCKER_HOST", host)
    with pytest.raises(SystemExit, match="DOCKER_HOST must name a private engine"):
        build.docker_environment()
    if not host:
        monkeypatch.delenv("DOCKER_HOST")
        with pytest.raises(SystemExit, match="the default socket"):
            build.docker_environment()


def test_a_private_engine_is_accepted(monkeypatch, tmp_path) -> None:
    host = f"unix://{tmp_path}/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", host)
    env = build.docker_environment()
    assert env["DOCKER_HOST"] == host and env["DOCKER_BUILDKIT"] == "0"


def test_cache_keys_change_with_what_they_hold() -> None:
    base = next(s for s in build.standins() if s.folder == "locust")
    changed = build.Standin("locust", wheels=(*base.wheels[:-1], "prometheus-client==0.0.1"))
    assert build._key(build.PYTHON, base) != build._key(build.PYTHON, changed)
    assert build._key(build.PYTHON, base) == build._key(build.PYTHON, base)


def test_make_standin_images_runs_the_builder() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nstandin-images:", 1)[1].split("\n\n", 1)[0]
    assert "## " in recipe.splitlines()[0]
    assert "-m tests.standins.build" in recipe
