"""tritonserver's command line, built once for every Triton the stack starts.

The container (tritonstack.launcher.start), the LLM's container and the embedded runtime
(tritonstack.serve.runtime) all call server_flags: the flags file's shared flags, then addresses,
ports, the exit timeout, GPU metrics and the restricted APIs. Only what differs by runtime (the
embedded runtime's backend directory, the container's repository view) is added by the caller.
"""

from __future__ import annotations

import os
import secrets
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tritonstack.core.contract import (
    ADMIN_APIS,
    ADMIN_APIS_ENV,
    ADMIN_HEADER,
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    RESTRICTED_APIS,
    SHUT_HEADER,
)
from tritonstack.core.errors import UserError

#: The variable that gives the admin key itself (else a key file is read, or made).
ADMIN_KEY_ENV = "TRITONSTACK_ADMIN_KEY"
#: Seconds Triton drains in-flight requests on SIGTERM: shorter than compose's and Kubernetes'
#: grace periods (30 s), so Triton exits before it is killed.
EXIT_TIMEOUT_SECS = 20
#: Flags with a secret value, and what the launcher's log shows instead of it.
SECRET_MARK = "<secret>"


def shared_flags(path: Path) -> list[str]:
    """The flags every Triton of the stack gets (scripts/tritonserver.flags: one a line, blank
    lines and # comments ignored)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def admin_key(
    path: Path,
    fallback: Path | None = None,
    env: Mapping[str, str] = os.environ,
    say: Callable[[str], None] | None = None,
) -> str:
    """The secret that opens the admin APIs: $TRITONSTACK_ADMIN_KEY, else the key in `path`,
    else one generated there (0600) on first use; where `path` cannot be written (a read-only
    Secret volume without the Secret) the same in `fallback`."""
    key = env.get(ADMIN_KEY_ENV, "").strip()
    if key:
        return key
    for candidate in (path, fallback):
        if candidate is None:
            continue
        try:
            return _read_or_create_key(candidate, say)
        except OSError as exc:
            reason = exc
    raise UserError(f"cannot write the admin key to {fallback or path}: {reason}")


def local_admin_key() -> str:
    """The embedded runtime's secret for the restricted APIs: $TRITONSTACK_ADMIN_KEY, else a key
    file generated on first use (~/.config/tritonstack/admin-key, mode 0600), so every
    installation gets its own secret and none is ever committed."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "tritonstack"
    return admin_key(base / "admin-key")


def _read_or_create_key(path: Path, say: Callable[[str], None] | None) -> str:
    if path.is_file() and path.stat().st_size:
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside, then linked into place: a process starting at the same moment (replicas on
    # one cache volume, two runtimes) finds either no key or a complete one, never an empty file.
    draft = path.parent / f".{path.name}.{uuid.uuid4().hex}"
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    try:
        os.link(draft, path)
        if say:
            say(f"generated the admin key in {path}")
    except FileExistsError:
        pass  # another process linked its key first; that one is the key
    finally:
        draft.unlink()
    return path.read_text().strip()


def restricted_flags(admin_key: str, asked: str | None = None) -> list[str]:
    """Triton's restricted-API flags, HTTP and gRPC: the admin APIs (contract.ADMIN_APIS, and
    those `asked`, default $TRITONSTACK_ADMIN_APIS) behind the admin key, every other restricted
    API behind a key drawn now and kept nowhere, so that nothing the stack runs or stores can
    call it."""
    asked = os.environ.get(ADMIN_APIS_ENV, "") if asked is None else asked
    known = RESTRICTED_APIS.split(",")
    wanted = {*ADMIN_APIS.split(","), *(api.strip() for api in asked.split(",") if api.strip())}
    unknown = sorted(wanted - set(known))
    if unknown:
        raise UserError(
            f"{ADMIN_APIS_ENV}={asked}: {unknown[0]} is not an API Triton restricts (those: "
            f"{RESTRICTED_APIS})"
        )
    admin = [api for api in known if api in wanted]
    shut = [api for api in known if api not in wanted]
    groups = [f"{','.join(admin)}:{ADMIN_HEADER}={admin_key}"] if admin else []
    if shut:
        groups.append(f"{','.join(shut)}:{SHUT_HEADER}={secrets.token_hex(24)}")
    return [
        f"--{flag}={group}"
        for group in groups
        for flag in ("http-restricted-api", "grpc-restricted-protocol")
    ]


def server_flags(
    repository: Path | str,
    shared: Sequence[str],
    admin_key: str,
    *,
    address: str = "0.0.0.0",
    metrics_address: str = "0.0.0.0",
    http_port: int = HTTP_PORT,
    grpc_port: int = GRPC_PORT,
    metrics_port: int = METRICS_PORT,
    exit_timeout_secs: int = EXIT_TIMEOUT_SECS,
    gpu: bool = False,
    asked_apis: str | None = None,
) -> list[str]:
    """tritonserver's flags, in one order for every runtime."""
    return [
        f"--model-repository={repository}",
        *shared,
        f"--exit-timeout-secs={exit_timeout_secs}",
        f"--http-address={address}",
        f"--http-port={http_port}",
        f"--grpc-address={address}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={metrics_address}",
        f"--metrics-port={metrics_port}",
        *(["--allow-gpu-metrics=true", "--model-config-name=gpu"] if gpu else []),
        *([] if gpu else ["--allow-gpu-metrics=false"]),
        *restricted_flags(admin_key, asked_apis),
    ]


def shown(flags: Sequence[str]) -> str:
    """The flags as the log may show them: every key replaced by SECRET_MARK."""
    words = []
    for flag in flags:
        for header in (ADMIN_HEADER, SHUT_HEADER):
            if f":{header}=" in flag:
                flag = f"{flag.split(f':{header}=', 1)[0]}:{header}={SECRET_MARK}"
        words.append(flag)
    return " ".join(words)
