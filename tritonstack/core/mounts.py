"""Can each container read the files docker-compose.yml bind-mounts into it?

Compose mounts files of the checkout (`./gateway`, `./prometheus/...`, `./grafana/...`,
`./loadtest`, the labels file, scripts/secrets.sh) into containers that run as their image's own
user, not as whoever cloned the repository. A checkout made under `umask 077`, or a private
`gateway/api-keys` or `gateway/tls.pem` (mode 0600), is unreadable there, and the service only
says so when it starts, in its own log ("Permission denied"), often after its dependencies.
`check_mounts` finds it before `docker compose up`: one line per mount, naming the reader and the
fix. (Dockerfile.triton's COPY keeps the modes too; the image makes what it copies readable.)
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Reader:
    """The user a service's image runs as (its Dockerfile's USER; root when it sets none)."""

    image_user: str
    uid: int
    gid: int


#: Each service's reader, from the official images' Dockerfiles (docs/versions.md): HAProxy's
#: alpine image runs as haproxy (99:99), Prometheus as nobody, Grafana as 472 with group 0, the
#: Locust image as locust (1000); blackbox_exporter and busybox set no USER and run as root.
READERS = {
    "gateway": Reader("haproxy", 99, 99),
    "prometheus": Reader("nobody", 65534, 65534),
    "grafana": Reader("grafana", 472, 0),
    "locust-master": Reader("locust", 1000, 1000),
    "locust-worker": Reader("locust", 1000, 1000),
    "blackbox": Reader("root", 0, 0),
    "secrets": Reader("root", 0, 0),
    "triton": Reader("triton-server", 1000, 1000),
    # NVIDIA's vLLM image run as its triton-server user (compose `user: "1000:1000"`).
    "triton-llm": Reader("triton-server", 1000, 1000),
    "perf-analyzer": Reader("root", 0, 0),
}


def can_read(mode: int, uid: int, gid: int, reader: Reader, directory: bool) -> bool:
    """What the permission bits let `reader` do: read a file, or list and enter a directory."""
    if reader.uid == 0:
        return True
    need = 0o5 if directory else 0o4
    if uid == reader.uid:
        return (mode >> 6) & need == need
    if gid == reader.gid:
        return (mode >> 3) & need == need
    return mode & need == need


def bind_mounts(compose_file: Path) -> list[tuple[str, Path, str]]:
    """(service, host path, container path) of every `./...` volume in the compose file."""
    services = yaml.safe_load(compose_file.read_text()).get("services", {})
    mounts = []
    for name, service in services.items():
        for volume in service.get("volumes", []):
            spec = volume if isinstance(volume, str) else f"{volume['source']}:{volume['target']}"
            source, _, rest = spec.partition(":")
            if source.startswith("./"):
                mounts.append((name, compose_file.parent / source, rest.split(":")[0]))
    return mounts


def _unreadable(path: Path, reader: Reader) -> list[tuple[Path, int]]:
    """Every file or folder under `path` (itself included) that `reader` cannot reach."""
    found = []
    entries = [path, *sorted(path.rglob("*"))] if path.is_dir() else [path]
    for entry in entries:
        info = entry.stat()
        directory = stat.S_ISDIR(info.st_mode)
        if not can_read(info.st_mode, info.st_uid, info.st_gid, reader, directory):
            found.append((entry, stat.S_IMODE(info.st_mode)))
    return found


def check_mounts(compose_file: Path) -> list[str]:
    """One message per bind mount that its containers' user cannot read; [] when all can."""
    problems = []
    root = compose_file.parent
    readers: dict[tuple[Path, str, Reader], list[str]] = {}
    for service, source, target in bind_mounts(compose_file):
        reader = READERS.get(service)
        if reader is None:
            problems.append(
                f"{compose_file.name}: service {service!r} mounts {source.relative_to(root)} but "
                "its image's user is unknown here; add it to tritonstack.core.mounts.READERS"
            )
        elif source.exists():  # a missing source is a folder compose creates (an output)
            readers.setdefault((source, target, reader), []).append(service)
    for (source, target, reader), services in readers.items():
        bad = _unreadable(source, reader)
        if not bad:
            continue
        shown = source.relative_to(root)
        first, mode = bad[0]
        what = f"{first.relative_to(root)} (mode {mode:04o})"
        if len(bad) > 1:
            what = f"{len(bad)} entries, e.g. {what}"
        fix = f"chmod -R a+rX {shown}" if source.is_dir() else f"chmod a+r {shown}"
        if "gateway" in services:  # API keys and TLS keys: readable by HAProxy's group only
            fix += f" (for a key file: sudo chgrp {reader.gid} FILE && chmod 0640 FILE)"
        containers = " and ".join(services) + (" containers" if len(services) > 1 else " container")
        problems.append(
            f"{shown}: the {containers} (user {reader.image_user}, uid {reader.uid}) cannot read "
            f"{what}, mounted at {target}; fix: {fix}"
        )
    return problems
