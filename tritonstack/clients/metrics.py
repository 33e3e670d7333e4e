"""Reading Triton's Prometheus endpoint with prometheus-client's own text parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, frozenset]


def scrape(url: str, timeout: float = 5.0) -> dict[Sample, float]:
    """{(sample name, frozenset of label items): value} for one scrape of a /metrics URL."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser appends `_total` to counters; Prometheus stores Triton's names as exposed.
            name = family.name if sample.name == f"{family.name}_total" else sample.name
            samples[(name, frozenset(sample.labels.items()))] = sample.value
    return samples


def model_value(samples: dict[Sample, float], name: str, model: str, **labels: str) -> float:
    """Sum of `name` over the samples of one model (all versions) matching `labels`."""
    wanted = {("model", model), *labels.items()}
    return sum(v for (n, items), v in samples.items() if n == name and wanted <= items)
