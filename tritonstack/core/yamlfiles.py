"""YAML as the repository's generated files write it: block style, indented sequences, literal
multi-line strings, keys in the order given (yamllint clean, readable in a diff)."""

from __future__ import annotations

import yaml


class Dumper(yaml.SafeDumper):
    """Block style with indented sequences (yamllint's default indentation rule)."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = (
        "|"
        if "\n" in value and not any(line != line.rstrip() for line in value.split("\n"))
        else None
    )
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _str)


def dump(data, width: int = 100) -> str:
    """One YAML document, as the generated files write it."""
    return yaml.dump(data, Dumper=Dumper, sort_keys=False, width=width)
