"""tritonstack: a small classifier served by NVIDIA Triton, with an embedded CPU runtime."""

from __future__ import annotations

from pathlib import Path

from tritonstack.core.project import project_dir

__version__ = "0.1.0"


def __getattr__(name: str) -> Path:
    """`DEFAULT_MODEL_REPOSITORY`: the project's model repository (the one compose bakes in).

    Resolved on first use, not at import: `tritonstack --project-dir` sets the project folder
    after this package is imported and before any command module reads it.
    """
    if name == "DEFAULT_MODEL_REPOSITORY":
        return project_dir() / "model_repository"
    raise AttributeError(f"module 'tritonstack' has no attribute {name!r}")
