"""Model configs written from Triton's own schema (model_config.proto), laid out as people write
them.

A config is built as Triton's `ModelConfig` protobuf message, so a field or value Triton would
refuse cannot be written at all (pytriton's generator does the same), and rendered in the layout
of the committed configs: lists in brackets (`dims: [ 4 ]`, `input [ { ... } ]`), which
`text_format.MessageToString` does not write and which the container's entrypoint reads. Every
rendering is parsed back and must equal the message, so layout can never change meaning.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from google.protobuf import descriptor, json_format, text_format
from tritonclient.grpc import model_config_pb2

ModelConfig = model_config_pb2.ModelConfig
INDENT = "  "


def message(config: Mapping) -> ModelConfig:
    """The config as Triton's message; a ParseError names a field Triton does not know."""
    return json_format.ParseDict(config, ModelConfig())


def render(config: Mapping | ModelConfig, header: str = "") -> str:
    """config.pbtxt text: `header` as comment lines, then the config."""
    parsed = config if isinstance(config, ModelConfig) else message(config)
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += _fields(parsed, 0)
    text = "\n".join(lines) + "\n"
    if text_format.Parse(text, ModelConfig()) != parsed:
        raise AssertionError(f"rendered config does not read back as written:\n{text}")
    return text


def _fields(msg, depth: int) -> list[str]:
    pad = INDENT * depth
    lines = []
    for field, value in msg.ListFields():
        name = field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            for key in sorted(value):
                entry = field.message_type.fields_by_name["value"]
                lines.append(f"{pad}{name} {{")
                lines.append(
                    f"{pad}{INDENT}key: {_scalar(field.message_type.fields_by_name['key'], key)}"
                )
                lines += _value(entry, value[key], depth + 1, "value")
                lines.append(f"{pad}}}")
        elif field.is_repeated:
            if field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
                lines.append(f"{pad}{name} [")
                for index, item in enumerate(value):
                    lines.append(f"{pad}{INDENT}{{")
                    lines += _fields(item, depth + 2)
                    lines.append(f"{pad}{INDENT}}}" + ("," if index < len(value) - 1 else ""))
                lines.append(f"{pad}]")
            else:
                items = ", ".join(_scalar(field, v) for v in value)
                lines.append(f"{pad}{name}: [ {items} ]" if items else f"{pad}{name}: []")
        else:
            lines += _value(field, value, depth, name)
    return lines


def _value(field, value, depth: int, name: str) -> list[str]:
    pad = INDENT * depth
    if field.type == descriptor.FieldDescriptor.TYPE_MESSAGE:
        inner = _fields(value, depth + 1)
        if not inner:
            return [f"{pad}{name} {{ }}"]
        return [f"{pad}{name} {{", *inner, f"{pad}}}"]
    return [f"{pad}{name}: {_scalar(field, value)}"]


def _scalar(field, value) -> str:
    if field.type == descriptor.FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values_by_number[value].name
    if field.type == descriptor.FieldDescriptor.TYPE_BOOL:
        return "true" if value else "false"
    if field.type == descriptor.FieldDescriptor.TYPE_STRING:
        return json.dumps(value, ensure_ascii=False)
    return str(value)
