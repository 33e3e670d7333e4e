"""`tritonstack check` names the bind mounts a container's user cannot read.

A copy of the files docker-compose.yml mounts gets the modes a `umask 077` checkout or a private
key file would have; the check must name each mount with its reader and the fix, and pass on the
repository as committed. The readers' uids are the ones compose's secrets service writes for.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support import ROOT
from tritonstack.core.mounts import READERS, bind_mounts, check_mounts

COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """docker-compose.yml and every file it bind-mounts, copied with their modes."""
    shutil.copy2(COMPOSE, tmp_path / COMPOSE.name)
    for _, source, _ in bind_mounts(COMPOSE):
        if not source.exists():  # an output folder compose creates (perf-analyzer's results)
            continue
        target = tmp_path / source.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
        else:
            shutil.copy2(source, target)
    (tmp_path / "model_repository").mkdir(exist_ok=True)  # what marks a project folder
    return tmp_path


def test_the_committed_mounts_are_readable(project: Path) -> None:
    assert check_mounts(project / "docker-compose.yml") == []
    assert check_mounts(COMPOSE) == []


def test_a_umask_077_checkout_is_named_mount_by_mount(project: Path) -> None:
    for path in [project, *project.rglob("*")]:
        path.chmod(path.stat().st_mode & 0o700)
    problems = check_mounts(project / "docker-compose.yml")
    named = {problem.split(":")[0] for problem in problems}
    assert {"gateway", "prometheus/prometheus.yml", "grafana/provisioning", "loadtest"} <= named
    gateway = next(p for p in problems if p.startswith("gateway:"))
    assert "the gateway container (user haproxy, uid 99) cannot read" in gateway
    assert "mounted at /usr/local/etc/haproxy" in gateway
    assert "fix: chmod -R a+rX gateway" in gateway
    assert not any("secrets.sh" in p for p in problems)  # busybox runs as root: it reads anyway


def test_a_private_api_keys_file_is_named_with_a_fix_that_keeps_it_private(project: Path) -> None:
    keys = project / "gateway" / "api-keys"
    keys.write_text("0123456789abcdef0123 me\n")
    keys.chmod(0o600)
    (problem,) = check_mounts(project / "docker-compose.yml")
    assert problem.startswith("gateway: the gateway container (user haproxy, uid 99)")
    assert "cannot read gateway/api-keys (mode 0600)" in problem
    assert "sudo chgrp 99 FILE && chmod 0640 FILE" in problem
    if os.geteuid() == 0:  # CI: the fix it names works
        os.chown(keys, os.getuid(), 99)
        keys.chmod(0o640)
        assert check_mounts(project / "docker-compose.yml") == []


def test_the_cli_reports_it_and_exits_1(project: Path) -> None:
    (project / "loadtest").chmod(0o700)
    shutil.copytree(ROOT / "model_repository", project / "model_repository", dirs_exist_ok=True,
                    symlinks=True)  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "--project-dir", str(project), "check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        "loadtest: the locust-master and locust-worker containers (user locust, uid 1000) "
        "cannot read loadtest (mode 0700)"
    ) in result.stderr
    assert f"1 problem(s) in {project / 'docker-compose.yml'}" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_mounting_service_has_a_known_reader_matching_the_secrets_owners() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    assert {service for service, _, _ in bind_mounts(COMPOSE)} <= set(READERS)
    secrets = compose["services"]["secrets"]["environment"]
    owners = {Path(e.split(":")[0]).name: int(e.split(":")[1])
              for e in (secrets["TRITONSTACK_SECRETS"] + " "
                        + secrets["TRITONSTACK_OPTIONAL_SECRETS"]).split()}  # fmt: skip
    assert owners["grafana-admin-password"] == READERS["grafana"].uid
    assert owners["admin-key"] == READERS["triton"].uid
    assert owners["locust-api-key"] == READERS["locust-master"].uid
    assert int(secrets["TRITONSTACK_KEY_MAP"].split(":")[1]) == READERS["gateway"].uid
    assert owners["deep-probe-api-key"] == READERS["blackbox"].uid
    assert owners["hf-token"] == READERS["triton-llm"].uid
