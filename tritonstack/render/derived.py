"""The files derived from the model repository and stack.env, committed so that compose and
Kubernetes read them as they are:

- gateway/models.map: the public models and their bounds (tritonstack.core.limits), HAProxy's map;
- gateway/limits.env: the gateway's values that follow from both (body caps, buffer size, the
  LLM's derived patterns), compose's `env_file` beside stack.env;
- prometheus/blackbox.yml: one deep-probe module per public model, a one-row request of zeros
  shaped as the model's config says, asking for every output, whose answer must name them all;
- prometheus/deep-probe.yml: the deep probe's targets (Prometheus file_sd), one per public model.

    python -m tritonstack.render.derived           # write what is stale (`make generate` runs it)
    python -m tritonstack.render.derived --check   # write nothing; exit 1 naming each stale file

`tritonstack add-model` rewrites them; tests/unit/test_derived.py fails while one is stale.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tritonstack.core import generated_files, health
from tritonstack.core.contract import HTTP_PORT
from tritonstack.core.errors import UserError
from tritonstack.core.limits import Limits, limits
from tritonstack.core.project import project_dir
from tritonstack.core.repository import Model, iter_models
from tritonstack.core.settings import load
from tritonstack.core.yamlfiles import dump

#: Where compose's deep probe finds the gateway and where blackbox_exporter finds its key.
PROBED_GATEWAY = f"gateway:{HTTP_PORT}"
PROBE_KEY_FILE = "/run/secrets/tritonstack-clients/deep-probe-api-key"
PROBE_TIMEOUT = "4s"


def _header(comment: str = "#") -> str:
    return (
        f"{comment} Generated from model_repository/ and stack.env by `python -m "
        f"tritonstack.render.derived`:\n{comment} do not edit. `make generate` (or `tritonstack "
        "add-model`) rewrites it.\n"
    )


def probe_module(model: str) -> str:
    return f"infer_{model}"


def blackbox(stack: Limits, models: dict[str, Model]) -> str:
    """prometheus/blackbox.yml: one module per public model."""
    modules = {}
    for name in stack.public_models:
        metadata, config = models[name].description()
        body, expected, tail = health.probe_request(metadata, config)
        text = json.dumps(body, separators=(",", ":"))
        headers = {"Content-Type": "application/json"}
        if tail:  # FP16/BF16: binary tensors of zeros after the JSON
            headers[health.HEADER_LENGTH] = str(len(text.encode()))
        modules[probe_module(name)] = {
            "prober": "http",
            "timeout": PROBE_TIMEOUT,
            "http": {
                "method": "POST",
                "headers": headers,
                "authorization": {"type": "Bearer", "credentials_file": PROBE_KEY_FILE},
                "valid_status_codes": [200],
                "fail_if_body_not_matches_regexp": [f'"name":"{output}"' for output in expected],
                "body": text + tail.decode("latin-1"),
            },
        }
    intro = (
        "# blackbox_exporter: the deep health probe. One real inference per public model, a row\n"
        "# of zeros through the gateway, whose answer must hold every output: /v2/health/ready\n"
        "# stays 200 with a dead Python stub; this does not. `Authorization: Bearer <key>`: the\n"
        "# key compose's secrets service generates for the probe (the gateway asks for it only\n"
        "# when published beyond loopback, and drops it otherwise). Scraped by prometheus.yml's\n"
        "# job deep_probe, whose targets (prometheus/deep-probe.yml) name each model's module.\n"
    )
    return _header() + intro + dump({"modules": modules})


def probe_targets(public_models, gateway: str = PROBED_GATEWAY) -> list[dict]:
    """The deep probe's target groups: each public model's infer URL and its module."""
    return [
        {
            "targets": [f"http://{gateway}/v2/models/{name}/infer"],
            "labels": {"__param_module": probe_module(name), "model": name},
        }
        for name in public_models
    ]


def outputs(root: Path | None = None) -> dict[Path, str]:
    """Every derived file and its content."""
    root = project_dir() if root is None else root
    repository = root / "model_repository"
    stack = limits(repository, load(root / "stack.env"))
    models = {m.name: m for m in iter_models(repository)}
    env = "".join(f"{key}={value}\n" for key, value in stack.environment().items())
    return {
        root / "gateway" / "models.map": _header() + stack.models_map(),
        root / "gateway" / "limits.env": _header() + env,
        root / "prometheus" / "blackbox.yml": blackbox(stack, models),
        root / "prometheus" / "deep-probe.yml": _header()
        + dump(probe_targets(stack.public_models)),
    }


def stale(root: Path | None = None) -> list[Path]:
    return generated_files.stale(outputs(root))


def write(root: Path | None = None) -> list[Path]:
    return generated_files.write(outputs(root))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tritonstack.render.derived", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    root = project_dir()
    try:
        if args.check:
            paths = stale(root)
            for path in paths:
                print(f"stale: {path.relative_to(root)} (run make generate)", file=sys.stderr)
            return 1 if paths else 0
        for path in write(root):
            print(f"wrote {path.relative_to(root)}")
    except UserError as exc:
        print(f"python -m tritonstack.render.derived: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
