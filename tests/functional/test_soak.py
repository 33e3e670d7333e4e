"""`tritonstack soak`: a short run produces the table, the plot and honest numbers."""

from __future__ import annotations

import csv
import subprocess
import sys


def test_short_soak_writes_table_plot_and_csv(tmp_path):
    out = tmp_path / "soak"
    result = subprocess.run(
        [sys.executable, "-m", "tritonstack.cli", "soak", "--minutes", "0.2", "--interval", "3",
         "--clients", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    progress = [line for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(progress) >= 3  # a line per sample while it runs
    rows = list(csv.DictReader((out / "soak.csv").open()))
    assert len(rows) == len(progress)
    assert all(float(r["requests_per_s"]) > 0 and int(r["errors"]) == 0 for r in rows)
    assert all(float(r["rss_mb"]) > 50 for r in rows)  # Triton plus four stubs
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "soak.md").read_text()
    assert "RSS drift" in report and "p99 latency drift" in report
