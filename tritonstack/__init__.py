"""tritonstack: a small classifier served by NVIDIA Triton, with an embedded CPU runtime."""

from tritonstack.project import project_dir

__version__ = "0.1.0"

#: The project's model repository (the one compose bakes into the image).
DEFAULT_MODEL_REPOSITORY = project_dir() / "model_repository"
