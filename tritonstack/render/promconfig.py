"""Render prometheus/prometheus.yml for a Prometheus running next to the embedded runtime.

The compose file's targets are service names (triton:8002, DNS discovery of Locust processes);
on one machine without Docker the same jobs must point at loopback ports instead. Rendering from
the committed file, rather than keeping a second one, means the scrape jobs, intervals and rule
files that the tests prove are exactly the ones compose deploys.

Compose's `triton-llm` job (the llm profile's own Triton) has no native counterpart: natively
`tritonstack serve --llm` serves `llm` on the classifier's Triton, so its vllm:* series come
with job `triton`, and the job is left out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from tritonstack.core.project import project_dir
from tritonstack.render.derived import probe_targets

PROMETHEUS_DIR = project_dir() / "prometheus"
#: Compose jobs whose server is, natively, the one job `triton` already scrapes.
SAME_TRITON_NATIVELY = frozenset({"triton-llm"})


def render(
    triton_metrics: str,
    locust_exporters: Sequence[str] = (),
    source: Path = PROMETHEUS_DIR / "prometheus.yml",
    rules_dir: Path = PROMETHEUS_DIR / "rules",
    blackbox: str | None = None,
    triton_http: str | None = None,
    gateway_metrics: str | None = None,
    probed_models: Sequence[str] = (),
) -> str:
    """prometheus.yml with job `triton` -> `triton_metrics`, job `locust` -> exporters, job
    `gateway` -> HAProxy's exporter at `gateway_metrics` (host:port; left out when None, i.e.
    Triton served without the gateway), and job `deep_probe` -> the blackbox exporter at
    `blackbox` probing `triton_http`, the host:port where clients send HTTP (the gateway's, or
    Triton's without one; left out unless both are given) for each of `probed_models`."""
    config = yaml.safe_load(source.read_text())
    config["rule_files"] = [str(rules_dir.resolve() / "*.yml")]
    targets = {"triton": [triton_metrics], "locust": list(locust_exporters)}
    if gateway_metrics:
        targets["gateway"] = [gateway_metrics]
    jobs = []
    for job in config["scrape_configs"]:
        if job["job_name"] == "gateway" and not gateway_metrics:
            continue
        if job["job_name"] in SAME_TRITON_NATIVELY:
            continue
        if job["job_name"] != "deep_probe":
            jobs.append(job)
        elif blackbox and triton_http:
            # The generated targets' file, for the models this Triton serves and this address.
            job.pop("file_sd_configs", None)
            job["static_configs"] = probe_targets(probed_models, triton_http)
            job["relabel_configs"][-1]["replacement"] = blackbox
            jobs.append(job)
    config["scrape_configs"] = jobs
    for job in jobs:
        if job["job_name"] == "deep_probe":
            continue
        name = job["job_name"]
        if name not in targets:
            raise ValueError(f"{source}: job {name!r} has no local target; extend render()")
        job.pop("dns_sd_configs", None)
        job["static_configs"] = [{"targets": targets[name]}] if targets[name] else []
    return yaml.safe_dump(config, sort_keys=False)


def render_blackbox(
    api_key_file: Path | None, source: Path = PROMETHEUS_DIR / "blackbox.yml"
) -> str:
    """prometheus/blackbox.yml with the deep probe's API key read from `api_key_file` instead of
    compose's secrets volume (None: the probe sends no key, for a gateway that asks for none)."""
    config = yaml.safe_load(source.read_text())
    for module in config["modules"].values():
        http = module["http"]
        if api_key_file is None:
            http.pop("authorization", None)
        else:
            http["authorization"]["credentials_file"] = str(Path(api_key_file).resolve())
    return yaml.safe_dump(config, sort_keys=False)
