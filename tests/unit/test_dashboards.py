"""Grafana dashboards: generated from tritonstack/render/dashboards.py, committed, and kept in sync.

Grafana cannot run here; what these tests prove is the JSON's shape. That every query returns
data is proven by tests/functional/test_observability_live.py against a real Prometheus.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support import ROOT
from tritonstack.cli import main
from tritonstack.render import dashboards

SPECS = {spec.uid: spec for spec in dashboards.DASHBOARDS}


def committed(spec: dashboards.DashboardSpec) -> dict:
    return json.loads(spec.path.read_text(encoding="utf-8"))


def all_panels(board: dict) -> list[dict]:
    return [panel for panel in board["panels"] if panel["type"] != "row"]


@pytest.mark.parametrize("uid", SPECS)
def test_committed_json_is_what_the_code_generates(uid):
    spec = SPECS[uid]
    assert spec.path.read_text(encoding="utf-8") == dashboards.render(spec), (
        f"{spec.path} drifted from tritonstack/render/dashboards.py: run `tritonstack dashboards` "
        "and commit the result"
    )


def test_no_stray_dashboard_files():
    generated = {spec.path.name for spec in dashboards.DASHBOARDS}
    assert {p.name for p in dashboards.DASHBOARDS_DIR.glob("*.json")} == generated


def test_cli_regenerates_identically(tmp_path, capsys):
    assert main(["dashboards", "--output", str(tmp_path)]) == 0
    for spec in dashboards.DASHBOARDS:
        assert (tmp_path / spec.path.name).read_text() == spec.path.read_text()
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("uid", SPECS)
def test_fixed_uid_and_sorted_keys(uid):
    spec = SPECS[uid]
    text = spec.path.read_text(encoding="utf-8")
    board = json.loads(text)
    assert board["uid"] == uid and len(uid) <= 40  # Grafana's uid limit
    assert text == json.dumps(board, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("uid", SPECS)
def test_every_panel_has_a_unit_the_prometheus_datasource_and_queries(uid):
    board = committed(SPECS[uid])
    panels = all_panels(board)
    assert panels
    for panel in panels:
        title = panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, title
        assert panel["targets"], f"{title}: no query"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "prometheus", title
            assert target["expr"].strip(), title
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


@pytest.mark.parametrize("uid", SPECS)
def test_model_variable_exists_and_every_triton_panel_uses_it(uid):
    board = committed(SPECS[uid])
    (variable,) = [v for v in board["templating"]["list"] if v["name"] == "model"]
    assert variable["type"] == "query" and variable["datasource"]["uid"] == "prometheus"
    assert variable["includeAll"] and variable["allValue"] == ".+"
    resource_metrics = ("nv_cpu_", "nv_gpu_")  # per host, not per model
    for panel in all_panels(board):
        for target in panel["targets"]:
            # One gateway serves every model: its metrics (job gateway) have no model label.
            if (
                not target["expr"].startswith(resource_metrics)
                and 'job="gateway"' not in (target["expr"])
                and not target["expr"].startswith(("proxy:", "proxy_code:"))
            ):
                assert '$model"' in target["expr"], f"{panel['title']}: ignores $model"


def test_json_matches_the_panel_specs_one_to_one():
    """The live test enumerates the specs; the JSON must hold exactly those queries."""
    for spec in dashboards.DASHBOARDS:
        in_json = [
            (panel["title"], target["expr"])
            for panel in all_panels(committed(spec))
            for target in panel["targets"]
        ]
        in_specs = [
            (panel.title, query.expr)
            for row in spec.rows
            for panel in row.panels
            for query in panel.queries
        ]
        assert in_json == in_specs


def test_required_panels_are_there():
    titles = " | ".join(panel.title for _, panel in dashboards.panels()).lower()
    for words in (
        "requests/s",
        "failures/s by reason",
        "inferences/s",
        "average batch size",
        "queue vs compute",
        "end-to-end server latency",
        "p50 / p95 / p99",
        "label distribution",
        "bls routing",
        "gpu utilisation",
        "gpu memory",
        "gpu power",
        "cpu utilisation",
        "cpu memory",
        "gateway requests/s by status",
        "gateway refusals/s",
        "gateway in flight and queue",
        "gateway latency",
    ):
        assert words in titles, f"no panel for {words!r}"


def test_exemptions_are_gpu_panels_only():
    exempt = [panel for _, panel in dashboards.panels() if panel.exempt_on_cpu]
    assert exempt and all("GPU" in panel.title for panel in exempt)


def test_provisioning_points_grafana_at_the_dashboards_and_the_datasource():
    provider = yaml.safe_load(
        (ROOT / "grafana/provisioning/dashboards/tritonstack.yml").read_text()
    )["providers"][0]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    datasources = yaml.safe_load(
        (ROOT / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"]
    assert [d["uid"] for d in datasources if d["type"] == "prometheus"] == ["prometheus"]


def test_the_llm_row_shows_every_llm_rule_and_only_it_needs_the_llm():
    """tests/functional/test_observability_llm.py proves the panels marked needs_llm on the LLM's
    server, the classifier's live test every other panel: each LLM recording rule is on a
    marked panel, and no unmarked panel reads a vllm:* series."""
    rules = [
        rule["record"]
        for group in yaml.safe_load((ROOT / "prometheus/rules/llm.yml").read_text())["groups"]
        for rule in group["rules"]
        if "record" in rule
    ]
    marked = [panel for _, panel in dashboards.panels() if panel.needs_llm]
    exprs = " ".join(query.expr for panel in marked for query in panel.queries)
    assert rules and [rule for rule in rules if rule not in exprs] == []
    assert all(panel.title.startswith("LLM ") for panel in marked)
    for _, panel in dashboards.panels():
        if not panel.needs_llm:
            assert not any("vllm" in query.expr for query in panel.queries), panel.title
    titles = " | ".join(panel.title for panel in marked).lower()
    for words in (
        "time to first token p50 / p90 / p99",
        "time per output token p50 / p99",
        "tokens/s",
        "requests/s",
        "not finished",
        "prompt and answer length p50 / p99",
    ):
        assert words in titles, f"no LLM panel for {words!r}"
