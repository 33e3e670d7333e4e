"""This stack's Python backend models: their model.py, the modules they share through symlinks,
and the models a BLS model calls by name (parameters preferred_model and fallback_model)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tritonstack.check.messages import Say, did_you_mean, quoted_names, shown
from tritonstack.check.model_config import DEFAULT_FILENAMES
from tritonstack.core.repository import Model

# Parameters through which a BLS model names the models it calls, in the order it tries them.
CALLED_MODEL_PARAMETERS = ("preferred_model", "fallback_model")


def check_python_files(model: Model, versions: Sequence[Path], say: Say) -> None:
    """Each version holds the model's Python file, and every symlink in it resolves."""
    filename = model.config.default_model_filename or DEFAULT_FILENAMES["python"]
    for version in versions:
        if not (version / filename).is_file():
            say(
                'backend "python"',
                f"loads {version.name}/{filename} and {version / filename} is missing",
                f"add the model's Python file there (class TritonPythonModel in {filename})",
            )
        # A module shared between models is a relative symlink (the stub puts only the model's
        # own folders on sys.path); a broken one fails only when Triton loads the model.
        for link in sorted(p for p in version.iterdir() if p.is_symlink() and not p.exists()):
            say(
                'backend "python"',
                f"imports from {version.name}/, where {shown(link)} links to "
                f"{os.readlink(link)}, which does not exist",
                "point the link at the file, relative to its folder, or put the file there",
            )


def check_called_models(model: Model, models: dict[str, Model], broken: set[str], say: Say) -> None:
    """The models named by preferred_model and fallback_model are in the repository."""
    for key in CALLED_MODEL_PARAMETERS:
        target = model.parameter(key)
        if target and target not in models and target not in broken:
            say(
                f'parameters "{key}"',
                f'names model "{target}", which is not in the repository',
                "set it to one of " + quoted_names(models) + did_you_mean(target, models),
            )
