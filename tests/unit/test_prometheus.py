"""Prometheus configuration, recording rules and alerts, checked with Prometheus' own promtool.

promtool comes with Debian's `prometheus` package (.ci/run installs it): these tests skip on a
laptop without it and fail in CI. What the rules compute is unit-tested in
prometheus/tests/triton_test.yml; these tests also make sure that file leaves no rule untested
and that every alert carries what an on-call engineer needs.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import ROOT, require_tool
from tritonstack.render.promconfig import render

PROMETHEUS = ROOT / "prometheus"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))
TEST_FILES = sorted((PROMETHEUS / "tests").glob("*.yml"))
OPERATIONS = ROOT / "docs" / "operations.md"
#: Severities and their meaning are documented in docs/operations.md.
SEVERITIES = {"critical", "warning", "none"}
#: Always firing by design: it has no "not yet firing" state to test.
ALWAYS_FIRING = {"Watchdog"}
#: Names public Triton dashboards query that Triton does not export (REFERENCE.md section 3).
WRONG_METRIC_NAMES = ("nv_inference_load_ratio", "nv_inference_queue_duration_us_bucket")


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [require_tool("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def rules() -> list[dict]:
    return [
        rule
        for path in RULE_FILES
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]


def unit_tests() -> list[dict]:
    return [test for path in TEST_FILES for test in yaml.safe_load(path.read_text())["tests"]]


def test_there_are_rules_and_tests():
    assert RULE_FILES and TEST_FILES


def test_promtool_check_config_of_the_committed_file():
    promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))


def test_promtool_check_config_of_the_loopback_rendering(tmp_path):
    """What tritonstack up and the live test run: same jobs, this checkout's rule files."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        render(
            "127.0.0.1:8002",
            ["127.0.0.1:9646"],
            blackbox="127.0.0.1:9115",
            triton_http="h:1",
            gateway_metrics="127.0.0.1:8404",
        )
    )
    output = promtool("check", "config", str(config)).stdout
    assert f"{len(RULE_FILES)} rule files found" in output


def test_rendering_points_the_deep_probe_at_local_ports_or_leaves_it_out():
    jobs = yaml.safe_load(render("127.0.0.1:8002"))["scrape_configs"]
    assert [job["job_name"] for job in jobs] == ["triton", "locust"]  # no gateway, no probe
    rendered = render(
        "127.0.0.1:8002",
        blackbox="127.0.0.1:9115",
        triton_http="127.0.0.1:8000",
        probed_models=("pipeline", "ranker"),
    )
    probe = {job["job_name"]: job for job in yaml.safe_load(rendered)["scrape_configs"]}
    probe = probe["deep_probe"]
    assert "file_sd_configs" not in probe
    assert probe["static_configs"] == [
        {
            "targets": [f"http://127.0.0.1:8000/v2/models/{model}/infer"],
            "labels": {"__param_module": f"infer_{model}", "model": model},
        }
        for model in ("pipeline", "ranker")
    ]
    assert probe["relabel_configs"][-1] == {
        "target_label": "__address__",
        "replacement": "127.0.0.1:9115",
    }


def test_promtool_check_rules():
    promtool("check", "rules", *map(str, RULE_FILES))


def test_promtool_test_rules():
    for path in TEST_FILES:
        output = promtool("test", "rules", path.name, cwd=path.parent).stdout
        assert "SUCCESS" in output


def test_every_recording_rule_value_is_unit_tested():
    tested = " ".join(
        case["expr"] for test in unit_tests() for case in test.get("promql_expr_test", [])
    )
    untested = [
        rule["record"]
        for rule in rules()
        if "record" in rule and not re.search(rf"{re.escape(rule['record'])}\b", tested)
    ]
    assert not untested, f"recording rules without a promql_expr_test: {untested}"


def test_every_alert_is_tested_not_yet_firing_and_firing():
    states: dict[str, set[str]] = {}
    for test in unit_tests():
        for case in test.get("alert_rule_test", []):
            state = "firing" if case.get("exp_alerts") else "quiet"
            states.setdefault(case["alertname"], set()).add(state)
    for name in {rule["alert"] for rule in rules() if "alert" in rule}:
        expected = {"firing"} if name in ALWAYS_FIRING else {"firing", "quiet"}
        assert expected <= states.get(name, set()), f"{name}: tested only {states.get(name)}"


def test_every_alert_has_summary_description_severity_and_a_runbook_section():
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in OPERATIONS.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in (rule for rule in rules() if "alert" in rule):
        name, annotations = rule["alert"], rule.get("annotations", {})
        assert rule.get("labels", {}).get("severity") in SEVERITIES, name
        assert annotations.get("summary") and annotations.get("description"), name
        url = annotations.get("runbook_url", "")
        assert url == f"docs/operations.md#{name.lower()}", f"{name}: runbook_url {url!r}"
        assert name.lower() in headings, f"docs/operations.md has no section '## {name}'"


def test_severities_are_documented():
    text = OPERATIONS.read_text()
    for severity in SEVERITIES:
        assert f"`{severity}`" in text, f"severity {severity} is not explained in {OPERATIONS}"


@pytest.mark.parametrize("wrong", WRONG_METRIC_NAMES)
def test_rules_use_no_metric_name_that_triton_does_not_export(wrong):
    for path in RULE_FILES:
        assert wrong not in path.read_text(), f"{path} queries {wrong}"


