"""The cache volume replicas share: one writer at a time, and files trusted only when whole.

`docker compose up --scale triton=N` starts N launchers at once against one volume: a plan is
built by one of them under a lock while the others wait, then reuse it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from pathlib import Path

from tritonstack.launcher.messages import LaunchError, log


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lock_or_wait(path: Path, message: str, timeout: float) -> int:
    """An exclusive lock on `path`, held through the returned descriptor (close it to release).
    While another process holds it, say `message` and wait for at most `timeout` seconds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        pass
    log(f"{message} (up to {timeout:g}s; lock {path})")
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise LaunchError(
                    f"{path} stayed locked for {timeout:g}s: the replica holding it is stuck; "
                    "restart it, or raise TRITONSTACK_CACHE_LOCK_TIMEOUT"
                ) from None
            time.sleep(0.1)


def write_atomically(path: Path, text: str) -> None:
    draft = path.with_name(path.name + ".tmp")
    draft.write_text(text)
    os.replace(draft, path)
