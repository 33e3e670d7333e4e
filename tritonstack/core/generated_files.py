"""Files written from sources: which are stale, and writing those (each text by its path)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def stale(outputs: Mapping[Path, str]) -> list[Path]:
    """The paths whose file is missing or holds other text."""
    return [p for p, text in outputs.items() if not p.is_file() or p.read_text() != text]


def write(outputs: Mapping[Path, str]) -> list[Path]:
    """Write each stale file (creating its folder); the paths written."""
    written = stale(outputs)
    for path in written:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(outputs[path])
    return written
