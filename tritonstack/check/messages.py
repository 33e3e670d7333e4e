"""The one shape of every message `tritonstack check` gives, and the formatting its parts share.

`<config>: <field> <problem>; <fix>`: the file, the field in Triton's naming, what is wrong and
the fix, on one line. Dims are written as config.pbtxt writes them, so a fix can be pasted.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from pathlib import Path

from tritonstack.core.repository import Model

Say = Callable[[str, str, str], None]


def shown(path: Path) -> Path:
    """The path as the user should see it: relative to the working directory when under it."""
    if path.is_absolute():
        try:
            return path.relative_to(Path.cwd())
        except ValueError:
            return path
    return path


def sayer(model: Model, config_path: Path | None = None) -> tuple[list[str], Say]:
    """A message list and the one way to add to it: `<config>: <field> <problem>; <fix>`."""
    problems: list[str] = []
    config_path = config_path or model.directory / "config.pbtxt"

    def say(field: str, problem: str, fix: str) -> None:
        problems.append(f"{config_path}: {field} {problem}; {fix}")

    return problems, say


def format_dims(dims: Iterable[int]) -> str:
    """Dims as config.pbtxt writes them, so a fix can be pasted."""
    values = ", ".join(str(d) for d in dims)
    return f"[ {values} ]" if values else "[ ]"


def quoted_names(names: Iterable[str]) -> str:
    return ", ".join(f'"{n}"' for n in sorted(names)) or "none"


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1)
    return f' (did you mean "{close[0]}"?)' if close else ""
