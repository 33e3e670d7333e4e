"""Fields the container's Triton knows and the embedded runtime's Triton 2.51 refuses.

Configs are parsed with tritonclient's model_config_pb2, whose schema is the container's
(tritonclient 2.73 ships common's model_config.proto, unchanged from release 26.07 through 26.09,
so the container's 26.08 too): a field unknown there is already a parse error. The embedded
runtime runs Triton 2.51 (release 24.10), which refuses the fields added since; docs/versions.md
has the diff.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import Message

from tritonstack.check.messages import shown
from tritonstack.core.errors import UserError
from tritonstack.core.repository import parse_config

FIELDS_NEWER_THAN_EMBEDDED = {
    "ModelConfig.model_metrics": "26.xx (per-model metric histogram buckets)",
    "ModelEnsembling.max_inflight_requests": "26.xx (ensemble in-flight limit)",
}
EMBEDDED_TRITON = "2.51"


def check_schema_skew(repository: Path) -> list[str]:
    """One message per config (config.pbtxt and configs/*.pbtxt) that sets a field Triton 2.51
    does not know: the container would serve it, the embedded runtime would refuse to load it."""
    repository = Path(repository)
    problems: list[str] = []
    paths = sorted(repository.glob("*/config.pbtxt")) + sorted(repository.glob("*/configs/*.pbtxt"))
    for config_path in paths:
        try:
            config = parse_config(config_path)
        except UserError:
            continue  # the schema check itself reports it
        for field in sorted(_set_fields(config) & FIELDS_NEWER_THAN_EMBEDDED.keys()):
            problems.append(
                f"{shown(config_path)}: {field} is not in Triton {EMBEDDED_TRITON}'s schema "
                f"(added in {FIELDS_NEWER_THAN_EMBEDDED[field]}), so the embedded runtime "
                f"would refuse this config; remove `{field.split('.')[-1]}` so that both "
                "runtimes serve the same repository"
            )
    return problems


def _set_fields(message: Message) -> set[str]:
    """`<MessageType>.<field>` of every field set anywhere in a parsed config."""
    found: set[str] = set()
    for field, value in message.ListFields():
        found.add(f"{message.DESCRIPTOR.name}.{field.name}")
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            items = list(value.values())
        elif field.is_repeated:
            items = list(value)
        else:
            items = [value]
        for item in items:
            if isinstance(item, Message):
                found |= _set_fields(item)
    return found
