"""The autoscaling queries as written: KEDA's is the adapter's averaged over pods, and the
adapter's rule names the metric it queries. tests/functional/test_autoscaling_query.py runs
both against a real Prometheus scraping the real Triton under load."""

from __future__ import annotations

import re

import yaml

from tests.support import ROOT

KUBERNETES = ROOT / "deploy" / "kubernetes"
#: The labels Prometheus Operator gives a pod's series (namespace as in the overlays).
POD_LABELS = {"namespace": "tritonstack", "pod": "triton-7d9f8-abcde", "container": "triton"}


def adapter_rule() -> dict:
    values = yaml.safe_load((KUBERNETES / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    return rule


def adapter_query(label_matchers: str, group_by: str) -> str:
    """The adapter's metricsQuery with its template filled as the adapter fills it."""
    query = adapter_rule()["metricsQuery"]
    return query.replace("<<.LabelMatchers>>", label_matchers).replace("<<.GroupBy>>", group_by)


def keda_query() -> str:
    scaled = yaml.safe_load((KUBERNETES / "components" / "keda" / "scaledobject.yaml").read_text())
    (trigger,) = scaled["spec"]["triggers"]
    return trigger["metadata"]["query"]


def same_query(a: str, b: str) -> bool:
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


def test_keda_query_is_the_adapters_averaged_over_pods() -> None:
    matchers = f'namespace="{POD_LABELS["namespace"]}",container="triton"'
    assert same_query(keda_query(), f"avg({adapter_query(matchers, 'pod')})")


def test_adapter_rule_names_the_metric_it_queries() -> None:
    rule = adapter_rule()
    assert re.fullmatch(rule["name"]["matches"], "nv_inference_queue_duration_us")
    assert "nv_inference_queue_duration_us" in rule["seriesQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
