"""The stack's settings: stack.env, the one hand-edited file of what the model repository does not
say (which models are public, the gateway's admission and LLM limits).

Compose reads the same file (`env_file`), so it keeps to what both understand: `KEY=VALUE` lines,
values unquoted, `#` starting a comment line. Every key is known here; a missing, unknown or
malformed one is a UserError naming the file, the line and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path

from tritonstack.core.errors import UserError
from tritonstack.core.project import project_dir

FILE_NAME = "stack.env"
#: A Triton model name as a URL path segment can carry it.
MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,126}")
DURATION = re.compile(r"([0-9]+)(ms|s)")


def settings_path() -> Path:
    return project_dir() / FILE_NAME


@dataclass(frozen=True)
class Settings:
    """stack.env's values, typed. Names are the environment variables' own."""

    PUBLIC_MODELS: tuple[str, ...]
    GATEWAY_MAXCONN: int
    GATEWAY_QUEUE_PER_REPLICA: int
    GATEWAY_QUEUE_TIMEOUT: str
    GATEWAY_LLM_STREAMS: int
    GATEWAY_LLM_QUEUE_PER_REPLICA: int
    GATEWAY_LLM_QUEUE_TIMEOUT: str
    GATEWAY_LLM_MAX_PROMPT: int
    GATEWAY_LLM_MAX_TOKENS: int
    GATEWAY_MEMORY_MB: int
    GATEWAY_LARGE_BODIES: int

    @property
    def public_models(self) -> tuple[str, ...]:
        return self.PUBLIC_MODELS

    @property
    def default_model(self) -> str:
        """What `infer` and `loadtest` call when told nothing: the first public model."""
        return self.PUBLIC_MODELS[0]

    def environment(self) -> dict[str, str]:
        """The values as the environment carries them (compose's env_file gives the same)."""
        return {
            f.name: " ".join(value)
            if isinstance(value := getattr(self, f.name), tuple)
            else str(value)
            for f in fields(self)
        }


def milliseconds(duration: str) -> int:
    """ "30ms" or "2s" (HAProxy's forms) in milliseconds."""
    found = DURATION.fullmatch(duration)
    if found is None:
        raise ValueError(f"{duration!r} is not a duration like 30ms or 2s")
    number, unit = found.groups()
    return int(number) * (1000 if unit == "s" else 1)


def parse(text: str, source: str) -> Settings:
    """stack.env's text as Settings; errors name `source` and the line."""
    values: dict[str, tuple[int, str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        where = f"{source}:{number}"
        if not sep or not key.isidentifier():
            raise UserError(f"{where}: expected KEY=VALUE, found {line!r}")
        if '"' in value or "'" in value or "#" in value:
            raise UserError(
                f"{where}: {key}'s value has a quote or a #: write values unquoted, comments on "
                "lines of their own (compose and tritonstack must read the same value)"
            )
        if key in values:
            raise UserError(f"{where}: {key} is set twice (first on line {values[key][0]})")
        values[key] = (number, value.strip())
    known = {f.name: f for f in fields(Settings)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise UserError(f"{source}: unknown setting {unknown[0]}; known: {', '.join(known)}")
    missing = [name for name in known if name not in values]
    if missing:
        raise UserError(f"{source}: {missing[0]} is not set; every key of {FILE_NAME} is needed")
    typed = {}
    for name, (number, value) in values.items():
        where = f"{source}:{number}"
        try:
            typed[name] = _typed(name, value)
        except ValueError as exc:
            raise UserError(f"{where}: {name}: {exc}") from None
    return Settings(**typed)


def _typed(name: str, value: str):
    if name == "PUBLIC_MODELS":
        models = tuple(value.split())
        if not models:
            raise ValueError("name at least one model (space-separated)")
        for model in models:
            if not MODEL_NAME.fullmatch(model):
                raise ValueError(f"{model!r} is not a model name Triton serves")
        if len(set(models)) < len(models):
            raise ValueError("a model is named twice")
        return models
    if name.endswith("_TIMEOUT"):
        if milliseconds(value) <= 0:
            raise ValueError("must be longer than 0")
        return value
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{value!r} is not a positive integer")
    return int(value)


def load(path: Path | None = None) -> Settings:
    """The project's stack.env (or `path`)."""
    path = settings_path() if path is None else Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"{path}: cannot read the stack's settings ({exc.strerror}); every project has one "
            f"{FILE_NAME} beside model_repository/"
        ) from None
    return parse(text, str(path))


def without_public_model(text: str, model: str) -> str:
    """stack.env's text with `model` taken out of PUBLIC_MODELS (unchanged where it is not
    public), every other line unchanged."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        key, sep, value = line.strip().partition("=")
        if sep and key == "PUBLIC_MODELS":
            ending = "\n" if line.endswith("\n") else ""
            kept = [name for name in value.split() if name != model]
            lines[index] = f"PUBLIC_MODELS={' '.join(kept)}{ending}"
            return "".join(lines)
    return text


def with_public_model(text: str, model: str) -> str:
    """stack.env's text with `model` appended to PUBLIC_MODELS, every other line unchanged."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        key, sep, value = line.strip().partition("=")
        if sep and key == "PUBLIC_MODELS":
            ending = "\n" if line.endswith("\n") else ""
            lines[index] = f"PUBLIC_MODELS={' '.join([*value.split(), model])}{ending}"
            return "".join(lines)
    raise UserError(f"{FILE_NAME} has no PUBLIC_MODELS line to add {model} to")
