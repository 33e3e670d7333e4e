"""What the launcher says: progress lines on stderr (the container log), and the one error."""

from __future__ import annotations

import sys

PREFIX = "[entrypoint]"


class LaunchError(Exception):
    """A start that cannot go on: the message says what was wrong and how to fix it."""


def log(*words: object) -> None:
    print(PREFIX, *words, file=sys.stderr, flush=True)
