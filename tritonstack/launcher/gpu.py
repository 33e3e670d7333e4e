"""Which GPU the container was given, and whether this image can serve on it.

The image's release (26.08) supports compute capability 7.5 (Turing) and later, and a GPU it
cannot use stops the container: never a silent fall back to CPU with a GPU reserved.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from tritonstack.launcher.messages import LaunchError, log

MIN_COMPUTE_CAPABILITY = (7, 5)
#: The image's CUDA 13.4.1 ships with driver 615.61 (the server's compatibility.md on r26.08);
#: CUDA 13.x runs on R580 and later in minor-version compatibility mode, with fewer features (no
#: JIT of PTX newer than the driver); older drivers only through the image's
#: forward-compatibility package, on data-center GPUs (NVIDIA's CUDA compatibility guide).
RECOMMENDED_DRIVER = 615
MIN_DRIVER = 580
CPU_COMMAND = "docker compose -f docker-compose.yml -f compose.cpu.yml up"


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str  # "8.6"

    @property
    def slug(self) -> str:
        """What names this GPU's cache entries: "NVIDIA_A10G-sm86"."""
        name = re.sub(r"[^A-Za-z0-9._-]", "_", self.name)
        return f"{name}-sm{self.compute_capability.replace('.', '')}"


def _nvidia_smi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, check=False, timeout=60
    )


def _one_line(text: str) -> str:
    return " ".join(text.split("\n")).strip()


def detect() -> Gpu | None:
    """The GPU nvidia-smi reports, or None on a host without one (said why in the log)."""
    if shutil.which("nvidia-smi") is None:
        log("no nvidia-smi in the container: no GPU was handed to it")
        return None
    query = _nvidia_smi("--query-gpu=name,compute_cap", "--format=csv,noheader")
    if query.returncode != 0:
        out = _one_line(query.stdout + query.stderr)
        # A driver that lists GPUs but cannot report compute_cap (R470 and older) is too old for
        # this image: stop rather than serve on CPU with a GPU reserved.
        listed = _nvidia_smi("-L")
        if listed.returncode == 0 and "GPU" in listed.stdout:
            raise LaunchError(
                f"nvidia-smi lists {'; '.join(listed.stdout.strip().splitlines())} but cannot "
                f"report its compute capability ({out}): the driver is too old for this image "
                f"(CUDA 13: driver R{MIN_DRIVER} or later, docs/deployment.md prerequisites). "
                "Update the driver, or serve on CPU deliberately with TRITONSTACK_DEVICE=cpu "
                "(compose.cpu.yml)"
            )
        log(
            f"WARNING: nvidia-smi is in the container but failed ({out}), so this container "
            "serves on CPU. If it was given a GPU, the host's driver is broken; "
            "TRITONSTACK_DEVICE=gpu makes this fatal, TRITONSTACK_DEVICE=cpu makes CPU deliberate"
        )
        return None
    rows = [line for line in query.stdout.splitlines() if line.strip()]
    kinds = sorted(set(rows))
    if not kinds:
        log("nvidia-smi lists no GPU")
        return None
    if len(kinds) > 1:
        raise LaunchError(
            f"GPUs of different kinds are visible ({'; '.join(kinds)}); a TensorRT plan runs on "
            "one kind only: hand the container GPUs of one model (compose device_ids)"
        )
    name, _, capability = kinds[0].rpartition(",")
    name, capability = name.strip(), "".join(capability.split())
    match = re.fullmatch(r"(\d+)\.(\d+)", capability)
    if not match:
        raise LaunchError(
            f"nvidia-smi reports compute capability '{capability}' for {name}; "
            "expected <major>.<minor>"
        )
    log(f"GPU: {name}, compute capability {capability} ({len(rows)} visible)")
    if (int(match[1]), int(match[2])) < MIN_COMPUTE_CAPABILITY:
        minimum = ".".join(map(str, MIN_COMPUTE_CAPABILITY))
        raise LaunchError(
            f"{name} has compute capability {capability}; this image's Triton release supports "
            f"{minimum} and later: serve on CPU with TRITONSTACK_DEVICE=cpu ({CPU_COMMAND}) or "
            "use a newer GPU"
        )
    check_driver()
    return Gpu(name, capability)


def check_driver() -> None:
    """Say once, at start, how the host's driver runs the image's CUDA 13.4."""
    lines = _nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader").stdout.split("\n")
    version = lines[0].strip()
    major = version.split(".", 1)[0]
    if not major.isdigit():
        log(
            f"WARNING: nvidia-smi reports no driver version ('{version}'); cannot check it "
            f"against CUDA 13 (R{RECOMMENDED_DRIVER} recommended)"
        )
    elif int(major) < MIN_DRIVER:
        log(
            f"WARNING: driver {version} is older than R{MIN_DRIVER}: CUDA 13 runs only through "
            f"forward compatibility (data-center GPUs); update to R{RECOMMENDED_DRIVER} or later "
            "(docs/deployment.md prerequisites)"
        )
    elif int(major) < RECOMMENDED_DRIVER:
        log(
            f"driver {version}: CUDA 13.4 in minor-version compatibility mode (PTX newer than "
            f"the driver cannot be compiled); R{RECOMMENDED_DRIVER} or later runs it fully"
        )
    else:
        log(f"driver {version}")


def choose(device: str) -> Gpu | None:
    """The GPU to serve on, from TRITONSTACK_DEVICE (auto, gpu or cpu); None: serve on CPU."""
    if device == "cpu":
        log("TRITONSTACK_DEVICE=cpu: GPU detection skipped")
        return None
    if device not in ("auto", "gpu"):
        raise LaunchError(f"TRITONSTACK_DEVICE={device}: use auto, gpu or cpu")
    found = detect()
    if found is None and device == "gpu":
        raise LaunchError(
            f"TRITONSTACK_DEVICE=gpu but no GPU is visible; on a CPU-only host run {CPU_COMMAND}"
        )
    return found
