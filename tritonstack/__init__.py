"""tritonstack: a small classifier served by NVIDIA Triton, with an embedded CPU runtime."""

from pathlib import Path

__version__ = "0.1.0"

#: The model repository shipped with this checkout (the one compose bakes into the image).
DEFAULT_MODEL_REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"
