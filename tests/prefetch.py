"""Fetch what the functional tests download into the caches they read: `make test` runs this
beside the unit tests, so on a fresh machine the network's minutes overlap the unit tests' CPU
instead of following them.

    python -m tests.prefetch

What it fills (each step is the tests' own code, so a cache it leaves is one they take): the
stand-in images' root filesystem and wheelhouses (~/.cache/tritonstack/standins/), the
benchmark's baselines virtualenv (~/.cache/tritonstack/bench-venv-*), and pip's own cache with
the GPU carry's wheels, the Locust image's virtualenv (~/.cache/tritonstack/locust-image-venv-*).
(The images' requirements are not worth it: their test's time is pip's
resolver, which a warm cache does not shorten.) A step that fails is reported and the
rest go on: the tests then fetch what they need themselves, only later.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _standins() -> None:
    from tests.standins import build

    build.rootfs_tarball(log=lambda _: None)
    for standin in build.standins():
        build.wheelhouse(standin, log=lambda _: None)


def _baselines() -> None:
    from bench.servers import baseline_venv

    baseline_venv(progress=lambda _: None)


def _locust_image_venv() -> None:
    from tests.functional.test_locust_distributed import image_venv

    image_venv()


def _gpu_carry_wheels() -> None:
    from tests.gpu.prepare import download_wheels

    with tempfile.TemporaryDirectory() as folder:
        download_wheels("3.12", Path(folder))


STEPS: dict[str, Callable[[], None]] = {
    "stand-in images' root filesystem and wheels": _standins,
    "benchmark baselines' virtualenv": _baselines,
    "GPU carry's wheels": _gpu_carry_wheels,
    "Locust image's virtualenv": _locust_image_venv,
}


def main() -> int:
    failed = 0
    for what, step in STEPS.items():
        started = time.monotonic()
        try:
            step()
        except (Exception, SystemExit) as exc:  # the builders stop with SystemExit on failure
            failed += 1
            print(f"prefetch: {what}: failed ({str(exc).splitlines()[0][:200]})", flush=True)
            continue
        print(f"prefetch: {what}: {time.monotonic() - started:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
