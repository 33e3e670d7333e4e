"""`tritonstack soak`, the pure parts: the drift arithmetic and its argument checks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tritonstack.load.soak import Sample, drift


def sample(minute: float, rss: float) -> Sample:
    return Sample(minute, 100.0, 1.0, 2.0, 0, rss, 1.0)


def test_drift_compares_last_quarter_with_first():
    samples = [sample(i, rss) for i, rss in enumerate([100, 100, 100, 100, 110, 110, 120, 120])]
    assert drift(samples, "rss_mb") == pytest.approx(0.2)
    assert drift([sample(0, 50), sample(1, 50)], "rss_mb") == 0


def test_soak_rejects_nonsense_durations():
    result = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "soak", "--minutes", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "must be positive" in result.stderr
