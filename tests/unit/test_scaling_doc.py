"""docs/scaling.md's tables and plot are what deploy/kubernetes/simulate.py makes of the committed
benchmark, HPA and gateway settings: regenerated here and compared, so changing any of them
without re-running the simulator fails."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from matplotlib.testing.compare import compare_images

from tests.support import ROOT

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


def load_simulator():
    spec = importlib.util.spec_from_file_location("simulate", SIMULATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulate"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def hpa(simulate, **changes):
    base = simulate.HpaSpec(
        min_replicas=2,
        max_replicas=10,
        target=300.0,
        up_window=0,
        down_window=300,
        up_policies=[{"type": "Percent", "value": 100, "periodSeconds": 30}],
        down_policies=[{"type": "Pods", "value": 1, "periodSeconds": 60}],
        up_select="Max",
        down_select="Max",
    )
    return simulate.Hpa(replace(base, **changes))


def test_simulated_hpa_follows_the_documented_algorithm() -> None:
    """The controller's rules, one by one, as the Kubernetes documentation states them."""
    simulate = load_simulator()
    # desiredReplicas = ceil(currentReplicas * currentMetric / target)
    assert hpa(simulate).calculate(4, [450.0] * 4, missing=0) == 6
    # within the 0.1 tolerance: no change, either way
    assert hpa(simulate).calculate(4, [329.0] * 4, missing=0) == 4
    assert hpa(simulate).calculate(4, [271.0] * 4, missing=0) == 4
    # pods without a metric count as 0 when scaling up: here that cancels the scale-up
    assert hpa(simulate).calculate(3, [400.0, 400.0], missing=1) == 3
    # Percent 100 per 30 s: at most double within a period, whatever the metric asks
    controller = hpa(simulate)
    assert controller.decide(15, 2, [3000.0] * 2, missing=0) == 4
    assert controller.decide(30, 4, [3000.0] * 4, missing=0) == 4  # 2 -> 4 was within 30 s
    assert controller.decide(60, 4, [3000.0] * 4, missing=0) == 8
    assert controller.decide(90, 8, [30000.0] * 8, missing=0) == 10  # maxReplicas
    # scale-down: the highest recommendation of the last 300 s, then 1 pod per 60 s
    controller = hpa(simulate)
    assert controller.decide(0, 6, [300.0] * 6, missing=0) == 6
    assert controller.decide(15, 6, [50.0] * 6, missing=0) == 6  # window still holds 6
    assert controller.decide(315, 6, [50.0] * 6, missing=0) == 5  # 1 pod per minute
    assert controller.decide(330, 5, [50.0] * 5, missing=0) == 5
    assert controller.decide(390, 5, [50.0] * 5, missing=0) == 4


def test_the_docs_prose_numbers_follow_the_measured_curve() -> None:
    """The sentences around the tables quote points of the curve; a re-run benchmark moves them,
    and the table test alone would not notice the prose falling behind."""
    simulate = load_simulator()
    curve = simulate.replica_curve()
    spec = simulate.HpaSpec.read()
    maxconn, _ = simulate.gateway_limits()
    doc = " ".join((ROOT / "docs" / "scaling.md").read_text().split())

    def queue(in_flight: float) -> float:
        return simulate.interpolate(curve, in_flight, "queue_us")

    at_target = simulate.concurrency_at(curve, spec.target)
    at_bound = queue(maxconn)
    expected = [
        f"measured {queue(16):.0f} µs. It varies",
        f"sits at about {at_target:.0f} requests in flight",
        f"tops out at {at_bound:.0f} µs, {at_bound / spec.target:.2f}x the target",
        f"raises the ratio only to {at_bound / spec.target:.2f}",
        f"24 per pod, {queue(24):.0f} µs, {queue(24) / spec.target:.2f}x the target",
        f"4 pods: {queue(12):.0f} µs)",
    ]
    missing = [sentence for sentence in expected if sentence not in doc]
    assert not missing, f"docs/scaling.md's prose is behind the curve: {missing}"
