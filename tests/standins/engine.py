"""A private Docker engine for one test session: its own data root, exec root, socket, pidfile
and bridge, started here and removed afterwards, so the tests never touch (or need) a machine's
own engine and leave no image, container or volume behind.

Networking is closed: no iptables rules, no NAT, no IP forwarding. Containers reach each other
on their compose networks and the host reaches them through the ports compose publishes on
127.0.0.1 (docker-proxy); nothing in a container reaches beyond the machine.

The default bridge is one of our own (not docker0, which a machine's own engine owns): builds'
RUN steps run on the engine's default bridge network, and with `--bridge none` both BuildKit
and the classic builder fail ("network bridge not found").
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tritonstack.serve import processes


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.is_file()), None
    )


#: What the engine and the stand-ins need: `.ci/run` installs each.
TOOLS = ("dockerd", "docker", "debootstrap", "ip")


def missing_tools() -> list[str]:
    """The tools that are not installed, with `docker compose` (the v2 plugin) among them."""
    missing = [name for name in TOOLS if _tool(name) is None]
    if "docker" not in missing:
        version = subprocess.run(
            [_tool("docker"), "compose", "version", "--short"], capture_output=True, text=True
        )
        if version.returncode or not version.stdout.startswith("2."):
            missing.append("docker compose (Compose v2)")
    return missing


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 for the bridge that overlaps no route of this machine (another engine's included)."""
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True,
                            text=True).stdout.split()  # fmt: skip
    taken = []
    for word in routes:
        with contextlib.suppress(ValueError):
            if "/" in word:
                taken.append(ipaddress.ip_network(word, strict=False))
    for third in range(200, 256):
        candidate = ipaddress.ip_network(f"10.{third}.0.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise RuntimeError("no free 10.x.0.0/24 for the private engine's bridge")


class PrivateEngine:
    """dockerd under a temporary root; a context manager. `env` is what docker commands need."""

    def __init__(self) -> None:
        # A short path: the socket's must fit in a sockaddr_un (108 bytes).
        self.root = Path(tempfile.mkdtemp(prefix="tse-"))
        self.socket = self.root / "docker.sock"
        self.log = self.root / "dockerd.log"
        self.bridge = f"tse{os.getpid() % 10**8}"
        self.process: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host}

    def start(self, timeout: float = 60.0) -> PrivateEngine:
        subnet = _free_subnet()
        gateway = f"{next(subnet.hosts())}/{subnet.prefixlen}"
        for step in (["link", "add", self.bridge, "type", "bridge"],
                     ["addr", "add", gateway, "dev", self.bridge],
                     ["link", "set", self.bridge, "up"]):  # fmt: skip
            subprocess.run(["ip", *step], check=True, capture_output=True)
        command = [
            _tool("dockerd"),
            f"--data-root={self.root / 'data'}",
            f"--exec-root={self.root / 'exec'}",
            f"--host={self.host}",
            f"--pidfile={self.root / 'docker.pid'}",
            f"--bridge={self.bridge}",
            "--iptables=false",
            "--ip-forward=false",
            "--ip-masq=false",
        ]
        self.process = processes.spawn(command, self.log)
        deadline = time.monotonic() + timeout
        while True:
            ready = subprocess.run(["docker", "version"], capture_output=True, env=self.env)
            if ready.returncode == 0:
                return self
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"dockerd did not start:\n{self.tail()}")
            time.sleep(0.5)

    def tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """Containers, then dockerd (and the containerd it runs), its mounts, bridge and files."""
        if self.process is not None and self.process.poll() is None:
            listed = subprocess.run(["docker", "ps", "-aq"], capture_output=True, text=True,
                                    env=self.env)  # fmt: skip
            if listed.stdout.split():
                subprocess.run(["docker", "rm", "-f", "-v", *listed.stdout.split()],
                               capture_output=True, env=self.env, timeout=120)  # fmt: skip
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # Whatever dockerd left mounted under its root (overlays, netns, shm), deepest first.
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(str(self.root))), reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PrivateEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