def test_average_batch_size_is_inferences_per_execution():
    """Not success / exec_count (requests per execution), the mistake public dashboards make."""
    (rule,) = [r for r in rules() if r.get("record") == "model:nv_inference_count:per_exec_rate1m"]
    expr = " ".join(rule["expr"].split())
    assert "rate(nv_inference_count[1m])" in expr and "rate(nv_inference_exec_count[1m])" in expr
    assert "nv_inference_request_success" not in expr


def test_blackbox_config_is_valid_and_probes_each_public_model_for_every_output():
    """One module per public model: a row of zeros shaped as its config says, through the
    gateway, and an answer that names every output (generated from the repository)."""
    from tritonstack.core.repository import iter_models
    from tritonstack.core.settings import load

    binary = require_tool("prometheus-blackbox-exporter")
    config = ROOT / "prometheus" / "blackbox.yml"
    check = subprocess.run(
        [binary, "--config.check", f"--config.file={config}"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    modules = yaml.safe_load(config.read_text())["modules"]
    public = load().public_models
    assert set(modules) == {f"infer_{model}" for model in public}
    models = {m.name: m.config for m in iter_models(ROOT / "model_repository")}
    for model in public:
        http = modules[f"infer_{model}"]["http"]
        body = json.loads(http["body"])
        declared = models[model]
        assert [i["name"] for i in body["inputs"]] == [i.name for i in declared.input]
        for sent, wanted in zip(body["inputs"], declared.input, strict=True):
            assert sent["shape"] == [1, *wanted.dims]
            assert sent["data"] == [0.0] * len(sent["data"]) and len(sent["data"]) == wanted.dims[0]
        outputs = [o.name for o in declared.output]
        assert http["fail_if_body_not_matches_regexp"] == [f'"name":"{o}"' for o in outputs]


def test_compose_scrapes_every_triton_replica_and_the_gateway_and_probes_through_it():
    jobs = {
        job["job_name"]: job
        for job in yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]
    }
    # `--scale triton=2`: the service name resolves to every replica, each scraped.
    assert jobs["triton"]["dns_sd_configs"][0]["names"] == ["triton"]
    # The llm profile's Triton, by DNS too: without the profile the name does not resolve and
    # the job has no target, instead of a static one that is down whenever the profile is off.
    assert jobs["triton-llm"] == {
        "job_name": "triton-llm",
        "dns_sd_configs": [
            {"names": ["triton-llm"], "type": "A", "port": 8002, "refresh_interval": "15s"}
        ],
    }
    assert jobs["gateway"]["static_configs"] == [{"targets": ["gateway:8404"]}]
    # The deep probe goes where a client's request goes: through the gateway, one target per
    # public model (generated), each naming its model's module.
    assert jobs["deep_probe"]["file_sd_configs"] == [{"files": ["/etc/prometheus/deep-probe.yml"]}]
    groups = yaml.safe_load((PROMETHEUS / "deep-probe.yml").read_text())
    from tritonstack.core.settings import load

    assert groups == [
        {
            "targets": [f"http://gateway:8000/v2/models/{model}/infer"],
            "labels": {"__param_module": f"infer_{model}", "model": model},
        }
        for model in load().public_models
    ]


def test_rendering_points_the_gateway_job_at_its_local_exporter():
    rendered = yaml.safe_load(render("127.0.0.1:8002", gateway_metrics="127.0.0.1:18404"))
    jobs = {job["job_name"]: job for job in rendered["scrape_configs"]}
    assert jobs["gateway"]["static_configs"] == [{"targets": ["127.0.0.1:18404"]}]
    assert jobs["triton"] == {
        "job_name": "triton",
        "static_configs": [{"targets": ["127.0.0.1:8002"]}],
    }


def test_natively_the_llm_is_scraped_with_the_classifier_s_triton():
    """`tritonstack serve --llm` serves `llm` on the one embedded Triton, whose metrics port job
    `triton` scrapes: the compose-only job `triton-llm` is left out of the loopback rendering
    (with a target there it would scrape the same port twice)."""
    committed = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]
    assert "triton-llm" in {job["job_name"] for job in committed}
    rendered = yaml.safe_load(render("127.0.0.1:8002", gateway_metrics="127.0.0.1:8404"))
    names = [job["job_name"] for job in rendered["scrape_configs"]]
    assert names == ["triton", "gateway", "locust"]


def test_the_llm_rules_name_only_the_served_llm_and_scraped_jobs():
    """llm.yml names the model once (LLMMetricsMissing: without vllm:* series nothing else tells
    an LLM from the classifier's models) and a job once (LLMTargetDown): both must be what the
    project serves and scrapes."""
    from tritonstack.core.contract import LLM_MODEL

    groups = yaml.safe_load((PROMETHEUS / "rules" / "llm.yml").read_text())["groups"]
    exprs = " ".join(rule["expr"] for group in groups for rule in group["rules"])
    assert set(re.findall(r'model="([^"]*)"', exprs)) == {LLM_MODEL}
    scraped = {
        job["job_name"]
        for job in yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]
    }
    named = set(re.findall(r'job="([^"]*)"', exprs))
    assert named and named <= scraped, f"{named - scraped} not scraped by prometheus.yml"
