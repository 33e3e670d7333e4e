"""Where the project's files are: model_repository/, gateway/, loadtest/, prometheus/, grafana/...

The installed package holds only code (and the embedded runtime's backends, package data). The
folders a deployment is made of belong to the project a user cloned and edits, so they are found
here, once: `tritonstack --project-dir`, else $TRITONSTACK_PROJECT_DIR, else the checkout the
package runs from (an editable install), else the current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from tritonstack.core.errors import UserError

PROJECT_DIR_ENV = "TRITONSTACK_PROJECT_DIR"
#: What marks a folder as a tritonstack project.
MARKER = "model_repository"


def project_dir() -> Path:
    """The project folder the commands read their configuration and models from."""
    configured = os.environ.get(PROJECT_DIR_ENV, "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    source = Path(__file__).resolve().parents[2]
    if (source / MARKER).is_dir():
        return source
    return Path.cwd()


def use_project_dir(path: Path) -> Path:
    """Make `path` the project folder for this process and the processes it starts."""
    resolved = path.expanduser().resolve()
    if not (resolved / MARKER).is_dir():
        raise UserError(
            f"--project-dir {path}: no {MARKER}/ folder there; give the folder you cloned "
            "tritonstack into (the one holding model_repository/, gateway/, prometheus/)"
        )
    os.environ[PROJECT_DIR_ENV] = str(resolved)
    return resolved
