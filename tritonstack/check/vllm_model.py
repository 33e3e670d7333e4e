"""An LLM model folder for Triton's vLLM backend: one KIND_MODEL instance, vLLM's engine
arguments in <version>/model.json, and the two settings whose defaults users trip on."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tritonclient.grpc import model_config_pb2

from tritonstack.check.messages import Say
from tritonstack.core.repository import Model


def check_vllm(model: Model, versions: Sequence[Path], say: Say) -> None:
    """Triton's vLLM backend: one KIND_MODEL instance, engine arguments in <version>/model.json,
    and the two settings whose defaults users trip on (metrics off, 90% of the GPU taken)."""
    kinds = [group.kind for group in model.config.instance_group]
    if (
        any(kind != model_config_pb2.ModelInstanceGroup.Kind.KIND_MODEL for kind in kinds)
        or len(kinds) > 1
    ):
        say(
            "instance_group",
            "must be one group of kind KIND_MODEL: the vLLM engine places itself on its GPUs "
            "(tensor_parallel_size) and batches on its own",
            "write instance_group [{ count: 1, kind: KIND_MODEL }]",
        )
    if (model.parameter("REPORT_CUSTOM_METRICS") or "").lower() != "true":
        say(
            "parameters",
            'lack REPORT_CUSTOM_METRICS "true", so none of the vllm:* metrics (time to first '
            "token, tokens/s) reach Triton's metrics port",
            'add parameters: { key: "REPORT_CUSTOM_METRICS" value: { string_value: "true" } }',
        )
    for version in versions:
        path = version / "model.json"
        try:
            engine = json.loads(path.read_text(encoding="utf-8"))
        except OSError:
            say('backend "vllm"', f"reads {path} and it is missing", "add vLLM's engine arguments")
            continue
        except json.JSONDecodeError as exc:
            say('backend "vllm"', f"reads {path}, which is not JSON ({exc})", "fix its syntax")
            continue
        if not isinstance(engine, dict) or not isinstance(engine.get("model"), str):
            say(
                'backend "vllm"',
                f'reads {path}, which needs a JSON object naming "model"',
                'write {"model": "<Hugging Face id or folder>", ...}',
            )
            continue
        if "gpu_memory_utilization" not in engine:
            say(
                'backend "vllm"',
                f"starts vLLM with gpu_memory_utilization unset in {path}: vLLM then takes 90% "
                "of the GPU's memory, and a Triton sharing that GPU runs out",
                'set "gpu_memory_utilization" to the share the model may use (weights plus KV '
                "cache), e.g. 0.3",
            )
