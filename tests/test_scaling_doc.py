"""docs/scaling.md's tables and plot are what deploy/kubernetes/simulate.py makes of the committed
benchmark, HPA and gateway settings: regenerated here and compared, so changing any of them
without re-running the simulator fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from matplotlib.testing.compare import compare_images

from tests.conftest import ROOT

SIMULATOR = ROOT / "deploy" / "kubernetes" / "simulate.py"
COMMITTED = ROOT / "docs" / "scaling"


def test_simulator_output_matches_the_committed_tables_plot_and_doc(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SIMULATOR), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    tables = (tmp_path / "tables.md").read_text()
    assert result.stdout == tables
    assert tables == (COMMITTED / "tables.md").read_text(), (
        "re-run python deploy/kubernetes/simulate.py and update docs/scaling.md"
    )
    # Every table block appears in the doc as generated.
    doc = (ROOT / "docs" / "scaling.md").read_text()
    for block in tables.split("\n\n"):
        assert block.strip() in doc, block.splitlines()[0]
    # Same figure, up to font rendering differences between FreeType builds.
    assert (
        compare_images(str(COMMITTED / "simulation.png"), str(tmp_path / "simulation.png"), tol=5)
        is None
    )
