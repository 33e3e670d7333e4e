"""Two runtimes, two versions on purpose: what keeps them serving the same files.

The container runs Triton 2.72 (release 26.08), Prometheus 3.13 and the other pinned images of
docs/versions.md; natively the tests run Triton 2.51, Debian's Prometheus 2.42 and HAProxy 2.6.
These tests check that the pins are documented and that the configurations use only what both
sides understand.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from tritonclient.grpc import model_config_pb2

from tests.support import REPOSITORY, ROOT
from tritonstack.check.repository import check_repository
from tritonstack.check.schema_skew import FIELDS_NEWER_THAN_EMBEDDED, check_schema_skew

VERSIONS = ROOT / "docs" / "versions.md"


# --- Triton's model configuration schema ---------------------------------------------------------


def test_tritonclient_schema_is_the_containers() -> None:
    """tritonclient's model_config_pb2 (what `tritonstack check` parses with) has the fields
    releases since 24.10 added (26.08's are 26.07's), with the field numbers of common's r26.07
    proto."""
    config = model_config_pb2.ModelConfig.DESCRIPTOR.fields_by_name
    ensembling = model_config_pb2.ModelEnsembling.DESCRIPTOR.fields_by_name
    assert config["model_metrics"].number == 26
    assert ensembling["max_inflight_requests"].number == 2
    assert set(FIELDS_NEWER_THAN_EMBEDDED) == {
        "ModelConfig.model_metrics",
        "ModelEnsembling.max_inflight_requests",
    }


def test_repository_uses_only_fields_both_servers_know() -> None:
    assert check_schema_skew(REPOSITORY) == []
    assert check_repository(REPOSITORY) == []


def test_fields_the_embedded_server_lacks_are_reported(tmp_path: Path) -> None:
    """Both new fields, in a config and in a configs/ variant: one line each, naming the file,
    the field and the fix; `tritonstack check` exits 1 with them."""
    repo = tmp_path / "model_repository"
    subprocess.run(["cp", "-r", str(REPOSITORY), str(repo)], check=True)
    pipeline = repo / "pipeline" / "config.pbtxt"
    pipeline.write_text(
        pipeline.read_text().replace(
            "ensemble_scheduling {", "ensemble_scheduling {\n  max_inflight_requests: 8", 1
        )
    )
    variant = repo / "classifier" / "configs" / "gpu.pbtxt"
    variant.write_text(
        variant.read_text()
        + '\nmodel_metrics { metric_control { metric_identifier { family: "nv_inference_first'
        '_response_histogram_ms" } histogram_options { buckets: [1, 10] } } }\n'
    )
    problems = check_schema_skew(repo)
    assert problems == [
        f"{pipeline}: ModelEnsembling.max_inflight_requests is not in Triton 2.51's schema "
        "(added in 26.xx (ensemble in-flight limit)), so the embedded runtime would refuse this "
        "config; remove `max_inflight_requests` so that both runtimes serve the same repository",
        f"{variant}: ModelConfig.model_metrics is not in Triton 2.51's schema (added in 26.xx "
        "(per-model metric histogram buckets)), so the embedded runtime would refuse this "
        "config; remove `model_metrics` so that both runtimes serve the same repository",
    ]
    cli = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "check", "--model-repository", str(repo)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "max_inflight_requests is not in Triton 2.51's schema" in cli.stdout + cli.stderr


# --- Prometheus: Debian's 2.42 (promtool, `tritonstack up`) and 3.13 (the container) ----------

# Keys and functions Prometheus 3 added (2.42 refuses them) or removed/renamed (3 refuses them).
PROMETHEUS_3_ONLY = (
    "fallback_scrape_protocol",
    "always_scrape_classic_histograms",
    "convert_classic_histograms_to_nhcb",
    "metric_name_validation_scheme",
    "metric_name_escaping_scheme",
)
PROMETHEUS_2_ONLY = ("scrape_classic_histograms", "holt_winters", "--storage.tsdb.retention=")


def test_prometheus_files_use_only_what_2_42_and_3_understand() -> None:
    """Static: neither side's exclusive keys, functions or flags (docs/versions.md); promtool
    2.42 itself checks the same files in tests/unit/test_prometheus.py."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    texts = {
        path.relative_to(ROOT).as_posix(): path.read_text()
        for path in [
            *sorted((ROOT / "prometheus").rglob("*.yml")),
            *sorted((ROOT / "grafana" / "dashboards").glob("*.json")),
        ]
    }
    texts["prometheus command"] = " ".join(compose["services"]["prometheus"]["command"])
    for name, text in texts.items():
        for word in PROMETHEUS_3_ONLY + PROMETHEUS_2_ONLY:
            assert word not in text, f"{name}: {word}"
    rules = yaml.safe_load((ROOT / "prometheus" / "rules" / "triton.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            # `.` matches newlines in 3.x regex matchers; label values here have none, but a
            # regex matcher is where the two versions could disagree: keep rules without them.
            assert "=~" not in rule["expr"] and "!~" not in rule["expr"], rule


# --- the image table ---------------------------------------------------------------------------


def image_table() -> dict[str, list[str]]:
    """docs/versions.md's Images table: image -> the versions listed for it."""
    section = VERSIONS.read_text().split("## Images", 1)[1].split("\n## ", 1)[0]
    table: dict[str, list[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            image = re.match(r"`([^`]+)`", cells[0])[1]
            version = re.fullmatch(r"`([^`]+)`", cells[1])
            table.setdefault(image, []).append(version[1] if version else cells[1])
            assert cells[2] and cells[3], line  # why and how to update, for every row
    return table


def used_images() -> set[str]:
    """Every `image:tag` compose pulls and every Dockerfile `FROM`."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    images = {
        service["image"]
        for service in compose["services"].values()
        # built here (listed by their FROM), or sharing an image built here (locust-worker)
        if "build" not in service and service.get("pull_policy") != "never"
    }
    for dockerfile in ("Dockerfile.triton", "Dockerfile.locust"):
        images |= set(re.findall(r"^FROM\s+(\S+)", (ROOT / dockerfile).read_text(), re.M))
    return images


def test_every_image_is_in_the_version_table_with_its_tag() -> None:
    table = image_table()
    for image in used_images():
        name, tag = image.rsplit(":", 1)
        assert tag in table.get(name, []), f"{image}: not in docs/versions.md's table"
    listed = {f"{name}:{tag}" for name, tags in table.items() for tag in tags if " " not in tag}
    assert listed == used_images()  # no row for an image nothing uses
    assert "haproxy" in table  # the gateway's row, filled in by the gateway's branch


def test_docs_name_the_locally_built_images_by_their_compose_tags() -> None:
    """`tritonstack/<image>:<tag>` in a page is what you build and push: the tag compose builds."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    built = {
        name: tag
        for service in compose["services"].values()
        if "build" in service
        for name, tag in [service["image"].rsplit(":", 1)]
    }
    assert set(built) == {"tritonstack/triton", "tritonstack/locust"}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    stale = [
        f"{page.relative_to(ROOT)}: {name}:{tag} (compose builds {name}:{built.get(name)})"
        for page in pages
        for name, tag in re.findall(r"(tritonstack/[a-z-]+):([\w.-]+)", page.read_text())
        if built.get(name) != tag
    ]
    assert not stale


def test_deployment_doc_quotes_the_pinned_versions() -> None:
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    for image in used_images():
        name, tag = image.rsplit(":", 1)
        if name.startswith(("prom/", "grafana/", "nvcr.io/")) and not tag.endswith("-sdk"):
            assert tag in deployment, image


def test_every_cve_in_the_security_table_is_fixed_by_the_pinned_release() -> None:
    dockerfile = (ROOT / "Dockerfile.triton").read_text()
    pinned = re.search(r"^FROM nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-py3$", dockerfile, re.M)
    section = (ROOT / "docs" / "security.md").read_text().split("## CVEs fixed", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| CVE-")]
    fixed = [re.fullmatch(r"(\d\d)\.(\d\d)", line.split("|")[4].strip()) for line in rows]
    assert len(rows) >= 12 and all(fixed), rows
    assert max((int(m[1]), int(m[2])) for m in fixed) <= (int(pinned[1]), int(pinned[2]))
    for cve in ("CVE-2025-23310", "CVE-2025-23316", "CVE-2026-24207", "CVE-2026-47627"):
        assert cve in section  # the critical ones the issue names


def test_the_gpu_configuration_asks_no_precision_the_images_tensorrt_cannot_give() -> None:
    """docs/versions.md says 26.08 ships TensorRT 11, whose networks are strongly typed: a
    precision request to ONNX Runtime's TensorRT accelerator is then at best a no-op, and a
    trtexec precision flag a failed start. The entrypoint reads trtexec's flags instead
    (tests/unit/test_entrypoint_cache.py); the configuration must not ask for one."""
    versions = (ROOT / "docs" / "versions.md").read_text()
    section = versions.split("## TensorRT\n", 1)[1].split("\n## ", 1)[0]
    assert "**TensorRT 11**" in section
    for config in REPOSITORY.glob("*/configs/gpu.pbtxt"):
        text = re.sub(r"#.*", "", config.read_text())
        assert "precision_mode" not in text, config
    launcher = (ROOT / "tritonstack" / "launcher" / "tensorrt.py").read_text()
    assert 'flags = ("--fp16",)' in launcher and '_takes(help_text, "--fp16")' in launcher
